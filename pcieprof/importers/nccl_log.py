"""`NCCL_DEBUG=INFO` logs: what NCCL chose (version, transport per peer, channels, rings, tuner).

Real multi-process logs interleave the ranks in one stream and sometimes glue two lines together
(one process's line cut off mid-word, the next process's line starting right after it, e.g.
`...ncclCommInitRankConproxmox:113134:113134 [2] NCCL INFO ENV/Plugin: ...`). Every occurrence
of the `host:pid:tid [dev] NCCL INFO|WARN` prefix therefore starts a message, wherever it sits in
a physical line; the host part of a glued prefix is recovered from the host names seen at line
starts. Messages are attributed to a communicator through the process and CUDA device that
printed them (`pid`, `[dev]`), which the `ncclCommInitRank ... Init START` line ties to a rank.

Message formats recognised (NVIDIA/nccl src/init.cc, src/transport/*.cc, src/graph/*.cc,
src/enqueue.cc over 2.x):
- `NCCL version 2.28.9+cuda13.0`, `cudaDriverVersion 13030`;
- `NCCL_P2P_LEVEL set by environment to PHB`;
- `ncclCommInitRank[Config] comm 0x.. rank R nranks N cudaDev C [nvmlDev M] busId B
  [commId 0x..] - Init START|COMPLETE`, `comm 0x.. rank R nRanks N nNodes K localRanks L ...`;
- rings `Channel 00/02 : 0 1 2 3` (older: `Ring 00 : 0 1 2 3`), per-rank ring neighbours
  `Ring 02 : 2 -> 0 -> 1` (previous -> this rank -> next), trees `Trees [0] 1/-1/-1->0->-1 ...`;
- transports `Channel 00/0 : 0[1] -> 1[2] via P2P/CUMEM` (also `P2P/IPC`, `P2P/direct
  pointer`, `SHM/direct/direct`, `NET/Socket/0`, with `/read` or `[send]`/`[receive]`; NCCL 2.5
  and older: `Ring 00 : 3[b0] -> 0[80] via direct shared memory`);
- `comm 0x.. rank R nranks N cudaDev C busId B - Init COMPLETE` without the function name
  (older versions);
- `2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, ...`;
- `threadThresholds ...`, tuner choices `AllReduce: 4096 Bytes -> Algo RING proto LL
  channel{Lo..Hi}={0..1}` and the older `4096 Bytes -> Algo 1 proto 2 time 12.3`;
- `NCCL WARN ...` lines are kept as warnings.

The returned dict (documented on `parse_nccl_log`) is JSON-serialisable as it is; the topology
probes store it as `nccl_choices.json` (one entry per variant) and `pcieprof import` does the same
for imported logs.
"""

from __future__ import annotations

import re
from typing import Any

from pcieprof.importers._text import fail, split_lines

#: Identifies the document layout for readers of nccl_choices.json.
FORMAT = "pcieprof.nccl_choices/1"

_PREFIX = re.compile(r"(?P<host>[^\s:]*):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
                     r"NCCL (?P<level>INFO|WARN|TRACE|ABORT)\b ?")
_BARE_VERSION = re.compile(r"^\s*NCCL version (\S+)")
_VERSION = re.compile(r"^NCCL version (\S+)")
_CUDA_DRIVER = re.compile(r"^cudaDriverVersion (\d+)")
_ENV = re.compile(r"^(NCCL_\w+) set by environment to (.*?)\.?\s*$")
_INIT = re.compile(r"^(?:(ncclCommInit\w*|ncclCommSplit|ncclCommInitAll) )?comm (0x[0-9a-fA-F]+) "
                   r"rank (\d+) nranks (\d+) cudaDev (\d+)(?: nvmlDev (\d+))? busId ([0-9a-fA-F]+)"
                   r"(?: commId (0x[0-9a-fA-F]+))?(?: - Init (START|COMPLETE))?")
_COMM = re.compile(r"^comm (0x[0-9a-fA-F]+) rank (\d+) nRanks (\d+) nNodes (\d+) "
                   r"localRanks (\d+) localRank (\d+)")
_RING = re.compile(r"^(?:Channel|Ring) (\d+)(?:/(\d+))? :((?: +\d+)+)\s*$")
_NEIGHBOURS = re.compile(r"^Ring (\d+) : (-?\d+) -> (\d+) -> (-?\d+)\s*$")
_TRANSPORT = re.compile(r"^(?:Channel|Ring) (\d+)(?:/\d+)? : (\d+)\[([0-9a-fA-Fx]+)\] -> (\d+)\[([0-9a-fA-Fx]+)\]"
                        r"(?: \[(send|receive)\])? via (.+?)\s*$")
_TREES = re.compile(r"^Trees((?: \[\d+\] \S+)+)\s*$")
_TREE_ITEM = re.compile(r"\[(\d+)\] (\S+)")
_CHANNELS = re.compile(r"^(\d+) coll channels,(.*)$")
_THRESH = re.compile(r"^threadThresholds (.+?)\s*$")
_TUNER = re.compile(r"^(\w+): (\d+) Bytes -> Algo (\w+) proto (\w+)"
                    r"(?: channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\})?(?: time ([-\d.]+))?")
_TUNER_OLD = re.compile(r"^(\d+) Bytes -> Algo (\d+) proto (\d+) time ([-\d.]+)")
_P2P_TYPE = re.compile(r"^Check P2P Type (.+?)\s*$")
_NETWORK = re.compile(r"^Using network (\S+)")


def looks_like(text: str) -> bool:
    """True when `text` holds NCCL_DEBUG lines (`host:pid:tid [dev] NCCL INFO ...`)."""
    return len(_PREFIX.findall(text[:200000])) >= 2


def _messages(text: str) -> tuple[list[dict[str, Any]], dict[str, int], list[str]]:
    """Split the stream into NCCL messages (with pid, dev, host, level, text)."""
    lines = split_lines(text)
    known_hosts: set[str] = set()
    for line in lines:
        m = _PREFIX.match(line.lstrip())
        if m and m.group("host"):
            known_hosts.add(m.group("host"))
    msgs: list[dict[str, Any]] = []
    bare_versions: list[str] = []
    counts = {"total": len(lines), "nccl": 0, "spliced": 0}
    for lineno, line in enumerate(lines, start=1):
        found = list(_PREFIX.finditer(line))
        if not found:
            if m := _BARE_VERSION.match(line):
                bare_versions.append(m.group(1))
            continue
        if len(found) > 1:
            counts["spliced"] += 1
        for k, m in enumerate(found):
            host = m.group("host")
            if k > 0 or (m.start() > 0 and line[:m.start()].strip()):
                host = _recover_host(host, known_hosts)
            end = found[k + 1].start("host") if k + 1 < len(found) else len(line)
            # The next prefix's host may be glued to this message's last word: cut it off.
            body = line[m.end():end]
            if k + 1 < len(found):
                glued = found[k + 1].group("host")
                real = _recover_host(glued, known_hosts)
                cut = len(glued) - len(real) if glued.endswith(real) else 0
                body = line[m.end():found[k + 1].start("host") + cut]
            msgs.append({"line": lineno, "host": host, "pid": int(m.group("pid")),
                         "tid": int(m.group("tid")), "dev": int(m.group("dev")),
                         "level": m.group("level"), "text": body.rstrip(),
                         "spliced": k + 1 < len(found)})
            counts["nccl"] += 1
    return msgs, counts, bare_versions


def _recover_host(token: str, known: set[str]) -> str:
    """The host name at the end of a glued token (`...RankConproxmox` -> `proxmox`)."""
    best = ""
    for h in known:
        if token.endswith(h) and len(h) > len(best):
            best = h
    if best:
        return best
    # A glued line may have lost the first letters of its host too (`...Rankoxmox`).
    for n in range(len(token), 1, -1):
        tail = token[-n:]
        if any(h.endswith(tail) for h in known):
            return next(h for h in sorted(known) if h.endswith(tail))
    return token


def parse_nccl_log(text: str, name: str = "<log>") -> dict[str, Any]:
    """Parse an NCCL_DEBUG=INFO log (one process or many interleaved) into what NCCL chose.

    Args:
        text: the log (other lines mixed in are ignored).
        name: file name for messages.

    Returns:
        A JSON-serialisable dict:
        - `format`: "pcieprof.nccl_choices/1"; `source`: `name`.
        - `nccl_version` (str|None, e.g. "2.28.9+cuda13.0"), `nccl_versions` (all seen),
          `cuda_driver_version` (str|None, e.g. "13030").
        - `env`: {NCCL_* variable: value} as NCCL reports "set by environment".
        - `nranks` (int|None), `nchannels` (int|None), `rings` ({channel: [ranks in ring
          order]}), `peer_transport` ({"src->dst": "P2P/CUMEM"}), `transports` (sorted unique
          `via` strings), `transport_families` (e.g. ["P2P", "SHM", "NET"]): taken from the
          main communicator (the first one with the most ranks).
        - `comms`: one entry per communicator (by commId; old logs without commId: the
          per-process entries of one size joined, `comm_id` null):
          `comm_id`, `nranks`, `nnodes`, `ranks` ({rank: {pid, host, cuda_dev, nvml_dev,
          bus_id, comm, local_rank, init}}), `rings`, `nchannels`, `ring_neighbours` ({rank:
          {channel: [previous, next]}}), `trees` ({rank: {channel:
          "up/.../->r->down"}}), `transports` ([{channel, src, dst, src_dev, dst_dev, via,
          family, direction, reported_by}]), `peer_transport`, `coll_channels`, `p2p_channels`,
          `thread_thresholds`, `p2p_type`, `network`, `tuner` ([{coll, bytes, algo, proto,
          channels, time_us}]), `connected_rings`, `connected_trees`.
        - `tuner`: all tuner choices seen; `warnings`: [{line, pid, rank, text}].
        - `lines`: {total, nccl, spliced} counts.

    Raises:
        BadInput: the text holds no NCCL_DEBUG line at all.
    """
    msgs, counts, bare_versions = _messages(text)
    if not msgs and not bare_versions:
        fail(name, None, "NCCL_DEBUG=INFO lines ('host:pid:tid [dev] NCCL INFO ...')")
    versions: list[str] = list(dict.fromkeys(bare_versions))
    env: dict[str, str] = {}
    cuda_driver: str | None = None
    comms: dict[str, dict[str, Any]] = {}
    ptr_to_comm: dict[tuple[int, str], str] = {}
    context: dict[tuple[int, int], str] = {}  # (pid, dev) -> comm key
    pid_comms: dict[int, list[str]] = {}
    warnings: list[dict[str, Any]] = []
    all_tuner: list[dict[str, Any]] = []

    def comm_of(msg: dict[str, Any]) -> dict[str, Any] | None:
        key = context.get((msg["pid"], msg["dev"]))
        if key is None and len(set(pid_comms.get(msg["pid"], []))) == 1:
            key = pid_comms[msg["pid"]][0]
        return comms.get(key) if key else None

    def rank_of(msg: dict[str, Any], comm: dict[str, Any] | None) -> int | None:
        if comm is None:
            return None
        for r, info in comm["ranks"].items():
            if info["pid"] == msg["pid"] and info["cuda_dev"] == msg["dev"]:
                return int(r)
        return None

    for msg in msgs:
        t = msg["text"]
        if msg["level"] == "WARN":
            comm = comm_of(msg)
            warnings.append({"line": msg["line"], "pid": msg["pid"], "rank": rank_of(msg, comm),
                             "text": t})
            continue
        if m := _VERSION.match(t):
            if m.group(1) not in versions:
                versions.append(m.group(1))
        elif m := _CUDA_DRIVER.match(t):
            cuda_driver = cuda_driver or m.group(1)
        elif m := _ENV.match(t):
            env.setdefault(m.group(1), m.group(2))
        elif m := _INIT.match(t):
            _fn, ptr, rank, nranks, cdev, ndev, bus, cid, phase = m.groups()
            key = cid or ptr_to_comm.get((msg["pid"], ptr)) or f"comm:{msg['pid']}:{ptr}"
            ptr_to_comm[(msg["pid"], ptr)] = key
            comm = comms.setdefault(key, _new_comm(key, int(nranks)))
            comm["ranks"].setdefault(rank, {"pid": msg["pid"], "host": msg["host"],
                                            "cuda_dev": int(cdev), "nvml_dev":
                                            int(ndev) if ndev else None, "bus_id": bus,
                                            "comm": ptr, "local_rank": None, "init": None})
            if phase:
                comm["ranks"][rank]["init"] = phase
            context[(msg["pid"], int(cdev))] = key
            pid_comms.setdefault(msg["pid"], []).append(key)
        elif m := _COMM.match(t):
            ptr, rank, nranks, nnodes, _lr, local_rank = m.groups()
            key = ptr_to_comm.get((msg["pid"], ptr))
            if key is None:  # old logs print this before (or without) an Init line
                key = f"comm:{msg['pid']}:{ptr}"
                ptr_to_comm[(msg["pid"], ptr)] = key
                comms.setdefault(key, _new_comm(key, int(nranks)))
                comms[key]["ranks"].setdefault(rank, {"pid": msg["pid"], "host": msg["host"],
                                                      "cuda_dev": msg["dev"], "nvml_dev": None,
                                                      "bus_id": None, "comm": ptr,
                                                      "local_rank": None, "init": None})
                context[(msg["pid"], msg["dev"])] = key
                pid_comms.setdefault(msg["pid"], []).append(key)
            comm = comms[key]
            comm["nnodes"] = int(nnodes)
            if rank in comm["ranks"]:
                comm["ranks"][rank]["local_rank"] = int(local_rank)
        elif (m := _RING.match(t)) and (comm := comm_of(msg)) is not None:
            ch, total, order = m.groups()
            comm["rings"].setdefault(str(int(ch)), [int(x) for x in order.split()])
            if total:
                comm["nchannels"] = int(total)
        elif (m := _NEIGHBOURS.match(t)) and (comm := comm_of(msg)) is not None:
            ch, prev, me, nxt = m.groups()
            comm["ring_neighbours"].setdefault(me, {})[str(int(ch))] = [int(prev), int(nxt)]
        elif (m := _TRANSPORT.match(t)) and (comm := comm_of(msg)) is not None:
            ch, src, sdev, dst, ddev, direction, via = m.groups()
            entry = {"channel": int(ch), "src": int(src), "dst": int(dst), "src_dev": sdev,
                     "dst_dev": ddev, "via": via, "family": via.split("/")[0],
                     "direction": direction, "reported_by": rank_of(msg, comm)}
            if entry not in comm["transports"]:
                comm["transports"].append(entry)
            comm["peer_transport"].setdefault(f"{int(src)}->{int(dst)}", via)
        elif (m := _TREES.match(t)) and (comm := comm_of(msg)) is not None:
            rank = rank_of(msg, comm)
            trees = {str(int(c)): spec for c, spec in _TREE_ITEM.findall(m.group(1))}
            comm["trees"].setdefault(str(rank) if rank is not None else "?", trees)
        elif (m := _CHANNELS.match(t)) and (comm := comm_of(msg)) is not None:
            comm["coll_channels"] = int(m.group(1))
            if p := re.search(r"(\d+) p2p channels(?! per)", m.group(2)):
                comm["p2p_channels"] = int(p.group(1))
        elif (m := _THRESH.match(t)) and (comm := comm_of(msg)) is not None:
            comm["thread_thresholds"] = m.group(1)
        elif (m := _P2P_TYPE.match(t)) and (comm := comm_of(msg)) is not None:
            comm["p2p_type"] = m.group(1)
        elif (m := _NETWORK.match(t)) and (comm := comm_of(msg)) is not None:
            comm["network"] = m.group(1)
        elif m := _TUNER.match(t):
            choice = {"coll": m.group(1), "bytes": int(m.group(2)), "algo": m.group(3),
                      "proto": m.group(4),
                      "channels": [int(m.group(5)), int(m.group(6))] if m.group(5) else None,
                      "time_us": float(m.group(7)) if m.group(7) else None}
            all_tuner.append(choice)
            if (comm := comm_of(msg)) is not None:
                comm["tuner"].append(choice)
        elif m := _TUNER_OLD.match(t):
            choice = {"coll": None, "bytes": int(m.group(1)), "algo": m.group(2),
                      "proto": m.group(3), "channels": None, "time_us": float(m.group(4))}
            all_tuner.append(choice)
            if (comm := comm_of(msg)) is not None:
                comm["tuner"].append(choice)
        elif t.startswith("Connected all rings") and (comm := comm_of(msg)) is not None:
            comm["connected_rings"] = True
        elif t.startswith("Connected all trees") and (comm := comm_of(msg)) is not None:
            comm["connected_trees"] = True
    comm_list = _merge_anonymous(list(comms.values()))
    for c in comm_list:
        c["ranks"] = dict(sorted(c["ranks"].items(), key=lambda kv: int(kv[0])))
        c["rings"] = dict(sorted(c["rings"].items(), key=lambda kv: int(kv[0])))
        c["transports"].sort(key=lambda e: (e["channel"], e["src"], e["dst"]))
        c["peer_transport"] = dict(sorted(c["peer_transport"].items()))
    main = max(comm_list, key=lambda c: c["nranks"], default=None)
    vias = sorted({e["via"] for e in main["transports"]}) if main else []
    return {
        "format": FORMAT,
        "source": name,
        "nccl_version": versions[0] if versions else None,
        "nccl_versions": versions,
        "cuda_driver_version": cuda_driver,
        "env": env,
        "nranks": main["nranks"] if main else None,
        "nchannels": main["nchannels"] if main else None,
        "rings": dict(main["rings"]) if main else {},
        "peer_transport": dict(main["peer_transport"]) if main else {},
        "transports": vias,
        "transport_families": sorted({v.split("/")[0] for v in vias}),
        "comms": comm_list,
        "tuner": all_tuner,
        "warnings": warnings,
        "lines": counts,
    }


def _merge_anonymous(comms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Older NCCL prints no commId: each process's view is then its own entry. Join those of the
    same size, in order, as long as no rank repeats (one communicator per group; an assumption
    that holds for the usual one-communicator job)."""
    out: list[dict[str, Any]] = []
    open_groups: dict[int, dict[str, Any]] = {}
    for c in comms:
        if not c["comm_id"].startswith("comm:"):
            out.append(c)
            continue
        g = open_groups.get(c["nranks"])
        if g is None or set(g["ranks"]) & set(c["ranks"]):
            g = {**c, "comm_id": None, "ranks": {}, "rings": {}, "ring_neighbours": {},
                 "trees": {}, "transports": [], "peer_transport": {}, "tuner": []}
            open_groups[c["nranks"]] = g
            out.append(g)
        g["ranks"].update(c["ranks"])
        for key in ("rings", "ring_neighbours", "trees", "peer_transport"):
            for k, v in c[key].items():
                g[key].setdefault(k, v)
        g["transports"] += [t for t in c["transports"] if t not in g["transports"]]
        g["tuner"] += c["tuner"]
        for key in ("nnodes", "nchannels", "coll_channels", "p2p_channels", "thread_thresholds",
                    "p2p_type", "network"):
            if g.get(key) is None:
                g[key] = c[key]
        g["connected_rings"] = g["connected_rings"] or c["connected_rings"]
        g["connected_trees"] = g["connected_trees"] or c["connected_trees"]
    return out


def _new_comm(key: str, nranks: int) -> dict[str, Any]:
    return {"comm_id": key, "nranks": nranks, "nnodes": None, "ranks": {}, "rings": {},
            "nchannels": None, "ring_neighbours": {}, "trees": {}, "transports": [],
            "peer_transport": {},
            "coll_channels": None, "p2p_channels": None, "thread_thresholds": None,
            "p2p_type": None, "network": None, "tuner": [], "connected_rings": False,
            "connected_trees": False}


def summarize(choices: dict[str, Any]) -> str:
    """One line: version, ranks, channels, transports."""
    parts = [f"NCCL {choices.get('nccl_version') or '?'}"]
    if choices.get("nranks"):
        parts.append(f"{choices['nranks']} ranks")
    if choices.get("nchannels"):
        parts.append(f"{choices['nchannels']} channels")
    if choices.get("rings"):
        first = next(iter(choices["rings"].values()))
        parts.append("ring " + " ".join(str(r) for r in first))
    if choices.get("transports"):
        parts.append("via " + ", ".join(choices["transports"]))
    parts.append(f"{len(choices.get('comms', []))} comms")
    if choices.get("lines", {}).get("spliced"):
        parts.append(f"{choices['lines']['spliced']} spliced lines split")
    return "NCCL log: " + ", ".join(parts)

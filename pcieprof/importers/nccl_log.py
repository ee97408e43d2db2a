"""`NCCL_DEBUG=INFO` logs: what NCCL chose (version, transport per peer, channels, rings, tuner).

The line prefixes NCCL prints (NVIDIA/nccl src/debug.cc, ncclDebugLogV @0456df20):
- INFO: `host:pid:tid [dev] NCCL INFO <msg>`;
- WARN: a newline, then by default a timestamp (`NCCL_DEBUG_TIMESTAMP_LEVELS` defaults to WARN,
  format `[%F %T] `), then `host:pid:tid [dev] file.cc:N NCCL WARN <msg>`, newer versions
  `host:pid:tid [dev] file.cc:N (func) NCCL WARN <msg>`.
As people paste them, lines also come with the prefix cut away (`NCCL INFO Channel 00/0 : 0[0] ->
1[1] via P2P/IPC`, a grep of the transport lines), cut down to `[dev] file.cc:N NCCL WARN`, or
behind a launcher's tag (`[1,0]<stdout>:`, `[0] `, `(VllmWorker pid=1)`).

Real multi-process logs interleave the ranks in one stream and sometimes glue two lines together
(one process's line cut off mid-word, the next process's line starting right after it, e.g.
`...ncclCommInitRankConproxmox:113134:113134 [2] NCCL INFO ENV/Plugin: ...`). Every level word
(`NCCL INFO|WARN|TRACE|ABORT`) with a prefix therefore starts a message, wherever it sits in a
physical line, and one without a prefix does at the start of a line; the host part of a glued
prefix is recovered from the host names seen at line starts. Messages are attributed to a
communicator through the process and CUDA device that printed them (`pid`, `[dev]`), which the
`ncclCommInitRank ... Init START` line ties to a rank; lines without a prefix go to the
communicator of the last Init line without one, or to one `unattributed` communicator.
Finding the messages is linear in the text: the level word is a literal, and the prefix is read
backwards from it over at most 512 characters.

Message formats recognised (NVIDIA/nccl src/init.cc, src/transport/*.cc, src/graph/*.cc,
src/enqueue.cc over 2.x):
- `NCCL version 2.28.9+cuda13.0`, `cudaDriverVersion 13030`;
- `NCCL_P2P_LEVEL set by environment to PHB`;
- `[Rank R] ncclCommInitRank[Config] comm 0x.. rank R nranks N cudaDev C [nvmlDev M] busId B
  [commId 0x..] - Init START|COMPLETE`, `comm 0x.. rank R nRanks N nNodes K localRanks L ...`;
- rings `Channel 00/02 : 0 1 2 3` (older: `Ring 00 : 0 1 2 3`), per-rank ring neighbours
  `Ring 02 : 2 -> 0 -> 1` (previous -> this rank -> next), trees `Trees [0] 1/-1/-1->0->-1 ...`;
- transports `Channel 00/0 : 0[1] -> 1[2] via P2P/CUMEM` (also `P2P/IPC`, `P2P/direct
  pointer`, `SHM/direct/direct`, `NET/Socket/0`, with `/read` or `[send]`/`[receive]`; NCCL 2.5
  and older: `Ring 00 : 3[b0] -> 0[80] via direct shared memory`);
- `comm 0x.. rank R nranks N cudaDev C busId B - Init COMPLETE` without the function name
  (older versions);
- releases 2.7-2.18 print a rank's ring, tree and transport lines before that Init COMPLETE line,
  the only one naming the communicator: they wait for it (per process and device); lines whose
  communicator line never comes (an excerpt) go to the one communicator of the log, else to an
  `unattributed` one. `via direct shared memory` is the SHM transport of those releases;
  channel lines without `/N` give the channel count from `N coll channels` or the ring lines;
- `2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, ...`,
  `NVLS multicast support is available on dev 0`;
- the graph search: `Pattern 4, crossNic 0, nChannels 2, bw 24.0/24.0, type NVL/PIX, sameChannels
  1` (`speed` in older releases) and its channels `  0 : NET/0 GPU/0 GPU/1 NET/0`; the
  per-channel `Tree 3 : -1 -> 0 -> 1/-1/-1` (parent -> rank -> children);
- RCCL's spellings: ` comm 0x.. nRanks 08` after a transport line, `used N bytes` in its Init
  COMPLETE line;
- `P2P is disabled between connected GPUs 1 and 0` (graph/paths.cc: the path allows P2P, CUDA
  does not);
- `threadThresholds ...`, tuner choices `AllReduce: 4096 Bytes -> Algo RING proto LL
  channel{Lo..Hi}={0..1}` and the older `4096 Bytes -> Algo 1 proto 2 time 12.3`;
- `NCCL WARN ...` lines are kept as warnings, with their timestamp and source line.

It returns the typed document (`pcieprof.bundle.nccl_choices.NcclParsed`, documented on
`parse_nccl_log`); the topology probes store it in `nccl_choices.json` (one entry per variant) and
`pcieprof import` does the same for imported logs.
"""

from __future__ import annotations

import re
from typing import Any

from pcieprof.bundle.document import decode
from pcieprof.bundle.nccl_choices import NcclComm, NcclParsed
from pcieprof.importers._text import clean_lines, fail, head_lines
from pcieprof.importers.nccl_xml import PATTERNS

#: Where a message starts: NCCL's level word. A literal, so finding every one is linear; the
#: `host:pid:tid [dev]` prefix is then read backwards from it over a bounded window.
_ANCHOR = re.compile(r"NCCL (INFO|WARN|TRACE|ABORT)\b ?")
#: `[dev] ` right before the level word, with `file.cc:N ` and `(func) ` in WARN lines.
_DEV_TAIL = re.compile(r"\[(\d+)\] (?:([^\s\[\]()]+):(\d+) (?:\(([^()\s]*)\) )?)?")
_PID_TAIL = re.compile(r":(\d+):(\d+) $")
_TIMESTAMP = re.compile(r"\[(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[^\]]*)\]\s*$")
#: How far back from the level word a prefix may start (host names are short; NCCL's line
#: buffer is 1 kB): bounds the work per message whatever the line.
_PREFIX_WINDOW = 512
_BARE_VERSION = re.compile(r"^\s*NCCL version (\S+)")
_VERSION = re.compile(r"^NCCL version (\S+)")
_GLUED_VERSION = re.compile(r" NCCL version (\d+\.\d+\.\d+\+cuda\S*)")
_CUDA_DRIVER = re.compile(r"^cudaDriverVersion (\d+)")
#: `NCCL_IB_HCA set to mlx5_2:1,mlx5_0:1` (transport/net_ib.cc) is the same fact without `by
#: environment` (NVIDIA/nccl-tests issue #228).
_ENV = re.compile(r"^(NCCL_\w+) set (?:by environment )?to (.*)$")
_INIT = re.compile(r"^(?:\[Rank \d+\] )?(?:(ncclCommInit\w*|ncclCommSplit|ncclCommInitAll) )?"
                   r"comm (0x[0-9a-fA-F]+) "
                   r"rank (\d+) nranks (\d+) cudaDev (\d+)(?: nvmlDev (\d+))?"
                   r"(?: busId ([0-9a-fA-F]+))?"
                   r"(?: commId (0x[0-9a-fA-F]+))?"
                   r"(?: parent 0x[0-9a-fA-F]+ splitCount (\d+) color (-?\d+) key -?\d+)?"
                   r"(?: used \d+ bytes)?(?: ?- Init (START|COMPLETE))?")
#: (`ncclCommSplit comm 0x.. rank 0 nranks 4 ... busId 36000 parent 0x.. splitCount 1 color
#: 2003953581 key 0- Init START` names no commId: the split's color and count identify it.)
#: (RCCL's Init COMPLETE line says the memory it took: `... busId 63000 used 67129296 bytes - Init
#: COMPLETE`, ROCm/rccl issue #419.)
_COMM = re.compile(r"^comm (0x[0-9a-fA-F]+) rank (\d+) nRanks (\d+) nNodes (\d+) "
                   r"localRanks (\d+) localRank (\d+)")
_RING = re.compile(r"^(?:Channel|Ring) (\d+)(?:/(\d+))? :((?: +\d+)+)$")
_NEIGHBOURS = re.compile(r"^Ring (\d+) : (-?\d+) -> (\d+) -> (-?\d+)$")
#: RCCL (AMD's fork) ends these lines with its communicator: `... via P2P/IPC comm 0xfb16e30 nRanks
#: 08` (ROCm/rccl issue #1026); that is not part of the transport.
#: NCCL 2.4 prints network hops without the device (`Ring 02 : 4 -> 19 [send] via NET/Socket/0`,
#: pytorch/pytorch issue #23534): the `[dev]` after each rank is optional.
_TRANSPORT = re.compile(r"^(?:Channel|Ring) (\d+)(?:/\d+)? : (\d+)(?:\[([0-9a-fA-Fx]+)\])? -> "
                        r"(\d+)(?:\[([0-9a-fA-Fx]+)\])?(?: \[(send|receive)\])? via (\S.*?)"
                        r"(?: comm 0x[0-9a-fA-F]+ nRanks \d+)?$")
_TREES = re.compile(r"^Trees((?: \[\d+\] \S+)+)$")
_TREE_ITEM = re.compile(r"\[(\d+)\] (\S+)")
#: One channel's tree as a line (`Tree 14 : -1 -> 0 -> 1/-1/-1`: parent -> rank -> children,
#: modelscope/easydistill issue #4); kept in the `Trees` spelling (`children->rank->parent`).
_TREE_LINE = re.compile(r"^Tree (\d+) : (-?\d+) -> (\d+) -> (-?\d+(?:/-?\d+)*)$")
_CHANNELS = re.compile(r"^(\d+) coll channels,(.*)$")
_THRESH = re.compile(r"^threadThresholds (.+)$")
_TUNER = re.compile(r"^(\w+): (\d+) Bytes -> Algo (\w+) proto (\w+)"
                    r"(?: channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\})?(?: time ([-\d.]+))?")
_TUNER_OLD = re.compile(r"^(\d+) Bytes -> Algo (\d+) proto (\d+) time ([-\d.]+)")
_P2P_TYPE = re.compile(r"^Check P2P Type (.+)$")
#: NCCL's SHM transport could not grow its segment (misc/shmutils.cc); the NCCL user guide,
#: troubleshooting "Runtime and MPI issues" > "Shared memory", quotes this line and names the
#: cause: too little /dev/shm, as in a container (Docker's default /dev/shm is 64 MB).
_SHM_EXTEND = re.compile(r"failed to extend (/dev/shm/\S+) to (\d+) bytes(?:, error: (.+))?")
#: The line newer releases print after it; alone (an excerpt) it says the same when the error is
#: ENOSPC.
_SHM_CREATE_FULL = re.compile(r"creating shared memory segment (/dev/shm/\S+) \(size (\d+)\), "
                              r"error: (No space left on device.*)")
SHM_TOO_SMALL = ("/dev/shm too small: NCCL could not grow its shared-memory segment (Docker gives "
                 "a container 64 MB of /dev/shm unless --shm-size is set)")
SHM_FIX = ("give the container more /dev/shm: `docker run --shm-size=1g --ulimit memlock=-1` "
           "(NCCL user guide, troubleshooting: shared memory) or share the host's with `--ipc=host`")
#: The network plugin's name may hold spaces: `Using network NCCL RDMA Plugin v6` (NVIDIA/nccl-tests
#: issue #321), `Using network AWS Libfabric`.
_NETWORK = re.compile(r"^Using network (\S.*)$")
#: PXN: a network hop that goes through another GPU of the node first names that rank in
#: parentheses after the NIC, `[send] via NET/IB/0(8)/GDRDMA` (the local rank whose NIC carries
#: it; graph/paths.cc PXN, NCCL_PXN_DISABLE=0).
_PXN = re.compile(r"^NET/.+?/\d+\((\d+)\)")
#: The graph search's result per pattern (graph/search.cc ncclTopoPrintGraph): `Pattern 4, crossNic
#: 0, nChannels 16, bw 44.000000/44.000000, type LOC/PIX, sameChannels 1` (`speed` for `bw` in older
#: releases, NVIDIA/nccl issue #601), then one line per channel, `  0 : NET/0 GPU/6 GPU/5 NET/0`.
_PATTERN = re.compile(r"^Pattern (\w+), crossNic (\d+), nChannels (\d+), (?:bw|speed) "
                      r"([\d.]+)/([\d.]+), type (\w+)/(\w+), sameChannels (\d+)")
_GRAPH_CHANNEL = re.compile(r"^\s*(\d+) : ([A-Z]+/\S+(?: [A-Z]+/\S+)*)$")
#: `Connected all rings, use ring PXN 0 GDR 1` (newer releases): whether the ring's network hops
#: go through another GPU (PXN) and use GPUDirect RDMA (GDR 0: staged through host memory).
_RING_NET = re.compile(r"use ring PXN (\d) GDR (\d)")
#: Whether the GPU can use NVLink SHARP (NVLS, multicast through the NVSwitch) (transport/nvls.cc):
#: `NVLS multicast support is available on dev 0 (NVLS_NCHANNELS 16)` or `... is not available`.
_NVLS_SUPPORT = re.compile(r"^NVLS multicast support is (not )?available on dev \d+")
#: graph/paths.cc p2pCanConnect: the path between two GPUs would allow P2P but CUDA says peer
#: access is off (ACS, an IOMMU, a VM, a consumer card). INFO for a PCIe path, WARN (and init
#: fails) for an NVLink one. The numbers are NVML device indexes (`indexes[]`, nvidia-smi order).
_P2P_DISABLED = re.compile(r"P2P is disabled between (NVLINK )?connected GPUs (\d+) and (\d+)")
#: CUDA error 217 (cudaErrorPeerAccessUnsupported) as NCCL's WARN lines word it: opening a peer's
#: IPC handle (transport/p2p.cc, `failed to open CUDA IPC handle : 217 peer access is not
#: supported ...`, ray-project/ray_lightning issue #24) or any `Cuda failure 'peer access ...'`.
_PEER_ACCESS = re.compile(r"peer access is not supported|cudaErrorPeerAccessUnsupported")
PEER_ACCESS_UNSUPPORTED = ("CUDA refused peer access between two GPUs "
                           "(cudaErrorPeerAccessUnsupported, error 217): NCCL's P2P transport "
                           "cannot work on this path")
#: NVIDIA/nccl issue #631 (sjeaugey): P2P not working is usually ACS; NCCL_P2P_DISABLE=1 makes
#: NCCL use shared memory instead, at some cost in bandwidth.
PEER_ACCESS_FIX = ("run with NCCL_P2P_DISABLE=1 (NCCL then uses SHM); to get P2P back disable ACS "
                   "on the PCIe switches, or VT-d / pass iommu=pt (NCCL user guide, "
                   "troubleshooting: GPU Direct)")
#: A failed InfiniBand/RoCE work completion (transport/net_ib.cc, the IB plugins): `NET/IB : Got
#: completion with error 4, opcode 8983, len 0, vendor err 81` (NVIDIA/nccl issue #707), newer
#: `NET/IB : Got completion from peer 10.0.0.2<54862> with status=12 opcode=0 len=0 vendor err 129
#: (Recv)` (issue #1405). The status is libibverbs' `enum ibv_wc_status`.
_IB_COMPLETION = re.compile(r"NET/IB ?: Got completion (?:from peer (\S+) )?with "
                            r"(?:error |status=)(\d+).*?vendor err (\d+)")
#: enum ibv_wc_status (libibverbs verbs.h), the values NCCL's users meet.
IBV_WC_STATUS = {1: "IBV_WC_LOC_LEN_ERR", 2: "IBV_WC_LOC_QP_OP_ERR", 4: "IBV_WC_LOC_PROT_ERR",
                 5: "IBV_WC_WR_FLUSH_ERR", 8: "IBV_WC_LOC_ACCESS_ERR",
                 10: "IBV_WC_REM_ACCESS_ERR", 11: "IBV_WC_REM_OP_ERR",
                 12: "IBV_WC_RETRY_EXC_ERR", 13: "IBV_WC_RNR_RETRY_EXC_ERR"}
IB_COMPLETION = ("the InfiniBand/RoCE network failed a transfer (a work completion with an error "
                 "status); the collective then fails or hangs")
#: What to check, by status; the default for the others.
IB_COMPLETION_FIX = {
    12: ("retry exceeded: the peer or a link stopped answering; check the links, switches and the "
         "peer host (`ibstat`, the ports' error counters)"),
    4: ("local protection error: the NIC could not use the registered (GPU) memory; check "
        "GPUDirect RDMA (nvidia-peermem or dmabuf) or try NCCL_NET_GDR_LEVEL=LOC"),
    0: "check the links and switches (`ibstat`, the ports' error counters) and the peer host",
}
P2P_DISABLED_NVLINK = ("NCCL found P2P disabled between NVLink-connected GPUs and stopped (a "
                       "hardware or driver problem, NCCL says)")
P2P_DISABLED_NVLINK_FIX = ("check the NVLink state (`nvidia-smi nvlink -s`) and the driver; NCCL "
                           "proceeds anyway with NCCL_IGNORE_DISABLED_P2P=1")


def _find_prefix(line: str, lo: int, p: int) -> dict[str, Any] | None:
    """The `host:pid:tid [dev] [file:N [(func)]] ` prefix that ends at `p` (the level word), read
    backwards within line[lo:p]; None when the level word has no such prefix.

    Returns {"start", "host", "pid", "tid", "dev", "source", "time"}; `pid`/`host` are None for
    a prefix cut down to `[dev] ` (as people paste it), `time` is NCCL's timestamp when present.
    """
    lo = max(lo, p - _PREFIX_WINDOW)
    q = line.rfind("[", lo, p)
    tail = None
    for _ in range(3):  # `[dev] (func) ` holds at most one more '[' after the one we want
        if q < 0:
            return None
        tail = _DEV_TAIL.fullmatch(line, q, p)
        if tail:
            break
        q = line.rfind("[", lo, q)
    if tail is None:
        return None
    out: dict[str, Any] = {"start": q, "host": None, "pid": None, "tid": None,
                           "dev": int(tail.group(1)), "time": None,
                           "source": f"{tail.group(2)}:{tail.group(3)}" if tail.group(2) else None}
    pm = _PID_TAIL.search(line, max(lo, q - 64), q)
    if pm:
        hs = max(line.rfind(" ", lo, pm.start()), line.rfind("\t", lo, pm.start()),
                 line.rfind(":", lo, pm.start()), line.rfind(">", lo, pm.start()), lo - 1)
        out.update(start=hs + 1, host=line[hs + 1:pm.start()], pid=int(pm.group(1)),
                   tid=int(pm.group(2)))
    if tm := _TIMESTAMP.search(line, max(lo, out["start"] - 64), out["start"]):
        out["time"] = tm.group(1)
    return out


def _cut_paste_comment(body: str) -> str:
    """A pasted line without its prefix may carry the paster's comment (`... via P2P/IPC   #
    good: NVLink`); NCCL prints none there. Cut it (a find, not a pattern: linear)."""
    k = body.find(" # ")
    return body[:k].rstrip() if k > 0 else body


def _bare_start(line: str, p: int) -> bool:
    """A level word without a prefix starts a message only at the start of a line, after at most
    a short tag (`[rank0]:`, `(VllmWorker pid=1)`, a timestamp, `container |`): not in prose."""
    before = line[:p].strip()
    return not before or (len(before) <= 120 and before[-1] in "]):>|")


def looks_like(text: str) -> bool:
    """True when `text` holds NCCL_DEBUG lines: one with the `host:pid:tid [dev] NCCL INFO`
    prefix, or two that start with `NCCL INFO`/`NCCL WARN` (a grep pasted without prefixes)."""
    bare = 0
    for line in head_lines(text):
        for m in _ANCHOR.finditer(line):
            pre = _find_prefix(line, 0, m.start())
            if pre is not None and pre["pid"] is not None:
                return True
            if pre is not None or _bare_start(line, m.start()):
                bare += 1
                break
        if bare >= 2:
            return True
    return False


def _messages(text: str) -> tuple[list[dict[str, Any]], dict[str, int], list[str]]:
    """Split the stream into NCCL messages (with host, pid, tid, dev, level, text; the prefix
    fields None where the line has none)."""
    lines = clean_lines(text)
    msgs: list[dict[str, Any]] = []
    bare_versions: list[str] = []
    counts = {"total": len(lines), "nccl": 0, "spliced": 0, "without_prefix": 0}
    found_per_line: list[list[tuple[re.Match[str], dict[str, Any] | None]]] = []
    known_hosts: set[str] = set()
    for line in lines:
        found: list[tuple[re.Match[str], dict[str, Any] | None]] = []
        lo = 0
        for m in _ANCHOR.finditer(line):
            pre = _find_prefix(line, lo, m.start())
            if pre is None and not (not found and _bare_start(line, m.start())):
                continue  # the words "NCCL INFO" inside a message, or in prose
            found.append((m, pre))
            lo = m.end()
        found_per_line.append(found)
        if found and found[0][1] and found[0][1]["host"] and not line[:found[0][1]["start"]].strip():
            known_hosts.add(found[0][1]["host"])
    for lineno, (line, found) in enumerate(zip(lines, found_per_line), start=1):
        if not found:
            if vm := _BARE_VERSION.match(line):
                bare_versions.append(vm.group(1))
            continue
        if len(found) > 1:
            counts["spliced"] += 1
        for k, (m, pre) in enumerate(found):
            host = pre["host"] if pre else None
            if pre is not None and host is not None and (k > 0 or line[:pre["start"]].strip()):
                host = _recover_host(host, known_hosts)
            end = len(line)
            if k + 1 < len(found):
                nxt = found[k + 1][1]
                end = nxt["start"] if nxt else found[k + 1][0].start()
                if nxt and nxt["host"]:
                    # The next prefix's host may be glued to this message's last word: cut it off.
                    real = _recover_host(nxt["host"], known_hosts)
                    if nxt["host"].endswith(real):
                        end += len(nxt["host"]) - len(real)
            body = line[m.end():end].rstrip()
            if glued := _GLUED_VERSION.search(body):
                # The bare version line glued to a message by a paste that joined the lines
                # (vllm-project/vllm issue #12292: `cudaDriverVersion 12060 NCCL version 2.20.5`).
                bare_versions.append(glued.group(1))
                body = body[:glued.start()].rstrip()
            if k + 1 == len(found) and body.endswith(" via") and lineno < len(lines):
                body += " " + _wrapped_tail(lines[lineno], found_per_line[lineno])
            if pre is None or pre["pid"] is None:
                counts["without_prefix"] += 1
                body = _cut_paste_comment(body)
            msgs.append({"line": lineno, "host": host,
                         "pid": pre["pid"] if pre else None, "tid": pre["tid"] if pre else None,
                         "dev": pre["dev"] if pre else None, "level": m.group(1), "text": body,
                         "source": pre["source"] if pre else None,
                         "time": pre["time"] if pre else None, "spliced": k + 1 < len(found)})
            counts["nccl"] += 1
    return msgs, counts, bare_versions


def _wrapped_tail(nxt: str, found: list[tuple[re.Match[str], dict[str, Any] | None]]) -> str:
    """What a transport line cut after `via` continues with on the next physical line: its text
    up to the next message, when the line starts with blanks (a terminal's or editor's wrap, as
    in deepseek-ai/DeepEP issue #106: `... [receive] via` / ` NET/IBext/4/GDRDMA   host:...`)."""
    if not nxt[:1].isspace():
        return ""
    stop = len(nxt)
    if found:
        stop = found[0][1]["start"] if found[0][1] else found[0][0].start()
    return nxt[:stop].strip()


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


def parse_nccl_log(text: str, name: str = "<log>") -> NcclParsed:
    """Parse an NCCL_DEBUG=INFO log (one process or many interleaved) into what NCCL chose.

    Args:
        text: the log (other lines mixed in are ignored).
        name: file name for messages.

    Returns:
        The typed document (pcieprof.bundle.nccl_choices.NcclParsed; as JSON, format
        "pcieprof.nccl_choices/2"):
        - `source`: `name`.
        - `nccl_version` (str|None, e.g. "2.28.9+cuda13.0"), `nccl_versions` (all seen),
          `cuda_driver_version` (str|None, e.g. "13030").
        - `env`: {NCCL_* variable: value} as NCCL reports "set by environment".
        - `nranks` (int|None), `nchannels` (int|None), `rings` ({channel: [ranks in ring
          order]}), `peer_transport` ({"src->dst": "P2P/CUMEM"}), `transports` (sorted unique
          `via` strings), `transport_families` (e.g. ["P2P", "SHM", "NET"]): taken from the
          main communicator (the first one with the most ranks).
        - `comms`: one NcclComm per communicator (by commId; `split:<color>:<splitCount>` for an
          ncclCommSplit one whose lines print no commId; old logs without commId: the
          per-process entries of one size joined, `comm_id` null):
          `comm_id`, `nranks`, `nnodes`, `ranks` ({rank: {pid, host, cuda_dev, nvml_dev,
          bus_id, comm, local_rank, init}}), `rings`, `nchannels`, `ring_neighbours` ({rank:
          {channel: [previous, next]}}), `trees` ({rank: {channel:
          "up/.../->r->down"}}), `transports` ([{channel, src, dst, src_dev, dst_dev, via,
          family, direction, reported_by, pxn_rank (the rank whose NIC a PXN hop goes out through,
          else null)}]), `peer_transport`, `coll_channels`, `p2p_channels`,
          `nvls_channels`, `collnet_channels` (from `N coll channels, ...`), `nvls_multicast`
          (bool|None: `NVLS multicast support is [not] available`), `graphs` (the graph
          search's `Pattern` lines, per host one process's: [{pattern, pattern_name, crossnic,
          nchannels, bw_intra, bw_inter (GB/s), type_intra, type_inter, same_channels,
          channels ([[`NET/0`, `GPU/6`, ...]]), host, reported_by}]),
          `ring_pxn`, `ring_gdr` (bool|None: `Connected all rings, use ring PXN 0 GDR 1`),
          `thread_thresholds`, `p2p_type`, `network`, `tuner` ([{coll, bytes, algo, proto,
          channels, time_us}]), `connected_rings`, `connected_trees`, `attribution` (how
          lines were tied to it: `prefix` by process and device, `order` lines without a
          prefix after their Init line, `none` a grep of lines without prefixes and Init
          lines, `comm_id` null and `nranks` the highest rank seen + 1).
        - `tuner`: all tuner choices seen; `warnings`: [{line, host, pid, dev, rank, time
          (NCCL's timestamp or null), source (`misc/socket.cc:483` or null), text}].
        - `p2p_disabled`: [[a, b]] pairs of GPUs (NVML indexes, as NCCL prints them) whose path
          would carry P2P but CUDA has peer access off (`P2P is disabled between connected
          GPUs a and b`): NCCL uses SHM or the network between them.
        - `failures`: what the WARN lines name, one entry per kind: {kind (`shm_too_small`,
          `peer_access_unsupported`, `p2p_disabled_nvlink`, `ib_completion_error` with
          status, status_name, vendor_err, peer),
          what, fix, line (the first), host, dev, count (lines), and the kind's detail
          (segment, bytes, error)}; a communicator they hit lists the kinds in its `failures`.
        - `lines`: {total, nccl, spliced, without_prefix} counts.

    Raises:
        BadInput: the text holds no NCCL_DEBUG line at all.
    """
    msgs, counts, bare_versions = _messages(text)
    if not msgs and not bare_versions:
        fail(name, None, "NCCL_DEBUG=INFO lines ('host:pid:tid [dev] NCCL INFO ...' or "
             "'NCCL INFO ...')")
    versions: list[str] = list(dict.fromkeys(bare_versions))
    env: dict[str, str] = {}
    cuda_driver: str | None = None
    comms: dict[str, dict[str, Any]] = {}
    ptr_to_comm: dict[tuple[int, str], str] = {}
    context: dict[tuple[int, int], str] = {}  # (pid, dev) -> comm key
    pid_comms: dict[int, list[str]] = {}
    warnings: list[dict[str, Any]] = []
    all_tuner: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    p2p_disabled: list[list[int]] = []
    # comm -> {(host, pid, dev): the graphs that process printed}
    graphs_by: dict[str, dict[tuple[Any, ...], list[dict[str, Any]]]] = {}
    last_graph: dict[tuple[Any, ...], dict[str, Any]] = {}  # (host, pid, dev) -> its last Pattern

    # Lines without the host:pid:tid prefix carry no process to tie them to a communicator:
    # they belong to the one the last such Init line named (a log pasted in order), else to
    # one `unattributed` communicator (a grep of transport lines).
    anon: dict[str, Any] = {"key": None, "rank": None}

    def comm_of(msg: dict[str, Any], create: bool = True) -> dict[str, Any] | None:
        if msg["pid"] is None:
            key = anon["key"]
            if key is None and create:
                key = "unattributed"
                comms.setdefault(key, _new_comm(key, 0))["attribution"] = "none"
            return comms.get(key) if key else None
        key = context.get((msg["pid"], msg["dev"]))
        if key is None and len(set(pid_comms.get(msg["pid"], []))) == 1:
            key = pid_comms[msg["pid"]][0]
        return comms.get(key) if key else None

    def rank_of(msg: dict[str, Any], comm: dict[str, Any] | None) -> int | None:
        if comm is None:
            return None
        if msg["pid"] is None:
            return anon["rank"] if anon["key"] == comm["comm_id"] else None
        for r, info in comm["ranks"].items():
            if info["pid"] == msg["pid"] and info["cuda_dev"] == msg["dev"]:
                return int(r)
        return None

    # Releases 2.7-2.18 print a rank's channel, ring and transport lines before the only line
    # naming its communicator (`comm 0x.. rank R nranks N ... - Init COMPLETE`, no Init START):
    # such lines wait here, per process and device, until that line comes.
    pending: dict[tuple[Any, ...], list[dict[str, Any]]] = {}

    def waiting_key(msg: dict[str, Any]) -> tuple[Any, ...]:
        return ("anon",) if msg["pid"] is None else (msg["pid"], msg["dev"])

    def replay(key: tuple[Any, ...]) -> None:
        for waiting in pending.pop(key, []):
            handle(waiting)

    def note_p2p_disabled(m: re.Match[str]) -> None:
        pair = sorted((int(m.group(2)), int(m.group(3))))
        if pair not in p2p_disabled:
            p2p_disabled.append(pair)

    def handle(msg: dict[str, Any], force: str | None = None) -> None:
        def comm_of_msg(m: dict[str, Any]) -> dict[str, Any] | None:
            return comms[force] if force is not None else comm_of(m)

        nonlocal cuda_driver
        t = msg["text"]
        if (force is None and msg["level"] != "WARN" and _needs_comm(t)
                and comm_of(msg, create=False) is None):
            pending.setdefault(waiting_key(msg), []).append(msg)
            return
        if msg["level"] == "WARN":
            comm = comm_of(msg, create=False)
            warnings.append({"line": msg["line"], "host": msg["host"], "pid": msg["pid"],
                             "dev": msg["dev"], "rank": rank_of(msg, comm), "time": msg["time"],
                             "source": msg["source"], "text": t})
            if shm := _SHM_EXTEND.search(t) or _SHM_CREATE_FULL.search(t):
                _note_failure(failures, comm, msg, "shm_too_small", SHM_TOO_SMALL, SHM_FIX,
                              segment=shm.group(1), bytes=int(shm.group(2)),
                              error=shm.group(3))
            elif ib := _IB_COMPLETION.search(t):
                status = int(ib.group(2))
                _note_failure(failures, comm, msg, "ib_completion_error", IB_COMPLETION,
                              IB_COMPLETION_FIX.get(status, IB_COMPLETION_FIX[0]), status=status,
                              status_name=IBV_WC_STATUS.get(status), vendor_err=int(ib.group(3)),
                              peer=ib.group(1))
            elif _PEER_ACCESS.search(t):
                _note_failure(failures, comm, msg, "peer_access_unsupported",
                              PEER_ACCESS_UNSUPPORTED, PEER_ACCESS_FIX)
            elif m := _P2P_DISABLED.search(t):
                note_p2p_disabled(m)
                _note_failure(failures, comm, msg, "p2p_disabled_nvlink", P2P_DISABLED_NVLINK,
                              P2P_DISABLED_NVLINK_FIX)
            return
        if m := _P2P_DISABLED.match(t):
            note_p2p_disabled(m)
            return
        if m := _VERSION.match(t):
            if m.group(1) not in versions:
                versions.append(m.group(1))
        elif m := _CUDA_DRIVER.match(t):
            cuda_driver = cuda_driver or m.group(1)
        elif m := _ENV.match(t):
            env.setdefault(m.group(1), m.group(2).rstrip().removesuffix("."))
        elif m := _INIT.match(t):
            _fn, ptr, rank, nranks, cdev, ndev, bus, cid, split_count, color, phase = m.groups()
            known = ptr_to_comm.get((msg["pid"], ptr))
            split = f"split:{color}:{split_count}" if color is not None else None
            # A split communicator is named by its color on every rank (the same on all its
            # members, NCCL's ncclCommSplit contract); its pointer keeps that name.
            key = ((known if known and known.startswith("split:") else None) or cid or known
                   or split or f"comm:{msg['pid']}:{ptr}")
            ptr_to_comm[(msg["pid"], ptr)] = key
            comm = comms.setdefault(key, _new_comm(key, int(nranks)))
            comm["ranks"].setdefault(rank, {"pid": msg["pid"], "host": msg["host"],
                                            "cuda_dev": int(cdev), "nvml_dev":
                                            int(ndev) if ndev else None, "bus_id": bus,
                                            "comm": ptr, "local_rank": None, "init": None})
            if phase:
                comm["ranks"][rank]["init"] = phase
            if msg["pid"] is None:
                comm["attribution"] = "order"
                anon.update(key=key, rank=int(rank))
            else:
                context[(msg["pid"], int(cdev))] = key
                pid_comms.setdefault(msg["pid"], []).append(key)
            replay(waiting_key({"pid": msg["pid"], "dev": int(cdev)}))
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
                if msg["pid"] is None:
                    comms[key]["attribution"] = "order"
                else:
                    context[(msg["pid"], msg["dev"])] = key
                    pid_comms.setdefault(msg["pid"], []).append(key)
            if msg["pid"] is None:
                anon.update(key=key, rank=int(rank))
            comm = comms[key]
            comm["nnodes"] = int(nnodes)
            if rank in comm["ranks"]:
                comm["ranks"][rank]["local_rank"] = int(local_rank)
            replay(waiting_key(msg))
        elif (m := _RING.match(t)) and (comm := comm_of_msg(msg)) is not None:
            ch, total, order = m.groups()
            comm["rings"].setdefault(str(int(ch)), [int(x) for x in order.split()])
            if total:
                comm["nchannels"] = int(total)
        elif (m := _NEIGHBOURS.match(t)) and (comm := comm_of_msg(msg)) is not None:
            ch, prev, me, nxt = m.groups()
            comm["ring_neighbours"].setdefault(me, {})[str(int(ch))] = [int(prev), int(nxt)]
        elif (m := _TRANSPORT.match(t)) and (comm := comm_of_msg(msg)) is not None:
            ch, src, sdev, dst, ddev, direction, via = m.groups()
            entry = {"channel": int(ch), "src": int(src), "dst": int(dst), "src_dev": sdev,
                     "dst_dev": ddev, "via": via, "family": transport_family(via),
                     "direction": direction, "reported_by": rank_of(msg, comm),
                     "pxn_rank": int(px.group(1)) if (px := _PXN.match(via)) else None}
            if entry not in comm["transports"]:
                comm["transports"].append(entry)
            comm["peer_transport"].setdefault(f"{int(src)}->{int(dst)}", via)
        elif (m := _TREES.match(t)) and (comm := comm_of_msg(msg)) is not None:
            rank = rank_of(msg, comm)
            trees = {str(int(c)): spec for c, spec in _TREE_ITEM.findall(m.group(1))}
            if rank is None:  # no Init line names the process: the tree says (`up->R->down`)
                me = re.search(r"->(\d+)->", next(iter(trees.values()), ""))
                rank = int(me.group(1)) if me else None
            comm["trees"].setdefault(str(rank) if rank is not None else "?", trees)
        elif (m := _TREE_LINE.match(t)) and (comm := comm_of_msg(msg)) is not None:
            ch, up, me, down = m.groups()
            comm["trees"].setdefault(me, {})[str(int(ch))] = f"{down}->{me}->{up}"
        elif (m := _CHANNELS.match(t)) and (comm := comm_of_msg(msg)) is not None:
            comm["coll_channels"] = int(m.group(1))
            for kind in ("p2p", "nvls", "collnet"):
                if p := re.search(rf"(\d+) {kind} channels(?! per)", m.group(2)):
                    comm[f"{kind}_channels"] = int(p.group(1))
        elif (m := _PATTERN.match(t)) and (comm := comm_of_msg(msg)) is not None:
            pat = m.group(1)
            graph = {"pattern": int(pat) if pat.isdigit() else pat,
                     "pattern_name": PATTERNS.get(int(pat), "unknown") if pat.isdigit()
                     else pat.lower(), "crossnic": int(m.group(2)),
                     "nchannels": int(m.group(3)), "bw_intra": float(m.group(4)),
                     "bw_inter": float(m.group(5)), "type_intra": m.group(6),
                     "type_inter": m.group(7), "same_channels": int(m.group(8)),
                     "channels": [], "host": msg["host"], "reported_by": rank_of(msg, comm)}
            who = (msg["host"], msg["pid"], msg["dev"])
            graphs_by.setdefault(comm["comm_id"], {}).setdefault(who, []).append(graph)
            last_graph[who] = graph
        elif (m := _GRAPH_CHANNEL.match(t)) and (comm := comm_of_msg(msg)) is not None:
            shown = last_graph.get((msg["host"], msg["pid"], msg["dev"]))
            if shown is not None and int(m.group(1)) == len(shown["channels"]):
                shown["channels"].append(m.group(2).split())
        elif (m := _NVLS_SUPPORT.match(t)) and (comm := comm_of_msg(msg)) is not None:
            comm["nvls_multicast"] = m.group(1) is None
        elif (m := _THRESH.match(t)) and (comm := comm_of_msg(msg)) is not None:
            comm["thread_thresholds"] = m.group(1)
        elif (m := _P2P_TYPE.match(t)) and (comm := comm_of_msg(msg)) is not None:
            comm["p2p_type"] = m.group(1)
        elif (m := _NETWORK.match(t)) and (comm := comm_of_msg(msg)) is not None:
            comm["network"] = m.group(1)
        elif m := _TUNER.match(t):
            choice = {"coll": m.group(1), "bytes": int(m.group(2)), "algo": m.group(3),
                      "proto": m.group(4),
                      "channels": [int(m.group(5)), int(m.group(6))] if m.group(5) else None,
                      "time_us": float(m.group(7)) if m.group(7) else None}
            all_tuner.append(choice)
            if (comm := comm_of_msg(msg)) is not None:
                comm["tuner"].append(choice)
        elif m := _TUNER_OLD.match(t):
            choice = {"coll": None, "bytes": int(m.group(1)), "algo": m.group(2),
                      "proto": m.group(3), "channels": None, "time_us": float(m.group(4))}
            all_tuner.append(choice)
            if (comm := comm_of_msg(msg)) is not None:
                comm["tuner"].append(choice)
        elif t.startswith("Connected all rings") and (comm := comm_of_msg(msg)) is not None:
            comm["connected_rings"] = True
            if ring := _RING_NET.search(t):
                comm["ring_pxn"], comm["ring_gdr"] = ring.group(1) == "1", ring.group(2) == "1"
        elif t.startswith("Connected all trees") and (comm := comm_of_msg(msg)) is not None:
            comm["connected_trees"] = True

    for msg in msgs:
        handle(msg)
    # Lines whose communicator line never came (an excerpt, a log cut short): to the one
    # communicator when all seen are one (old logs' per-process entries of one size), else
    # to the `unattributed` one, as a grep of transport lines.
    named = [k for k in comms if k != "unattributed"]
    one = len(named) == 1 or (len({comms[k]["nranks"] for k in named}) == 1
                              and all(k.startswith("comm:") for k in named))
    only = named[0] if named and one else None
    loose_prefixed = any(key != ("anon",) for key in pending)
    for key in list(pending):
        for waiting in pending.pop(key):
            if only is None:
                comms.setdefault("unattributed", _new_comm("unattributed", 0))[
                    "attribution"] = "none"
            handle(waiting, force=only or "unattributed")
    for comm_key, by in graphs_by.items():
        # Every rank of a node prints the same search (its node's GPUs, by rank): per host, keep
        # the process that printed the most of it (an excerpt cuts the others).
        best: dict[Any, list[dict[str, Any]]] = {}
        for (host, _pid, _dev), graphs in by.items():
            if len(graphs) > len(best.get(host, [])):
                best[host] = graphs
        comms[comm_key]["graphs"] = [g for graphs in best.values() for g in graphs]
    loose = comms.get("unattributed")
    settings = ("coll_channels", "network", "thread_thresholds", "p2p_type", "nvls_multicast")
    if loose is not None and not (
            loose["rings"] or loose["transports"] or loose["trees"] or loose["tuner"]
            or loose["ring_neighbours"] or loose["graphs"]
            or (loose_prefixed and any(loose[k] is not None for k in settings))):
        # Only settings lines came without a prefix: nothing to keep. What processes whose
        # Init line is not in the excerpt printed (channel counts, the network: NVIDIA/nccl
        # issue #1646, NVIDIA/nccl-tests issue #228) stays.
        del comms["unattributed"]
    comm_list = _merge_anonymous(list(comms.values()))
    eager = not versions or _release(versions[0]) < (2, 19)
    for c in comm_list:
        if c["comm_id"] == "unattributed":
            # Its size is what the lines show: the longest ring, or the highest rank seen.
            seen = [r for ring in c["rings"].values() for r in ring]
            seen += [x for e in c["transports"] for x in (e["src"], e["dst"])]
            seen += [int(r) for spec in c["trees"].values() for tree in spec.values()
                     for r in re.findall(r"-?\d+", tree) if r != "-1"]
            c["comm_id"] = None
            c["nranks"] = max(seen) + 1 if seen else 0
        c["ranks"] = dict(sorted(c["ranks"].items(), key=lambda kv: int(kv[0])))
        c["rings"] = dict(sorted(c["rings"].items(), key=lambda kv: int(kv[0])))
        c["transports"].sort(key=lambda e: (e["channel"], e["src"], e["dst"]))
        c["peer_transport"] = dict(sorted(c["peer_transport"].items()))
        if c["nchannels"] is None:
            # Ring lines without `/N` (older releases): NCCL's own count, else one ring per channel.
            c["nchannels"] = c["coll_channels"] or (len(c["rings"]) or None)
        if (not c["connected_rings"] and c["transports"] and eager
                and (versions or c["comm_id"] is None)
                and any(r["init"] == "COMPLETE" for r in c["ranks"].values())):
            # The releases this is about (2.7-2.18) connect every channel inside init, before
            # Init COMPLETE, and not all print "Connected all rings". Newer ones may connect at
            # the first collective (NCCL_RUNTIME_CONNECT): there only their own line counts.
            c["connected_rings"] = True
    main = max(comm_list, key=lambda c: c["nranks"], default=None)
    vias = sorted({e["via"] for e in main["transports"]}) if main else []
    families = sorted({transport_family(v) for v in vias})
    return NcclParsed(
        source=name, nccl_version=versions[0] if versions else None, nccl_versions=versions,
        cuda_driver_version=cuda_driver, env=env,
        nranks=main["nranks"] if main else None, nchannels=main["nchannels"] if main else None,
        rings={str(k): list(v) for k, v in main["rings"].items()} if main else {},
        peer_transport=dict(main["peer_transport"]) if main else {},
        transports=list(vias), transport_families=families,
        comms=[decode(NcclComm, c, name) for c in comm_list], tuner=all_tuner,
        warnings=list(warnings), failures=failures, p2p_disabled=sorted(p2p_disabled),
        lines=dict(counts))


def _note_failure(failures: list[dict[str, Any]], comm: dict[str, Any] | None,
                  msg: dict[str, Any], kind: str, what: str, fix: str, **detail: Any) -> None:
    """Name a failure NCCL's WARN lines identify: one entry per kind, counting its lines (every
    rank prints its own); the communicator it hit, where known, gets the kind too."""
    for f in failures:
        if f["kind"] == kind:
            f["count"] += 1
            break
    else:
        failures.append({"kind": kind, "what": what, "fix": fix, "line": msg["line"],
                         "host": msg["host"], "dev": msg["dev"], "count": 1, **detail})
    if comm is not None:
        comm.setdefault("failures", [])
        if kind not in comm["failures"]:
            comm["failures"].append(kind)


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of `2.18.3+cuda12.2`; (99, 0) when unreadable (treated as new)."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else (99, 0)


def transport_family(via: str) -> str:
    """P2P, SHM, NET, ... of a `via` string. Older releases name the SHM transport `direct shared
    memory` (NCCL 2.10.3 in pytorch/pytorch issue #72835), later ones `SHM/direct/direct`."""
    return "SHM" if via.startswith("direct shared memory") else via.split("/")[0]


def _needs_comm(text: str) -> bool:
    """A message that says something of one communicator (its channels, rings, transports)."""
    return (text.startswith("Connected all") or any(
        r.match(text) for r in (_RING, _NEIGHBOURS, _TRANSPORT, _TREES, _TREE_LINE, _CHANNELS,
                                _THRESH, _P2P_TYPE, _NETWORK, _NVLS_SUPPORT, _PATTERN,
                                _GRAPH_CHANNEL)))


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
        g["graphs"] = g.get("graphs") or c["graphs"]
        for key in ("nnodes", "nchannels", "coll_channels", "p2p_channels", "nvls_channels",
                    "collnet_channels", "nvls_multicast", "thread_thresholds", "p2p_type",
                    "network", "ring_pxn", "ring_gdr"):
            if g.get(key) is None:
                g[key] = c[key]
        g["connected_rings"] = g["connected_rings"] or c["connected_rings"]
        g["connected_trees"] = g["connected_trees"] or c["connected_trees"]
    return out


def _new_comm(key: str, nranks: int) -> dict[str, Any]:
    return {"comm_id": key, "nranks": nranks, "nnodes": None, "ranks": {}, "rings": {},
            "nchannels": None, "ring_neighbours": {}, "trees": {}, "transports": [],
            "peer_transport": {},
            "coll_channels": None, "p2p_channels": None, "nvls_channels": None,
            "collnet_channels": None, "nvls_multicast": None, "graphs": [], "ring_pxn": None,
            "ring_gdr": None,
            "thread_thresholds": None,
            "p2p_type": None, "network": None, "tuner": [], "connected_rings": False,
            "connected_trees": False, "attribution": "prefix"}


def summarize(choices: NcclParsed) -> str:
    """One line: version, ranks, channels, transports."""
    parts = [f"NCCL {choices.nccl_version or '?'}"]
    if choices.nranks:
        parts.append(f"{choices.nranks} ranks")
    if choices.nchannels:
        parts.append(f"{choices.nchannels} channels")
    if choices.rings:
        first = next(iter(choices.rings.values()))
        parts.append("ring " + " ".join(str(r) for r in first))
    if choices.transports:
        parts.append("via " + ", ".join(map(str, choices.transports)))
    parts.append(f"{len(choices.comms)} comms")
    if choices.warnings:
        parts.append(f"{len(choices.warnings)} WARN lines")
    if choices.p2p_disabled:
        parts.append(f"P2P disabled between {len(choices.p2p_disabled)} GPU pairs")
    for f in choices.failures:
        parts.append(f"failed: {f['what']}; fix: {f['fix']}")
    if choices.lines.get("spliced"):
        parts.append(f"{choices.lines['spliced']} spliced lines split")
    return "NCCL log: " + ", ".join(parts)

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
from dataclasses import dataclass, field
from typing import Any, Callable

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
#: An Init line wrapped inside its commId: `... commId 0x9d61c66c9945` then `bb3e - Init COMPLETE`
#: at column 0 on the next line (sgl-project/sglang issue #14382, a pasted pod log).
_INIT_CUT = re.compile(r" commId 0x[0-9a-fA-F]+$")
_INIT_TAIL = re.compile(r"[0-9a-fA-F]* ?- Init (?:START|COMPLETE)\s*$")
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
# Each channel's tree as far as it is whole: another process's output glued into the line cuts
# the last one (`[25] -1/-1/-All deep_gemm operations loaded successfully!`, sgl-project/sglang
# issue #11208), and the channels before it are kept.
_TREES = re.compile(r"^Trees((?: \[\d+\] [-\d/>|]+(?= \[|$))+)")
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


#: The messages found in one physical line: each level word with the prefix before it (None
#: for a message without one).
_Found = list[tuple[re.Match[str], dict[str, Any] | None]]


def _messages(text: str) -> tuple[list[dict[str, Any]], dict[str, int], list[str]]:
    """Split the stream into NCCL messages (with host, pid, tid, dev, level, text; the prefix
    fields None where the line has none)."""
    lines = clean_lines(text)
    msgs: list[dict[str, Any]] = []
    bare_versions: list[str] = []
    counts = {"total": len(lines), "nccl": 0, "spliced": 0, "without_prefix": 0}
    found_per_line, known_hosts = _anchors(lines)
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
            body = line[m.end():_message_end(line, found, k, known_hosts)].rstrip()
            if glued := _GLUED_VERSION.search(body):
                # The bare version line glued to a message by a paste that joined the lines
                # (vllm-project/vllm issue #12292: `cudaDriverVersion 12060 NCCL version 2.20.5`).
                bare_versions.append(glued.group(1))
                body = body[:glued.start()].rstrip()
            if k + 1 == len(found) and body.endswith(" via") and lineno < len(lines):
                body += " " + _wrapped_tail(lines[lineno], found_per_line[lineno])
            elif (k + 1 == len(found) and lineno < len(lines) and not found_per_line[lineno]
                  and _INIT_CUT.search(body) and (tail := _INIT_TAIL.match(lines[lineno]))):
                body += tail.group(0).rstrip()  # the commId's last digits on the next line
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


def _anchors(lines: list[str]) -> tuple[list[_Found], set[str]]:
    """Per line, the level words that start a message, with their prefixes; and the host names
    seen at line starts (to recover the host of a prefix glued to the line before it)."""
    found_per_line: list[_Found] = []
    known_hosts: set[str] = set()
    for line in lines:
        found: _Found = []
        lo = 0
        for m in _ANCHOR.finditer(line):
            pre = _find_prefix(line, lo, m.start())
            if pre is None and not (not found and _bare_start(line, m.start())):
                continue  # the words "NCCL INFO" inside a message, or in prose
            found.append((m, pre))
            lo = m.end()
        found_per_line.append(found)
        first = found[0][1] if found else None
        if first and first["host"] and not line[:first["start"]].strip():
            known_hosts.add(first["host"])
    return found_per_line, known_hosts


def _message_end(line: str, found: _Found, k: int, known_hosts: set[str]) -> int:
    """Where message `k` of `line` ends: at the next message's prefix (or level word), else at
    the end of the line."""
    if k + 1 == len(found):
        return len(line)
    nxt = found[k + 1][1]
    end: int = nxt["start"] if nxt else found[k + 1][0].start()
    if nxt and nxt["host"]:
        # The next prefix's host may be glued to this message's last word: cut it off.
        real = _recover_host(nxt["host"], known_hosts)
        if nxt["host"].endswith(real):
            end += len(nxt["host"]) - len(real)
    return end


def _wrapped_tail(nxt: str, found: _Found) -> str:
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


#: One message as `_messages` splits it: {line, host, pid, tid, dev, level, text, source, time,
#: spliced}, the prefix fields None where the line has none.
_Msg = dict[str, Any]
#: One communicator's entry (`_new_comm`; its fields are documented on `parse_nccl_log`).
_Comm = dict[str, Any]
#: Where a message waits for its communicator's line: (pid, dev), or ("anon",) without a prefix.
_WaitKey = tuple[Any, ...]
#: The process that printed a graph search: (host, pid, dev).
_Printer = tuple[Any, ...]


@dataclass
class _LogState:
    """What `parse_nccl_log` has read so far: the process-wide facts, the communicators and how
    messages are tied to them."""

    versions: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cuda_driver: str | None = None
    comms: dict[str, _Comm] = field(default_factory=dict)
    # (pid, comm pointer) -> comm key; pid None for lines without a prefix
    ptr_to_comm: dict[tuple[int | None, str], str] = field(default_factory=dict)
    context: dict[tuple[int, int], str] = field(default_factory=dict)  # (pid, dev) -> comm key
    pid_comms: dict[int, list[str]] = field(default_factory=dict)
    # Lines without the host:pid:tid prefix carry no process to tie them to a communicator:
    # they belong to the one the last such Init line named (a log pasted in order), else to
    # one `unattributed` communicator (a grep of transport lines).
    anon_key: str | None = None
    anon_rank: int | None = None
    # Releases 2.7-2.18 print a rank's channel, ring and transport lines before the only line
    # naming its communicator (`comm 0x.. rank R nranks N ... - Init COMPLETE`, no Init START):
    # such lines wait here, per process and device, until that line comes.
    pending: dict[_WaitKey, list[_Msg]] = field(default_factory=dict)
    warnings: list[dict[str, Any]] = field(default_factory=list)
    tuner: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    p2p_disabled: list[list[int]] = field(default_factory=list)
    # comm -> {(host, pid, dev): the graphs that process printed}
    graphs_by: dict[str, dict[_Printer, list[dict[str, Any]]]] = field(default_factory=dict)
    last_graph: dict[_Printer, dict[str, Any]] = field(default_factory=dict)  # its last Pattern

    def comm_of(self, msg: _Msg, create: bool = True) -> _Comm | None:
        """The communicator `msg` belongs to: by its process and device, or for a message
        without a prefix the last Init line's (`create`: else the `unattributed` one)."""
        if msg["pid"] is None:
            key = self.anon_key
            if key is None and create:
                key = "unattributed"
                self.comms.setdefault(key, _new_comm(key, 0))["attribution"] = "none"
            return self.comms.get(key) if key else None
        key = self.context.get((msg["pid"], msg["dev"]))
        if key is None and len(set(self.pid_comms.get(msg["pid"], []))) == 1:
            key = self.pid_comms[msg["pid"]][0]
        return self.comms.get(key) if key else None

    def rank_of(self, msg: _Msg, comm: _Comm | None) -> int | None:
        """The rank that printed `msg` in `comm`, where an Init line says it."""
        if comm is None:
            return None
        if msg["pid"] is None:
            return self.anon_rank if self.anon_key == comm["comm_id"] else None
        for r, info in comm["ranks"].items():
            if info["pid"] == msg["pid"] and info["cuda_dev"] == msg["dev"]:
                return int(r)
        return None


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
    st = _LogState(versions=list(dict.fromkeys(bare_versions)))
    for msg in msgs:
        _handle(st, msg)
    loose_prefixed = _attribute_leftovers(st)
    _keep_one_graph_search_per_host(st.comms, st.graphs_by)
    _drop_empty_unattributed(st.comms, loose_prefixed)
    comm_list = _merge_anonymous(list(st.comms.values()))
    eager = not st.versions or _release(st.versions[0]) < (2, 19)
    for c in comm_list:
        _finish_comm(c, eager, bool(st.versions))
    return _document(name, st, comm_list, counts)


def _handle(st: _LogState, msg: _Msg, force: str | None = None) -> None:
    """Read one message into `st`. A communicator's line whose communicator is not known yet
    waits in `st.pending`; `force` names the communicator such a line goes to when its own line
    never came (`_attribute_leftovers`)."""
    t = msg["text"]
    if (force is None and msg["level"] != "WARN" and _needs_comm(t)
            and st.comm_of(msg, create=False) is None):
        st.pending.setdefault(_waiting_key(msg), []).append(msg)
        return
    if msg["level"] == "WARN":
        _on_warning(st, msg)
    elif m := _P2P_DISABLED.match(t):
        _note_p2p_disabled(st.p2p_disabled, m)
    elif not _on_setting(st, t) and not _on_comm_init(st, msg):
        _on_comm_line(st, msg, force)


def _waiting_key(msg: _Msg) -> _WaitKey:
    return ("anon",) if msg["pid"] is None else (msg["pid"], msg["dev"])


def _replay(st: _LogState, key: _WaitKey) -> None:
    """Read the lines that waited for the communicator line of process/device `key`."""
    for waiting in st.pending.pop(key, []):
        _handle(st, waiting)


def _note_p2p_disabled(p2p_disabled: list[list[int]], m: re.Match[str]) -> None:
    """A `P2P is disabled between connected GPUs a and b` pair, once."""
    pair = sorted((int(m.group(2)), int(m.group(3))))
    if pair not in p2p_disabled:
        p2p_disabled.append(pair)


def _on_warning(st: _LogState, msg: _Msg) -> None:
    """A WARN line: kept as a warning, and named as a failure where it is one NCCL's users meet."""
    t = msg["text"]
    comm = st.comm_of(msg, create=False)
    st.warnings.append({"line": msg["line"], "host": msg["host"], "pid": msg["pid"],
                        "dev": msg["dev"], "rank": st.rank_of(msg, comm), "time": msg["time"],
                        "source": msg["source"], "text": t})
    if shm := _SHM_EXTEND.search(t) or _SHM_CREATE_FULL.search(t):
        _note_failure(st.failures, comm, msg, "shm_too_small", SHM_TOO_SMALL, SHM_FIX,
                      segment=shm.group(1), bytes=int(shm.group(2)), error=shm.group(3))
    elif ib := _IB_COMPLETION.search(t):
        status = int(ib.group(2))
        _note_failure(st.failures, comm, msg, "ib_completion_error", IB_COMPLETION,
                      IB_COMPLETION_FIX.get(status, IB_COMPLETION_FIX[0]), status=status,
                      status_name=IBV_WC_STATUS.get(status), vendor_err=int(ib.group(3)),
                      peer=ib.group(1))
    elif _PEER_ACCESS.search(t):
        _note_failure(st.failures, comm, msg, "peer_access_unsupported",
                      PEER_ACCESS_UNSUPPORTED, PEER_ACCESS_FIX)
    elif m := _P2P_DISABLED.search(t):
        _note_p2p_disabled(st.p2p_disabled, m)
        _note_failure(st.failures, comm, msg, "p2p_disabled_nvlink", P2P_DISABLED_NVLINK,
                      P2P_DISABLED_NVLINK_FIX)


def _on_setting(st: _LogState, t: str) -> bool:
    """The process-wide lines: NCCL's version, the CUDA driver's, `NCCL_* set by environment`.
    False for any other line."""
    if m := _VERSION.match(t):
        if m.group(1) not in st.versions:
            st.versions.append(m.group(1))
    elif m := _CUDA_DRIVER.match(t):
        st.cuda_driver = st.cuda_driver or m.group(1)
    elif m := _ENV.match(t):
        st.env.setdefault(m.group(1), m.group(2).rstrip().removesuffix("."))
    else:
        return False
    return True


def _on_comm_init(st: _LogState, msg: _Msg) -> bool:
    """The lines that name a communicator (`ncclCommInitRank ... Init START`, `comm 0x.. rank R
    nRanks N nNodes K ...`); False for any other line."""
    if m := _INIT.match(msg["text"]):
        _on_init(st, msg, m)
    elif m := _COMM.match(msg["text"]):
        _on_comm_summary(st, msg, m)
    else:
        return False
    return True


def _tie_process(st: _LogState, key: str, pid: int, dev: int) -> None:
    """From now on, what process `pid` prints from CUDA device `dev` is of communicator `key`."""
    st.context[(pid, dev)] = key
    st.pid_comms.setdefault(pid, []).append(key)


def _on_init(st: _LogState, msg: _Msg, m: re.Match[str]) -> None:
    """`ncclCommInitRank comm 0x.. rank R nranks N cudaDev C ... - Init START|COMPLETE`: the
    communicator, this process's rank in it, and the lines that waited for it."""
    _fn, ptr, rank, nranks, cdev, ndev, bus, cid, split_count, color, phase = m.groups()
    known = st.ptr_to_comm.get((msg["pid"], ptr))
    split = f"split:{color}:{split_count}" if color is not None else None
    # A split communicator is named by its color on every rank (the same on all its
    # members, NCCL's ncclCommSplit contract); its pointer keeps that name.
    key = ((known if known and known.startswith("split:") else None) or cid or known
           or split or f"comm:{msg['pid']}:{ptr}")
    st.ptr_to_comm[(msg["pid"], ptr)] = key
    comm = st.comms.setdefault(key, _new_comm(key, int(nranks)))
    comm["ranks"].setdefault(rank, {"pid": msg["pid"], "host": msg["host"],
                                    "cuda_dev": int(cdev), "nvml_dev":
                                    int(ndev) if ndev else None, "bus_id": bus,
                                    "comm": ptr, "local_rank": None, "init": None})
    if phase:
        comm["ranks"][rank]["init"] = phase
    if msg["pid"] is None:
        comm["attribution"] = "order"
        st.anon_key, st.anon_rank = key, int(rank)
    else:
        _tie_process(st, key, msg["pid"], int(cdev))
    _replay(st, _waiting_key({"pid": msg["pid"], "dev": int(cdev)}))


def _on_comm_summary(st: _LogState, msg: _Msg, m: re.Match[str]) -> None:
    """`comm 0x.. rank R nRanks N nNodes K localRanks L localRank l`: the node count and local
    rank; old logs print it before (or without) an Init line, so it may name the communicator."""
    ptr, rank, nranks, nnodes, _lr, local_rank = m.groups()
    key = st.ptr_to_comm.get((msg["pid"], ptr))
    if key is None:
        key = f"comm:{msg['pid']}:{ptr}"
        st.ptr_to_comm[(msg["pid"], ptr)] = key
        st.comms.setdefault(key, _new_comm(key, int(nranks)))
        st.comms[key]["ranks"].setdefault(rank, {"pid": msg["pid"], "host": msg["host"],
                                                 "cuda_dev": msg["dev"], "nvml_dev": None,
                                                 "bus_id": None, "comm": ptr,
                                                 "local_rank": None, "init": None})
        if msg["pid"] is None:
            st.comms[key]["attribution"] = "order"
        else:
            _tie_process(st, key, msg["pid"], msg["dev"])
    if msg["pid"] is None:
        st.anon_key, st.anon_rank = key, int(rank)
    comm = st.comms[key]
    comm["nnodes"] = int(nnodes)
    if rank in comm["ranks"]:
        comm["ranks"][rank]["local_rank"] = int(local_rank)
    _replay(st, _waiting_key(msg))


def _on_comm_line(st: _LogState, msg: _Msg, force: str | None) -> None:
    """A line about one communicator: its rings, trees, transports, channel counts, graph
    search, settings, tuner choices. A line whose communicator is unknown is skipped (tuner
    choices still count for the log)."""
    t = msg["text"]

    def comm_of_msg() -> _Comm | None:
        return st.comms[force] if force is not None else st.comm_of(msg)

    if (m := _RING.match(t)) and (comm := comm_of_msg()) is not None:
        _add_ring(comm, m)
    elif (m := _NEIGHBOURS.match(t)) and (comm := comm_of_msg()) is not None:
        ch, prev, me, nxt = m.groups()
        comm["ring_neighbours"].setdefault(me, {})[str(int(ch))] = [int(prev), int(nxt)]
    elif (m := _TRANSPORT.match(t)) and (comm := comm_of_msg()) is not None:
        _add_transport(comm, m, st.rank_of(msg, comm))
    elif (m := _TREES.match(t)) and (comm := comm_of_msg()) is not None:
        _add_trees(comm, m, st.rank_of(msg, comm))
    elif (m := _TREE_LINE.match(t)) and (comm := comm_of_msg()) is not None:
        ch, up, me, down = m.groups()
        comm["trees"].setdefault(me, {})[str(int(ch))] = f"{down}->{me}->{up}"
    elif (m := _CHANNELS.match(t)) and (comm := comm_of_msg()) is not None:
        _set_channel_counts(comm, m)
    elif (m := _PATTERN.match(t)) and (comm := comm_of_msg()) is not None:
        _add_graph(st, comm, msg, m)
    elif (m := _GRAPH_CHANNEL.match(t)) and comm_of_msg() is not None:
        _add_graph_channel(st.last_graph, msg, m)
    elif not _on_comm_setting(t, comm_of_msg) and not _on_tuner(st, t, comm_of_msg):
        _on_connected(t, comm_of_msg)


def _on_comm_setting(t: str, comm_of_msg: Callable[[], _Comm | None]) -> bool:
    """One value of the communicator: NVLS support, thread thresholds, P2P type, network plugin.
    False when `t` is none of those or its communicator is unknown."""
    if (m := _NVLS_SUPPORT.match(t)) and (comm := comm_of_msg()) is not None:
        comm["nvls_multicast"] = m.group(1) is None
    elif (m := _THRESH.match(t)) and (comm := comm_of_msg()) is not None:
        comm["thread_thresholds"] = m.group(1)
    elif (m := _P2P_TYPE.match(t)) and (comm := comm_of_msg()) is not None:
        comm["p2p_type"] = m.group(1)
    elif (m := _NETWORK.match(t)) and (comm := comm_of_msg()) is not None:
        comm["network"] = m.group(1)
    else:
        return False
    return True


def _on_tuner(st: _LogState, t: str, comm_of_msg: Callable[[], _Comm | None]) -> bool:
    """A tuner choice (`AllReduce: 4096 Bytes -> Algo RING proto LL ...`, the older `4096 Bytes
    -> Algo 1 proto 2 time 12.3`): kept for the log, and for its communicator where known."""
    if m := _TUNER.match(t):
        choice = {"coll": m.group(1), "bytes": int(m.group(2)), "algo": m.group(3),
                  "proto": m.group(4),
                  "channels": [int(m.group(5)), int(m.group(6))] if m.group(5) else None,
                  "time_us": float(m.group(7)) if m.group(7) else None}
    elif m := _TUNER_OLD.match(t):
        choice = {"coll": None, "bytes": int(m.group(1)), "algo": m.group(2),
                  "proto": m.group(3), "channels": None, "time_us": float(m.group(4))}
    else:
        return False
    st.tuner.append(choice)
    if (comm := comm_of_msg()) is not None:
        comm["tuner"].append(choice)
    return True


def _on_connected(t: str, comm_of_msg: Callable[[], _Comm | None]) -> None:
    """`Connected all rings[, use ring PXN p GDR g]`, `Connected all trees`."""
    if t.startswith("Connected all rings") and (comm := comm_of_msg()) is not None:
        comm["connected_rings"] = True
        if ring := _RING_NET.search(t):
            comm["ring_pxn"], comm["ring_gdr"] = ring.group(1) == "1", ring.group(2) == "1"
    elif t.startswith("Connected all trees") and (comm := comm_of_msg()) is not None:
        comm["connected_trees"] = True


def _add_ring(comm: _Comm, m: re.Match[str]) -> None:
    """`Channel 00/02 : 0 1 2 3` (older `Ring 00 : 0 1 2 3`): the ring's order, the first seen
    per channel; `/N` is the channel count."""
    ch, total, order = m.groups()
    comm["rings"].setdefault(str(int(ch)), [int(x) for x in order.split()])
    if total:
        comm["nchannels"] = int(total)


def _add_transport(comm: _Comm, m: re.Match[str], reported_by: int | None) -> None:
    """`Channel 00/0 : 0[1] -> 1[2] via P2P/CUMEM`: one transport entry (once) and the first
    `via` per peer pair."""
    ch, src, sdev, dst, ddev, direction, via = m.groups()
    entry = {"channel": int(ch), "src": int(src), "dst": int(dst), "src_dev": sdev,
             "dst_dev": ddev, "via": via, "family": transport_family(via),
             "direction": direction, "reported_by": reported_by,
             "pxn_rank": int(px.group(1)) if (px := _PXN.match(via)) else None}
    if entry not in comm["transports"]:
        comm["transports"].append(entry)
    comm["peer_transport"].setdefault(f"{int(src)}->{int(dst)}", via)


def _add_trees(comm: _Comm, m: re.Match[str], rank: int | None) -> None:
    """`Trees [0] 1/-1/-1->0->-1 [1] ...`: the trees of `rank` per channel."""
    trees = {str(int(c)): spec for c, spec in _TREE_ITEM.findall(m.group(1))}
    if rank is None:  # no Init line names the process: the tree says (`up->R->down`)
        me = re.search(r"->(\d+)->", next(iter(trees.values()), ""))
        rank = int(me.group(1)) if me else None
    comm["trees"].setdefault(str(rank) if rank is not None else "?", trees)


def _set_channel_counts(comm: _Comm, m: re.Match[str]) -> None:
    """`2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, ...`."""
    comm["coll_channels"] = int(m.group(1))
    for kind in ("p2p", "nvls", "collnet"):
        if p := re.search(rf"(\d+) {kind} channels(?! per)", m.group(2)):
            comm[f"{kind}_channels"] = int(p.group(1))


def _add_graph(st: _LogState, comm: _Comm, msg: _Msg, m: re.Match[str]) -> None:
    """`Pattern 4, crossNic 0, nChannels 2, bw 24.0/24.0, type NVL/PIX, sameChannels 1`: one
    graph search result, kept per printing process (its channel lines follow)."""
    pat = m.group(1)
    graph = {"pattern": int(pat) if pat.isdigit() else pat,
             "pattern_name": PATTERNS.get(int(pat), "unknown") if pat.isdigit()
             else pat.lower(), "crossnic": int(m.group(2)),
             "nchannels": int(m.group(3)), "bw_intra": float(m.group(4)),
             "bw_inter": float(m.group(5)), "type_intra": m.group(6),
             "type_inter": m.group(7), "same_channels": int(m.group(8)),
             "channels": [], "host": msg["host"], "reported_by": st.rank_of(msg, comm)}
    who = (msg["host"], msg["pid"], msg["dev"])
    st.graphs_by.setdefault(comm["comm_id"], {}).setdefault(who, []).append(graph)
    st.last_graph[who] = graph


def _add_graph_channel(last_graph: dict[_Printer, dict[str, Any]], msg: _Msg,
                       m: re.Match[str]) -> None:
    """`  0 : NET/0 GPU/0 GPU/1 NET/0`: the next channel of the process's last `Pattern`."""
    shown = last_graph.get((msg["host"], msg["pid"], msg["dev"]))
    if shown is not None and int(m.group(1)) == len(shown["channels"]):
        shown["channels"].append(m.group(2).split())


def _attribute_leftovers(st: _LogState) -> bool:
    """Read the lines whose communicator line never came (an excerpt, a log cut short): into
    the one communicator when all seen are one (old logs' per-process entries of one size),
    else into the `unattributed` one, as a grep of transport lines. True when some of them had
    a process prefix."""
    named = [k for k in st.comms if k != "unattributed"]
    one = len(named) == 1 or (len({st.comms[k]["nranks"] for k in named}) == 1
                              and all(k.startswith("comm:") for k in named))
    only = named[0] if named and one else None
    loose_prefixed = any(key != ("anon",) for key in st.pending)
    for key in list(st.pending):
        for waiting in st.pending.pop(key):
            if only is None:
                st.comms.setdefault("unattributed", _new_comm("unattributed", 0))[
                    "attribution"] = "none"
            _handle(st, waiting, force=only or "unattributed")
    return loose_prefixed


def _keep_one_graph_search_per_host(comms: dict[str, _Comm],
                                    graphs_by: dict[str, dict[_Printer, list[dict[str, Any]]]]
                                    ) -> None:
    """Every rank of a node prints the same search (its node's GPUs, by rank): per host, keep
    the process that printed the most of it (an excerpt cuts the others)."""
    for comm_key, by in graphs_by.items():
        best: dict[Any, list[dict[str, Any]]] = {}
        for (host, _pid, _dev), graphs in by.items():
            if len(graphs) > len(best.get(host, [])):
                best[host] = graphs
        comms[comm_key]["graphs"] = [g for graphs in best.values() for g in graphs]


def _drop_empty_unattributed(comms: dict[str, _Comm], loose_prefixed: bool) -> None:
    """Drop the `unattributed` communicator when only settings lines came without a prefix:
    nothing to keep. What processes whose Init line is not in the excerpt printed (channel
    counts, the network: NVIDIA/nccl issue #1646, NVIDIA/nccl-tests issue #228) stays."""
    loose = comms.get("unattributed")
    settings = ("coll_channels", "network", "thread_thresholds", "p2p_type", "nvls_multicast")
    if loose is not None and not (
            loose["rings"] or loose["transports"] or loose["trees"] or loose["tuner"]
            or loose["ring_neighbours"] or loose["graphs"]
            or (loose_prefixed and any(loose[k] is not None for k in settings))):
        del comms["unattributed"]


def _finish_comm(c: _Comm, eager: bool, has_versions: bool) -> None:
    """Put one communicator in its final form: sorted, its channel count and `connected_rings`
    filled in where the lines imply them (`eager`: a release that connects inside init)."""
    if c["comm_id"] == "unattributed":
        c["comm_id"] = None
        c["nranks"] = _ranks_seen(c)
    c["ranks"] = dict(sorted(c["ranks"].items(), key=lambda kv: int(kv[0])))
    c["rings"] = dict(sorted(c["rings"].items(), key=lambda kv: int(kv[0])))
    c["transports"].sort(key=lambda e: (e["channel"], e["src"], e["dst"]))
    c["peer_transport"] = dict(sorted(c["peer_transport"].items()))
    if c["nchannels"] is None:
        # Ring lines without `/N` (older releases): NCCL's own count, else one ring per channel.
        c["nchannels"] = c["coll_channels"] or (len(c["rings"]) or None)
    if (not c["connected_rings"] and c["transports"] and eager
            and (has_versions or c["comm_id"] is None)
            and any(r["init"] == "COMPLETE" for r in c["ranks"].values())):
        # The releases this is about (2.7-2.18) connect every channel inside init, before
        # Init COMPLETE, and not all print "Connected all rings". Newer ones may connect at
        # the first collective (NCCL_RUNTIME_CONNECT): there only their own line counts.
        c["connected_rings"] = True


def _ranks_seen(c: _Comm) -> int:
    """The size of a communicator no Init line names: the highest rank its lines show + 1."""
    seen = [r for ring in c["rings"].values() for r in ring]
    seen += [x for e in c["transports"] for x in (e["src"], e["dst"])]
    seen += [int(r) for spec in c["trees"].values() for tree in spec.values()
             for r in re.findall(r"-?\d+", tree) if r != "-1"]
    return max(seen) + 1 if seen else 0


def _document(name: str, st: _LogState, comm_list: list[_Comm],
              counts: dict[str, int]) -> NcclParsed:
    """The parse result: the log's facts, with the main communicator's (the first with the most
    ranks) rings and transports at the top level."""
    main = max(comm_list, key=lambda c: c["nranks"], default=None)
    vias = sorted({e["via"] for e in main["transports"]}) if main else []
    families = sorted({transport_family(v) for v in vias})
    versions = st.versions
    return NcclParsed(
        source=name, nccl_version=versions[0] if versions else None, nccl_versions=versions,
        cuda_driver_version=st.cuda_driver, env=st.env,
        nranks=main["nranks"] if main else None, nchannels=main["nchannels"] if main else None,
        rings={str(k): list(v) for k, v in main["rings"].items()} if main else {},
        peer_transport=dict(main["peer_transport"]) if main else {},
        transports=list(vias), transport_families=families,
        comms=[decode(NcclComm, c, name) for c in comm_list], tuner=st.tuner,
        warnings=list(st.warnings), failures=st.failures, p2p_disabled=sorted(st.p2p_disabled),
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

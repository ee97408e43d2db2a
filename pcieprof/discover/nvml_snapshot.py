"""NVML snapshots: record every NVML answer discovery needs on a real box, replay it anywhere.

A snapshot is JSON: `{"format": "pcieprof-nvml-snapshot", "version": 1, "recorded": {...},
"init": {"ok": true} | {"error": <nvmlReturn_t>}, "calls": {"<fn>(<args>)": answer}}` where an
answer is `{"value": ...}`, `{"error": <nvmlReturn_t code>}` (replayed as that pynvml error) or
`{"unknown": "<why>"}` (replayed as SnapshotMissing -> status `unknown`). Device handles appear as
`gpu<i>` in the keys; ctypes structures as `{"_struct": name, field: value}`.

Command line (what a user with a real GPU box runs, and how the committed fixture was built):
    python -m pcieprof.discover.nvml_snapshot record FILE
    python -m pcieprof.discover.nvml_snapshot from-logs --smi-q F --topo-m F OUT
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import sys
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pcieprof.discover.nvml import (
    NO_DRIVER_HINT,
    P2P_CAPS,
    TOPOLOGY_LEVELS,
    VIRTUALIZATION_MODES,
    Nvml,
    SnapshotMissing,
    collect,
    cpu_words,
)
from pcieprof.discover.smi_query import parse_smi_query
from pcieprof.discover.topo_matrix import parse_topo_matrix
from pcieprof.errors import BadInput

FORMAT = "pcieprof-nvml-snapshot"
VERSION = 1
_UNKEYED_ARGS = {"nvmlDeviceGetCpuAffinity": 1}  # cpuSetSize depends on the caller, not the GPU


class _Handle:
    """A device handle in a replay (or a recording): just the NVML index."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"gpu{self.index}"


def _key(fn: str, args: tuple[Any, ...], handle_index: dict[int, int]) -> str:
    keep = args[:_UNKEYED_ARGS[fn]] if fn in _UNKEYED_ARGS else args
    parts = []
    for a in keep:
        if isinstance(a, _Handle):
            parts.append(repr(a))
        elif id(a) in handle_index:
            parts.append(f"gpu{handle_index[id(a)]}")
        else:
            parts.append(json.dumps(a))
    return f"{fn}({','.join(parts)})"


def _to_json(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, ctypes.Array):
        return [_to_json(x) for x in v]
    if isinstance(v, ctypes.Structure):
        d: dict[str, Any] = {"_struct": type(v).__name__}
        for name, *_ in v._fields_:
            d[name] = _to_json(getattr(v, name))
        return d
    if isinstance(v, SimpleNamespace):
        return {k: _to_json(x) for k, x in vars(v).items()}
    if isinstance(v, (list, tuple)):
        return [_to_json(x) for x in v]
    return repr(v)


def _from_json(v: Any) -> Any:
    if isinstance(v, dict):
        return SimpleNamespace(**{k: _from_json(x) for k, x in v.items()})
    return v


class _Recorder:
    """Proxy in front of pynvml that writes every nvml* call and its answer into `calls`."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self.calls: dict[str, Any] = {}
        self.init: dict[str, Any] = {"ok": True}
        self._handle_index: dict[int, int] = {}
        self._keep: list[Any] = []  # keep handles alive so their id() stays unique

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._lib, name, None)
        if target is None and name.startswith("nvml"):
            def absent(*args: Any) -> Any:
                # this pynvml lacks the function: replay it as NVML_ERROR_FUNCTION_NOT_FOUND
                self.calls[_key(name, args, self._handle_index)] = {"error": 13}
                raise AttributeError(name)

            return absent
        if target is None:
            raise AttributeError(name)
        if not (callable(target) and name.startswith("nvml")):
            return target

        def call(*args: Any) -> Any:
            key = _key(name, args, self._handle_index)
            try:
                value = target(*args)
            except Exception as e:
                code = getattr(e, "value", None)
                answer = ({"error": code} if isinstance(code, int)
                          else {"unknown": f"{type(e).__name__}: {e}"})
                if name == "nvmlInit":
                    self.init = answer
                else:
                    self.calls[key] = answer
                raise
            if name == "nvmlDeviceGetHandleByIndex":
                self._handle_index[id(value)] = int(args[0])
                self._keep.append(value)
                self.calls[key] = {"value": {"handle": int(args[0])}}
            elif name not in ("nvmlInit", "nvmlShutdown"):
                self.calls[key] = {"value": _to_json(value)}
            return value

        return call


def record_snapshot(nvml: Any = None) -> dict[str, Any]:
    """Record the NVML answers discovery uses, on this machine.

    Args:
        nvml: an `Nvml` wrapper, or a pynvml-like library; default: the installed pynvml.

    Returns:
        The snapshot dict (see the module docstring); `init` holds the error code when NVML does
        not start, so even a failed recording says why.
    """
    lib = nvml.lib if isinstance(nvml, Nvml) else nvml
    if lib is None:
        import pynvml  # heavy: pynvml (the NVIDIA driver library)

        lib = pynvml
    rec = _Recorder(lib)
    wrapper = Nvml(rec)
    collect(wrapper)
    wrapper.shutdown()
    try:
        pyver: str | None = version("nvidia-ml-py")
    except Exception:  # noqa: BLE001 - provenance only
        pyver = None
    return {"format": FORMAT, "version": VERSION,
            "recorded": {"how": "record", "host": platform.node(), "pynvml": pyver},
            "init": rec.init, "calls": rec.calls}


def _nvml_error(code: int) -> Exception:
    try:
        import pynvml  # heavy: pynvml (the NVIDIA driver library)

        err: Exception = pynvml.NVMLError(code)
        return err
    except ImportError:
        e = RuntimeError(f"NVML error {code}")
        e.value = code  # type: ignore[attr-defined]
        return e


class NvmlReplay:
    """A pynvml stand-in answering from a snapshot (same function names and shapes).

    Args:
        snapshot: the snapshot dict, or a path to its JSON file.
    """

    def __init__(self, snapshot: dict[str, Any] | str | Path) -> None:
        if not isinstance(snapshot, dict):
            path = Path(snapshot)
            try:
                loaded: dict[str, Any] = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise BadInput(f"{path}: cannot read NVML snapshot: {e}") from e
            snapshot = loaded
        if snapshot.get("format") != FORMAT:
            raise BadInput(f"not an NVML snapshot (format {snapshot.get('format')!r})",
                           hint=f"expected format {FORMAT!r}")
        self.snapshot = snapshot
        self._calls: dict[str, Any] = snapshot.get("calls", {})

    def _answer(self, fn: str, args: tuple[Any, ...]) -> Any:
        key = _key(fn, args, {})
        ans = self._calls.get(key)
        if ans is None:
            raise SnapshotMissing(f"{key} not in snapshot")
        if "error" in ans:
            raise _nvml_error(int(ans["error"]))
        if "unknown" in ans:
            raise SnapshotMissing(ans["unknown"])
        return ans["value"]

    def nvmlInit(self) -> None:
        init = self.snapshot.get("init", {"ok": True})
        if "error" in init:
            raise _nvml_error(int(init["error"]))

    def nvmlShutdown(self) -> None:
        return None

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._answer("nvmlDeviceGetHandleByIndex", (index,))
        return _Handle(int(index))

    def nvmlDeviceGetCpuAffinity(self, handle: _Handle, cpu_set_size: int) -> list[int]:
        words = list(self._answer("nvmlDeviceGetCpuAffinity", (handle,)))
        return (words + [0] * cpu_set_size)[:cpu_set_size]

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("nvml"):
            raise AttributeError(name)

        def call(*args: Any) -> Any:
            return _from_json(self._answer(name, args))

        return call


# --- building a snapshot from the text logs of a real machine --------------------------------

_LEVEL_CODES = {v: k for k, v in TOPOLOGY_LEVELS.items()}
_VIRT_CODES = {v: k for k, v in VIRTUALIZATION_MODES.items()}
_NOT_IN_LOGS = "not in the source logs"


def snapshot_from_logs(smi_q: str, topo_m: str, *, smi_q_name: str = "nvidia-smi -q",
                       topo_m_name: str = "nvidia-smi topo -m") -> dict[str, Any]:
    """A snapshot holding what `nvidia-smi -q` and `nvidia-smi topo -m` texts say NVML answered.

    Only answers the logs contain are filled; the rest (NVML version, P2P status, ...) are
    recorded as `unknown` rather than invented. See tests/data/nvml_snapshot_rtxpro6000_8x/NOTE.md.
    """
    q = parse_smi_query(smi_q, source=smi_q_name)
    t = parse_topo_matrix(topo_m, source=topo_m_name)
    if t["gpus"] != len(q["gpus"]):
        raise BadInput(f"{topo_m_name} has {t['gpus']} GPUs but {smi_q_name} has "
                       f"{len(q['gpus'])}", hint="both logs must come from the same machine")
    calls: dict[str, Any] = {}

    def put(key: str, value: Any) -> None:
        calls[key] = {"unknown": _NOT_IN_LOGS} if value is None else {"value": value}

    put("nvmlSystemGetDriverVersion()", q["driver_version"])
    cuda = None
    if q["cuda_version"]:
        major, _, minor = q["cuda_version"].partition(".")
        cuda = int(major) * 1000 + int(minor or 0) * 10  # CUDA_VERSION encoding: 13.2 -> 13020
    put("nvmlSystemGetCudaDriverVersion_v2()", cuda)
    put("nvmlSystemGetCudaDriverVersion()", cuda)
    put("nvmlSystemGetNVMLVersion()", None)
    put("nvmlDeviceGetCount()", q["attached_gpus"] or len(q["gpus"]))
    for g in q["gpus"]:
        i, pcie, h = g["index"], g["pcie"], f"gpu{g['index']}"
        put(f"nvmlDeviceGetHandleByIndex({i})", {"handle": i})
        put(f"nvmlDeviceGetName({h})", g["name"])
        put(f"nvmlDeviceGetUUID({h})", g["uuid"])
        dom, bus, rest = g["bus_id"].split(":")
        put(f"nvmlDeviceGetPciInfo_v3({h})", {
            "_struct": "nvmlPciInfo_t", "busId": f"{int(dom, 16):08X}:{bus.upper()}:{rest.upper()}",
            "domain": int(dom, 16), "bus": int(bus, 16), "device": int(rest.split(".")[0], 16),
            "pciDeviceId": int(g["pci_device_id"], 16) if g["pci_device_id"] else None,
            "pciSubSystemId": int(g["pci_subsystem_id"], 16) if g["pci_subsystem_id"] else None})
        put(f"nvmlDeviceGetCurrPcieLinkGeneration({h})", pcie["gen_current"])
        put(f"nvmlDeviceGetMaxPcieLinkGeneration({h})", pcie["gen_max"])
        put(f"nvmlDeviceGetGpuMaxPcieLinkGeneration({h})", pcie["gen_max_device"])
        put(f"nvmlDeviceGetCurrPcieLinkWidth({h})", pcie["width_current"])
        put(f"nvmlDeviceGetMaxPcieLinkWidth({h})", pcie["width_max"])
        if g["bar1_bytes"] is not None:
            used = g["bar1_used_bytes"] or 0
            put(f"nvmlDeviceGetBAR1MemoryInfo({h})", {
                "_struct": "c_nvmlBAR1Memory_t", "bar1Total": g["bar1_bytes"],
                "bar1Used": used, "bar1Free": g["bar1_bytes"] - used})
        else:
            put(f"nvmlDeviceGetBAR1MemoryInfo({h})", None)
        if g["memory_bytes"] is not None:
            used = g["memory_used_bytes"] or 0
            reserved = g["memory_reserved_bytes"] or 0
            put(f"nvmlDeviceGetMemoryInfo({h})", {
                "_struct": "c_nvmlMemory_t", "total": g["memory_bytes"], "used": used,
                "free": g["memory_bytes"] - used - reserved})
        else:
            put(f"nvmlDeviceGetMemoryInfo({h})", None)
        # topo -m prints N/A in "GPU NUMA ID" when nvmlDeviceGetNumaNodeId is not supported
        numa_id = t["gpu_numa_id"].get(i)
        calls[f"nvmlDeviceGetNumaNodeId({h})"] = ({"value": numa_id} if numa_id is not None
                                                  else {"error": 3})  # NVML_ERROR_NOT_SUPPORTED
        aff = t["cpu_affinity"].get(i)
        put(f"nvmlDeviceGetCpuAffinity({h})", cpu_words(aff, 16) if aff else None)
        vm = g["virtualization_mode"]
        put(f"nvmlDeviceGetVirtualizationMode({h})", _VIRT_CODES.get(vm) if vm else None)
    for p in t["pairs"]:
        a, b = f"gpu{p['a']}", f"gpu{p['b']}"
        put(f"nvmlDeviceGetTopologyCommonAncestor({a},{b})", _LEVEL_CODES.get(p["level"]))
        for cap, idx in P2P_CAPS.items():
            put(f"nvmlDeviceGetP2PStatus({a},{b},{idx})",
                _nvlink_code(p["level"], t["view"]) if cap == "nvlink" else None)
    return {"format": FORMAT, "version": VERSION,
            "recorded": {"how": "from-logs", "smi_q": smi_q_name, "topo_m": topo_m_name},
            "init": {"ok": True}, "calls": calls}


def _nvlink_code(level: str | None, view: str) -> int | None:
    """The NVLink P2P status of a pair as topo -m shows it: NVML_P2P_STATUS_OK (0) for NV#,
    NVML_P2P_STATUS_NOT_SUPPORTED (5, assumed: the code NVML gives a pair without NVLink) for a
    PCIe level; None (unknown) where the view hides NVLink (topo -mp) or the level is unknown."""
    if view != "full" or level is None:
        return None
    return 0 if level.startswith("NV") else 5


def main(argv: list[str] | None = None) -> int:
    """`python -m pcieprof.discover.nvml_snapshot record FILE | from-logs ... OUT`."""
    ap = argparse.ArgumentParser(prog="python -m pcieprof.discover.nvml_snapshot",
                                 description="Record or build an NVML snapshot for replay.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="record this machine's NVML answers")
    rec.add_argument("file", type=Path)
    fl = sub.add_parser("from-logs", help="build a snapshot from nvidia-smi -q and topo -m logs")
    fl.add_argument("--smi-q", type=Path, required=True)
    fl.add_argument("--topo-m", type=Path, required=True)
    fl.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "record":
            snap = record_snapshot()
            out = args.file
            if "error" in snap["init"]:
                print(f"error: NVML did not start (nvmlReturn_t {snap['init']['error']}): "
                      f"{NO_DRIVER_HINT}", file=sys.stderr)
                return 3  # ExitCode.ENVIRONMENT
        else:
            snap = snapshot_from_logs(args.smi_q.read_text(errors="replace"),
                                      args.topo_m.read_text(errors="replace"),
                                      smi_q_name=args.smi_q.name, topo_m_name=args.topo_m.name)
            out = args.out
    except BadInput as e:
        print(f"error: {e.one_line()}", file=sys.stderr)
        return int(e.exit_code)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(snap, indent=1, sort_keys=True) + "\n")
    print(f"{out}: {len(snap['calls'])} NVML answers")
    return 0


if __name__ == "__main__":
    sys.exit(main())

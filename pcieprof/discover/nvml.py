"""The one door to NVML: every call returns a value or a recorded status, never raises.

In the spirit of nvitop's `libnvml`: "not supported / not found / no permission" and a missing
function become data (`Missing(status)`) that lands in topology.json's `status` maps. The library
behind the door is `pynvml` (nvidia-ml-py) on a live machine or an `NvmlReplay` of a recorded
snapshot (`pcieprof.discover.nvml_snapshot`) in tests and on machines without a GPU.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from pcieprof.discover.pci import normalize_bdf

#: One-line hint shown when NVML cannot start.
NO_DRIVER_HINT = "is the NVIDIA driver installed? use --backend cpu"

# NVML error codes (nvml.h nvmlReturn_t; the same numbers as pynvml.NVML_ERROR_*).
_NOT_SUPPORTED, _NO_PERMISSION, _NOT_FOUND = 3, 4, 6
_DRIVER_NOT_LOADED, _LIBRARY_NOT_FOUND, _FUNCTION_NOT_FOUND = 9, 12, 13

#: nvmlGpuTopologyLevel_t -> the level names `nvidia-smi topo -m` prints.
TOPOLOGY_LEVELS: dict[int, str] = {
    0: "X",      # NVML_TOPOLOGY_INTERNAL (same board)
    10: "PIX",   # NVML_TOPOLOGY_SINGLE: at most one PCIe bridge
    20: "PXB",   # NVML_TOPOLOGY_MULTIPLE: several bridges, no host bridge
    30: "PHB",   # NVML_TOPOLOGY_HOSTBRIDGE
    40: "NODE",  # NVML_TOPOLOGY_NODE (== NVML_TOPOLOGY_CPU): host bridges within a NUMA node
    50: "SYS",   # NVML_TOPOLOGY_SYSTEM: across NUMA nodes (SMP interconnect)
}

#: nvmlGpuP2PStatus_t -> the codes `nvidia-smi topo -p2p` prints.
P2P_STATUS: dict[int, str] = {
    0: "OK",   # NVML_P2P_STATUS_OK
    1: "CNS",  # NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED
    2: "GNS",  # NVML_P2P_STATUS_GPU_NOT_SUPPORTED
    3: "TNS",  # NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED
    4: "DR",   # NVML_P2P_STATUS_DISABLED_BY_REGKEY
    5: "NS",   # NVML_P2P_STATUS_NOT_SUPPORTED
    6: "U",    # NVML_P2P_STATUS_UNKNOWN
}

#: nvmlGpuVirtualizationMode_t -> topology.json names.
VIRTUALIZATION_MODES: dict[int, str] = {
    0: "bare_metal",   # NVML_GPU_VIRTUALIZATION_MODE_NONE
    1: "passthrough",  # NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH
    2: "vgpu",         # NVML_GPU_VIRTUALIZATION_MODE_VGPU (a vGPU inside a VM)
    3: "host_vgpu",    # NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU (hypervisor side)
    4: "host_vsga",    # NVML_GPU_VIRTUALIZATION_MODE_HOST_VSGA
}


class SnapshotMissing(Exception):
    """Raised by a replayed snapshot for a call it holds no answer to (status `unknown`)."""


@dataclass(frozen=True)
class Missing:
    """The answer of a call that did not give a value: `status` says why."""

    status: str

    def __bool__(self) -> bool:
        return False


def _p2p_index(name: str, default: int) -> int:
    """An NVML_P2P_CAPS_INDEX_* constant as an int.

    nvidia-ml-py 13.x defines `NVML_P2P_CAPS_INDEX_READ = 0,` (a one-element tuple, a stray
    comma); NVML needs the integer.
    """
    try:
        import pynvml  # heavy: pynvml (the NVIDIA driver library, absent on many machines)

        value = getattr(pynvml, name, default)
    except ImportError:
        value = default
    if isinstance(value, tuple):
        value = value[0]
    return int(value)


#: `nvlink`: whether the pair is joined by NVLink, the question SGLang's own is_full_nvlink
#: asks (sglang 0.5.23 srt/distributed/device_communicators/custom_all_reduce_utils.py); the
#: common-ancestor level is a PCIe path and does not tell (pcieprof.analysis.box.fabric_of).
P2P_CAPS = {"read": _p2p_index("NVML_P2P_CAPS_INDEX_READ", 0),
            "write": _p2p_index("NVML_P2P_CAPS_INDEX_WRITE", 1),
            "nvlink": _p2p_index("NVML_P2P_CAPS_INDEX_NVLINK", 2),
            "atomics": _p2p_index("NVML_P2P_CAPS_INDEX_ATOMICS", 3)}


def status_of(exc: BaseException) -> str:
    """The recorded status for an exception raised by an NVML call."""
    if isinstance(exc, SnapshotMissing):
        return "unknown"
    if isinstance(exc, AttributeError):
        return "not_supported"  # this pynvml has no such function
    code = getattr(exc, "value", None)
    if isinstance(code, int) and type(exc).__name__.startswith("NVMLError"):
        if code in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND):
            return "not_supported"
        if code == _NOT_FOUND:
            return "not_found"
        if code == _NO_PERMISSION:
            return "no_permission"
    text = str(exc).strip() or type(exc).__name__
    return f"error: {text}"


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def cpulist(words: Any) -> str:
    """CPU affinity bitmask words (64 CPUs per word, as NVML returns them) -> "0-63,128-191"."""
    cpus = [64 * w + b for w, word in enumerate(words) for b in range(64) if (int(word) >> b) & 1]
    ranges: list[str] = []
    start = prev = None
    for c in cpus + [None]:
        if c is not None and prev is not None and c == prev + 1:
            prev = c
            continue
        if start is not None:
            ranges.append(f"{start}-{prev}" if prev != start else f"{start}")
        start = prev = c
    return ",".join(ranges)


def cpu_words(cpus: str, nwords: int) -> list[int]:
    """Inverse of `cpulist`: "0-63,128-191" -> `nwords` 64-bit mask words."""
    words = [0] * nwords
    for part in filter(None, (p.strip() for p in cpus.split(","))):
        lo, _, hi = part.partition("-")
        for c in range(int(lo), int(hi or lo) + 1):
            if c // 64 < nwords:
                words[c // 64] |= 1 << (c % 64)
    return words


class Nvml:
    """NVML behind one wrapper.

    Args:
        lib: a pynvml-like module/object (`pynvml`, or `NvmlReplay`); default: import pynvml.

    Attributes:
        status: "ok" once `init()` succeeded, else why not (one line with a hint).
    """

    def __init__(self, lib: Any | None = None) -> None:
        self.lib = lib
        self.status = "not initialised"
        self._handles: dict[int, Any] = {}

    @property
    def available(self) -> bool:
        return self.status == "ok"

    def init(self) -> str:
        """Start NVML; returns and records the status instead of raising."""
        if self.available:
            return self.status
        if self.lib is None:
            try:
                import pynvml  # heavy: pynvml (the NVIDIA driver library, absent on many machines)

                self.lib = pynvml
            except ImportError as e:
                self.status = f"error: pynvml not importable ({e}); {NO_DRIVER_HINT}"
                return self.status
        try:
            self.lib.nvmlInit()
            self.status = "ok"
        except Exception as e:  # noqa: BLE001 - every failure becomes a status
            code = getattr(e, "value", None)
            why = _text(e) or type(e).__name__
            if code in (_LIBRARY_NOT_FOUND, _DRIVER_NOT_LOADED) or isinstance(e, OSError):
                self.status = f"error: {why}; {NO_DRIVER_HINT}"
            else:
                self.status = f"{status_of(e)}; {NO_DRIVER_HINT}"
        return self.status

    def shutdown(self) -> None:
        if self.available:
            self.call("nvmlShutdown")
            self.status = "not initialised"
            self._handles.clear()

    def call(self, fn: str, *args: Any) -> Any:
        """Call `lib.<fn>(*args)`: the value, or `Missing(status)` on any failure."""
        if not self.available:
            return Missing(f"error: NVML not available ({self.status})")
        try:
            return getattr(self.lib, fn)(*args)
        except Exception as e:  # noqa: BLE001 - the point of the wrapper
            return Missing(status_of(e))

    def handle(self, index: int) -> Any:
        """Device handle for an NVML index (cached), or Missing."""
        if index not in self._handles:
            h = self.call("nvmlDeviceGetHandleByIndex", index)
            if isinstance(h, Missing):
                return h
            self._handles[index] = h
        return self._handles[index]


def _put(obj: dict[str, Any], key: str, value: Any, convert: Any = None) -> None:
    """obj[key] = value (converted), or None with obj["status"][key] = why."""
    if isinstance(value, Missing):
        obj[key] = None
        obj.setdefault("status", {})[key] = value.status
        return
    try:
        obj[key] = convert(value) if convert else value
    except Exception as e:  # noqa: BLE001 - an odd value is a status too
        obj[key] = None
        obj.setdefault("status", {})[key] = f"error: {e}"


def idle_link_note(pcie: dict[str, Any]) -> dict[str, Any]:
    """`current_at` and `note` for a link read at discovery, before any probe: an idle GPU lowers
    its link speed to save power (nvidia-smi(1), "GPU Link Info": the current generation and
    width "may be reduced when the GPU is not in use"), so a current generation below the maximum
    at idle is normal and says nothing about the link under load."""
    out: dict[str, Any] = {"current_at": "idle"}
    cur, top = pcie.get("gen_current"), pcie.get("gen_max")
    if isinstance(cur, int) and isinstance(top, int) and cur < top:
        out["note"] = (f"Gen{cur} at idle, Gen{top} max: read before any load, when GPUs lower the "
                       f"link speed to save power (normal); under load it trains back to "
                       f"Gen{top}. The probes' h2d/d2h bandwidth shows the link as it carries data.")
    return out


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def _bus_id(pci: Any) -> str:
    return normalize_bdf(_text(pci.busId))


def collect(nvml: Nvml) -> dict[str, Any]:
    """The NVML part of topology.json: `driver`, `gpus`, `pairs` and `status.nvml`.

    GPU indices are NVML indices. Fields NVML cannot give are None with a status. `numa_node`
    and `pcie.gen_max_system` come from the OS side (topology.discover fills them): NVML has no
    host-side maximum generation call, and nvmlDeviceGetNumaNodeId is the NUMA node of GPU
    memory (`gpu_numa_id`, only on coherent platforms), not the host node next to the GPU.
    """
    status = nvml.init()
    driver: dict[str, Any] = {"status": {}}
    out: dict[str, Any] = {"driver": driver, "gpus": [], "pairs": [], "status": {"nvml": status}}
    if not nvml.available:
        for k in ("driver_version", "cuda_driver_version", "nvml_version"):
            driver[k] = None
            driver["status"][k] = "not_supported"
        return out
    _put(driver, "driver_version", nvml.call("nvmlSystemGetDriverVersion"), _text)
    cuda = nvml.call("nvmlSystemGetCudaDriverVersion_v2")
    if isinstance(cuda, Missing):
        cuda = nvml.call("nvmlSystemGetCudaDriverVersion")
    _put(driver, "cuda_driver_version", cuda, _cuda_version)
    _put(driver, "nvml_version", nvml.call("nvmlSystemGetNVMLVersion"), _text)

    count = nvml.call("nvmlDeviceGetCount")
    if isinstance(count, Missing):
        out["status"]["nvml"] = f"error: nvmlDeviceGetCount: {count.status}"
        return out
    nwords = max(16, -(-(os.cpu_count() or 1) // 64))
    handles: dict[int, Any] = {}
    for i in range(int(count)):
        gpu: dict[str, Any] = {"index": i, "status": {}}
        h = nvml.handle(i)
        if isinstance(h, Missing):
            gpu["status"]["handle"] = h.status
            out["gpus"].append(gpu)
            continue
        handles[i] = h
        _put(gpu, "name", nvml.call("nvmlDeviceGetName", h), _text)
        _put(gpu, "uuid", nvml.call("nvmlDeviceGetUUID", h), _text)
        pci = nvml.call("nvmlDeviceGetPciInfo_v3", h)
        if isinstance(pci, Missing):
            pci = nvml.call("nvmlDeviceGetPciInfo", h)
        _put(gpu, "bus_id", pci, _bus_id)
        pcie: dict[str, Any] = {}
        _put(pcie, "gen_current", nvml.call("nvmlDeviceGetCurrPcieLinkGeneration", h), int)
        _put(pcie, "gen_max", nvml.call("nvmlDeviceGetMaxPcieLinkGeneration", h), int)
        _put(pcie, "gen_max_device", nvml.call("nvmlDeviceGetGpuMaxPcieLinkGeneration", h), int)
        pcie["gen_max_system"] = None
        pcie.setdefault("status", {})["gen_max_system"] = "unknown"
        _put(pcie, "width_current", nvml.call("nvmlDeviceGetCurrPcieLinkWidth", h), int)
        _put(pcie, "width_max", nvml.call("nvmlDeviceGetMaxPcieLinkWidth", h), int)
        pcie.update(idle_link_note(pcie))
        gpu["pcie"] = pcie
        _put(gpu, "bar1_bytes", nvml.call("nvmlDeviceGetBAR1MemoryInfo", h),
             lambda m: int(m.bar1Total))
        _put(gpu, "memory_bytes", nvml.call("nvmlDeviceGetMemoryInfo", h), lambda m: int(m.total))
        # (major, minor): the architecture the launch advice is for (pcieprof.analysis.box)
        _put(gpu, "compute_capability", nvml.call("nvmlDeviceGetCudaComputeCapability", h),
             lambda v: f"{int(v[0])}.{int(v[1])}")
        gpu["numa_node"] = None
        gpu["status"]["numa_node"] = "unknown"
        _put(gpu, "gpu_numa_id", nvml.call("nvmlDeviceGetNumaNodeId", h), int)
        _put(gpu, "cpu_affinity", nvml.call("nvmlDeviceGetCpuAffinity", h, nwords), cpulist)
        _put(gpu, "virtualization_mode", nvml.call("nvmlDeviceGetVirtualizationMode", h),
             lambda v: VIRTUALIZATION_MODES.get(int(v), "unknown"))
        out["gpus"].append(gpu)

    for a in handles:
        for b in handles:
            if a == b:
                continue
            pair: dict[str, Any] = {"a": a, "b": b, "status": {}}
            _put(pair, "level", nvml.call("nvmlDeviceGetTopologyCommonAncestor",
                                          handles[a], handles[b]),
                 lambda v: TOPOLOGY_LEVELS.get(int(v), f"level {int(v)}"))
            p2p: dict[str, Any] = {}
            for cap, idx in P2P_CAPS.items():
                _put(p2p, cap, nvml.call("nvmlDeviceGetP2PStatus", handles[a], handles[b], idx),
                     lambda v: P2P_STATUS.get(int(v), "U"))
            pair["p2p"] = p2p
            out["pairs"].append(pair)
    return out


def device_count(nvml: Nvml | None = None) -> tuple[int, str]:
    """(GPUs NVML sees, why none when 0), starting and stopping NVML around the one call."""
    nvml = nvml or Nvml()
    status = nvml.init()
    if not nvml.available:
        return 0, f"NVML not usable ({status})"
    try:
        n = nvml.call("nvmlDeviceGetCount")
    finally:
        nvml.shutdown()
    if isinstance(n, Missing):
        return 0, f"NVML not usable ({n.status})"
    return int(n), ""


#: The facts the GPU self-test prints of one GPU: key -> (NVML function, per-device call).
_FACTS = {
    "name": ("nvmlDeviceGetName", True),
    "pcie_gen_current": ("nvmlDeviceGetCurrPcieLinkGeneration", True),
    "pcie_gen_max": ("nvmlDeviceGetMaxPcieLinkGeneration", True),
    "pcie_width_current": ("nvmlDeviceGetCurrPcieLinkWidth", True),
    "pcie_width_max": ("nvmlDeviceGetMaxPcieLinkWidth", True),
    "driver_version": ("nvmlSystemGetDriverVersion", False),
    "gpu_count": ("nvmlDeviceGetCount", False),
}


def gpu_facts(index: int, nvml: Nvml | None = None) -> dict[str, Any]:
    """Name, bus id, PCIe link (at idle, and its maximum), BAR1 size and driver of one GPU (NVML
    index); a call that gives no value is recorded under `status`, never raised."""
    nvml = nvml or Nvml()
    status = nvml.init()
    if not nvml.available:
        return {"status": {"nvml": status}}
    try:
        h = nvml.handle(index)
        facts: dict[str, Any] = {}
        for key, (fn, per_device) in _FACTS.items():
            facts[key] = nvml.call(fn, h) if per_device else nvml.call(fn)
        pci = nvml.call("nvmlDeviceGetPciInfo", h)
        facts["bus_id"] = pci if isinstance(pci, Missing) else normalize_bdf(_text(pci.busId))
        bar1 = nvml.call("nvmlDeviceGetBAR1MemoryInfo", h)
        facts["bar1_bytes"] = bar1 if isinstance(bar1, Missing) else int(bar1.bar1Total)
        for key, v in list(facts.items()):
            if isinstance(v, Missing):
                facts[key] = None
                facts.setdefault("status", {})[key] = v.status
            elif isinstance(v, bytes):
                facts[key] = v.decode()
        facts["pcie_current_at"] = "idle"
        return facts
    finally:
        nvml.shutdown()


#: Seconds between NVML reads of the link generation while a load runs.
LINK_SAMPLE_S = 0.005


class LinkSampler:
    """Reads the PCIe generation and width of one GPU (NVML index) in a background thread while
    a block runs: the highest seen is the link as it trains under load (it downshifts at idle).

    Attributes:
        gen, width: the highest seen, or None.
        why: why none was read ("" when read).
    """

    def __init__(self, index: int, nvml: Nvml | None = None) -> None:
        self.index = index
        self.nvml = nvml or Nvml()
        self.gen: int | None = None
        self.width: int | None = None
        self.why = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        status = self.nvml.init()
        if not self.nvml.available:
            self.why = f"NVML: {status}"
            return
        try:
            h = self.nvml.handle(self.index)
            while not self._stop.wait(LINK_SAMPLE_S):
                g = self.nvml.call("nvmlDeviceGetCurrPcieLinkGeneration", h)
                w = self.nvml.call("nvmlDeviceGetCurrPcieLinkWidth", h)
                if isinstance(g, Missing) or isinstance(w, Missing):
                    self.why = f"NVML: {(g if isinstance(g, Missing) else w).status}"
                    return
                self.gen = max(self.gen or 0, int(g))
                self.width = max(self.width or 0, int(w))
        finally:
            self.nvml.shutdown()

    def __enter__(self) -> "LinkSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

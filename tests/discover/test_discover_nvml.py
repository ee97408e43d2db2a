"""The NVML wrapper against the replayed snapshot of the ASUS server, and its failure statuses."""

from __future__ import annotations

from pathlib import Path

import copy
import json

import pytest

from pcieprof.discover import nvml as nv
from pcieprof.discover.nvml import Missing, Nvml, collect, cpulist, cpu_words
from pcieprof.discover.nvml_snapshot import NvmlReplay, main, record_snapshot, snapshot_from_logs

DATA = Path(__file__).resolve().parents[1] / "data"

SNAP = DATA / "nvml_snapshot_rtxpro6000_8x" / "snapshot.json"


@pytest.fixture(scope="module")
def snap() -> dict:
    return json.loads(SNAP.read_text())


def test_collect_on_replayed_snapshot(snap):
    out = collect(Nvml(NvmlReplay(snap)))
    assert out["status"]["nvml"] == "ok"
    assert out["driver"]["driver_version"] == "595.58.03"
    assert out["driver"]["cuda_driver_version"] == "13.2"
    assert out["driver"]["nvml_version"] is None
    assert out["driver"]["status"]["nvml_version"] == "unknown"
    gpus = out["gpus"]
    assert len(gpus) == 8
    assert {g["name"] for g in gpus} == {"NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    assert [g["bus_id"] for g in gpus] == [
        "0000:06:00.0", "0000:07:00.0", "0000:75:00.0", "0000:76:00.0",
        "0000:84:00.0", "0000:85:00.0", "0000:f4:00.0", "0000:f5:00.0"]
    assert gpus[0]["uuid"] == "GPU-e588912b-1368-6b4f-0e2a-0d08f8afb39b"
    for g in gpus:
        assert (g["pcie"]["gen_max"], g["pcie"]["gen_max_device"], g["pcie"]["width_max"]) == (5, 5, 16)
        assert g["pcie"]["gen_current"] == 1  # idle GPUs retrain to Gen1
        assert g["bar1_bytes"] == 128 * 1024**3
        assert g["memory_bytes"] == 97887 * 1024**2
        assert g["virtualization_mode"] == "bare_metal"
        assert g["gpu_numa_id"] is None and g["status"]["gpu_numa_id"] == "not_supported"
    assert [g["cpu_affinity"] for g in gpus] == ["0-63,128-191"] * 4 + ["64-127,192-238"] * 4


def test_pair_levels_match_topo_m(snap):
    out = collect(Nvml(NvmlReplay(snap)))
    level = {(p["a"], p["b"]): p["level"] for p in out["pairs"]}
    assert len(level) == 56
    assert level[(0, 1)] == "PIX" and level[(2, 3)] == "PIX" and level[(6, 7)] == "PIX"
    assert level[(0, 2)] == "NODE" and level[(5, 7)] == "NODE"
    assert level[(0, 4)] == "SYS" and level[(7, 0)] == "SYS"
    p = out["pairs"][0]
    # read/write/atomics are not in the logs; NVLink is (topo -m shows no NV# pair)
    assert p["p2p"] == {"read": None, "write": None, "atomics": None, "nvlink": "NS",
                        "status": {"read": "unknown", "write": "unknown", "atomics": "unknown"}}


def test_p2p_status_codes_and_index_is_int(snap):
    s = copy.deepcopy(snap)
    # read OK, write chipset-not-supported, atomics not supported: as a VM with ACS might answer
    for key in list(s["calls"]):
        if key.startswith("nvmlDeviceGetP2PStatus(gpu0,gpu1,"):
            idx = int(key.rsplit(",", 1)[1].rstrip(")"))
            s["calls"][key] = {"value": {0: 0, 1: 1, 2: 5, 3: 5}[idx]}
    out = collect(Nvml(NvmlReplay(s)))
    p01 = next(p for p in out["pairs"] if (p["a"], p["b"]) == (0, 1))
    assert (p01["p2p"]["read"], p01["p2p"]["write"], p01["p2p"]["atomics"]) == ("OK", "CNS", "NS")
    assert nv.P2P_CAPS == {"read": 0, "write": 1, "nvlink": 2, "atomics": 3}
    assert all(type(v) is int for v in nv.P2P_CAPS.values())


def test_errors_become_statuses(snap):
    s = copy.deepcopy(snap)
    s["calls"]["nvmlDeviceGetBAR1MemoryInfo(gpu3)"] = {"error": 4}  # NO_PERMISSION
    s["calls"]["nvmlDeviceGetUUID(gpu2)"] = {"error": 999}
    del s["calls"]["nvmlDeviceGetName(gpu1)"]
    out = collect(Nvml(NvmlReplay(s)))
    g = out["gpus"]
    assert g[3]["bar1_bytes"] is None and g[3]["status"]["bar1_bytes"] == "no_permission"
    assert g[2]["uuid"] is None and g[2]["status"]["uuid"].startswith("error: ")
    assert g[1]["name"] is None and g[1]["status"]["name"] == "unknown"


def test_no_driver_is_a_status_not_an_exception():
    snap = {"format": "pcieprof-nvml-snapshot", "version": 1, "init": {"error": 12}, "calls": {}}
    n = Nvml(NvmlReplay(snap))
    out = collect(n)
    assert not n.available
    assert "is the NVIDIA driver installed? use --backend cpu" in out["status"]["nvml"]
    assert out["gpus"] == [] and isinstance(n.call("nvmlDeviceGetCount"), Missing)


def test_real_pynvml_on_this_machine_reports_unavailable():
    pytest.importorskip("pynvml")
    n = Nvml()
    status = n.init()
    if n.available:
        pytest.skip("this machine has a working NVML")
    assert status.startswith("error: ") and "use --backend cpu" in status


def test_record_roundtrip(snap):
    rec = record_snapshot(Nvml(NvmlReplay(snap)))
    assert rec["recorded"]["how"] == "record"
    replayed = collect(Nvml(NvmlReplay(rec)))
    assert replayed == collect(Nvml(NvmlReplay(snap)))


def test_committed_snapshot_is_what_the_script_builds(samples, snap):
    d = samples / "rtxpro6000-8x-asus-baremetal"
    built = snapshot_from_logs((d / "nvidia_smi_full.log").read_text(),
                               (d / "nvidia_topo.log").read_text(),
                               smi_q_name="nvidia_smi_full.log", topo_m_name="nvidia_topo.log")
    assert built == snap


def test_cli_from_logs_and_record(samples, tmp_path, capsys):
    d = samples / "rtxpro6000-8x-asus-baremetal"
    out = tmp_path / "s.json"
    assert main(["from-logs", "--smi-q", str(d / "nvidia_smi_full.log"),
                 "--topo-m", str(d / "nvidia_topo.log"), str(out)]) == 0
    assert json.loads(out.read_text())["calls"]["nvmlDeviceGetCount()"] == {"value": 8}
    if not Nvml().init() == "ok":
        assert main(["record", str(tmp_path / "r.json")]) == 3
        assert "use --backend cpu" in capsys.readouterr().err


def test_cpulist_roundtrip():
    assert cpulist(cpu_words("0-63,128-191", 4)) == "0-63,128-191"
    assert cpulist(cpu_words("64-127,192-238", 4)) == "64-127,192-238"
    assert cpulist([0b1011]) == "0-1,3"


class _RealTypes:
    """Answers from the snapshot, but in the types real pynvml returns: its ctypes structures
    (nvmlPciInfo_t with busId as c_char bytes), c_ulonglong arrays and pynvml.NVMLError."""

    def __init__(self, snap: dict) -> None:
        self._replay = NvmlReplay(snap)

    def __getattr__(self, name):
        pynvml = pytest.importorskip("pynvml")
        fn = getattr(self._replay, name)
        structs = {"nvmlPciInfo_t": pynvml.nvmlPciInfo_t,
                   "c_nvmlBAR1Memory_t": pynvml.c_nvmlBAR1Memory_t,
                   "c_nvmlMemory_t": pynvml.c_nvmlMemory_t}

        def call(*args):
            v = fn(*args)
            if hasattr(v, "_struct"):
                s = structs[v._struct]()
                for field, *_ in s._fields_:
                    x = getattr(v, field, None)
                    if x is not None:
                        setattr(s, field, x.encode() if isinstance(x, str) else x)
                return s
            if name == "nvmlDeviceGetCpuAffinity":
                import ctypes

                return (ctypes.c_ulonglong * len(v))(*v)
            return v

        return call


def test_recorder_on_real_pynvml_types(snap):
    lib = _RealTypes(snap)
    direct = collect(Nvml(lib))
    assert direct == collect(Nvml(NvmlReplay(snap)))
    rec = record_snapshot(lib)
    assert collect(Nvml(NvmlReplay(rec))) == direct
    pci = rec["calls"]["nvmlDeviceGetPciInfo_v3(gpu2)"]["value"]
    assert pci["_struct"] == "nvmlPciInfo_t" and pci["busId"] == "00000000:75:00.0"
    assert rec["calls"]["nvmlDeviceGetNumaNodeId(gpu0)"] == {"error": 3}


def test_function_missing_from_pynvml_is_not_supported(snap):
    class OldPynvml:  # an old nvidia-ml-py without nvmlDeviceGetNumaNodeId
        def __init__(self):
            self._r = NvmlReplay(snap)

        def __getattr__(self, name):
            if name == "nvmlDeviceGetNumaNodeId":
                raise AttributeError(name)
            return getattr(self._r, name)

    out = collect(Nvml(OldPynvml()))
    assert out["gpus"][0]["status"]["gpu_numa_id"] == "not_supported"
    rec = record_snapshot(OldPynvml())
    assert rec["calls"]["nvmlDeviceGetNumaNodeId(gpu0)"] == {"error": 13}
    assert collect(Nvml(NvmlReplay(rec)))["gpus"][0]["status"]["gpu_numa_id"] == "not_supported"


def test_link_generation_read_at_idle_says_so(snap):
    # the recorded box was idle: Gen1 now, Gen5 max. That is the GPUs' power saving, not the link's
    # state under load, and topology.json must not let a reader take it for a degraded link.
    out = collect(Nvml(NvmlReplay(snap)))
    for g in out["gpus"]:
        pcie = g["pcie"]
        assert pcie["current_at"] == "idle"
        assert "Gen1 at idle" in pcie["note"] and "Gen5" in pcie["note"]
        assert "power" in pcie["note"]

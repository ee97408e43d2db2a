"""A short proof on a machine with at least one NVIDIA GPU that the cuda paths of the probes work.

    python -m pcieprof.gpu_selftest [--out DIR] [--device 0]

Runs, with the project's own code (nothing here is a re-implementation):
1. NVML reads through pynvml: name, bus id, PCIe link (current/max), BAR1, driver version.
2. Host-to-device and device-to-host copies of 64 MiB through `probes.p2p_worker.CudaCopier`
   (pinned host memory, CUDA-event timing, pattern check), and P2P copies when there are two GPUs.
3. A one-GPU all-reduce sweep (8 B .. 1 MiB, bf16 and fp32) through the measurement session
   (`pcieprof.measurement`, as `pcieprof topology` runs it): a real torchrun launch with
   NCCL_DEBUG=INFO, rows into a bundle, what NCCL chose parsed.
Prints one line per check and `selftest: ok` (exit 0) or `selftest: FAILED` (exit 1); the
bundle (allreduce.csv, nccl/*.log, nccl_choices.json) and selftest.json land in --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pynvml
import torch

from pcieprof.bundle import Bundle
from pcieprof.measurement import MeasurementSession
from probes.p2p_worker import CudaCopier, p2p_row
from probes.plan import MiB, AllReduceCase, P2PCase, Plan, sizes_pow2


def nvml_facts(index: int) -> dict[str, Any]:
    """NVML facts of one GPU; a call that is not supported is recorded, not fatal."""
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        facts: dict[str, Any] = {}
        calls = {
            "name": lambda: pynvml.nvmlDeviceGetName(h),
            "bus_id": lambda: pynvml.nvmlDeviceGetPciInfo(h).busId,
            "pcie_gen_current": lambda: pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
            "pcie_gen_max": lambda: pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
            "pcie_width_current": lambda: pynvml.nvmlDeviceGetCurrPcieLinkWidth(h),
            "pcie_width_max": lambda: pynvml.nvmlDeviceGetMaxPcieLinkWidth(h),
            "bar1_bytes": lambda: pynvml.nvmlDeviceGetBAR1MemoryInfo(h).bar1Total,
            "driver_version": pynvml.nvmlSystemGetDriverVersion,
            "gpu_count": pynvml.nvmlDeviceGetCount,
        }
        for key, call in calls.items():
            try:
                v = call()
                facts[key] = v.decode() if isinstance(v, bytes) else v
            except pynvml.NVMLError as exc:
                facts[key] = None
                facts.setdefault("status", {})[key] = str(exc)
        return facts
    finally:
        pynvml.nvmlShutdown()


def copies(index: int, n_gpus: int) -> list[dict[str, Any]]:
    """h2d/d2h (and p2p with a second GPU) rows from the probe's own CudaCopier."""
    devices = [index] + ([1 if index == 0 else 0] if n_gpus > 1 else [])
    cases = [P2PCase(-1, index, "h2d", "uni", "bandwidth", 64 * MiB, 5, 3),
             P2PCase(index, -1, "d2h", "uni", "bandwidth", 64 * MiB, 5, 3),
             P2PCase(-1, index, "h2d", "uni", "latency", 8, 100, 3)]
    if len(devices) > 1:
        a, b = devices
        cases += [P2PCase(a, b, "p2p", "uni", "bandwidth", 64 * MiB, 5, 3),
                  P2PCase(a, b, "p2p", "bi", "bandwidth", 64 * MiB, 5, 3),
                  P2PCase(a, b, "host_staged", "uni", "bandwidth", 64 * MiB, 5, 3)]
    plan = Plan(backend="cuda", devices=devices, p2p=cases)
    copier = CudaCopier(plan)
    rows = []
    for i, case in enumerate(cases):
        times, ok, why = copier.run_p2p(i, case)
        if times is None:
            rows.append(p2p_row(case, "cuda", None, status="not_supported", detail=why))
        elif not ok:
            rows.append(p2p_row(case, "cuda", None, status="error", detail="wrong bytes"))
        else:
            rows.append(p2p_row(case, "cuda", times))
    return rows


def allreduce(index: int, out: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A one-GPU all-reduce sweep through the measurement session (torchrun + NCCL) into a
    bundle."""
    case = AllReduceCase("default", {}, [index], sizes_pow2(8, 1 << 20), ["bf16", "fp32"], 2, 10)
    plan = Plan(backend="cuda", devices=[index], allreduce=[case], timeout_s=120)
    bundle = Bundle.create(out / "bundle", command="gpu_selftest", source="measured",
                           backend="cuda", force=True)
    with MeasurementSession(bundle) as session:
        session.measure(plan)
    bundle.finish()
    rows = bundle.read_table("allreduce").to_dict("records")
    return rows, {"result": bundle.part("allreduce"),
                  "choices": bundle.read_json("nccl_choices.json", {}),
                  "nccl": bundle.manifest["versions"].get("nccl")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="pcieprof GPU self-test")
    ap.add_argument("--out", type=Path, default=None, help="where selftest.json and the bundle go")
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="pcieprof-selftest-"))
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"device": args.device}
    failed = []
    t0 = time.monotonic()

    def step(name: str, fn: Any) -> Any:
        try:
            v = fn()
            print(f"{name}: ok", flush=True)
            return v
        except Exception as exc:  # a self-test reports every failure and carries on
            failed.append(name)
            report[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
            print(f"{name}: FAILED {type(exc).__name__}: {exc}", flush=True)
            return None

    facts = step("nvml", lambda: nvml_facts(args.device))
    report["nvml"] = facts
    if facts:
        print(f"  {facts.get('name')} {facts.get('bus_id')} PCIe gen {facts.get('pcie_gen_current')}"
              f"/{facts.get('pcie_gen_max')} x{facts.get('pcie_width_current')}"
              f"/{facts.get('pcie_width_max')} driver {facts.get('driver_version')}")
    n = torch.cuda.device_count()
    report["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda, "devices": n}
    rows = step("copies", lambda: copies(args.device, n)) or []
    report["copies"] = rows
    for r in rows:
        val = (f"{r.get('bandwidth_gbps'):.1f} GB/s" if r.get("bandwidth_gbps") is not None
               and r.get("bandwidth_gbps") == r.get("bandwidth_gbps") else
               f"{r.get('latency_us', float('nan')):.2f} us")
        print(f"  {r['path']:<12}{r['direction']:<4}{r['size_bytes']:>10} B  {r['status']:<6}{val}")
        if r["status"] not in ("ok", "not_supported"):
            failed.append(f"copy {r['path']}")
    ar = step("allreduce", lambda: allreduce(args.device, out))
    if ar:
        ar_rows, info = ar
        report["allreduce"] = ar_rows
        report["allreduce_info"] = info
        bad = [r for r in ar_rows if r["status"] != "ok"]
        print(f"  {len(ar_rows)} rows, {len(bad)} not ok, NCCL {info.get('nccl')}")
        for r in ar_rows[:: max(len(ar_rows) // 4, 1)]:
            print(f"  {r['dtype']} {r['size_bytes']:>8} B  {r['time_us']:.1f} us")
        if bad or not ar_rows:
            failed.append("allreduce rows")
    report["failed"] = failed
    report["wall_s"] = time.monotonic() - t0
    (out / "selftest.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"selftest: {'ok' if not failed else 'FAILED ' + ', '.join(failed)} "
          f"({report['wall_s']:.0f} s; details in {out})")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())

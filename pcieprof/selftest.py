"""A short proof, run by hand (a measuring entry point, not a probe: it drives the measurement
session that runs the probes), on a machine with at least one NVIDIA GPU that the cuda paths of the probes work.

    python -m pcieprof.selftest [--out DIR] [--device 0]

`--device` is the NVML index (nvidia-smi's numbering). The CUDA ordinal of that GPU is found by
PCI bus id (CUDA's default order is "fastest first", not NVML's), and the all-reduce launch uses
CUDA_DEVICE_ORDER=PCI_BUS_ID as `pcieprof topology` does.

Runs, with the project's own code (nothing here is a re-implementation):
1. NVML reads through the one NVML wrapper (pcieprof.discover.nvml): name, bus id, PCIe link (at idle, under the copies' load, max),
   BAR1, driver version.
2. Host-to-device and device-to-host copies of 64 MiB through `probes.p2p_worker.CudaCopier`
   (pinned host memory on the GPU's NUMA node, CUDA-event timing with the stream held until the
   copies are queued, pattern check), and P2P copies when there are two GPUs.
3. A one-GPU all-reduce sweep (8 B .. 1 MiB, bf16 and fp32) through the measurement session
   (`pcieprof.measurement`, which runs `pcieprof.probe_runner`):
   real torchrun launches (untimed with NCCL's tuner log, then timed) with NCCL_DEBUG=INFO, rows
   into a bundle, what NCCL chose parsed.
Prints one line per check and `selftest: ok` (exit 0) or `selftest: FAILED` (exit 1); the
bundle (allreduce.csv, nccl/*.log, nccl_choices.json) and selftest.json land in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pcieprof.bundle import Bundle
from pcieprof.bundle.document import encode
from pcieprof.discover.nvml import LinkSampler, gpu_facts
from pcieprof.discover.pci import normalize_bdf
from pcieprof.measurement import MeasurementSession
from probes.gpu_api import CudaApi
from pcieprof.bundle.plan import AllReduceCase, P2PCase, Plan
from probes.plan import MiB, sizes_pow2


def cuda_ordinal(bus_id: str | None, api: CudaApi, count: int) -> tuple[int | None, str]:
    """The CUDA ordinal of the GPU at PCI address `bus_id`, and how it was found.

    Matches the PCI ids torch reports for each ordinal; returns (None, why) when no ordinal has
    that address or torch reports no PCI ids (then the caller relies on CUDA_DEVICE_ORDER)."""
    if not bus_id:
        return None, "NVML gave no bus id"
    want = normalize_bdf(bus_id)
    seen = 0
    for i in range(count):
        got = api.bus_id(i)
        if got is None:
            continue
        seen += 1
        if normalize_bdf(got) == want:
            return i, f"PCI bus id {want}"
    if not seen:
        return None, "torch reports no PCI ids for its devices"
    return None, f"no CUDA device at PCI bus id {want}"


def copies(ordinal: int, n_gpus: int) -> list[dict[str, Any]]:
    """h2d/d2h (and p2p with a second GPU) rows from the probe's own CudaCopier."""
    from probes.p2p_worker import CudaCopier, p2p_result_row  # heavy: imports torch (CUDA)

    devices = [ordinal] + ([1 if ordinal == 0 else 0] if n_gpus > 1 else [])
    cases = [P2PCase(-1, ordinal, "h2d", "uni", "bandwidth", 64 * MiB, 5, 3),
             P2PCase(ordinal, -1, "d2h", "uni", "bandwidth", 64 * MiB, 5, 3),
             P2PCase(-1, ordinal, "h2d", "uni", "latency", 8, 100, 3)]
    if len(devices) > 1:
        a, b = devices
        cases += [P2PCase(a, b, "p2p", "uni", "bandwidth", 64 * MiB, 5, 3),
                  P2PCase(a, b, "p2p", "bi", "bandwidth", 64 * MiB, 5, 3),
                  P2PCase(a, b, "host_staged", "uni", "bandwidth", 64 * MiB, 5, 3)]
    plan = Plan(backend="cuda", devices=devices, p2p=cases)
    copier = CudaCopier(plan)
    # the probe's own row (a copy that did not land names its trial and iterations)
    return [p2p_result_row(case, "cuda", copier.run_p2p(i, case)) for i, case in enumerate(cases)]


def allreduce(index: int, out: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A one-GPU all-reduce sweep through the measurement session (torchrun + NCCL, as
    `pcieprof topology` runs it) into a bundle."""
    case = AllReduceCase("default", {}, [index], sizes_pow2(8, 1 << 20), ["bf16", "fp32"], 2, 10)
    plan = Plan(backend="cuda", devices=[index], allreduce=[case], timeout_s=120)
    bundle = Bundle.create(out / "bundle", command="gpu_selftest", source="measured",
                           backend="cuda", force=True)
    with MeasurementSession(bundle) as session:
        session.measure(plan)
    bundle.finish()
    rows = bundle.read_table("allreduce").to_dict("records")
    return rows, {"result": encode(bundle.part("allreduce")) or {},
                  "choices": bundle.read_json("nccl_choices.json", {}),
                  "nccl": bundle.manifest.versions.get("nccl")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="pcieprof GPU self-test")
    ap.add_argument("--out", type=Path, default=None, help="where selftest.json and the bundle go")
    ap.add_argument("--device", type=int, default=0, help="NVML index (nvidia-smi numbering)")
    args = ap.parse_args(argv)
    # before CUDA starts: ordinals in PCI order, as the probes use them
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    out = args.out or Path(tempfile.mkdtemp(prefix="pcieprof-selftest-"))
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"device": args.device}
    failed = []
    t0 = time.monotonic()

    def step(name: str, fn: Callable[[], Any]) -> Any:
        try:
            v = fn()
            print(f"{name}: ok", flush=True)
            return v
        except Exception as exc:  # a self-test reports every failure and carries on
            failed.append(name)
            report[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
            print(f"{name}: FAILED {type(exc).__name__}: {exc}", flush=True)
            return None

    facts = step("nvml", lambda: gpu_facts(args.device)) or {}
    report["nvml"] = facts
    import torch  # heavy: CUDA starts here, after CUDA_DEVICE_ORDER is set

    from probes.gpu_api import TorchCuda  # heavy: after torch, as the line above says

    n = torch.cuda.device_count()
    report["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda, "devices": n}
    ordinal, how = cuda_ordinal(facts.get("bus_id"), TorchCuda(), n)
    if ordinal is None:
        ordinal, how = args.device, f"{how}; CUDA_DEVICE_ORDER=PCI_BUS_ID order assumed"
    report["cuda_ordinal"] = {"ordinal": ordinal, "mapped_by": how}
    print(f"  NVML {args.device} = CUDA {ordinal} ({how})")
    with LinkSampler(args.device) as link:
        rows = step("copies", lambda: copies(ordinal, n)) or []
    facts.update(pcie_gen_under_load=link.gen, pcie_width_under_load=link.width)
    if link.why:
        facts.setdefault("status", {})["pcie_under_load"] = link.why
    if facts:
        print(f"  {facts.get('name')} {facts.get('bus_id')} PCIe gen {facts.get('pcie_gen_current')}"
              f" at idle (a lower gen at idle is the normal power-saving downshift), "
              f"{facts.get('pcie_gen_under_load')} under load, {facts.get('pcie_gen_max')} max; "
              f"x{facts.get('pcie_width_current')}/x{facts.get('pcie_width_max')}; "
              f"driver {facts.get('driver_version')}")
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

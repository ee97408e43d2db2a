"""One command, on a machine with one NVIDIA GPU, that runs every CUDA path of pcieprof one GPU can
reach and writes everything under --out (issue 17: the first proof on real hardware).

    python -m probes.gpu_proof --out DIR [--device 0] [--check]

Steps (each recorded in DIR/proof.json with its status, seconds and files; a step that fails does
not stop the others; exit 0 only when every step passed):
1. `nvml`: this machine's NVML answers, recorded for replay (pcieprof.discover.nvml_snapshot)
   -> nvml_snapshot.json, a test fixture to commit.
2. `selftest`: `python -m probes.gpu_selftest` -> selftest/ (NVML reads, h2d/d2h through the
   probe's CudaCopier with the data check, the one-rank NCCL all-reduce sweep with
   NCCL_DEBUG=INFO parsed, in a bundle).
3. `topology`: `pcieprof topology --backend cuda --quick` on the GPU -> topology/ (NVML
   discovery of a real device, h2d/d2h copies; one GPU has no all-reduce in that plan).
4. `copies_vs_torch`: the same h2d/d2h copies as a plain torch loop timed the same way (pinned
   host memory, stream held by a spin kernel, CUDA events), the link's generation and width read
   by NVML while that loop runs, and each figure's ratio to the link's raw and payload rate
   (pcieprof.sim.model: 128b/130b coding, then TLP framing at 256 B payloads and a fitted DLLP
   share) -> copies.json.
5. `decode_trace`: a small decoder-only transformer (defined here) decodes DECODE_STEPS tokens
   under torch.profiler with CPU and CUDA activities, eagerly and as CUDA graph replays ->
   decode/{eager,graph}.trace.json.gz.
6. `attribute`: `pcieprof attribute` on each trace -> attribution-{eager,graph}/; checks that every
   GPU event is counted in a class (none ignored, the class counts adding up to the trace's GPU
   events) and that the busy time (the union over all classes) is within 1% of a union of the
   trace's kernel, memcpy and memset intervals computed here from the raw JSON.

`--check` (no GPU needed): imports everything, prints and writes the plan (plan.json), runs the
decoder for two steps on the CPU under the profiler and attributes that trace, so that on the GPU
machine only the GPU can be wrong.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
#: Decode steps profiled per trace (after one untraced warm-up step and the profiler's warm-up).
DECODE_STEPS = 6
#: Largest difference between the attribution's busy time and the union computed here.
UNION_TOLERANCE = 0.01
#: GPU event categories of a Kineto trace (what the union counts).
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
#: Copies of the torch loop: the probe's quick bandwidth case (64 MiB, 2 copies per trial).
COPY_BYTES = 64 * 1024 * 1024
COPY_ITERS, COPY_TRIALS = 2, 3
#: Seconds each subprocess step may take.
STEP_TIMEOUT_S = {"selftest": 300, "topology": 300, "attribute": 180}


# ------------------------------------------------------------------------------------------------
# the model


class Block(nn.Module):
    """Pre-norm attention + MLP with a static KV cache, so one decode step can be a CUDA graph."""

    def __init__(self, d: int, heads: int, max_len: int, batch: int) -> None:
        super().__init__()
        self.heads, self.dh = heads, d // heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("k", torch.zeros(batch, heads, max_len, d // heads))
        self.register_buffer("v", torch.zeros(batch, heads, max_len, d // heads))

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        q, k, v = self.qkv(self.ln1(x)).view(b, 1, 3, self.heads, self.dh).permute(2, 0, 3, 1, 4)
        kc, vc = self.get_buffer("k"), self.get_buffer("v")
        kc.index_copy_(2, pos, k)  # in place at a position held in a tensor: graph-safe
        vc.index_copy_(2, pos, v)
        att = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask)
        x = x + self.proj(att.transpose(1, 2).reshape(b, 1, -1))
        out: torch.Tensor = x + self.down(F.gelu(self.up(self.ln2(x))))
        return out


class TinyDecoder(nn.Module):
    """A small GPT-like decoder (4 layers, d=512) that decodes one token per sequence per step."""

    def __init__(self, batch: int = 8, vocab: int = 4096, d: int = 512, heads: int = 8,
                 layers: int = 4, max_len: int = 64) -> None:
        super().__init__()
        self.emb, self.pos_emb = nn.Embedding(vocab, d), nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads, max_len, batch) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.register_buffer("positions", torch.arange(max_len))

    def forward(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Next tokens (greedy) for tokens `tok` [batch] at position `pos` [1]."""
        x = (self.emb(tok) + self.pos_emb(pos)).unsqueeze(1)
        positions = self.get_buffer("positions")
        mask = (positions <= pos).view(1, 1, 1, -1)
        for blk in self.blocks:
            x = blk(x, pos, mask)
        out: torch.Tensor = self.head(self.norm(x[:, 0])).argmax(-1)
        return out


def decode_trace(path: Path, device: torch.device, *, graph: bool, steps: int = DECODE_STEPS
                 ) -> dict[str, Any]:
    """Profile `steps` decode steps of TinyDecoder (one ProfilerStep each) into a Kineto trace."""
    from torch.profiler import ProfilerActivity, profile, schedule

    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    model = TinyDecoder().to(device=device, dtype=dtype).eval()
    tok = torch.zeros(8, dtype=torch.long, device=device)
    pos = torch.zeros(1, dtype=torch.long, device=device)
    run: Callable[[], torch.Tensor] = lambda: model(tok, pos)  # noqa: E731
    with torch.inference_mode():
        run()  # warm-up (kernels chosen, lazy init done) outside the trace
        if graph:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static_out: torch.Tensor = model(tok, pos)

            def replay() -> torch.Tensor:
                g.replay()
                return static_out

            run = replay
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        path.parent.mkdir(parents=True, exist_ok=True)
        written: list[str] = []

        def export(p: profile) -> None:  # at the end of the active window
            p.export_chrome_trace(str(path))  # ".gz": torch writes it gzipped
            written.append(str(path))

        with profile(activities=activities, on_trace_ready=export,
                     schedule=schedule(wait=0, warmup=1, active=steps, repeat=1)) as prof:
            for _ in range(steps + 1):
                nxt = run()
                tok.copy_(nxt)
                pos.add_(1)
                prof.step()
        if cuda:
            torch.cuda.synchronize(device)
    if not written:
        raise RuntimeError("the profiler wrote no trace")
    return {"trace": str(path), "steps": steps, "graph": graph, "dtype": str(dtype)}


# ------------------------------------------------------------------------------------------------
# independent checks


def gpu_events(trace: Path) -> list[tuple[str, str, float, float]]:
    """(category, name, start us, duration us) of every GPU event (kernel, memcpy, memset)."""
    opener = gzip.open if trace.name.endswith(".gz") else open
    with opener(trace, "rt") as f:
        doc = json.load(f)
    return [(str(e["cat"]), str(e.get("name", "")), float(e["ts"]), float(e.get("dur", 0.0)))
            for e in doc.get("traceEvents", [])
            if e.get("ph") == "X" and e.get("cat") in GPU_CATS]


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, start + duration) intervals, us."""
    total, end = 0.0, float("-inf")
    for s, d in sorted(intervals):
        e = s + d
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def check_attribution(trace: Path, attribution: dict[str, Any]) -> dict[str, Any]:
    """Compare the attribution of one trace with what the raw trace says."""
    events = gpu_events(trace)
    rank = attribution["ranks"][0]
    classes: dict[str, int] = {}
    for fam in rank.get("families", []):
        classes[fam["class"]] = classes.get(fam["class"], 0) + int(fam["count"])
    union = union_us([(s, d) for _, _, s, d in events])
    busy = float(rank["totals"]["busy_us"])
    out = {"gpu_events": len(events), "counted_by_class": classes, "union_us": union,
           "attributed_busy_us": busy,
           "busy_vs_union": (busy / union - 1.0) if union > 0 else None,
           "graph_steps": sum(1 for s in attribution.get("steps", []) if s.get("kind") == "graph")}
    problems = []
    if not events:
        problems.append("the trace has no GPU events")
    if classes.get("ignore"):
        problems.append(f"{classes['ignore']} GPU event(s) in no class")
    if sum(v for k, v in classes.items() if k != "ignore") != len(events):
        problems.append(f"classes count {sum(classes.values())} events, the trace has {len(events)}")
    if union > 0 and abs(busy / union - 1.0) > UNION_TOLERANCE:
        problems.append(f"busy {busy:.1f} us vs independent union {union:.1f} us")
    out["problems"] = problems
    return out


# ------------------------------------------------------------------------------------------------
# copies: a plain torch loop timed the same way, and the link


def torch_copies(device: int) -> list[dict[str, Any]]:
    """h2d and d2h GB/s of a plain torch loop: pinned host memory, a stream held by a spin kernel
    while COPY_ITERS copies are queued, CUDA events around them; median of COPY_TRIALS."""
    import statistics

    host = torch.empty(COPY_BYTES, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    stream = torch.cuda.Stream(device=device)
    rate = torch.cuda.get_device_properties(device).clock_rate * 1e3 or 2e9
    rows = []
    copies: list[tuple[str, Callable[[], object]]] = [
        ("h2d", lambda: dev.copy_(host, non_blocking=True)),
        ("d2h", lambda: host.copy_(dev, non_blocking=True))]
    for direction, copy in copies:
        times = []
        for _ in range(COPY_TRIALS + 1):  # the first is a warm-up
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                torch.cuda._sleep(int(1e-3 * rate))  # hold 1 ms while the copies are queued
                e0.record(stream)
                for _ in range(COPY_ITERS):
                    copy()
                e1.record(stream)
            e1.synchronize()
            times.append(e0.elapsed_time(e1) / 1e3)
        t = statistics.median(times[1:])
        rows.append({"direction": direction, "bytes": COPY_BYTES * COPY_ITERS, "seconds": t,
                     "bandwidth_gbps": COPY_BYTES * COPY_ITERS / t / 1e9})
    return rows


def compare_copies(out: Path, nvml_index: int, cuda_device: int) -> dict[str, Any]:
    """The probe's h2d/d2h rows (topology bundle) next to the torch loop and the link's limits."""
    from pcieprof.bundle import Bundle
    from pcieprof.sim.fabric import raw_link_gbps
    from pcieprof.sim.model import link_gbps
    from probes.gpu_selftest import LinkSampler

    with LinkSampler(nvml_index) as link:
        plain = torch_copies(cuda_device)
    probe: dict[str, float] = {}
    bundle = out / "topology"
    if (bundle / "manifest.json").is_file():
        p2p = Bundle.open(bundle).read_table("p2p")
        bw = p2p[p2p["path"].isin(["h2d", "d2h"]) & p2p["bandwidth_gbps"].notna()]
        probe = {str(r.path): float(r.bandwidth_gbps) for r in bw.itertuples()}
    res: dict[str, Any] = {"link_under_load": {"gen": link.gen, "width": link.width,
                                               "why": link.why or None},
                           "torch_loop": plain, "probe": probe}
    if link.gen and link.width:
        raw, payload = raw_link_gbps(link.gen, link.width), link_gbps(link.gen, link.width)
        res["link_gbps"] = {"raw": raw, "payload": payload,
                            "payload_assumes": "256 B TLP payloads and the fabric model's fitted "
                                               "DLLP share (pcieprof/sim/calibration)"}
        for r in plain:
            r["of_payload_limit"] = r["bandwidth_gbps"] / payload
            r["of_raw_rate"] = r["bandwidth_gbps"] / raw
        res["probe_of_payload_limit"] = {k: v / payload for k, v in probe.items()}
    res["probe_vs_torch"] = {r["direction"]: probe[r["direction"]] / r["bandwidth_gbps"]
                             for r in plain if r["direction"] in probe}
    return res


# ------------------------------------------------------------------------------------------------
# the run


def _python(args: list[str]) -> list[str]:
    return [sys.executable, *args]


def plan(out: Path, device: int) -> list[dict[str, Any]]:
    """The steps in order, with the command lines of those that run as subprocesses."""
    return [
        {"name": "nvml", "what": "record this machine's NVML answers", "files": ["nvml_snapshot.json"]},
        {"name": "selftest", "argv": _python(["-m", "probes.gpu_selftest", "--out",
                                              str(out / "selftest"), "--device", str(device)]),
         "timeout_s": STEP_TIMEOUT_S["selftest"]},
        {"name": "topology", "argv": _python(["-m", "pcieprof", "topology", "--backend", "cuda",
                                              "--quick", "--devices", str(device), "--out",
                                              str(out / "topology"), "--force"]),
         "timeout_s": STEP_TIMEOUT_S["topology"]},
        {"name": "copies_vs_torch", "what": "torch copy loop, NVML link under load, ratios",
         "files": ["copies.json"]},
        {"name": "decode_trace", "what": f"{DECODE_STEPS} decode steps, eager and CUDA graph",
         "files": ["decode/eager.trace.json.gz", "decode/graph.trace.json.gz"]},
        {"name": "attribute", "argv": _python(["-m", "pcieprof", "attribute", "TRACE", "--out",
                                               "DIR", "--force"]),
         "timeout_s": STEP_TIMEOUT_S["attribute"], "files": ["attribution-eager", "attribution-graph"]},
    ]


@contextmanager
def _step(report: dict[str, Any], name: str) -> Iterator[dict[str, Any]]:
    rec: dict[str, Any] = {"status": "ok"}
    report["steps"][name] = rec
    t0 = time.monotonic()
    try:
        yield rec
    except Exception as exc:  # noqa: BLE001 - a proof reports every failure and carries on
        rec.update(status="failed", why=f"{type(exc).__name__}: {exc}")
    finally:
        rec["seconds"] = round(time.monotonic() - t0, 2)
        print(f"{name}: {rec['status']}{' ' + rec['why'] if rec.get('why') else ''} "
              f"({rec['seconds']:.0f} s)", flush=True)


def _subprocess(rec: dict[str, Any], argv: list[str], timeout_s: float, log: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        proc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                              timeout=timeout_s)
    rec.update(argv=argv, returncode=proc.returncode, log=log.name)
    if proc.returncode != 0:
        rec.update(status="failed", why=f"exit {proc.returncode} (see {log.name})")


def _attribute(rec: dict[str, Any], out: Path, kind: str, trace: Path) -> None:
    dest = out / f"attribution-{kind}"
    _subprocess(rec, _python(["-m", "pcieprof", "attribute", str(trace), "--out", str(dest),
                              "--force"]), STEP_TIMEOUT_S["attribute"], out / f"attribute-{kind}.log")
    if rec["status"] != "ok":
        return
    doc = json.loads((dest / "attribution.json").read_text())
    check = check_attribution(trace, doc)
    rec[kind] = check
    if check["problems"] and check["gpu_events"]:
        rec.update(status="failed", why="; ".join(check["problems"]))


def run(out: Path, device: int) -> int:
    """Every step on the GPU; proof.json and the files under `out`. Exit status 0 when all passed."""
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA ordinals = NVML indices
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"device": device, "started": time.time(), "steps": {},
                              "torch": torch.__version__, "cuda": torch.version.cuda}
    t0 = time.monotonic()
    steps = {s["name"]: s for s in plan(out, device)}
    with _step(report, "nvml") as rec:
        from pcieprof.discover.nvml_snapshot import record_snapshot

        (out / "nvml_snapshot.json").write_text(json.dumps(record_snapshot(), indent=1))
    for name in ("selftest", "topology"):
        with _step(report, name) as rec:
            _subprocess(rec, steps[name]["argv"], steps[name]["timeout_s"], out / f"{name}.log")
    with _step(report, "copies_vs_torch") as rec:
        rec.update(compare_copies(out, device, device))
        (out / "copies.json").write_text(json.dumps(rec, indent=1))
    traces: dict[str, Path] = {}
    with _step(report, "decode_trace") as rec:
        for kind in ("eager", "graph"):
            traces[kind] = out / "decode" / f"{kind}.trace.json.gz"
            rec[kind] = decode_trace(traces[kind], torch.device("cuda", device),
                                     graph=kind == "graph")
    with _step(report, "attribute") as rec:
        for kind, trace in traces.items():
            _attribute(rec, out, kind, trace)
    report["wall_s"] = round(time.monotonic() - t0, 1)
    failed = [k for k, v in report["steps"].items() if v["status"] != "ok"]
    report["failed"] = failed
    (out / "proof.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"gpu_proof: {'ok' if not failed else 'FAILED ' + ', '.join(failed)} "
          f"({report['wall_s']:.0f} s; {out})", flush=True)
    return 0 if not failed else 1


def check(out: Path, device: int) -> int:
    """No GPU: import everything, write the plan, decode and attribute on the CPU."""
    out.mkdir(parents=True, exist_ok=True)
    import pcieprof.discover.nvml_snapshot  # noqa: F401
    import pcieprof.sim.model  # noqa: F401
    import probes.gpu_selftest  # noqa: F401

    steps = plan(out, device)
    (out / "plan.json").write_text(json.dumps(steps, indent=1))
    for s in steps:
        print(f"plan: {s['name']:<16} {' '.join(s.get('argv', [])) or s.get('what', '')}")
    report: dict[str, Any] = {"check": True, "steps": {}}
    trace = out / "decode" / "cpu.trace.json.gz"
    with _step(report, "decode_trace") as rec:
        rec.update(decode_trace(trace, torch.device("cpu"), graph=False, steps=2))
    with _step(report, "attribute") as rec:
        if report["steps"]["decode_trace"]["status"] == "ok":
            _attribute(rec, out, "cpu", trace)
    (out / "proof.json").write_text(json.dumps(report, indent=1, default=str))
    failed = [k for k, v in report["steps"].items() if v["status"] != "ok"]
    print(f"gpu_proof --check: {'ok' if not failed else 'FAILED ' + ', '.join(failed)}")
    return 0 if not failed else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="where everything is written")
    ap.add_argument("--device", type=int, default=0, help="NVML index of the GPU")
    ap.add_argument("--check", action="store_true",
                    help="no GPU: import, plan, and decode + attribute on the CPU")
    args = ap.parse_args(argv)
    return check(args.out, args.device) if args.check else run(args.out, args.device)


if __name__ == "__main__":
    sys.exit(main())

"""One command, on a machine with one NVIDIA GPU, that runs every CUDA path of pcieprof one GPU can
reach and writes everything under --out (issue 17: the first proof on real hardware; issue 23:
what one GPU can prove, under one deadline).

    python -m probes.gpu_proof --out DIR [--device 0] [--wheels WHEELS] [--check]

The whole run has one deadline (DEADLINE_S, under the 600 s a command may take on the lent
machine); each subprocess step gets what is left of it at most, and a step that cannot start in
time is recorded as `not_run`. DIR/proof.json is rewritten after every step, and DIR/proof.tar.gz
(everything else under DIR, one file to bring back) with it, so a run cut short still leaves what
it did.

Steps (each recorded in DIR/proof.json with its status, seconds and files; a step that fails does
not stop the others; exit 0 only when every step passed):
0. `deps`: plotly (the report), ijson and orjson (the trace reader) where they are missing,
   installed from the wheels given with --wheels into DIR/deps (pip --no-index: nothing is
   fetched); a step whose modules are still missing is `not_run` and says which. Wheels for the
   machine (x86-64, Python 3.12), made where there is a network:
   `pip download --only-binary=:all: --platform manylinux2014_x86_64 --python-version 3.12
   -d WHEELS plotly ijson orjson`.
1. `nvml`: this machine's NVML answers, recorded for replay (pcieprof.discover.nvml_snapshot)
   -> nvml_snapshot.json, a test fixture to commit.
2. `selftest`: `python -m pcieprof.selftest` -> selftest/ (NVML reads, h2d/d2h through the
   probe's CudaCopier with the data check, the one-rank NCCL all-reduce sweep with
   NCCL_DEBUG=INFO parsed, in a bundle).
3. `one_gpu`: what one GPU proves of the paths that need two (one_gpu.json): a same-device
   cudaMemcpyPeerAsync through the probe's libcudart call with the data check,
   nvmlDeviceGetP2PStatus(h, h) for each capability topology.json records (read, write,
   nvlink, atomics), and the all-reduce timing loop captured in a CUDA graph (warm-up on a side
   stream, as torch.cuda.graphs asks) timed against its eager form; the step fails on wrong
   bytes, an NVML that does not start, or a time that is not positive. With one rank NCCL takes its one-rank path (an in-place sum is a no-op), so those times
   are of an empty operation: they prove the capture and the timing, not a fabric.
3b. `host_flag`: the release of timed copy rounds (issue 23 pt 7; probes/host_flag.py): a stream
   waits on the pinned host word (cuStreamWaitValue32), an event behind the wait must still be
   pending 50 ms later and complete once the host writes the word, with the device's
   acknowledgement bounding the anchor's lag; then the probe's CudaCopier times an h2d latency
   case released by the flag (host_flag.json; `release` must be host_flag, the data check pass).
4. `topology`: `pcieprof topology --backend cuda --quick` on the GPU -> topology/ (NVML
   discovery of a real device, h2d/d2h copies; one GPU has no all-reduce in that plan).
5. `copies_vs_torch`: the same h2d/d2h copies as a plain torch loop timed the same way (pinned
   host memory, stream held by a spin kernel, CUDA events), the link's generation and width read
   by NVML while that loop runs, and each figure's ratio to the link's raw and payload rate
   (pcieprof.sim.model: 128b/130b coding, then TLP framing at 256 B payloads and a fitted DLLP
   share) -> copies.json.
6. `decode_trace`: a small decoder-only transformer (defined here) decodes DECODE_STEPS tokens
   under torch.profiler with CPU and CUDA activities, eagerly and as CUDA graph replays ->
   decode/{eager,graph}.trace.json.gz.
7. `attribute`: `pcieprof attribute` on each trace -> attribution-{eager,graph}/; checks that every
   GPU event is counted in a class (none ignored, the class counts adding up to the trace's GPU
   events) and that the busy time (the union over all classes) is within 1% of a union of the
   trace's kernel, memcpy and memset intervals computed here from the raw JSON.

`--check` (no GPU needed): imports everything, prints and writes the plan (plan.json), runs the
decoder for two steps on the CPU under the profiler and attributes that trace, under the same
deadline and with proof.json after each step, so that on the GPU machine only the GPU can be
wrong.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from probes.gpu_api import CudaApi

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
#: Seconds the whole proof may take: under the lent machine's 600 s per command, with room for
#: its start and for bringing the files back.
DEADLINE_S = 330.0
#: Seconds each subprocess step may take at most (less when less of the deadline is left).
STEP_TIMEOUT_S = {"selftest": 120, "topology": 120, "attribute": 60}
#: Seconds a step needs at least; with less of the deadline left it is not started (`not_run`).
MIN_STEP_S = 10.0
#: Modules a step needs that the lent machine lacks (issue 23 pt 9); `deps` installs them.
NEEDS = {"topology": ("plotly",), "attribute": ("ijson", "orjson")}


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
    from pcieprof.discover.nvml import LinkSampler
    from pcieprof.sim.fabric import raw_link_gbps
    from pcieprof.sim.model import link_gbps

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
        {"name": "deps", "what": "plotly, ijson, orjson from --wheels where missing (pip "
                                 "--no-index)", "files": ["deps/"]},
        {"name": "nvml", "what": "record this machine's NVML answers", "files": ["nvml_snapshot.json"]},
        {"name": "selftest", "argv": _python(["-m", "pcieprof.selftest", "--out",
                                              str(out / "selftest"), "--device", str(device)]),
         "timeout_s": STEP_TIMEOUT_S["selftest"]},
        {"name": "one_gpu", "what": "same-device peer copy with the data check, "
                                    "nvmlDeviceGetP2PStatus(h, h), the all-reduce loop as a CUDA "
                                    "graph vs eager", "files": ["one_gpu.json"]},
        {"name": "host_flag", "what": "a stream held by the pinned host flag until the host "
                                      "writes it; the copier's rounds released by it",
         "files": ["host_flag.json"]},
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


class Proof:
    """proof.json and proof.tar.gz of one run, rewritten after every step, and the deadline."""

    def __init__(self, out: Path, report: dict[str, Any], deadline_s: float = DEADLINE_S) -> None:
        self.out, self.report = out, report
        self.t0 = time.monotonic()
        self.deadline = self.t0 + deadline_s
        report.setdefault("steps", {})
        report["deadline_s"] = deadline_s

    def left(self) -> float:
        """Seconds left before the deadline."""
        return self.deadline - time.monotonic()

    @contextmanager
    def step(self, name: str) -> Iterator[dict[str, Any]]:
        """Run one step (the body) and record it; a step that would start past the deadline, or
        needs a module that is missing (NEEDS), is recorded as not_run and its body skipped
        (the caller checks `rec["status"] == "not_run"`)."""
        rec: dict[str, Any] = {"status": "ok"}
        self.report["steps"][name] = rec
        missing = [m for m in NEEDS.get(name, ()) if importlib.util.find_spec(m) is None]
        if self.left() < MIN_STEP_S:
            rec.update(status="not_run", why=f"the proof's {DEADLINE_S:g} s deadline was reached")
        elif missing:
            rec.update(status="not_run", why=f"needs {', '.join(missing)} (not installed here: "
                                             "bring its wheel with --wheels)")
        t0 = time.monotonic()
        try:
            yield rec
        except Exception as exc:  # noqa: BLE001 - a proof reports every failure and carries on
            rec.update(status="failed", why=f"{type(exc).__name__}: {exc}")
        finally:
            rec["seconds"] = round(time.monotonic() - t0, 2)
            print(f"{name}: {rec['status']}{' ' + rec['why'] if rec.get('why') else ''} "
                  f"({rec['seconds']:.0f} s; {max(0.0, self.left()):.0f} s left)", flush=True)
            self.save()

    def save(self) -> None:
        """proof.json, then proof.tar.gz of everything under the output directory."""
        self.report["wall_s"] = round(time.monotonic() - self.t0, 1)
        self.report["failed"] = [k for k, v in self.report["steps"].items()
                                 if v["status"] != "ok"]
        (self.out / "proof.json").write_text(json.dumps(self.report, indent=1, default=str))
        tmp = self.out / "proof.tar.gz.part"
        with tarfile.open(tmp, "w:gz") as tar:
            for f in sorted(self.out.rglob("*")):
                if f.is_file() and f.name not in ("proof.tar.gz", tmp.name) \
                        and "deps" not in f.relative_to(self.out).parts:
                    tar.add(f, arcname=str(f.relative_to(self.out)))
        tmp.replace(self.out / "proof.tar.gz")

    def timeout(self, step_s: float) -> float:
        """A subprocess step's timeout: its own, or what is left of the deadline."""
        return max(1.0, min(step_s, self.left() - 5.0))


def _subprocess(rec: dict[str, Any], argv: list[str], timeout_s: float, log: Path) -> None:
    """Run one step's command in its own session; past `timeout_s` the whole session (torchrun
    and its workers too) is killed and the step fails."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rec.update(argv=argv, returncode=None, log=log.name, status="failed",
                       why=f"killed after {timeout_s:.0f} s (the proof's deadline; see {log.name})")
            return
    rec.update(argv=argv, returncode=proc.returncode, log=log.name)
    if proc.returncode != 0:
        rec.update(status="failed", why=f"exit {proc.returncode} (see {log.name})")


def _attribute(rec: dict[str, Any], out: Path, kind: str, trace: Path, timeout_s: float) -> None:
    dest = out / f"attribution-{kind}"
    _subprocess(rec, _python(["-m", "pcieprof", "attribute", str(trace), "--out", str(dest),
                              "--force"]), timeout_s, out / f"attribute-{kind}.log")
    if rec["status"] != "ok":
        return
    doc = json.loads((dest / "attribution.json").read_text())
    check = check_attribution(trace, doc)
    rec[kind] = check
    if check["problems"] and check["gpu_events"]:
        rec.update(status="failed", why="; ".join(check["problems"]))


def install_wheels(wheels: Path | None, target: Path) -> dict[str, Any]:
    """Install the NEEDS modules that are missing from the wheels in `wheels` (pip --no-index,
    their dependencies from the same folder) into `target`, and put `target` on this process's
    and its subprocesses' path. Returns what was missing, installed and still missing."""
    wanted = sorted({m for mods in NEEDS.values() for m in mods
                     if importlib.util.find_spec(m) is None})
    rec: dict[str, Any] = {"missing": wanted, "wheels": str(wheels) if wheels else None}
    if wanted and wheels is not None:
        target.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index",
                               "--find-links", str(wheels), "--target", str(target), *wanted],
                              capture_output=True, text=True, timeout=120)
        rec["pip_returncode"] = proc.returncode
        if proc.returncode != 0:
            rec["pip_output"] = proc.stdout[-2000:] + proc.stderr[-2000:]
        sys.path.insert(0, str(target))
        os.environ["PYTHONPATH"] = os.pathsep.join([str(target)] + [
            p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        importlib.invalidate_caches()
    rec["still_missing"] = [m for m in wanted if importlib.util.find_spec(m) is None]
    return rec


def one_gpu(device: int, *, api: CudaApi | None = None, rt: Any = None, nvml: Any = None,
            backend: str = "nccl") -> dict[str, Any]:
    """What one GPU proves of the paths that need two (see the module docstring, step 3);
    `problems` lists what failed.

    Args:
        device: CUDA ordinal (= NVML index: the proof sets CUDA_DEVICE_ORDER=PCI_BUS_ID).
        api: the CUDA calls (default: torch.cuda; tests pass builders.cuda.CudaStandin).
        rt: the peer-copy runtime (default: probes.gpu_api.Cudart, the copy probe's call).
        nvml: the NVML wrapper (default: pcieprof.discover.nvml.Nvml over pynvml; tests replay
            a snapshot).
        backend: the process group of the timed loop (nccl; gloo where there is no GPU).
    """
    from pcieprof.discover.nvml import Nvml
    from probes.gpu_api import Cudart, TorchCuda

    api = api or TorchCuda()
    res: dict[str, Any] = {
        "same_device_peer_copy": same_device_copy(device, api, rt if rt is not None else Cudart()),
        "nvml_p2p_status_self": p2p_status_self(device, nvml if nvml is not None else Nvml()),
        "allreduce_one_rank_16KiB": one_rank_loop(device, api, backend)}
    problems = []
    if not res["same_device_peer_copy"]["data_check"]:
        problems.append("the same-device peer copy moved wrong bytes")
    status = res["nvml_p2p_status_self"]
    if "nvml" in status:
        problems.append(f"NVML: {status['nvml']}")
    loop = res["allreduce_one_rank_16KiB"]
    if not all(t > 0 for k in ("time_us_eager", "time_us_graph") for t in loop[k]):
        problems.append("the timed all-reduce loop gave a time that is not positive")
    res["problems"] = problems
    return res


def same_device_copy(device: int, api: CudaApi, rt: Any, nbytes: int = 4 * 1024 * 1024,
                     seed: int = 7) -> dict[str, Any]:
    """A peer copy from `device` to itself through the copy probe's call (`rt.memcpy_peer`,
    cudaMemcpyPeerAsync), into a buffer poisoned first: `data_check` is whether every byte of
    the pattern landed."""
    from probes.pattern import matches, pattern, poison

    src = api.empty(nbytes, device)
    src.copy_(pattern(nbytes, seed, src.device))
    dst = poison(api.empty(nbytes, device), nbytes, seed)
    stream = api.new_stream(device)
    # the fills ran on the current stream, which the copy's stream is not ordered with
    api.synchronize(device)
    rt.memcpy_peer(dst, src, nbytes, stream)
    api.synchronize(device)
    return {"bytes": nbytes, "data_check": matches(dst, nbytes, seed)}


def p2p_status_self(device: int, nvml: Any) -> dict[str, Any]:
    """nvmlDeviceGetP2PStatus(h, h, cap) for each capability topology.json records, named as
    `nvidia-smi topo -p2p` prints them (OK, NS, ...); a call NVML refuses is recorded as its
    status (the one NVML wrapper). `{"nvml": why}` when NVML does not start."""
    from pcieprof.discover.nvml import P2P_CAPS, P2P_STATUS, Missing

    if nvml.init() != "ok":
        return {"nvml": nvml.status}
    try:
        h = nvml.handle(device)
        if isinstance(h, Missing):
            return {"nvml": f"no handle for device {device}: {h.status}"}
        out: dict[str, Any] = {}
        # P2P_CAPS, not pynvml's constants: nvidia-ml-py 13.x defines one of them as a tuple
        for cap, idx in P2P_CAPS.items():
            v = nvml.call("nvmlDeviceGetP2PStatus", h, h, idx)
            out[cap] = v.status if isinstance(v, Missing) else P2P_STATUS.get(int(v), f"U ({v})")
        return out
    finally:
        nvml.shutdown()


def one_rank_loop(device: int, api: CudaApi, backend: str = "nccl") -> dict[str, Any]:
    """The all-reduce timing loop on a one-rank group, eager and captured in a CUDA graph, as
    probes.allreduce_worker times it (one rank: NCCL's one-rank path, an empty operation)."""
    import datetime

    import torch.distributed as dist

    from probes.allreduce_worker import time_back_to_back, time_graph

    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60),
                            device_id=torch.device("cuda", device) if backend == "nccl" else None)
    try:
        x = api.empty(16 * 1024, device).view(torch.bfloat16).fill_(1)
        eager = time_back_to_back(lambda: dist.all_reduce(x), 20, 3, api=api, device=device)
        graph = time_graph(lambda: dist.all_reduce(x), 20, 3, api=api, device=device)
    finally:
        dist.destroy_process_group()
    return {"time_us_eager": [t * 1e6 for t in eager], "time_us_graph": [t * 1e6 for t in graph],
            "note": "one rank: NCCL's one-rank path, an empty operation; proves the capture and "
                    "the timing only"}


def host_flag_proof(device: int) -> dict[str, Any]:
    """The host flag on one GPU (see the module docstring, step 3b); `problems` lists what failed."""
    from probes.host_flag import DriverHostFlag
    from probes.p2p_worker import CudaCopier, p2p_row
    from pcieprof.bundle.plan import P2PCase, Plan

    res: dict[str, Any] = {}
    flag = DriverHostFlag([device])
    res["memops"] = flag.version
    stream = torch.cuda.Stream(device=device)
    ev = torch.cuda.Event(enable_timing=True)
    flag.wait(stream, 1)
    ev.record(stream)
    flag.ack(stream, 1)
    time.sleep(0.05)
    res["held_before_write"] = not ev.query()
    bounds = flag.release(1)
    ev.synchronize()
    res["released_after_write"] = ev.query()
    res["release_to_anchor_us_max"] = bounds.get(device)
    flag.close()
    case = P2PCase(-1, device, "h2d", "uni", "latency", 8, 200, 3)
    copier = CudaCopier(Plan(backend="cuda", devices=[device], p2p=[case]))
    times, ok, detail = copier.run_p2p(0, case)
    res["copier"] = {**p2p_row(case, "cuda", times), "release": copier.release,
                     "why": copier.flag_why, "data_check": ok, "detail": detail}
    copier.close()
    problems = [k for k in ("held_before_write", "released_after_write") if not res[k]]
    if copier.release != "host_flag":
        problems.append(f"the copier fell back to the gate event: {copier.flag_why}")
    if not ok:
        problems.append("the h2d copies moved wrong bytes")
    res["problems"] = problems
    return res


def run(out: Path, device: int, wheels: Path | None = None) -> int:
    """Every step on the GPU; proof.json and the files under `out`. Exit status 0 when all passed."""
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA ordinals = NVML indices
    out.mkdir(parents=True, exist_ok=True)
    proof = Proof(out, {"device": device, "started": time.time(), "steps": {},
                        "torch": torch.__version__, "cuda": torch.version.cuda})
    steps = {s["name"]: s for s in plan(out, device)}
    with proof.step("deps") as rec:
        if rec["status"] != "not_run":
            rec.update(install_wheels(wheels, out / "deps"))
            if rec["still_missing"]:
                rec.update(status="failed", why=f"missing {', '.join(rec['still_missing'])}")
    with proof.step("nvml") as rec:
        if rec["status"] != "not_run":
            from pcieprof.discover.nvml_snapshot import record_snapshot

            (out / "nvml_snapshot.json").write_text(json.dumps(record_snapshot(), indent=1))
    with proof.step("selftest") as rec:
        if rec["status"] != "not_run":
            _subprocess(rec, steps["selftest"]["argv"],
                        proof.timeout(steps["selftest"]["timeout_s"]), out / "selftest.log")
    with proof.step("one_gpu") as rec:
        if rec["status"] != "not_run":
            rec.update(one_gpu(device))
            (out / "one_gpu.json").write_text(json.dumps(rec, indent=1, default=str))
            if rec["problems"]:
                rec.update(status="failed", why="; ".join(rec["problems"]))
    with proof.step("host_flag") as rec:
        if rec["status"] != "not_run":
            rec.update(host_flag_proof(device))
            (out / "host_flag.json").write_text(json.dumps(rec, indent=1, default=str))
            if rec["problems"]:
                rec.update(status="failed", why="; ".join(rec["problems"]))
    with proof.step("topology") as rec:
        if rec["status"] != "not_run":
            _subprocess(rec, steps["topology"]["argv"],
                        proof.timeout(steps["topology"]["timeout_s"]), out / "topology.log")
    with proof.step("copies_vs_torch") as rec:
        if rec["status"] != "not_run":
            rec.update(compare_copies(out, device, device))
            (out / "copies.json").write_text(json.dumps(rec, indent=1))
    traces: dict[str, Path] = {}
    with proof.step("decode_trace") as rec:
        if rec["status"] != "not_run":
            for kind in ("eager", "graph"):
                traces[kind] = out / "decode" / f"{kind}.trace.json.gz"
                rec[kind] = decode_trace(traces[kind], torch.device("cuda", device),
                                         graph=kind == "graph")
    with proof.step("attribute") as rec:
        if rec["status"] != "not_run":
            for kind, trace in traces.items():
                _attribute(rec, out, kind, trace, proof.timeout(STEP_TIMEOUT_S["attribute"]))
    failed = proof.report["failed"]
    print(f"gpu_proof: {'ok' if not failed else 'FAILED ' + ', '.join(failed)} "
          f"({proof.report['wall_s']:.0f} s; {out})", flush=True)
    return 0 if not failed else 1


def check(out: Path, device: int, wheels: Path | None = None) -> int:
    """No GPU: import everything, write the plan, decode and attribute on the CPU, under the
    same deadline, proof.json and proof.tar.gz after each step."""
    out.mkdir(parents=True, exist_ok=True)
    proof = Proof(out, {"check": True, "steps": {}})
    with proof.step("deps") as rec:
        if rec["status"] != "not_run":
            rec.update(install_wheels(wheels, out / "deps"))
    with proof.step("imports") as rec:
        if rec["status"] != "not_run":
            import pcieprof.discover.nvml_snapshot  # noqa: F401
            import pcieprof.sim.model  # noqa: F401
            import probes.allreduce_worker  # noqa: F401
            import probes.host_flag  # noqa: F401
            import probes.p2p_worker  # noqa: F401

            steps = plan(out, device)
            (out / "plan.json").write_text(json.dumps(steps, indent=1))
            for s in steps:
                print(f"plan: {s['name']:<16} {' '.join(s.get('argv', [])) or s.get('what', '')}")
    trace = out / "decode" / "cpu.trace.json.gz"
    with proof.step("decode_trace") as rec:
        if rec["status"] != "not_run":
            rec.update(decode_trace(trace, torch.device("cpu"), graph=False, steps=2))
    with proof.step("attribute") as rec:
        if rec["status"] != "not_run" and proof.report["steps"]["decode_trace"]["status"] == "ok":
            _attribute(rec, out, "cpu", trace, proof.timeout(STEP_TIMEOUT_S["attribute"]))
    failed = proof.report["failed"]
    print(f"gpu_proof --check: {'ok' if not failed else 'FAILED ' + ', '.join(failed)} "
          f"({proof.report['wall_s']:.0f} s)")
    return 0 if not failed else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="where everything is written")
    ap.add_argument("--device", type=int, default=0, help="NVML index of the GPU")
    ap.add_argument("--wheels", type=Path, default=None,
                    help="a folder of wheels (plotly, ijson, orjson) for what is missing here")
    ap.add_argument("--check", action="store_true",
                    help="no GPU: import, plan, and decode + attribute on the CPU")
    args = ap.parse_args(argv)
    return (check(args.out, args.device, args.wheels) if args.check
            else run(args.out, args.device, args.wheels))


if __name__ == "__main__":
    sys.exit(main())

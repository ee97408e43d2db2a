#!/usr/bin/env python
"""Write synthetic PyTorch-profiler (Kineto) traces of TP decode, as large as asked.

The shape follows a real SGLang/torch TP8 decode trace: per decode step a `ProfilerStep#N` span
(or, with --graphs, one cudaGraphLaunch per step, as under CUDA graphs), per layer the CPU op,
its cudaLaunchKernel runtime event and the kernel (RMSNorm, GEMMs, attention, MoE) on the compute
stream, and two NCCL all-reduce kernels per layer on a separate stream, with the collective args
Kineto records (`Collective name`, `In msg nelems`, `Group size`, `Process Group Ranks`). Ranks
differ by a random skew, so that cross-rank wait shows up. `distributedInfo` is written after
`traceEvents` (as some writers do). The events are generated and written one by one, so memory
stays flat whatever --target-mb. The output is SYNTHETIC: for benchmarks and tests, never results.

    python benchmarks/make_synthetic_trace.py --out /tmp/syn --ranks 2 --target-mb 1000
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path
from typing import IO, Any

# (name, mean duration us) of the compute kernels of one layer, in launch order; "AR" marks
# where the all-reduce after attention and after the MoE go.
LAYER = [
    ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16 const*, unsigned int, unsigned int, unsigned int, float, float)", 4.0),
    ("sm120_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_stage4_warpsize2x2x1_tensor16x8x16_kernel", 14.0),
    ("void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0, 4u, 1u, 8u, 16u, 1u, 8u, flashinfer::DefaultAttention<false, false, false, false>, flashinfer::PagedParams>(flashinfer::PagedParams)", 22.0),
    ("sm120_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x32x64_stage5_warpsize2x1x1_tensor16x8x16_kernel", 9.0),
    ("AR", 0.0),
    ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16 const*, unsigned int, unsigned int, unsigned int, float, float)", 4.0),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)", 3.0),
    ("void moe_align_block_size_kernel<int>(int const*, int*, int*, int*, int, int, int, unsigned long)", 5.0),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int> >, nvfp4_moe_gemm1>>(cutlass::gemm::kernel::Params)", 38.0),
    ("void silu_and_mul_kernel<__nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16 const*, int)", 3.0),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<cutlass::gemm::GroupProblemShape<cute::tuple<int, int, int> >, nvfp4_moe_gemm2>>(cutlass::gemm::kernel::Params)", 30.0),
    ("AR", 0.0),
]
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
CPU_OPS = {"AR": "c10d::allreduce_"}


class Writer:
    """Writes events into the traceEvents array of one file, counting bytes."""

    def __init__(self, f: IO[str]) -> None:
        self.f = f
        self.first = True
        self.bytes = 0

    def event(self, ev: dict[str, Any]) -> None:
        s = ("" if self.first else ",\n") + "  " + json.dumps(ev, separators=(", ", ": "))
        self.first = False
        self.f.write(s)
        self.bytes += len(s)


def write_rank(path: Path, rank: int, world: int, target_bytes: int, layers: int, batch: int,
               hidden: int, graphs: bool, seed: int, gz: bool) -> dict[str, Any]:
    """Write one rank's trace of about `target_bytes`; return what was written."""
    rng = random.Random(seed * 1000 + rank)
    opener = gzip.open if gz else open
    pid, main_tid, gpu_pid, s_comp, s_comm = 1000 + rank, 1000 + rank, rank, 7, 20 + rank
    # Real traces carry large ids (Kineto counts from process start); small ones would also make
    # HTA 0.5.0 downcast the column to int16 and fail on pandas 3.
    corr = 5_000_000
    ext = 5_000_000
    t_cpu = 1_700_000_000_000.0 + rank * 3.0
    t_gpu = t_cpu + 50.0
    nelems = batch * hidden
    ranks = "[" + ", ".join(str(r) for r in range(world)) + "]"
    steps = kernels = comm = 0
    with opener(path, "wt", encoding="utf-8") as f:  # type: ignore[operator]
        f.write('{\n  "schemaVersion": 1,\n  "deviceProperties": [{"id": %d, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition (synthetic)", "computeMajor": 12, "computeMinor": 0, "numSms": 188}],\n  "displayTimeUnit": "ms",\n  "traceEvents": [\n' % rank)
        w = Writer(f)
        while w.bytes < target_bytes:
            step_t0 = t_cpu
            if graphs:
                w.event({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": pid,
                         "tid": main_tid, "ts": round(t_cpu, 3), "dur": 12.5,
                         "args": {"External id": ext, "cbid": 311, "correlation": corr}})
                graph_corr = corr
                corr += 1
                ext += 1
                t_cpu += 14.0
            for layer in range(layers):
                for name, mean in LAYER:
                    is_ar = name == "AR"
                    if not graphs:
                        op = CPU_OPS.get(name, "aten::mm" if "gemm" in name else "aten::empty_like")
                        w.event({"ph": "X", "cat": "cpu_op", "name": op, "pid": pid, "tid": main_tid,
                                 "ts": round(t_cpu, 3), "dur": 9.0,
                                 "args": {"External id": ext, "Record function id": 0,
                                          "Ev Idx": ext}})
                        w.event({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                                 "pid": pid, "tid": main_tid, "ts": round(t_cpu + 2.0, 3),
                                 "dur": 4.5, "args": {"External id": ext, "cbid": 211,
                                                      "correlation": corr}})
                        t_cpu += 10.0
                    kcorr = graph_corr if graphs else corr
                    if is_ar:
                        # rank skew: the all-reduce starts when this rank arrives and ends when
                        # the slowest has; earlier ranks wait longer.
                        transfer = rng.uniform(18.0, 30.0)
                        wait = rng.expovariate(1 / 8.0)
                        dur = transfer + wait
                        args = {"External id": ext, "queued": 0, "device": rank, "context": 1,
                                "stream": s_comm, "correlation": kcorr,
                                "registers per thread": 96, "shared memory": 0,
                                "blocks per SM": 0.0425, "warps per SM": 0.68,
                                "grid": [8, 1, 1], "block": [544, 1, 1],
                                "est. achieved occupancy %": 0, "Collective name": "allreduce",
                                "In msg nelems": nelems, "Out msg nelems": nelems,
                                "Group size": world, "dtype": "BFloat16",
                                "In split size": "[]", "Out split size": "[]",
                                "Process Group Name": "0", "Process Group Description": "tp",
                                "Process Group Ranks": ranks}
                        w.event({"ph": "X", "cat": "kernel", "name": NCCL, "pid": gpu_pid,
                                 "tid": s_comm, "ts": round(t_gpu, 3), "dur": round(dur, 3),
                                 "args": args})
                        # a little of the next kernel overlaps the tail of the all-reduce
                        t_gpu += dur - min(2.0, dur * 0.05)
                        comm += 1
                    else:
                        dur = max(1.0, rng.gauss(mean, mean * 0.1))
                        w.event({"ph": "X", "cat": "kernel", "name": name, "pid": gpu_pid,
                                 "tid": s_comp, "ts": round(t_gpu, 3), "dur": round(dur, 3),
                                 "args": {"External id": ext, "queued": 0, "device": rank,
                                          "context": 1, "stream": s_comp, "correlation": kcorr,
                                          "registers per thread": 128, "shared memory": 49152,
                                          "blocks per SM": 1.0, "warps per SM": 8.0,
                                          "grid": [188, 1, 1], "block": [256, 1, 1],
                                          "est. achieved occupancy %": 12}})
                        t_gpu += dur + 1.5
                    kernels += 1
                    corr += 0 if graphs else 1
                    ext += 1
            # sampling / logits to host at the end of the step
            w.event({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)",
                     "pid": gpu_pid, "tid": s_comp, "ts": round(t_gpu, 3), "dur": 2.2,
                     "args": {"device": rank, "context": 1, "stream": s_comp,
                              "correlation": graph_corr if graphs else corr, "bytes": batch * 8}})
            if not graphs:
                w.event({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": pid,
                         "tid": main_tid, "ts": round(t_cpu, 3), "dur": 6.0,
                         "args": {"External id": ext, "cbid": 41, "correlation": corr}})
                corr += 1
            t_gpu += 60.0
            t_cpu = max(t_cpu + 30.0, t_gpu - 40.0)
            if not graphs:
                w.event({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{steps}",
                         "pid": pid, "tid": main_tid, "ts": round(step_t0, 3),
                         "dur": round(t_cpu - step_t0, 3), "args": {"External id": ext}})
            steps += 1
        f.write("\n  ],\n")
        f.write('  "distributedInfo": %s,\n' % json.dumps(
            {"backend": "nccl", "rank": rank, "world_size": world, "nccl_version": "2.27.5"}))
        f.write('  "traceName": "synthetic"\n}\n')
    return {"path": str(path), "rank": rank, "steps": steps, "kernels": kernels,
            "comm_kernels": comm, "json_bytes": w.bytes}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="directory for the trace files")
    ap.add_argument("--ranks", type=int, default=1, help="files to write (one per rank)")
    ap.add_argument("--world", type=int, default=8, help="world size written in the traces")
    ap.add_argument("--target-mb", type=float, default=1000.0, help="size of each file (MB of JSON)")
    ap.add_argument("--layers", type=int, default=78)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=6144)
    ap.add_argument("--graphs", action="store_true", help="CUDA-graph shape: one cudaGraphLaunch per step")
    ap.add_argument("--gzip", action="store_true", help="write .json.gz")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    done = []
    for r in range(a.ranks):
        name = f"synthetic-TP-{r}.trace.json" + (".gz" if a.gzip else "")
        info = write_rank(a.out / name, r, max(a.world, a.ranks), int(a.target_mb * 1e6),
                          a.layers, a.batch, a.hidden, a.graphs, a.seed, a.gzip)
        done.append(info)
        print(json.dumps(info))
    return done


if __name__ == "__main__":
    main()

"""What every TP rank does at startup: join the gloo group and load its model shard.

Rank 0 (the HTTP process) creates the rendezvous store on 127.0.0.1 with a port the kernel
picks, and starts ranks 1..N-1 as `python -m pcieprof.refserver.worker`; all join one gloo
process group (the TP group, for the model's collectives) and one more gloo group for the step
plans, as SGLang keeps a CPU group beside its device group.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from pcieprof.refserver.args import ServerArgs
from pcieprof.refserver.logs import rank_log
from pcieprof.refserver.model import TinyMoEConfig, TinyMoEModel, TPGroup

# Collectives never time out by themselves: a hang (injected or not) is the server's state, for
# the client's deadline to judge, and an idle server waits on the next plan indefinitely.
COLLECTIVE_TIMEOUT = timedelta(days=7)
RENDEZVOUS_TIMEOUT = timedelta(seconds=120)


def join_group(store: Any, rank: int, world_size: int) -> Any:
    """Join the gloo TP group (the default group) and create the CPU group for plans."""
    rank_log.info("Init torch distributed begin.")
    t0 = time.perf_counter()
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=COLLECTIVE_TIMEOUT)
    cpu_group = dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)
    rank_log.info(f"Init torch distributed ends. elapsed={time.perf_counter() - t0:.2f} s, "
                  f"backend=gloo, world_size={world_size}")
    return cpu_group


def load_model(args: ServerArgs, rank: int, world_size: int) -> TinyMoEModel:
    """Build this rank's shard (and raise here for --inject crash-on-start on the last rank)."""
    torch.set_num_threads(1)
    cfg = TinyMoEConfig()
    rank_log.info(f"Load weight begin. model={args.model_path}, tp_size={world_size}")
    t0 = time.perf_counter()
    if args.inject.kind == "crash-on-start" and rank == world_size - 1:
        rank_log.error("[pcieprof inject] crash-on-start: failing this rank while it loads "
                       "weights (injected fault)")
        raise RuntimeError("[pcieprof inject] crash-on-start: injected fault while loading "
                           f"weights on TP{rank}")
    if args.inject.kind == "unsupported-arch" and rank == world_size - 1:
        # The traceback ends in the line a real kernel raises (given by the fault matrix), so a
        # log reader sees what it would see from SGLang, labelled as injected.
        rank_log.error("[pcieprof inject] unsupported-arch: a kernel chosen by the launch flags "
                       "refuses this GPU architecture (injected fault)")
        raise RuntimeError(f"[pcieprof inject] {args.inject.line}")
    group = dist.group.WORLD if world_size > 1 else None
    model = TinyMoEModel(cfg, TPGroup(rank, world_size, group), args.random_seed,
                         args.context_length)
    params = sum(t.numel() for t in _tensors(model))
    rank_log.info(f"Load weight end. elapsed={time.perf_counter() - t0:.2f} s, "
                  f"type=TinyMoeForCausalLM, dtype=float32, params on this rank={params}, "
                  f"mem usage={params * 4 / 2**20:.1f} MiB.")
    return model


def _tensors(model: TinyMoEModel) -> list[torch.Tensor]:
    out = [model.embed, model.lm_head]
    for layer in model.layers:
        out.extend(layer.values())
    return out

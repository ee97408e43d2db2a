"""Run the pinned SGLang's own `initialize_model_parallel` for one layout and print the rank
groups it asks `init_model_parallel_group` for, as JSON (test-only; run as a script with the
SGLang install on PYTHONPATH, so its modules never enter the test process).

Nothing distributed starts: torch.distributed's "is initialised" and world size, SGLang's world
group, its parallel context (the widths of the layout) and the group constructor are stand-ins;
the rank arithmetic is SGLang's own.

    python tests/builders/sglang_groups.py TP,PP,EP,ATTN_DP ...
        -> {"TP,PP,EP,ATTN_DP": {"tp": [[0, 1, ...]], ...}, ...}
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any


def groups(tp: int, pp: int, ep: int, attn_dp: int) -> dict[str, list[list[int]]]:
    # the sampler's flag is read inside the function; its module imports kernels we lack
    sys.modules["sglang.srt.layers.sampler"] = types.SimpleNamespace(  # type: ignore[assignment]
        SYNC_TOKEN_IDS_ACROSS_TP=False)
    import sglang.srt.distributed.parallel_state as ps

    made: dict[str, list[list[int]]] = {}

    def init(group_ranks: list[list[int]], _local_rank: int, _backend: str,
             **kw: Any) -> Any:
        made[kw["group_name"]] = [list(g) for g in group_ranks]
        return types.SimpleNamespace(rank_in_group=0, pynccl_comm=None)

    widths = types.SimpleNamespace(
        tp_size=tp, pp_size=pp, moe_ep_size=ep, attn_dp_size=attn_dp, attn_cp_size=1,
        moe_dp_size=1, attn_dcp_size=1, shared_experts_tp_size=None,
        override_permanently=lambda **_kw: None)
    for name in dir(ps):  # the module's groups, built once per process: start afresh
        if name.startswith("_") and name.isupper() and getattr(ps, name) is not None and \
                type(getattr(ps, name)).__name__ in ("GroupCoordinator", "SimpleNamespace"):
            setattr(ps, name, None)
    ps.init_model_parallel_group = init
    ps.get_parallel = lambda: widths
    ps.get_world_group = lambda: types.SimpleNamespace(local_rank=0)
    ps.torch.distributed.is_initialized = lambda: True
    ps.torch.distributed.get_world_size = lambda *_a: tp * pp
    ps.initialize_model_parallel(backend="nccl")
    return made


if __name__ == "__main__":
    print(json.dumps({arg: groups(*(int(x) for x in arg.split(","))) for arg in sys.argv[1:]}))

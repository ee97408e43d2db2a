"""The communication of the published GLM-5 decode anchor (glm5-nvfp4.toml's [decode_anchor]),
priced with the fabric model of the box it ran on: how the anchor's `comm_ms` rows were made and
are checked (tests/tune/test_tune_anchor.py)."""

from __future__ import annotations

from pcieprof.analysis.comm_model import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, Layout, count_collectives
from pcieprof.cards import ModelCard
from pcieprof.sim import collectives
from pcieprof.sim.fabric import load_profile


def anchor_comm_ms(card: ModelCard, profile: str, env: dict[str, str], tp: int,
                   batch: int) -> float:
    """One decode step's communication (ms) at `batch` on the simulated `profile` with `env`,
    each collective priced as pcieprof.analysis.comm_model.Pricer prices it."""
    fabric = load_profile(profile)
    ranks = list(range(tp))
    total = 0.0
    for c in count_collectives(card, Layout(tp=tp), batch):
        size = c.size_bytes / 2 if c.op == ALL_TO_ALL else c.size_bytes
        t, _ = collectives.predict_allreduce(fabric, ranks, size, "bf16", env)
        assert c.op in (ALL_REDUCE, ALL_GATHER, ALL_TO_ALL), c.op
        total += (0.5 * t if c.op == ALL_GATHER else t) * c.count
    return total / 1e3

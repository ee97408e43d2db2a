"""The fabric model's assumed parameters that price an all-reduce, and each measured variant's
all-reduce time at the low and high end of each (topology.json `sim.assumed`).

A simulated bundle's gains rest on these numbers (calibration/params.toml kind "assumed": no
reference point constrains them). The tuner shows a recommendation's gain at both ends of every
one that moves it (pcieprof.tune.assumed), as the VM's like-for-like verdict does for
latency.iommu_us (pcieprof.sim.vm_cost.SENSITIVITY).

Not here, because no all-reduce reads them: pcie.read_efficiency and pcie.copy_setup_us (the
P2P copy runs only; p2p.csv's numbers rest on them).
"""

from __future__ import annotations

from typing import Any, Sequence

from pcieprof.sim import collectives, model
from pcieprof.sim.fabric import Fabric

#: (section, key, low, high, why that range). Where nothing bounds a guess, the range is half to
#: twice it (assumed, as the value itself is).
ASSUMED: tuple[tuple[str, str, float, float, str], ...] = (
    ("latency", "iommu_us", 0.0, 1.0,
     "0 (translation costs nothing beyond the bandwidth factor) to 1 us (an IOTLB miss walks a "
     "multi-level I/O page table, a few DRAM reads)"),
    ("latency", "host_copy_us", 1.25, 5.0, "half to twice the guess"),
    ("host_staged", "efficiency", 0.6, 1.0, "0.6 to 1.0 (staging cannot beat the slower leg)"),
    ("nccl", "ll128_step_us", 1.25, 5.0, "half to twice NCCL's PCI LL128 hwLat it was taken from"),
    ("nccl", "ll_channel_gbps", 6.5, 16.0,
     "6.5 (the least the LL calibration points need, params.toml) to twice the guess"),
    ("nccl", "ll128_channel_gbps", 5.0, 20.0, "half to twice the guess"),
    ("nccl", "tree_bw_factor", 0.25, 1.0, "half the guess to the ring's own bandwidth"),
)


def variant_times(fabric: Fabric, cases: Sequence[tuple[str, dict[str, str], list[int]]],
                  sizes: Sequence[int]) -> list[dict[str, Any]]:
    """Each case's all-reduce time at each size, at the low and high end of every ASSUMED
    parameter.

    Args:
        fabric: the box.
        cases: (variant name, NCCL environment, ranks) of the all-reduces the bundle holds.
        sizes: message sizes, bytes (the card's decode all-reduces).

    Returns:
        [{param, value, kind, why, low: {value, time_us: {variant: {size: us}}}, high: ...}].
    """
    out = []
    for section, key, low, high, why in ASSUMED:
        entry: dict[str, Any] = {"param": f"{section}.{key}",
                                 "value": model.params()[section][key], "kind": "assumed",
                                 "why": why}
        for end, value in (("low", low), ("high", high)):
            with model.params_with(section, key, value):
                entry[end] = {"value": value, "time_us": {
                    name: {str(s): collectives.predict_allreduce(fabric, ranks, s, "bf16", env)[0]
                           for s in sizes}
                    for name, env, ranks in cases}}
        out.append(entry)
    return out

"""A simulated gain at both ends of each assumed number it rests on (issue 22 point 7).

A simulated bundle's all-reduce times rest on the fabric model's assumed parameters; the
simulator stores each variant's time at the card's decode sizes at the low and high end of each
(topology.json `sim.assumed`, pcieprof.sim.assumed: latency.iommu_us, latency.host_copy_us,
host_staged.efficiency, nccl.ll128_step_us, nccl.ll_channel_gbps, nccl.ll128_channel_gbps,
nccl.tree_bw_factor). A recommendation measured as a variant of such a bundle says, for every
one that moves its gain, the mean decode-step gain at both ends: the verdict may turn.

The other assumed inputs of the tuner's pricing carry their range where they are used: the
layouts' anchor communication (pcieprof.tune.layout), the VM's like-for-like verdict
(pcieprof.analysis.vm_words), SGLang's default chunk when a card names none (the prefill
verdict at both ends of an assumed range: pcieprof.tune.workload.chunk_range), the GPU memory a
card assumes for a box that does not tell its own (nominal size down to NVML's total after the
driver's reservation: pcieprof.tune.layout.gpu_memory; the fit, KV room and concurrency at both
ends, pcieprof.tune.memory.Fit).
"""

from __future__ import annotations

from typing import Any, Callable

from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.bundle.recommendations import Recommendation
from pcieprof.bundle.topology import Topology

#: A gain moved less than this between the ends (ms per decode step) does not rest on it.
MOVES_MS = 0.01
#: How each line starts (recommend's console prints these caveats under the card).
RESTS_ON = "the gain rests on "


def gain_ranges(rec: Recommendation, variant: str, default: str, topology: Topology,
                band: DecodeBand, count: Callable[[int], int]) -> list[str]:
    """One line per assumed parameter that moves `rec`'s gain: the mean decode-step gain over
    the band's batches at its low and high end; [] for a bundle that stores none.

    Args:
        rec: the recommendation (its gain_ms_per_step, from the bundle's curves).
        variant, default: the allreduce.csv variants of the setting and of NCCL's default.
        topology: topology.json (its `sim.assumed`).
        band: the decode band (batch -> message size).
        count: batch -> all-reduces per decode step.
    """
    stored: list[dict[str, Any]] = list((topology.sim or {}).get("assumed") or [])
    batches = [b for b in band.batches]
    out = []
    for entry in stored:
        ends = []
        for end in ("low", "high"):
            times = (entry.get(end) or {}).get("time_us") or {}
            base, new = times.get(default) or {}, times.get(variant) or {}
            gains = [(base[str(s)] - new[str(s)]) * count(b) / 1000.0
                     for b in batches if str(s := band.message_bytes(b)) in base
                     and str(s) in new]
            if gains:
                ends.append((float(entry[end]["value"]), sum(gains) / len(gains)))
        if len(ends) == 2 and abs(ends[0][1] - ends[1][1]) > MOVES_MS:
            (lo, g_lo), (hi, g_hi) = ends
            out.append(f"{RESTS_ON}{entry['param']} = {entry['value']:g} (assumed, "
                       f"range {entry.get('why', '')}): mean decode-step gain {g_lo:+.2f} ms at "
                       f"{lo:g}, {g_hi:+.2f} ms at {hi:g}")
    return out

"""A VM mechanism: why a VM costs what it costs, as the fabric model states it and as
topology.json's `sim.vm.mechanisms` stores it; and a known issue, a failure a setting risks, as
`sim.vm.known_issues` (and nccl_choices.json's `model.known_risks`) store it.

One definition for both sides of the bundle: the sim (measure) builds it from a profile's
`[[mechanism]]` tables and writes it; analysis reads it back. Neither may import the other, so the
shape lives here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mechanism:
    """A named effect, in words, with its sources.

    `model` names the parameters or rules of the fabric model that carry it, so that a reader can
    go from the sentence to the number ("" in tables written before it was stored).
    """

    id: str
    title: str
    text: str = ""
    model: str = ""
    sources: tuple[str, ...] = ()


@dataclass(frozen=True)
class KnownIssue:
    """A failure reported in the wild for a setting on this kind of box (not modelled as time).

    `when` names the condition the model checks (`p2p_through_translating_iommu`: NCCL would
    use P2P on some ring edge while the IOMMU translates peer DMA). A profile's
    `[[known_issue]]` gives every field; nccl_choices.json's `model.known_risks` store only id,
    title, check and sources (the rest read as empty).
    """

    id: str
    when: str = ""
    title: str = ""
    text: str = ""
    check: str = ""
    sources: tuple[str, ...] = ()

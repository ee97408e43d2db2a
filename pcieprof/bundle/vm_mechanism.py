"""A VM mechanism: why a VM costs what it costs, as the fabric model states it and as
topology.json's `sim.vm.mechanisms` stores it.

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

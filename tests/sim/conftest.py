"""The fabric model's two calibrated boxes, as the sim tests use them."""

from __future__ import annotations

import pytest

from pcieprof.sim.fabric import Fabric, load_profile


@pytest.fixture(scope="module")
def vm() -> Fabric:
    """The rtxpro6000-8x-vm profile: 8 GPUs seen from a VM (flat tree, IOMMU translating)."""
    return load_profile("rtxpro6000-8x-vm")


@pytest.fixture(scope="module")
def bare() -> Fabric:
    """The rtxpro6000-8x-switch profile: its bare-metal twin behind PCIe switches."""
    return load_profile("rtxpro6000-8x-switch")

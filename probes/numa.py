"""Host memory next to a GPU: the GPU's NUMA node from sysfs, and running a block of code on that
node's CPUs so that the pages it touches first (a pinned host buffer) come from that node.

Linux places an anonymous page on the node of the CPU that first touches it (the default "local"
memory policy), and cudaHostAlloc touches and locks its pages in the calling thread, so allocating
a pinned buffer from a thread bound to the GPU's node puts the buffer there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SYSFS = Path("/sys")


def parse_cpulist(text: str) -> set[int]:
    """A sysfs cpulist ("0-3,8,10-11") as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def pci_numa_node(bus_id: str | None, sysfs: Path = SYSFS) -> int | None:
    """The NUMA node of a PCI device ("0000:1b:00.0"), or None when unknown (sysfs says -1 on
    machines with one node and in many VMs)."""
    if not bus_id:
        return None
    try:
        node = int((sysfs / "bus/pci/devices" / bus_id.lower() / "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def node_cpus(node: int, sysfs: Path = SYSFS) -> set[int]:
    """The CPUs of NUMA node `node` (empty when sysfs does not say)."""
    try:
        return parse_cpulist((sysfs / f"devices/system/node/node{node}/cpulist").read_text())
    except OSError:
        return set()


@contextmanager
def on_numa_node(node: int | None, sysfs: Path = SYSFS) -> Iterator[bool]:
    """Run the block with this thread bound to the CPUs of `node`; yields whether it was (no node,
    no CPUs of it allowed to this process: runs where it is). The previous binding comes back."""
    allowed = os.sched_getaffinity(0)
    cpus = node_cpus(node, sysfs) & allowed if node is not None else set()
    if not cpus:
        yield False
        return
    os.sched_setaffinity(0, cpus)
    try:
        yield True
    finally:
        os.sched_setaffinity(0, allowed)

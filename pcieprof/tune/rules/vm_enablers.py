"""In a VM, peer-to-peer between passed-through GPUs and their large BARs need the hypervisor
host's settings; the guest can only check them.

- GPUDirect clique (QEMU vfio-pci `x-nv-gpudirect-clique=N`, QEMU commit dfbee78d "vfio/pci: Add
  NVIDIA GPUDirect Cliques support"): in a VM the guest driver cannot see the physical topology,
  so without a clique hint it reports P2P as unsupported, and NCCL's NVML check in
  ncclTopoCheckP2p (NVIDIA/nccl src/graph/paths.cc) then keeps P2P off even with
  NCCL_P2P_LEVEL=SYS. Check: NVML's P2P status in the guest (`nvidia-smi topo -p2p r`).
- 64-bit MMIO window: every GPU's BAR1 must fit the guest firmware's 64-bit PCI window. OVMF sizes
  it from the guest's physical address width (QEMU `-cpu host,host-phys-bits=on`, libvirt
  `<maxphysaddr mode='passthrough'/>`) or from `-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=MiB`.
  Check: the BAR1 total NVML reports in the guest (topology.json `bar1_bytes`) against the card's
  own (analysis/gpus.toml `bar1_gib`).
Where both checks pass in the guest the rule says nothing: the host has set both.

The host's own IOMMU and ACS are pcieprof.tune.rules.iommu_acs.
"""

from __future__ import annotations

from pcieprof.analysis.box import GIB, gib, product
from pcieprof.bundle.recommendations import Recommendation
from pcieprof.tune.rules.base import RuleContext

CLIQUE_SOURCE = ("QEMU hw/vfio/pci-quirks.c, commit dfbee78d (vfio/pci: Add NVIDIA GPUDirect "
                 "Cliques support): x-nv-gpudirect-clique=0-15, GPUs of one id may peer")
NCCL_NVML = ("NVIDIA/nccl src/graph/paths.cc ncclTopoCheckP2p: after the distance check, NVML's "
             "P2P status of the pair must be OK (NCCL_IGNORE_DISABLED_P2P aside)")


def evaluate(ctx: RuleContext) -> list[Recommendation]:
    topo = ctx.topology
    if not topo.virtualization.is_vm or len(topo.gpus) < 2:
        return []
    states = {(p.a, p.b): p.p2p_state() for p in topo.pairs if p.a < p.b}
    bad = sorted(k for k, s in states.items() if s == "not_supported")
    unknown = [k for k, s in states.items() if s in (None, "unknown")]
    if bad:
        clique = (f"the guest's driver reports P2P unsupported on {len(bad)} pair(s) ("
                  + ", ".join(f"{a}-{b}" for a, b in bad[:6]) + "): set a clique on the host")
    elif unknown or not states:
        clique = "NVML's P2P status was not recorded in this guest: check it"
    else:
        clique = "the guest's driver reports P2P OK on every pair: a clique (or equal) is set"
    n = len(topo.gpus)
    bars = [g.bar1_bytes for g in topo.gpus if g.bar1_bytes]
    full = [product(g.name) for g in topo.gpus]
    bar_ok = len(bars) == n and all(p is not None and p.bar1_gib for p in full) and all(
        (g.bar1_bytes or 0) >= (p.bar1_gib or 0) * GIB for g, p in zip(topo.gpus, full) if p)
    if states and not bad and not unknown and bar_ok:
        return []  # both checks pass in this guest: the host has set both
    total = float(sum(bars)) if len(bars) == n else None
    # the next power of two above the BARs' sum: room for the other BARs and their alignment
    mib = 1 << int(total / (1 << 20)).bit_length() if total else None
    window = (f"{n} x {gib(max(bars))} BAR1 = {gib(total)}" if total and bars
              else "every GPU's BAR1 (not in this bundle)")
    lines = [
        "# on the hypervisor host (QEMU / libvirt), not in this guest:",
        "# 1. GPUDirect clique: the GPUs that may peer share one id (0-15), e.g. libvirt",
        "#    <qemu:commandline>: -set device.hostdev0.x-nv-gpudirect-clique=0 (one per GPU)",
        "#    check in the guest: nvidia-smi topo -p2p r   (OK between the GPUs)",
        f"# 2. 64-bit MMIO window for {window}:",
        "#    QEMU -cpu host,host-phys-bits=on (libvirt <maxphysaddr mode='passthrough'/>), or",
        f"#    OVMF: -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string={mib or '<MiB>'}",
        "#    check in the guest: nvidia-smi -q -d MEMORY   (BAR1 Total: the card's full BAR1)"]
    return [Recommendation(
        rule="vm_enablers", kind="host", confidence="advice",
        priority=300.0 if bad else 0.7,
        title="In a VM, P2P and the GPUs' BARs need the hypervisor host's settings (checks inside)",
        action="\n".join(lines),
        gain_text=f"host view, not visible from this guest; {clique}",
        evidence=[CLIQUE_SOURCE, NCCL_NVML,
                  f"topology.json: BAR1 {gib(max(bars))} per GPU as the guest sees it"
                  if bars else "topology.json: no BAR1 size recorded"],
        caveats=["GPUs in one clique must really be able to peer (same switch or root complex, "
                 "ACS allowing it): QEMU does not check"])]

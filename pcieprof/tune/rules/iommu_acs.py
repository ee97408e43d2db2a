"""IOMMU translation and ACS redirect put every P2P transfer through the root complex.

When P2P is measured slow (below the host-staged path, or below SLOW_VS_H2D of the same GPUs'
host-to-device rate, which is what their links carry without the peer path) or broken, and the topology shows the IOMMU translating or ACS ReqRedir/CmpltRedir set, the fix is
on the host: `iommu=pt` (with `amd_iommu=on` / `intel_iommu=on`) keeps the IOMMU for VFIO but
passes host DMA through; ACS redirect is cleared per bridge with setpci or in the BIOS. In a VM
the guest cannot change either: VFIO needs ACS isolation on the host, so it is a hypervisor
setting (or a different passthrough layout), not a guest one.
"""

from __future__ import annotations

import numpy as np

from pcieprof.analysis.matrices import gpu_indices, pair_matrix
from pcieprof.bundle.recommendations import Recommendation
from pcieprof.tune.rules.base import RuleContext

#: P2P slower than this share of host-to-device bandwidth means the peer path costs (translation,
#: redirect to the root complex); bare-metal boxes measure P2P at 93-100% of H2D (calibration).
SLOW_VS_H2D = 0.85


def evaluate(ctx: RuleContext) -> list[Recommendation]:
    iommu = ctx.topology.iommu
    virt = ctx.topology.virtualization
    is_vm = bool(virt.is_vm)
    acs = ctx.topology.acs_redirect_bridges()
    translated = iommu.translating
    if not (translated or acs):
        return []
    p = ctx.p2p
    gpus = gpu_indices(p)
    if not gpus:
        ctx.needs_measuring.append("P2P copies (p2p and host_staged paths): the IOMMU/ACS state "
                                   "only matters if P2P is slow or broken, which was not measured")
        return []
    bw = pair_matrix(p, path="p2p", metric="bandwidth_gbps", gpus=gpus)
    hs = pair_matrix(p, path="host_staged", metric="bandwidth_gbps", gpus=gpus)
    broken = not p[(p["path"] == "p2p") & p["status"].isin(["error", "hang"])].empty
    med_p2p = float(np.nanmedian(bw)) if not np.isnan(bw).all() else float("nan")
    med_hs = float(np.nanmedian(hs)) if not np.isnan(hs).all() else float("nan")
    best = float(np.nanmax(bw)) if not np.isnan(bw).all() else float("nan")
    h2d = p[(p["path"] == "h2d") & (p["status"] == "ok")]["bandwidth_gbps"].dropna()
    med_h2d = float(h2d.median()) if len(h2d) else float("nan")
    slow = broken or (np.isfinite(med_p2p) and np.isfinite(med_hs) and med_p2p < med_hs) or (
        np.isfinite(med_p2p) and np.isfinite(med_h2d) and med_p2p < SLOW_VS_H2D * med_h2d)
    evidence = []
    if translated:
        evidence.append(f"topology.json: IOMMU {iommu.mode} (kernel command line: "
                        f"{iommu.cmdline or 'unknown'})")
    if acs:
        evidence.append(f"topology.json: ACS ReqRedir/CmpltRedir set on {len(acs)} bridge(s) "
                        f"({', '.join(acs[:6])}): peer writes are redirected to the root complex")
    if is_vm:
        evidence.append(f"topology.json: running in a VM ({virt.hypervisor or 'hypervisor unknown'})")
    if np.isfinite(med_p2p):
        evidence.append(f"p2p.csv: median P2P {med_p2p:.1f} GB/s (best pair {best:.1f}), "
                        f"host-staged {med_hs:.1f} GB/s, host-to-device {med_h2d:.1f} GB/s "
                        f"[{ctx.provenance}]")
    if not slow:
        return [Recommendation(
            rule="iommu_acs", kind="info", priority=1,
            title="IOMMU/ACS are in the P2P path, but measured P2P is healthy: nothing to change",
            evidence=evidence, confidence="advice",
            caveats=["a hang on the first NCCL all-reduce would point here; none was measured"])]
    if is_vm:
        action = ("# on the hypervisor host, not in this guest:\n"
                  "#   kernel command line: amd_iommu=on iommu=pt   (Intel: intel_iommu=on iommu=pt)\n"
                  "#   ACS: the guest cannot clear ACS on the host's bridges; VFIO needs it for\n"
                  "#   isolation. Pass the GPUs of one switch through together, or ask the\n"
                  "#   provider for a P2P-capable (ATS/ACS-override) configuration.")
        title = "P2P runs through the host IOMMU/root complex: change the hypervisor host, not the guest"
    else:
        action = ("# kernel command line (then reboot): amd_iommu=on iommu=pt   (Intel: intel_iommu=on iommu=pt)\n"
                  "# or disable the IOMMU in the BIOS if nothing needs it\n")
        if acs:
            action += "# clear ACS redirect on each bridge (as root, until reboot), or disable ACS in the BIOS:\n"
            action += "\n".join(f"setpci -s {b} ECAP_ACS+0x6.w=0000" for b in acs[:16])
        title = "IOMMU translation / ACS redirect slow P2P down: pass DMA through and clear ACS"
    return [Recommendation(
        rule="iommu_acs", kind="host", priority=500 if broken else 200, action=action,
        title=title,
        gain_text=("P2P is broken on this path; " if broken else
                   f"P2P measured {med_p2p:.1f} GB/s vs {med_h2d:.1f} GB/s host-to-device on the "
                   f"same links (at most {max(med_h2d / med_p2p - 1, 0) * 100:.0f}% more P2P "
                   f"bandwidth); ")
                  + "the gain after the change has to be measured (rerun pcieprof topology)",
        evidence=evidence, confidence="advice",
        caveats=["iommu=pt keeps VFIO working; turning the IOMMU off breaks device passthrough",
                 "setpci changes are lost on reboot and on hot-reset of the bridge"]
                + (["in a VM, ACS cannot be turned off from the guest"] if is_vm else []))]

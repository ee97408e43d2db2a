"""IOMMU translation and ACS redirect put every P2P transfer through the root complex.

Bare metal: when P2P is slow (below the host-staged path, or below SLOW_VS_H2D of the same GPUs'
host-to-device rate, which is what their links carry without the peer path) or broken, and the
topology shows the IOMMU translating or ACS ReqRedir/CmpltRedir set, the fix is on the host:
`iommu=pt` passes host DMA through (AMD: the IOMMU is on whenever the BIOS enables it, and
`amd_iommu=` has no `on` value, Linux Documentation/admin-guide/kernel-parameters.txt; Intel:
`intel_iommu=on iommu=pt`); ACS redirect is cleared per bridge with setpci or in the BIOS.

In a VM the guest can change neither, and `iommu=pt` on the host does not help either: a GPU
bound to vfio-pci gets VFIO's own translating domain (that is its isolation). The card lists the
changes only the hypervisor host can make, priced by the fabric model where the bundle carries
its table (topology.json `sim.vm`: serve on the host, ACS off, ATS, the real topology in the
guest, each with its risk or why it is blocked), else what is known and what to measure.
"""

from __future__ import annotations

import numpy as np

from pcieprof.analysis.matrices import gpu_indices, pair_matrix
from pcieprof.analysis.virtualization import VmCost, known_state
from pcieprof.bundle.vm_cost import HostChange
from pcieprof.bundle.recommendations import Recommendation, Risk
from pcieprof.tune.rules.base import RuleContext, fixed_rank
from pcieprof.analysis.vm_words import (best_host_change, host_change_line, known_words, step_gain,
                              what_to_measure)
from pcieprof.tune.assumed import RESTS_ON
from pcieprof.tune.vm_context import vm_cost

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
                                   "only matters if P2P is slow or broken, which this bundle "
                                   "does not show")
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
    if is_vm:
        return [_vm_host_card(ctx, evidence, slow, broken, med_p2p, med_h2d)]
    if not slow:
        share = f", {med_p2p / med_h2d * 100:.0f}% of host-to-device" if np.isfinite(med_p2p) and \
            np.isfinite(med_h2d) and med_h2d > 0 else ""
        return [Recommendation(
            rule="iommu_acs", kind="info", priority=1,
            title=(f"IOMMU/ACS are in the P2P path, but the {ctx.obtained} P2P copies are healthy "
                   f"({med_p2p:.1f} GB/s{share}): nothing to change for copies"),
            evidence=evidence, confidence="advice",
            caveats=["a hang on the first NCCL all-reduce with P2P would point here (see the "
                     "risk of any NCCL_P2P_LEVEL recommendation)"])]
    # amd_iommu= has no "on" value (kernel-parameters.txt): the AMD IOMMU is on when the BIOS
    # enables it, so iommu=pt alone sets passthrough there
    action = ("# kernel command line (then reboot): iommu=pt   (Intel: intel_iommu=on iommu=pt)\n"
              "# or disable the IOMMU in the BIOS if nothing needs it\n")
    if acs:
        action += "# clear ACS redirect on each bridge (as root, until reboot), or disable ACS in the BIOS:\n"
        action += "\n".join(f"setpci -s {b} ECAP_ACS+0x6.w=0000" for b in acs[:16])
    return [Recommendation(
        rule="iommu_acs", kind="host", priority=500 if broken else 200, action=action,
        title="IOMMU translation / ACS redirect slow P2P down: pass DMA through and clear ACS",
        gain_text=("P2P is broken on this path; " if broken else
                   f"P2P {ctx.obtained} {med_p2p:.1f} GB/s vs {med_h2d:.1f} GB/s host-to-device "
                   f"on the same links (at most {max(med_h2d / med_p2p - 1, 0) * 100:.0f}% more "
                   f"P2P bandwidth); ")
                  + "the gain after the change has to be measured (rerun pcieprof topology)",
        evidence=evidence, confidence="advice",
        caveats=["iommu=pt keeps VFIO working; turning the IOMMU off breaks device passthrough",
                 "setpci changes are lost on reboot and on hot-reset of the bridge"])]


def _vm_host_card(ctx: RuleContext, evidence: list[str], slow: bool, broken: bool,
                  med_p2p: float, med_h2d: float) -> Recommendation:
    """In a VM the IOMMU and ACS belong to the hypervisor host: the changes only it can make,
    each priced by the fabric model when the bundle carries its table (topology.json sim.vm),
    else what is known and what to measure."""
    cost = vm_cost(ctx)
    state = known_state(ctx.bundle)
    copies = (f"P2P copies {ctx.obtained} at {med_p2p:.1f} GB/s vs {med_h2d:.1f} GB/s "
              "host-to-device on the same links" if np.isfinite(med_p2p) and np.isfinite(med_h2d)
              else "")
    if cost is not None and cost.host_changes:
        best = best_host_change(cost)
        lines = [f"# on the hypervisor host ({cost.source}, all-reduces of a decode step at batch "
                 f"{cost.batches[0]}; each change in the report's 'What the VM costs'):"]
        # how, each risk, why some are blocked: the report's VM section
        # Listed as a change only where it makes the step faster: one that leaves the best
        # setting's step as it is (and NCCL's defaults slower) is named apart, never as a gain.
        helps = [h for h in cost.host_changes if h.feasible and h.changes_anything
                 and h.step_best_safe_us[1] < h.step_best_safe_us[0]]
        lines += [f"# - {host_change_line(h)}" for h in helps]
        for what, group in (("no faster decode step here (the model's numbers: 'What the VM costs')",
                             [h for h in cost.host_changes if h.feasible and h.changes_anything
                              and h not in helps]),
                            ("no change for the guest's GPUs",
                             [h for h in cost.host_changes if h.feasible and not h.changes_anything]),
                            ("blocked on this box", [h for h in cost.host_changes if not h.feasible])):
            if group:
                lines.append(f"# - {what}: " + "; ".join(h.title for h in group))
        gain = (f"{cost.source}: {step_gain(cost, best.step_best_safe_us)} if served on the host "
                "with its best setting free of the hang risk" if best is not None else
                f"{cost.source}: no feasible host-side change saves time here")
        gain += "; nothing in the guest changes the IOMMU or ACS"
        risks = [Risk(id=h.id, title=f"{h.title}: {h.risk}",
                      check=("after the change, run `pcieprof topology` where the GPUs are "
                             f"served and `pcieprof compare {ctx.bundle.path.name} NEW`"),
                      sources=list(h.sources))
                 for h in helps]
        saved_ms = (best.step_best_safe_us[0] - best.step_best_safe_us[1]) / 1e3 if best else 0.0
        priority = 500 if broken else max(10.0 * saved_ms, 1.0)
        return Recommendation(
            rule="iommu_acs", kind="host", priority=priority,
            ranked_by=(fixed_rank(priority) if broken else
                       f"score {priority:.1f} = 10 x the best host change's {cost.source} step "
                       f"gain at batch {cost.batches[0] if cost.batches else 1}, {saved_ms:.2f} ms"),
            title="Only the hypervisor host can take the IOMMU and ACS redirect out of the GPUs' path",
            action="\n".join(lines), gain_text=gain,
            evidence=evidence + ([copies] if copies else []) + [
                f"topology.json sim.vm: host-side changes priced by the fabric model "
                f"({', '.join(h.id for h in cost.host_changes)})"],
            confidence="simulated" if cost.source == "simulated" else "advice",
            caveats=["iommu=pt on the host kernel does not change GPUs passed through with VFIO: "
                     "VFIO keeps translating (that is its isolation)"]
                    + (assumed_ranges(ctx, cost, best) if best is not None else []),
            risks=risks)
    return Recommendation(
        rule="iommu_acs", kind="host", priority=500 if broken else (200 if slow else 30),
        title=("The IOMMU and ACS redirect in the GPUs' path belong to the hypervisor host: what "
               "the host can change, and what to measure first"),
        action=("# on the hypervisor host, not in this guest:\n"
                "# - serve on the host instead (GPUs bound to the nvidia driver, not vfio-pci): no "
                "translation, and ACS redirect can be cleared (setpci / BIOS)\n"
                "# - ACS: the guest cannot clear ACS on the host's bridges, and the host should "
                "not without ATS: ATS on the GPUs with ACS Direct Translated P2P on the switch "
                "ports, where the GPUs and the hypervisor support it (lspci -vvv: an ATS "
                "capability)\n"
                "# - iommu=pt on the host kernel: no change for GPUs passed through with VFIO\n"
                "# - give the guest the real topology (NUMA cells, switch grouping) or use "
                "NCCL_TOPO_FILE"),
        gain_text=(("P2P is broken on this path; " if broken else (copies + "; " if copies else ""))
                   + f"the gain of a host-side change is not known from this bundle (known: "
                   f"{known_words(state)}); to know it, {what_to_measure(ctx.bundle.path.name)}"),
        evidence=evidence, confidence="advice",
        caveats=["in a VM, ACS cannot be turned off from the guest; clearing it on the host "
                 "without ATS lets the switch route guest addresses untranslated",
                 "iommu=pt keeps VFIO translating: it changes host-owned devices only"])


def assumed_ranges(ctx: RuleContext, cost: VmCost, best: HostChange) -> list[str]:
    """The best host change's step gain at both ends of each assumed parameter the VM's cost
    rests on (VmTable.sensitivity, e.g. latency.iommu_us), as pcieprof.tune.assumed words a
    range: the VM's side is its best setting free of the hang risk, re-priced at each end from
    topology.json `sim.assumed`; the host's side is held where the parameter does not move it
    (the sensitivity's bare-metal step is the same at both ends). The like-for-like step (the
    same NCCL choices on both sides) follows: at the low end the VM may equal bare metal."""
    row = cost.at("best_safe", step=True)
    if row is None:
        return []
    env = dict(kv.split("=", 1) for kv in row.vm.setting.split() if "=" in kv)
    curve = ctx.curves.find(env) if env else ctx.curves.default()
    stored = {e.get("param"): e for e in (ctx.topology.sim or {}).get("assumed") or []}
    after = best.step_best_safe_us[1]
    out = []
    for s in cost.sensitivity:
        lo, hi = s.get("low") or {}, s.get("high") or {}
        if not (lo.get("step_bare_us") and hi.get("step_bare_us")):
            continue
        alike = (f"like for like (same NCCL choices) VM vs bare metal "
                 f"{lo['step_vm_us'] / 1e3:.2f} vs {lo['step_bare_us'] / 1e3:.2f} ms at "
                 f"{lo['value']:g}, {hi['step_vm_us'] / 1e3:.2f} vs "
                 f"{hi['step_bare_us'] / 1e3:.2f} ms at {hi['value']:g}")
        entry = stored.get(s["param"])
        gains = []
        held = abs(lo["step_bare_us"] - hi["step_bare_us"]) <= 1e-6 * hi["step_bare_us"]
        for end in ("low", "high"):
            times = ((entry or {}).get(end) or {}).get("time_us") or {}
            t = (times.get(curve.variant) or {}).get(str(row.size_bytes)) if curve else None
            if t is not None and held:
                gains.append((float(entry[end]["value"]), t * row.count / 1e3))  # type: ignore[index]
        said = (f"step gain {gains[0][1] - after / 1e3:+.2f} ms at {gains[0][0]:g}, "
                f"{gains[1][1] - after / 1e3:+.2f} ms at {gains[1][0]:g} (VM {row.vm.setting} "
                f"{gains[0][1]:.2f} / {gains[1][1]:.2f} ms vs {after / 1e3:.2f} on the host); "
                if len(gains) == 2 else "")
        why = (entry or {}).get("why", "")
        out.append(f"{RESTS_ON}{s['param']} = {s['value']:g} ({s.get('kind', 'assumed')}"
                   f"{', range ' + why if why else ''}): {said}{alike}")
    return out

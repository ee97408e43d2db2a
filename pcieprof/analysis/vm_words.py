"""The VM story in words: what virtualization costs here, why, and what the guest and the host can
do about it; the one place the report's VM verdict, the VM rules' risks and `compare` take them
from, so that they tell the same story with the same numbers.

Numbers come from pcieprof.analysis.virtualization (the fabric model's like-for-like table of a
simulated VM bundle, or two bundles' curves); the words for a VM without either say what is
known and what to measure.
"""

from __future__ import annotations


from pcieprof.analysis.anchors import token_share
from pcieprof.analysis.virtualization import (BASIS_HEADS, P2P_HANG, KnownState, Row, VmCost,
                                              from_topology, known_state)
from pcieprof.bundle.recommendations import Risk
from pcieprof.bundle.vm_cost import HostChange
from pcieprof.bundle.vm_mechanism import KnownIssue
from pcieprof.units import size_label

#: How `recommend --verify` checks a setting that can hang, before anyone serves with it.
VERIFY_CHECK = (
    "before serving with it, run `pcieprof recommend BUNDLE --verify` on a bundle of the VM "
    "itself (backend cuda): it re-runs the all-reduce with the setting under the probes' "
    "watchdog, which kills a launch that makes no progress for --timeout seconds (default 60; "
    "NCCL init gets 120 s more) and records status=hang, and the run goes on; if it hangs, keep "
    "NCCL's default or NCCL_P2P_DISABLE=1, or make the host-side change")
#: Said of a simulated bundle: the model prices time, not failures.
SIM_CANNOT_HANG = ("this bundle is simulated: the fabric model does not model the hang, so "
                   "--verify on it re-simulates the time only")
#: Where the hang is reported, for bundles without the fabric model's known issue.
P2P_HANG_SOURCES = [
    "NCCL user guide, Troubleshooting, PCI Access Control Services (ACS): IO virtualization can "
    "redirect peer traffic to the root complex, causing a significant performance reduction or "
    "even a hang",
    "NVIDIA/nccl issue #2079: ncclAllReduce deadlock with ACS on AMD root ports forcing P2P "
    "through the IOMMU; fixed by clearing ACS",
]
P2P_HANG_TITLE = "NCCL P2P through a translating IOMMU can hang on the first collective"


def _lower(title: str) -> str:
    """A title inside a sentence: `Serve on ...` -> `serve on ...`; `ATS on ...` stays."""
    return title[:1].lower() + title[1:] if title[1:2].islower() else title


def first_sentence(text: str) -> str:
    """The first sentence of a text, with its full stop."""
    head = text.split(". ", 1)[0].strip()
    return head if head.endswith(".") else head + "."


def _us(x: float) -> str:
    return f"{x:.1f}"


def _ms(x_us: float) -> str:
    return f"{x_us / 1e3:.2f}"


def _pct(r: Row) -> str:
    return f"VM {(r.vm_over_bare - 1) * 100:+.0f}%"


def cell(r: Row, *, step: bool = False) -> str:
    """`62.9 / 54.5 (VM +15%)`: VM / bare metal (us, or ms for a step row) and the VM's excess."""
    f = _ms if step else _us
    return f"{f(r.vm.time_us)} / {f(r.bare.time_us)} ({_pct(r)})"


def table(cost: VmCost) -> tuple[list[str], list[list[str]]]:
    """The like-for-like table as the report and `compare` show it: a row per decode batch,
    a column per basis (VM / bare metal, us), then the decode step at the smallest batch (ms)."""
    bases = cost.bases
    cols = ["batch", "message"] + [f"{BASIS_HEADS[b]}: VM / bare metal" for b in bases]
    rows: list[list[str]] = []
    for batch in cost.batches:
        cells = [cost.at(b, batch) for b in bases]
        if any(c is None for c in cells):
            continue
        size = next(c.size_bytes for c in cells if c is not None)
        rows.append([str(batch), size_label(size)] + [cell(c) for c in cells if c is not None])
    first = cost.batches[0] if cost.batches else None
    steps = [cost.at(b, first, step=True) for b in bases]
    if first is not None and steps and all(s is not None for s in steps):
        rows.append([str(first), f"decode step ({cost.step_allreduces} all-reduces), ms"]
                    + [cell(s, step=True) for s in steps if s])
    return cols, rows


def setting_rows(cost: VmCost) -> list[list[str]]:
    """What each side ran at the smallest batch, per basis: [basis, VM, bare metal]."""
    out = []
    for b in cost.bases:
        r = cost.at(b)
        if r is None:
            continue
        vm = r.vm.setting + (f" ({r.vm.choice})" if r.vm.choice else "")
        if P2P_HANG in r.vm.risks:
            vm += "; risks an NCCL hang (P2P through the translating IOMMU)"
        bare = r.bare.setting + (f" ({r.bare.choice})" if r.bare.choice else "")
        out.append([BASIS_HEADS[b], vm, bare])
    return out


def settings(cost: VmCost) -> list[str]:
    """What each side ran at the smallest batch, per basis, as lines (compare's footnotes)."""
    first = size_label(cost.rows(cost.bases[0])[0].size_bytes) if cost.bases else ""
    return [f"{b} at {first}: VM {vm}; bare metal {bare}" for b, vm, bare in setting_rows(cost)]


def text_table(cost: VmCost) -> list[str]:
    """The table as fixed-width lines (compare's stdout)."""
    cols, rows = table(cost)
    widths = [max(len(str(x)) for x in [c] + [r[i] for r in rows]) for i, c in enumerate(cols)]
    line = lambda cells: "  ".join(str(x).ljust(w) for x, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [line(cols)] + [line(r) for r in rows]


def _who(rows: list[Row]) -> str:
    """`bare metal is faster at every decode size` / `the VM is faster ...` / by batch."""
    bare = [r.batch for r in rows if r.bare_faster]
    vm = [r.batch for r in rows if r.vm_minus_bare_us < -0.05]
    if len(bare) == len(rows):
        return "bare metal is faster at every decode size"
    if len(vm) == len(rows):
        return "the VM is faster at every decode size"
    same = [r.batch for r in rows if r.batch not in bare and r.batch not in vm]
    parts = [f"{who} at batch {', '.join(map(str, batches))}" for who, batches in (
        ("bare metal is faster", bare), ("the VM is faster", vm), ("they are even", same)) if batches]
    return ", while ".join(parts)


def _range(rows: list[Row]) -> str:
    """`VM +15%` at one size, `VM +13% to +73%` over several."""
    pcts = [round((r.vm_over_bare - 1) * 100) for r in rows]
    lo, hi = min(pcts), max(pcts)
    return f"VM {lo:+d}%" if lo == hi else f"VM {lo:+d}% to {hi:+d}%"


def verdict(cost: VmCost) -> str:
    """The VM verdict: like for like (same NCCL choices, each at its best), the decode step,
    default against default and why they differ, what the VM's data path pays, what to do.
    Every number is a cell of `table(cost)`."""
    return " ".join(verdict_parts(cost))


def verdict_parts(cost: VmCost) -> list[str]:
    """The verdict's sentences: the claim with its numbers first (the report shows it and folds
    the rest), then the decode step, default against default, the mechanisms, what to do."""
    first = cost.batches[0]
    head = cost.rows(cost.bases[0])
    size = size_label(head[0].size_bytes)
    band = f"batch {first}-{cost.batches[-1]} = {size}-{size_label(head[-1].size_bytes)}"
    like = [b for b in ("same_choices", "best") if b in cost.bases]
    out = []
    everywhere = all(r.bare_faster for b in like for r in cost.rows(b))
    where = f"{band}, {cost.source}: {cost.vm_label} against {cost.bare_label}"
    if like and everywhere:
        out.append(f"Virtualization costs time here: like for like, bare metal is faster at "
                   f"every decode size ({where}).")
    else:
        out.append(f"What the VM costs against bare metal, like for like ({where}):"
                   + ("" if like else " no like-for-like basis in this table."))
    parts = []
    for b in like:
        r = cost.at(b)
        assert r is not None
        what = "with the same NCCL choices" if b == "same_choices" else "each at its best"
        who = "" if everywhere else f", {_who(cost.rows(b))}:"
        phrase = (f"{what}{who} {_us(r.vm.time_us)} us in the VM vs {_us(r.bare.time_us)} us on "
                  f"bare metal at {size} ({_range(cost.rows(b))} over the band")
        if b == "best" and P2P_HANG in r.vm.risks:
            phrase += f"; the VM's best, {r.vm.setting}, risks an NCCL hang"
            safe = cost.at("best_safe")
            if safe is not None:
                phrase += f", and without that risk the VM takes {_us(safe.vm.time_us)} us"
        parts.append(phrase + ")")
    if parts:
        text = "; ".join(parts)
        out[0] += " " + text[0].upper() + text[1:] + "."
    steps = [(b, cost.at(b, first, step=True)) for b in like]
    steps_txt = [f"{_ms(s.vm.time_us)} vs {_ms(s.bare.time_us)} ms "
                 f"{'with the same choices' if b == 'same_choices' else 'each at its best'}"
                 for b, s in steps if s is not None]
    if steps_txt:
        out.append(f"The all-reduce time of a {cost.model} decode step at batch {first} "
                   f"({cost.step_allreduces} all-reduces, not the whole step): "
                   + ", ".join(steps_txt) + ".")
    d = cost.at("default")
    if d is not None:
        rows = cost.rows("default")
        sentence = (f"Default against default {_who(rows)} ({_us(d.vm.time_us)} vs "
                    f"{_us(d.bare.time_us)} us at {size}, {_range(rows)} over the band)")
        if not all(r.bare_faster for r in rows):
            if "flat_guest_tree" in d.why or "same_choices" in cost.bases:
                sentence += (", not because virtualization helps: NCCL decides from the tree it "
                             "sees. In the guest it sees a flat one-socket tree and chose "
                             f"{d.vm.choice or 'its default'}; on bare metal it sees the two "
                             f"sockets, rates the crossing low and chose {d.bare.choice or 'less'}")
                same = cost.at("same_choices")
                if same is not None:
                    sentence += (f". Made to choose what the guest chose, bare metal takes "
                                 f"{_us(same.bare.time_us)} us")
            else:
                sentence += (", which compares NCCL's choices more than the data paths: "
                             "nccl_choices.json of each bundle says what NCCL chose; run bare "
                             "metal with the VM's choices to compare the paths alone")
        out.append(sentence + ".")
    paid = _paid(cost)
    if paid:
        out.append("What the VM's data path pays: " + "; ".join(paid) + ".")
    out += assumed_range(cost)
    todo = _todo(cost)
    if todo:
        out.append("What to do: " + todo + ".")
    return out


def assumed_range(cost: VmCost) -> list[str]:
    """One sentence per assumed model parameter the verdict rests on: its value, then the
    like-for-like numbers at the low and high end of its range (the verdict may turn)."""
    out = []
    for s in cost.sensitivity:
        ends = []
        for end in ("low", "high"):
            e = s.get(end) or {}
            if not e.get("bare_us"):
                continue
            pct = (e["vm_us"] / e["bare_us"] - 1) * 100
            ends.append(f"at {e['value']:g}, {_us(e['vm_us'])} us in the VM vs "
                        f"{_us(e['bare_us'])} us on bare metal at {size_label(int(e['size_bytes']))}"
                        f" (VM {pct:+.0f}%, {e.get('basis', '')}; all-reduces of a decode step "
                        f"{_ms(e['step_vm_us'])} vs {_ms(e['step_bare_us'])} ms)")
        if ends:
            out.append(f"This rests on {s['param']} = {s['value']:g} ({s.get('kind', 'assumed')}, "
                       f"no measurement constrains it): " + "; ".join(ends) + ".")
    return out


def _paid(cost: VmCost) -> list[str]:
    """The mechanisms behind the like-for-like rows, as the profile words them."""
    ids: list[str] = []
    for b in ("same_choices", "best", "default"):
        r = cost.at(b)
        for i in (r.why if r else ()):
            if i not in ids:
                ids.append(i)
    words = {"iommu_translation": "the host IOMMU translates every DMA of the guest's GPUs, peer "
                                  "writes and NCCL's host-memory steps included",
             "acs_redirect": "ACS redirect sends peer traffic up through the root complex, so "
                             "same-switch pairs share one uplink",
             "flat_guest_tree": "the flat guest tree makes NCCL go through host memory (SHM) for "
                                "every ring step by default, and hides the sockets from it"}
    return [words.get(i) or cost.mechanisms[i].title for i in ids
            if i in words or i in cost.mechanisms]


def best_host_change(cost: VmCost) -> HostChange | None:
    """The feasible host-side change that saves the most on the decode step (best safe setting)."""
    useful = [h for h in cost.host_changes if h.feasible and h.changes_anything
              and h.step_best_safe_us[1] < h.step_best_safe_us[0]]
    return min(useful, key=lambda h: h.step_best_safe_us[1]) if useful else None


def _todo(cost: VmCost) -> str:
    parts = []
    d, best = cost.at("default"), cost.at("best")
    if d is not None and best is not None and best.vm.time_us < d.vm.time_us - 0.05:
        txt = (f"in the guest, {best.vm.setting} ({_us(d.vm.time_us)} -> {_us(best.vm.time_us)} us "
               f"at {size_label(d.size_bytes)})")
        if P2P_HANG in best.vm.risks:
            txt += (" only after `pcieprof recommend --verify` on the VM itself shows that it "
                    "does not hang")
        parts.append(txt)
    h = best_host_change(cost)
    if h is not None:
        parts.append(f"host-side, {_lower(h.title)} ({step_gain(cost, h.step_best_safe_us)} "
                     "with the best setting free of the hang risk; see the host-side changes)")
    return "; ".join(parts)


def step_gain(cost: VmCost, before_after_us: tuple[float, float]) -> str:
    """`all-reduces of a decode step 9.88 -> 5.04 ms (22% of a ~22.0 ms token ...)`: a change of
    the step's communication, never read as the whole step."""
    before, after = before_after_us
    txt = f"all-reduces of a decode step {_ms(before)} -> {_ms(after)} ms"
    batch = cost.batches[0] if cost.batches else 1
    share = token_share(cost.model, batch, before / 1e3, (before - after) / 1e3)
    return txt + (f" ({share})" if share else "")


def host_change_gain(h: HostChange) -> str:
    """What the model expects of a host-side change: the decode step before -> after, with NCCL's
    defaults and with the best setting free of the hang risk; or why it does nothing or cannot
    be made."""
    if not h.feasible:
        return "blocked on this box"
    if not h.changes_anything:
        return "no change for the guest's GPUs"
    return (f"all-reduces of a decode step {_ms(h.step_default_us[0])} -> "
            f"{_ms(h.step_default_us[1])} ms with NCCL's defaults, -> "
            f"{_ms(h.step_best_safe_us[1])} ms with the best setting free of the hang risk")


def host_change_line(h: HostChange) -> str:
    """One host-side change with the model's expected gain (the decode step at batch 1)."""
    return f"{h.title}: {host_change_gain(h)}"


def what_to_measure(label: str) -> str:
    """How to get the like-for-like numbers a VM bundle alone lacks."""
    return ("measure the same GPUs without the hypervisor: `pcieprof topology` on the host (or "
            "the box booted bare metal), or `pcieprof import` of its nccl-tests and "
            f"p2pBandwidthLatencyTest outputs; then `pcieprof compare {label} BARE` or "
            f"`pcieprof report {label} BARE` shows the like-for-like table (default vs default, "
            "best vs best)")


def known_words(state: KnownState) -> str:
    """What a VM bundle says about its virtualization, in a few words."""
    known = [f"hypervisor {state.hypervisor or 'not identified'}", f"IOMMU {state.iommu}"]
    if state.acs_bridges:
        known.append(f"ACS P2P redirect on {len(state.acs_bridges)} bridge(s)")
    if state.flat_tree:
        known.append("the guest sees a flat PCIe tree")
    if state.shm_links:
        known.append(f"NCCL's default sends {len(state.shm_links)} peer link(s) through host memory")
    return ", ".join(known)


def unknown_cost(state: KnownState, label: str) -> str:
    """The VM verdict of a bundle without the model's table and without a bare-metal bundle."""
    return (f"What the VM costs against bare metal is not known from {label} alone. Known here: "
            f"{known_words(state)}. To know it, {what_to_measure(label)}.")


def host_alternative(cost: VmCost | None, state: KnownState, is_vm: bool) -> str:
    """The change only the host can make instead of sending NCCL's P2P through a translating
    IOMMU from the guest, with the model's gain where the bundle carries it."""
    if not is_vm:
        return ("on this host: boot with iommu=pt (Intel: intel_iommu=on iommu=pt; amd_iommu= has "
                "no 'on' value) "
                "so that the GPUs' DMA is not translated, and clear ACS redirect on the bridges "
                "above them (setpci or BIOS); see the IOMMU/ACS recommendation")
    h = best_host_change(cost) if cost is not None else None
    if cost is not None and h is not None:
        bare = cost.at("best_safe")
        txt = (f"{cost.source}: {step_gain(cost, h.step_best_safe_us)} if the hypervisor host "
               f"changes this: "
               f"{_lower(h.title)}"
               + (f" ({_us(bare.bare.time_us)} us per all-reduce at {size_label(bare.size_bytes)} "
                  f"with {bare.bare.setting})" if bare else "")
               + f"; risk: {first_sentence(h.risk).rstrip('.')}")
        blocked = [_lower(x.title) for x in cost.host_changes if not x.feasible]
        if blocked:
            txt += "; blocked on this box: " + "; ".join(blocked)
        return txt
    return ("on the hypervisor host: serve on the host instead of in the VM (the GPUs bound to "
            "the nvidia driver, not vfio-pci: no translation, and ACS redirect can be cleared), "
            "or enable ATS on the GPUs with ACS Direct Translated P2P on the switch ports where "
            "the GPUs and the hypervisor support it; iommu=pt on the host kernel does not change "
            "GPUs passed through with VFIO. The gain is not known from this bundle: measure the "
            "same GPUs bare metal and `pcieprof compare` the two")


def p2p_hang_risk(*, translating: bool, is_vm: bool, simulated: bool,
                  issue: KnownIssue | None, cost: VmCost | None,
                  state: KnownState) -> Risk | None:
    """The hang risk of a setting that puts NCCL's P2P transport through a translating IOMMU,
    with the check and the host-side alternative; None when the IOMMU does not translate.

    Args:
        translating: the IOMMU translates the GPUs' DMA.
        is_vm: the bundle ran in a VM.
        simulated: the bundle's numbers are the fabric model's.
        issue: the fabric model's known issue (nccl_choices.json `model.known_risks` or the VM
            table's `known_issues`), or None.
        cost: the like-for-like table, or None.
        state: what the bundle says about its virtualization.
    """
    if not translating:
        return None
    check = VERIFY_CHECK + (f" ({SIM_CANNOT_HANG})" if simulated else "")
    return Risk(id=P2P_HANG, title=(issue.title if issue else "") or P2P_HANG_TITLE, check=check,
                host_alternative=host_alternative(cost, state, is_vm),
                sources=list((issue.sources if issue else ()) or P2P_HANG_SOURCES))

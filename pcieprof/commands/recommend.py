"""`pcieprof recommend BUNDLE [--serve SERVE]`: ring order, NCCL settings, parallel layout and
the SGLang launch backends, each with its evidence.

Writes into the bundle (or, with `--out DIR`, into a copy of it at DIR, leaving BUNDLE as it
is): recommendations.json, tune/recommended.env, tune/sglang_command.sh and the NCCL
graph/topology files (tune/nccl_graph.xml, tune/nccl_topo.xml). Prints the recommendations.

`save` is that write, and the one way the tuner's result reaches a bundle: the commands that
draw a report (`report`, `topology`) save it first with `save_for_report`, and the report reads
only what is saved (docs/design.md).
"""

from __future__ import annotations

import json
import math
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

import click

from pcieprof import progress
from pcieprof.analysis.box import box_of
from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.analysis.nodes import Nodes
from pcieprof.bundle import Bundle, writer
from pcieprof.bundle.host_tree import HostPcieTree
from pcieprof.bundle.recommendations import Recommendations
from pcieprof.bundle.topology import Topology
from pcieprof.cards import ModelCard
from pcieprof.commands.card_choice import MODEL_HELP, card_for
from pcieprof.commands.options import verbosity
from pcieprof.commands.tuning import launch_choice, serve_searches, the_launch, tune
from pcieprof.discover.lspci import parse_lspci
from pcieprof.discover.pcie_tree import build_tree
from pcieprof.errors import BadInput, PcieprofError
from pcieprof.importers.detect import is_lspci, is_lspci_tree
from pcieprof.importers.reading import read_input
from pcieprof.measurement import MeasurementSession, allreduce_plan
from pcieprof.schema import source_of
from pcieprof.tune.launch import LaunchChoice, searched_in
from pcieprof.tune.assumed import RESTS_ON
from pcieprof.tune.recommend import write_outputs
from pcieprof.tune.verify import (VerifyPlan, attach, check_verifiable, plan_verify,
                                  verify_lines, verify_results)


def summary_lines(result: Recommendations) -> list[str]:
    """The fixed-width text printed on stdout."""
    lines = [f"principal bottleneck: {result.bottleneck}", ""]
    if not result.recommendations:
        lines.append("no change supported by the measurements")
    # A risk's check and host-side paragraph are the same for every card it applies to: said in
    # full once, then named by the card that said it.
    said: dict[str, int] = {}
    host_card = next((i for i, r in enumerate(result.recommendations, 1)
                      if r.rule == "iommu_acs" and r.kind == "host"), None)

    def once(text: str, i: int) -> str | None:
        """`text` the first time, then "as card N says"; None for a repeat inside card N."""
        if text in said:
            return None if said[text] == i else f"as card {said[text]} says"
        said[text] = i
        return text

    for i, r in enumerate(result.recommendations, 1):
        lines.append(f"{i}. [{r.confidence}] {r.title}")
        if r.gain_text:  # a finding (warn, info) says what it means, a change what it gains
            lines.append(f"   {'means' if r.kind in ('warn', 'info') else 'gain'}: {r.gain_text}")
        for a in (r.action or "").splitlines():
            lines.append(f"   {a}")
        for risk in r.risks:
            lines.append(f"   RISK: {risk.title}")
            if risk.check and (check := once(risk.check, i)) is not None:
                lines.append(f"   check: {check}")
            if risk.host_alternative:
                alt = (f"card {host_card} (the hypervisor host's changes)" if host_card
                       else once(risk.host_alternative, i))
                if alt is not None:
                    lines.append(f"   host-side alternative: {alt}")
        for c in r.caveats:
            # a simulated gain's range over an assumed number it rests on
            if c.startswith(RESTS_ON):
                lines.append(f"   range: {c[len(RESTS_ON):]}")
            else:  # what the advice does not show: said with it, not only in the JSON
                lines.append(f"   caveat: {_brief(c)}")
        for e in r.evidence[:2]:
            lines.append(f"   evidence: {e}")
    if result.layouts:
        unranked = result.layouts_unranked
        lines += ["", "parallel layouts (" + (f"not ranked: no compute anchor for {result.model}"
                                             "; fitting first, in a fixed order" if unranked
                                             else "best first") + "):"]
        for lay in result.layouts:
            rows = {x.concurrency: x for x in lay.per_concurrency}
            c1 = rows[min(rows)]
            fit = [x for x in lay.per_concurrency if x.fits] if lay.fits else []
            head = f"  {lay.label:<24} weights {lay.weights_gib:.1f} GiB/GPU, "
            if not fit:
                lines.append(head + "does not fit: no launch line")
                continue
            peak = fit[-1]  # side by side: latency at c=1, throughput where the KV still fits
            # no decode curve (a config.json card): the step is communication only, said so
            # rather than "nan ms/step"
            if c1.step_ms is not None and math.isfinite(c1.step_ms):
                step = f"c={c1.concurrency} {c1.step_ms:.1f} ms/step"
            else:
                step = (f"c={c1.concurrency} comm {c1.comm_ms or 0:.1f} ms/step (compute not "
                        "predicted)")
            tok = (f"{peak.tok_s:.0f}" if peak.tok_s is not None and math.isfinite(peak.tok_s)
                   else "-")
            # memory unknown: the fit was not checked, so no concurrency bound is claimed
            bound = (f"max concurrency {lay.concurrency_text()}" if lay.gpu_memory_gib > 0
                     else "fit not checked (GPU memory unknown)")
            if lay.fit_uncertain:  # fits at one end of the assumed range only
                bound = f"fit uncertain, {bound}"
            if lay.memory_assumed():  # the bound rests on the card's size, and its range
                bound += f" (assumed {lay.memory_text()}/GPU)"

            lines.append(head + f"{bound}: {step}, c={peak.concurrency} {tok} tok/s")
        if unranked:
            lines.append(f"  why: {unranked}")
        elif result.layouts[0].why:
            lines.append(f"  why: {result.layouts[0].why}")
    if result.needs_measuring:
        lines += ["", "would need measuring:"] + [f"  - {m}" for m in result.needs_measuring]
    return lines


#: Longest caveat line on the console (characters); recommendations.json keeps the whole text.
CAVEAT_CHARS = 240


def _brief(text: str) -> str:
    """One console line of a caveat: its first line, cut at CAVEAT_CHARS with a pointer to
    the whole text."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    if len(first) <= CAVEAT_CHARS and first == text.strip():
        return first
    return first[:CAVEAT_CHARS].rstrip() + "... (in full: recommendations.json)"


@click.command("recommend")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--out", "-o", "out", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Write a copy of BUNDLE with the recommendations to DIR and leave BUNDLE "
              "untouched (default: write into BUNDLE).")
@click.option("--force", is_flag=True, help="Replace what a non-empty --out directory holds.")
@click.option("--model", default=None, help=MODEL_HELP + " Its decode message sizes and "
              "layouts are advised.")
@click.option("--batch-max", default=64, show_default=True, type=click.IntRange(1, 4096),
              help="Largest decode batch (decode all-reduce = batch x hidden x 2 bytes).")
@click.option("--context", default=8192, show_default=True, type=click.IntRange(1),
              help="Tokens per request for the KV-cache fit of the layouts.")
@click.option("--no-layouts", is_flag=True, help="Skip the parallel layout advice.")
@click.option("--serve", "serve", type=click.Path(path_type=Path), default=None,
              metavar="SERVE_BUNDLE",
              help="A `serve-bench --sweep` bundle: the SGLang commands use the launch backends "
                   "its search served correct tokens with (default: the search's first-ranked "
                   "configuration, labelled not yet served on this box).")
@click.option("--arch", default=None, metavar="smXY",
              help="GPU architecture the launch backends are ranked for when no search served "
                   "(sm120, sm100; default: the --serve search's, else the GPUs' in BUNDLE: "
                   "NVML's compute capability or the product name; unknown: none named).")
@click.option("--host-lspci", "host_lspci", type=click.Path(path_type=Path), default=None,
              metavar="FILE",
              help="`lspci -vvv` of the machine the GPUs sit in (for a VM: the hypervisor "
                   "host's): the real PCIe tree for NCCL_TOPO_FILE when the VM hides the "
                   "switches; kept in BUNDLE as tune/host_pcie_tree.json.")
@click.option("--verify", is_flag=True, help="Re-run the all-reduce (decode sizes plus one large "
              "size) with each NCCL / ring-order recommendation and the bundle's backend, into a "
              "new bundle; store the measured (sim: simulated) gain next to the predicted one.")
@click.option("--verify-out", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Bundle of the verification (default BUNDLE/verify, replaced on each run).")
@click.option("--timeout", "timeout_s", type=float, default=60.0, show_default=True,
              help="--verify: the watchdog's deadline, seconds: a launch whose all-reduces make "
                   "no progress for this long (the first collective of a message size included) "
                   "is killed and recorded as status=hang, and the run goes on.")
@verbosity
def command(bundle: Path, out: Path | None, force: bool, model: str | None, batch_max: int,
            context: int, no_layouts: bool, serve: Path | None, arch: str | None,
            host_lspci: Path | None, verify: bool, verify_out: Path | None,
            timeout_s: float) -> None:
    """Recommend NCCL settings, the ring order, a parallel layout and the SGLang launch for
    BUNDLE (a topology, import or sim bundle).

    Every recommendation carries its evidence from the bundle and its gain at decode-sized
    messages; a setting the measurements do not support is never recommended (the output says
    what would need measuring instead). The SGLang command (printed ready to paste, and in
    tune/sglang_command.sh) uses the launch backends that `pcieprof serve-bench --sweep` served
    correct tokens with when --serve names its bundle; without one it uses the search's
    first-ranked backends for the GPU architecture and says they are not yet served on this box.
    """
    b = Bundle.open(bundle).check()
    card = card_for(model, [b])  # a wrong name is one line, before any work
    if arch is not None and not re.fullmatch(r"sm\d{2,3}", arch):
        raise BadInput(f"--arch {arch!r}: give a compute capability as smXY (sm120, sm100, sm90)")
    host = host_tree_of(host_lspci) if host_lspci is not None else None
    choice = the_launch(card, arch, bundle=b, box=box_of(b),
                        serve=Bundle.open(serve).check() if serve is not None else None)
    band = DecodeBand.of_card(card, 1, batch_max)
    nodes = Nodes.of(b)
    if verify and nodes is not None:
        raise BadInput(f"--verify re-measures on this machine alone; {b.path} is a "
                       f"{nodes.describe()} bundle", hint="re-run pcieprof topology on every node")
    if verify:
        check_verifiable(b)
        if timeout_s <= 0:
            raise BadInput(f"--timeout {timeout_s:g}: must be positive")
        if verify_out is not None and not _ours(verify_out):
            raise BadInput(f"--verify-out {verify_out} exists and is not empty",
                           hint="choose another directory (an earlier verify bundle is replaced)")
    if out is not None:
        b = b.copy_to(out, force=force)
        progress.info(f"copied the bundle to {b.path}")
    if host is not None:
        try:
            b.write_doc(host)
        except OSError as exc:
            raise BadInput(f"cannot write {HostPcieTree.FILE} into {b.path}: "
                           f"{exc.strerror or exc}", hint="pass --out DIR") from None
    progress.info(f"tuning {b.path} ({b.source}, backend {b.backend})")
    try:
        result, paths = save(b, card, band, layouts=not no_layouts, context=context,
                             choice=choice)
    except OSError as exc:
        raise BadInput(f"cannot write the recommendations into {b.path}: {exc.strerror or exc}",
                       hint="pass --out DIR to write them into a copy of the bundle") from None
    if nodes is not None:
        click.echo("\n".join(nodes.lines()))
        click.echo("")
    click.echo("\n".join(summary_lines(result)))
    click.echo("")
    if verify:
        paths["verify"] = _verify(b, result, band, verify_out, timeout_s)
    for what, p in paths.items():
        click.echo(f"{what}: {p}")
    click.echo(f"report: pcieprof report {b.path}")


def save(b: Bundle, card: ModelCard, band: DecodeBand, *, layouts: bool = True,
         context: int = 8192, choice: LaunchChoice | None = None
         ) -> tuple[Recommendations, dict[str, str]]:
    """The tuner's result for `b` (pcieprof.commands.tuning.tune), saved into it as `recommend`
    saves it: recommendations.json, tune/recommended.env, tune/sglang_command.sh, the NCCL
    graph/topology files, and the card they are for in the manifest (`model`).

    Args:
        b: the bundle, written in place.
        card: the model card advised for.
        band: the decode band of the gains.
        layouts: also rank the parallel layouts.
        context: tokens per request of the layouts' KV-cache fit.
        choice: the launch backends of the SGLang commands (None: the_launch's default).

    Returns:
        The result and {what: path} of the files written.

    Raises:
        PcieprofError: the tuner cannot read the bundle (one line).
        OSError: the bundle cannot be written.
    """
    result = tune(b, card, band, layouts=layouts, context=context, choice=choice)
    paths = write_outputs(b, result)
    b.set_model(card)  # the card the recommendations are for
    return result, paths


def save_for_report(bundles: Sequence[Bundle], card: ModelCard,
                    band: DecodeBand) -> dict[str, str]:
    """Before a report draws `bundles`, which reads only what they saved: `recommend`'s result
    saved (`save`) into each bundle with P2P or all-reduce rows whose recommendations.json is
    missing or stale (`stale`), with the launch search of a serve bundle among them
    (`joined_search`). One progress line per bundle written.

    Returns:
        Per bundle path, why the report shows no recommendations for it (said on stderr too):
        the bundle cannot be written (read-only, or another process is still writing it), or
        the tuner could not run on it. The report leaves their stale recommendations.json out.
    """
    choice = joined_search(bundles, card)
    why_not: dict[str, str] = {}
    for b in bundles:
        if b.read_table("p2p").empty and b.read_table("allreduce").empty:
            continue
        why = stale(b, card, choice)
        if why is None:
            continue
        cannot = _unwritable(b)
        if cannot is None:
            progress.info(f"{b.path}: {why}; writing recommend's into the bundle "
                          f"({Recommendations.FILE}, tune/), as `pcieprof recommend` would")
            try:
                save(b, card, band, choice=choice)
                continue
            except PcieprofError as exc:
                cannot = f"the tuner could not run on it: {exc.one_line()}"
            except OSError as exc:  # a full disk half-way
                cannot = f"it cannot be written ({exc.strerror or exc})"
        why_not[str(b.path)] = (f"{why}, and {cannot}; `pcieprof recommend {b.path} --out DIR` "
                                f"writes them into a copy")
        progress.warn(f"{b.path}: no recommendations in the report: {why_not[str(b.path)]}")
    return why_not


def stale(b: Bundle, card: ModelCard, choice: LaunchChoice | None = None) -> str | None:
    """Why `b`'s saved recommendations do not answer for `card` (one line), None when they do:
    none saved, made for another card or an older version of this one (the manifest's `model`,
    which `save` sets), or made without the served launch search `choice` comes from."""
    stored = b.read_doc(Recommendations)
    if stored is None:
        return f"no {Recommendations.FILE}"
    if stored.model != card.name:
        return f"{Recommendations.FILE} was made for {stored.model or 'another model'}, not {card.name}"
    made = b.model()
    if made is not None and made.name == card.name and made.hash != card.content_hash:
        return (f"{Recommendations.FILE} was made for {made.short()}; the card is "
                f"{card.short_hash()} now")
    if choice is not None and choice.served and not _same(searched_in(stored),
                                                          choice.serve_bundle):
        return f"{Recommendations.FILE} was made without the launch search in {choice.serve_bundle}"
    return None


def joined_search(bundles: Sequence[Bundle], card: ModelCard) -> LaunchChoice | None:
    """The launch backends from the first serve bundle among `bundles` whose search served
    `card`, else the first-ranked ones of an unfinished search, else None: each bundle's own
    box decides (a search of another model is shown, not joined)."""
    first = None
    for b in serve_searches(bundles):
        try:
            choice = launch_choice(card, b)
        except BadInput as exc:
            progress.warn(f"not joined: {exc.one_line()}")
            continue
        if choice.served:
            return choice
        first = first or choice
    return first


def _same(a: str | None, b: str) -> bool:
    return a is not None and Path(a).resolve() == Path(b).resolve()


def _unwritable(b: Bundle) -> str | None:
    """Why `save` cannot write into `b` now (one line), None when it can."""
    m = b.manifest
    if (m.end_time is None and m.writer and writer.state(m.writer) == "running"
            and not writer.is_this_process(m.writer)):
        return f"it is still being written ({writer.describe(m.writer)})"
    try:  # a read-only mount or directory refuses this, whoever runs it
        with tempfile.TemporaryFile(dir=b.path):
            pass
    except OSError as exc:
        return f"it cannot be written ({exc.strerror or exc})"
    return None


def host_tree_of(path: Path) -> HostPcieTree:
    """tune/host_pcie_tree.json from the user's `lspci -vvv` (pcieprof.discover.lspci, the
    parser the importers use), or BadInput naming what is wrong with the file."""
    _, text = read_input(path)
    if is_lspci_tree(text) and not is_lspci(text):
        raise BadInput(f"{path}: this is `lspci -t` output: it draws the tree but not the NUMA "
                       "node of each root port, which NCCL_TOPO_FILE's <cpu numaid> needs",
                       hint="give `lspci -vvv` of the same machine (sudo shows ACS too)")
    if not is_lspci(text):
        raise BadInput(f"{path}: not `lspci -vvv` output", hint="give `lspci -vvv` of the "
                       "machine the GPUs sit in (for a VM: the hypervisor host's)")
    tree = build_tree(parse_lspci(text, source=str(path)))
    if not tree["gpu_paths"]:
        raise BadInput(f"{path}: lspci shows no NVIDIA GPU",
                       hint="give `lspci -vvv` of the machine the GPUs sit in")
    return HostPcieTree(source=f"the user's lspci -vvv ({path.name}, recommend --host-lspci)",
                        tree=tree)


def _verify(b: Bundle, result: Recommendations, band: DecodeBand, out: Path | None,
            timeout_s: float) -> str:
    """Plan the re-run (pcieprof.tune.verify), measure it (pcieprof.measurement), store the
    verified blocks in recommendations.json and print the comparison."""
    plan = plan_verify(b, result.recommendations, band,
                       ring_order=result.ring.order if result.ring else None)
    target = out if out is not None else b.path / "verify"
    vb = measure_verify(b, plan, target, timeout_s)
    blocks = verify_results(b, vb, plan, result.recommendations, band)
    b.write_doc(attach(result, blocks, vb))
    click.echo("\n".join(verify_lines(result.recommendations, blocks)))
    click.echo("")
    return str(vb.path)


def measure_verify(b: Bundle, plan: VerifyPlan, out: Path, timeout_s: float) -> Bundle:
    """Run a verify plan into a new `recommend-verify` bundle at `out` with the bundle's backend."""
    vb = Bundle.create(out, command="recommend-verify", source=source_of(plan.backend),
                       backend=plan.backend, force=_ours(out), inputs=[b.path])
    topo = b.read_doc(Topology)
    probe_plan = allreduce_plan(plan.backend, list(plan.devices),
                                [(c.name, c.env, c.ranks, c.title) for c in plan.cases],
                                list(plan.sizes), timeout_s=timeout_s, topology=topo)
    vb.write_doc(probe_plan)
    if plan.backend != "sim" and topo is not None:  # sim writes the fabric's own topology
        vb.write_doc(topo)
    vb.set_versions(verifies=str(b.path.resolve()))
    progress.info(f"verify: {len(plan.cases) - 1} recommendation(s) + baseline, "
                  f"{len(plan.sizes)} sizes, backend {plan.backend} -> {vb.path}")
    with MeasurementSession(vb, sim_profile=plan.sim_profile) as session:
        session.measure(probe_plan)
    vb.finish()
    return vb


def _ours(path: Path) -> bool:
    """True when `path` is absent or an earlier verify bundle (safe to replace)."""
    if not path.exists() or (path.is_dir() and not any(path.iterdir())):
        return True
    try:
        return json.loads((path / "manifest.json").read_text()).get("command") == "recommend-verify"
    except (OSError, ValueError):
        return False

"""`pcieprof compare A B [--fail-if "METRIC>+X%"]`: metrics side by side, exit 1 on a regression."""

from __future__ import annotations

import fnmatch
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import click

from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.analysis.virtualization import known_state, like_for_like, pick_pair
from pcieprof.analysis.nodes import Nodes
from pcieprof import progress
from pcieprof.bundle import Bundle
from pcieprof.commands.card_choice import MODEL_HELP, card_for
from pcieprof.commands.options import verbosity
from pcieprof.errors import BadInput, ExitCode
from pcieprof.analysis.metrics import bundle_metrics, higher_is_better
from pcieprof.tune.vm import settings, text_table, unknown_cost, verdict

_EXPR = re.compile(r"^\s*(?P<metric>[A-Za-z0-9_.@*?\-\[\]=,]+)\s*(?P<op>[<>])\s*"
                   r"(?P<num>[+-]?\d+(?:\.\d+)?)\s*(?P<pct>%?)\s*$")


@dataclass(frozen=True)
class Condition:
    """`METRIC > +X%`: fail when B is more than X% above A (`<` with -X%: more than X% below).
    Without `%` the threshold is absolute, in the metric's unit."""

    metric: str
    op: str
    threshold: float
    percent: bool
    text: str

    def failed(self, a: float, b: float) -> bool:
        delta = (b - a) / abs(a) * 100 if self.percent else b - a
        if self.percent and a == 0:
            delta = float("inf") if b > 0 else (float("-inf") if b < 0 else 0.0)
        return delta > self.threshold if self.op == ">" else delta < self.threshold


def parse_condition(text: str) -> Condition:
    """Parse one --fail-if expression; BadInput (one line) when it is not METRIC>+X% / METRIC<-X%."""
    m = _EXPR.match(text)
    if not m:
        raise BadInput(f"--fail-if {text!r}: expected METRIC>+X% or METRIC<-X% "
                       f"(e.g. \"allreduce.default.n8.time_us@12KiB>+10%\")")
    return Condition(m["metric"], m["op"], float(m["num"]), bool(m["pct"]), text.strip())


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _wrap(text: str) -> list[str]:
    """Lines of 100 columns, words and hyphenated sizes (12 KiB-768 KiB) kept whole."""
    return textwrap.wrap(text, 100, break_on_hyphens=False, break_long_words=False)


def vm_lines(a: Bundle, b: Bundle, band: DecodeBand) -> list[str]:
    """When one bundle is a VM and the other bare metal: the VM verdict and the like-for-like
    table (pcieprof.tune.vm, as the report shows them), before the metrics, whose per-variant
    rows compare the same setting on both sides although NCCL chooses differently under it."""
    pair = pick_pair(a, b)
    if pair is None:
        return []
    vm, bare = pair
    cost = like_for_like(vm, bare, band)
    who = "A" if vm is a else "B"
    out = [f"what the VM costs, like for like ({who} = {vm.path.name} is the VM, "
           f"{'B' if who == 'A' else 'A'} = {bare.path.name} bare metal):"]
    if cost is None:
        out += _wrap(unknown_cost(known_state(vm), vm.path.name))
        return out + [""]
    out += _wrap(verdict(cost)) + [""] + text_table(cost)
    out += [f"  {s}" for s in settings(cost) + cost.notes]
    out += ["  (the metrics below compare each variant's own setting on both sides; NCCL "
            "decides differently under the same setting, see above)", ""]
    return out


@click.command("compare")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--fail-if", "fail_if", multiple=True, metavar="EXPR",
              help='Regression condition, repeatable: "METRIC>+X%" fails when B is more than X% '
                   'above A; "METRIC<-X%" when more than X% below; no % = absolute units. '
                   'METRIC may use * wildcards.')
@click.option("--all", "show_all", is_flag=True, help="Show metrics present in only one bundle.")
@click.option("--model", default=None, help=MODEL_HELP + " Its decode sizes name the all-reduce "
              "metrics (time_us@12KiB).")
@verbosity
def command(a: Path, b: Path, fail_if: tuple[str, ...], show_all: bool, model: str | None) -> None:
    """Show the metrics of bundles A and B side by side (B relative to A).

    When one of them ran in a VM and the other on bare metal, first what the VM costs like for
    like: default vs default and best vs best per decode size and per decode step, why, and
    what to do (the report's VM verdict and table).

    Exit status 1 when a --fail-if condition holds (a regression), 2 on bad input.
    """
    conds = [parse_condition(t) for t in fail_if]
    ba, bb = Bundle.open(a).check(), Bundle.open(b).check()
    band = DecodeBand.of_card(card_for(model, [ba, bb]))
    ma, mb = bundle_metrics(ba, band), bundle_metrics(bb, band)
    matched = {c: sorted(n for n in set(ma) & set(mb) if fnmatch.fnmatchcase(n, c.metric))
               for c in conds}
    for c, names_c in matched.items():  # bad input is refused before anything is printed
        if not names_c:
            raise BadInput(f"--fail-if {c.text!r}: no metric {c.metric!r} in both bundles",
                           hint="run without --fail-if to list the metric names")
    for name, bundle in (("A", ba), ("B", bb)):
        if (why := bundle.incomplete()) is not None:
            progress.warn(f"{name} {bundle.path}: bundle {why}; its metrics may be missing "
                          "or incomplete")
    for line in vm_lines(ba, bb, band):
        click.echo(line)
    for name, bundle in (("A", ba), ("B", bb)):
        nodes = Nodes.of(bundle)
        if nodes is not None:  # allreduce.*.<K>x<N> metrics are its groups across the nodes
            click.echo(f"{name}: {nodes.describe()} (node {nodes.layout.node_rank}'s bundle; "
                       f"inter-node transport: {nodes.transport})")
    names = sorted(set(ma) | set(mb)) if show_all else sorted(set(ma) & set(mb))
    width = max([len(n) for n in names] + [6])
    click.echo(f"{'metric':<{width}}  {'A':>10}  {'B':>10}  {'B vs A':>8}")
    for n in names:
        va, vb = ma.get(n), mb.get(n)
        rel = ""
        if va is not None and vb is not None and va != 0:
            d = (vb - va) / abs(va) * 100
            better = (d > 0) == higher_is_better(n)
            rel = f"{d:+.1f}%" + ("" if abs(d) < 0.05 else (" better" if better else " worse"))
        click.echo(f"{n:<{width}}  {_fmt(va):>10}  {_fmt(vb):>10}  {rel}")
    if not names:
        click.echo("(no metric measured in both bundles; --all shows each bundle's own)")
    failures = []
    for c in conds:
        for n in matched[c]:
            if c.failed(ma[n], mb[n]):
                failures.append(f"{n}: {_fmt(ma[n])} -> {_fmt(mb[n])} ({c.text})")
    if failures:
        click.echo("")
        for f in failures:
            click.echo(f"REGRESSION {f}")
        raise SystemExit(int(ExitCode.FAILURE))
    if conds:
        click.echo(f"\nno regression ({len(conds)} condition(s))")

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
from pcieprof.analysis.vm_words import settings, text_table, unknown_cost, verdict

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


def _change(va: float | None, vb: float | None) -> float | None:
    """B vs A in percent, or None when one side is missing or A is 0."""
    if va is None or vb is None or va == 0:
        return None
    return (vb - va) / abs(va) * 100


def _rel(name: str, va: float | None, vb: float | None) -> str:
    d = _change(va, vb)
    if d is None:
        return ""
    better = (d > 0) == higher_is_better(name)
    return f"{d:+.1f}%" + ("" if abs(d) < 0.05 else (" better" if better else " worse"))


def _summary_rows(common: list[str], ma: dict[str, float], mb: dict[str, float],
                  budget: int) -> list[str]:
    """The rows of the default output: the key metrics, then the largest changes among the
    others, `budget` rows at most (at least the key ones that fit), in name order."""
    budget = max(budget, 8)
    key = [n for n in common if _KEY.search(n)][:budget]
    # whole-group rows before the per-pair/sub-group ones (allreduce.*.g0-1), which repeat them
    rest = sorted((n for n in common if n not in key),
                  key=lambda n: (".g" in n, -abs(_change(ma[n], mb[n]) or 0.0)))
    return sorted(key + rest[:budget - len(key)])


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _wrap(text: str) -> list[str]:
    """Lines of 100 columns, words and hyphenated sizes (12 KiB-768 KiB) kept whole."""
    return textwrap.wrap(text, 100, break_on_hyphens=False, break_long_words=False)


#: Lines the default output stays within (`--all` prints everything).
SUMMARY_LINES = 40
#: Metrics a summary always shows when both bundles have them: the default all-reduce over the
#: whole group (one node, or nodes x ranks) and the median of every P2P path.
_KEY = re.compile(r"^allreduce\.default\.(n\d+|\d+x\d+)\.|^p2p\.\w+\.\w+\.median$|^p2p\.bad_rows$"
                  r"|^serve\.decode\.")


def _first_sentence(text: str) -> str:
    """The verdict's first sentence (its claim); the rest is the reasoning --all prints."""
    m = re.search(r"(?<=[a-z)])\.\s+(?=[A-Z])", text)
    return text if m is None else text[:m.start() + 1]


def vm_lines(a: Bundle, b: Bundle, band: DecodeBand, *, full: bool = True) -> list[str]:
    """When one bundle is a VM and the other bare metal: the VM verdict and the like-for-like
    table (pcieprof.analysis.vm_words, as the report shows them), before the metrics, whose per-variant
    rows compare the same setting on both sides although NCCL chooses differently under it.
    Not `full`: the verdict's first sentence and the decode-step row of the table."""
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
    if not full:
        table = text_table(cost)
        step = [ln for ln in table[1:] if "decode step" in ln]
        return out + _wrap(_first_sentence(verdict(cost))) + [table[0], *step[:1], ""]
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
@click.option("--all", "show_all", is_flag=True,
              help=f"Print everything: the whole VM verdict and table, and every metric row (also "
                   f"those of one bundle only). Without it a summary of at most {SUMMARY_LINES} "
                   "lines: the verdict's claim, the default all-reduce, the P2P medians and the "
                   "largest changes.")
@click.option("--model", default=None, help=MODEL_HELP + " Its decode sizes name the all-reduce "
              "metrics (time_us@12KiB).")
@verbosity
def command(a: Path, b: Path, fail_if: tuple[str, ...], show_all: bool, model: str | None) -> None:
    """Show the metrics of bundles A and B side by side (B relative to A).

    When one of them ran in a VM and the other on bare metal, first what the VM costs like for
    like: default vs default and best vs best per decode size and per decode step, why, and
    what to do (the report's VM verdict and table; its claim and the decode-step row without
    --all).

    Prints at most 40 lines unless --all: the default all-reduce over the whole group, the P2P
    medians, then the largest changes among the other metrics, and how many rows --all adds.

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
    head = vm_lines(ba, bb, band, full=show_all)
    for name, bundle in (("A", ba), ("B", bb)):
        nodes = Nodes.of(bundle)
        if nodes is not None:  # allreduce.*.<K>x<N> metrics are its groups across the nodes
            head.append(f"{name}: {nodes.describe()} (node {nodes.layout.node_rank}'s bundle; "
                        f"inter-node transport: {nodes.transport})")
    for line in head:
        click.echo(line)
    common = sorted(set(ma) & set(mb))
    names = sorted(set(ma) | set(mb)) if show_all else _summary_rows(
        common, ma, mb, SUMMARY_LINES - len(head) - 3)
    width = max([len(n) for n in names] + [6])
    click.echo(f"{'metric':<{width}}  {'A':>10}  {'B':>10}  {'B vs A':>8}")
    for n in names:
        va, vb = ma.get(n), mb.get(n)
        click.echo(f"{n:<{width}}  {_fmt(va):>10}  {_fmt(vb):>10}  {_rel(n, va, vb)}")
    if not names:
        click.echo("(no metric measured in both bundles; --all shows each bundle's own)")
    elif not show_all:
        more = len(set(ma) | set(mb)) - len(names)
        click.echo(f"({len(names)} of {len(set(ma) | set(mb))} rows; --all prints the other "
                   f"{more}{' and the whole VM verdict' if head else ''})" if more or head
                   else "(every row shown)")
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

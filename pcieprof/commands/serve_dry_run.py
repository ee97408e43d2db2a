"""serve-bench --dry-run: the exact commands and environment it would launch (secrets masked),
or, with --sweep, the launch search's order with the reason and sources of each step."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import click

from pcieprof.cards import LaunchTarget, ModelCard
from pcieprof.redact import redact
from pcieprof.serve.sglang_cmd import (LaunchConfig, LaunchPrefix, ParserSpec, ServerCommand,
                                       build_command, recorded_env)
from pcieprof.serve.sweep import entries_from
from pcieprof.tune.learn import RULES
from pcieprof.tune.search import End, Search, Step
from pcieprof.tune.space import SearchSpace

def print_commands(card: ModelCard, base: LaunchConfig, sweep_file: Path | None,
                   parser: ParserSpec | None, prefix: LaunchPrefix | None,
                   notes: list[str], target: LaunchTarget | None = None) -> None:
    """The command of the given configuration, or of each of --sweep-file's, for the box
    `target` (the card's box settings that hold there)."""
    configs = entries_from(base, sweep_file) if sweep_file else None
    items = [(e.config, e.why) for e in configs] if configs else [(base, "")]
    for note in notes:
        click.echo(f"# {note}")
    for i, (cfg, why) in enumerate(items):
        cmd = build_command(card, cfg, parser=parser, prefix=prefix, target=target)
        if len(items) > 1:
            click.echo(f"# attempt {i}: {cfg.name}" + (f" - {why}" if why else ""))
        _echo_command(cmd)
        if i + 1 < len(items):
            click.echo("")


def _echo_command(cmd: ServerCommand) -> None:
    checked = (f"checked against SGLang {cmd.checked_against}'s own parser"
               if cmd.checked_against else "")
    click.echo(f"# {'reference server' if cmd.reference else 'SGLang'} command"
               + (f" ({checked})" if checked else ""))
    for note in cmd.notes:
        click.echo(f"# {note}")
    click.echo("# environment set for the server (secrets shown as ***):")
    for k, v in sorted(redact(cmd.env).items()):
        click.echo(f"export {k}={_q(v)}")
    inherited = {k: v for k, v in recorded_env(cmd).items() if k not in cmd.env}
    for k, v in inherited.items():
        click.echo(f"# inherited: {k}={v}")
    if cmd.prefix:
        click.echo(f"# through the launch prefix: {redact(cmd.prefix.text())}")
        click.echo(" ".join(_q(a) for a in redact(cmd.exec_argv())))
    else:
        click.echo(" ".join(_q(a) for a in redact(cmd.argv)))
    click.echo("# argv: " + json.dumps(redact(cmd.argv)))


def print_search(card: ModelCard, base: LaunchConfig, search: Search,
                 parser: ParserSpec | None, prefix: LaunchPrefix | None,
                 notes: list[str], target: LaunchTarget | None = None) -> None:
    """Print the search: its order (each step with reason and sources), the value ranking per
    axis with the claims behind it, the rules, the commands, the sources."""
    sp = search.space
    plan = search.plan(min(search.max_attempts, 12))
    checked = (f"flags checked against SGLang {parser.version}'s own parser" if parser
               else "flags not checked (no SGLang parser here)")
    like = f", playing {sp.like}'s search" if sp.like else ""
    click.echo(f"# launch search: {card.name} on {sp.arch}{like}; {checked}")
    click.echo("# the order if every attempt failed without a recognised cause; a classified "
               "failure changes what follows (rules below). attempt: configuration [rule] "
               "what it sets, verdict (evidence, sources)")
    steps = [st for st in plan if isinstance(st, Step)]
    for i, st in enumerate(steps):
        click.echo(f"# {i}: {sp.label(st.config)} [{st.rule}] {_what(sp, st)}")
    last = plan[-1] if plan else None
    if isinstance(last, End):
        click.echo(f"# then: {last.why}")
    for note in [*notes, *sp.notes]:
        click.echo(f"# {note}")
    click.echo("")
    click.echo("# values by axis: works, then unknown, then fails; per value the strongest "
               "evidence decides (own stack > report > SGLang source > docs > assumed):")
    for a in sp.axes:
        when = (" (only with " + ", ".join(f"{k}={'|'.join(v)}" for k, v in a.only_when.items())
                + ")") if a.only_when else ""
        click.echo(f"# {a.name}{when}:")
        for r in sp.ranked(a.name):
            click.echo(f"#   {r.value}: {r.why}")
    for req in sp.requirements:
        click.echo(f"# SGLang refuses: {req.text()}")
    click.echo("")
    click.echo("# what a failure teaches (the first rule that matches decides):")
    for rule in RULES:
        on = "|".join(rule.outcomes) + (f" and {rule.when}" if rule.when else "")
        axes = f" {', '.join(rule.axes)}" if rule.axes else ""
        click.echo(f"#   {rule.name}: {on} -> {rule.action}{axes}: {rule.why}")
    for i, st in enumerate(steps):
        click.echo("")
        click.echo(f"# attempt {i} [{st.rule}]: {st.why}")
        for change in st.changes:
            click.echo(f"#   {change}")
        cmd = build_command(card, base.with_axes(st.config, sp.label(st.config)),
                            parser=parser, prefix=prefix, target=target)
        _echo_command(cmd)
    click.echo("")
    for key, text in card.sources.items():
        click.echo(f"# {key}: {text}")


def _what(space: SearchSpace, step: Step) -> str:
    """The step in a few words: what it sets (the first) or changes, and why."""
    if step.rule == "first":
        said = []
        for a, v in step.config.items():
            if v and a in ("dsa_decode_backend", "attention_backend"):
                r = space.rank_of(a, v)
                said.append(f"{a}={v}" + (f" {r.short()}" if r else ""))
        return step.why + ": " + ", ".join(said)
    parts = []
    for axis in step.varied:
        r = space.rank_of(axis, step.config.get(axis, ""))
        parts.append(f"{axis} -> {step.config.get(axis) or '-'}" + (f" {r.short()}" if r else ""))
    return "; ".join(parts) or (step.changes[0][:160] if step.changes else "")


def _q(s: str) -> str:
    return shlex.quote(s)

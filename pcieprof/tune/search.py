"""The launch search: from the attempts so far, the next configuration to launch, and why.

The first attempt is the best-ranked value on every axis (pcieprof.tune.space). After each
failure the first matching rule of pcieprof.tune.learn says what the failure teaches: values
that leave the search, which axes to change next, or that no launch choice can help. The search
is a pure function of the attempts recorded so far, so a search that was interrupted resumes from
the bundle and picks the same next step it would have picked. It ends at the first configuration
that serves correct tokens, when a rule stops it, or when no untried configuration is left near
the attempts made (it then says which axes it exhausted).

The bundle document `serve/search.json` is pcieprof.bundle.serve_search.ServeSearch, built by
`search_document` below and written by pcieprof.serve.run after every attempt (the command
hands serve.run the search as its plan: pcieprof.commands.launch_plan).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from pcieprof.bundle.serve_search import (NOT_A_RESULT, Attempt, AxisValue, Exclusion,
                                          SearchAxis, SearchEnd, SearchRule, ServeSearch, Winner)
from pcieprof.errors import BadInput
from pcieprof.tune.learn import ATTENTION_AXES, RULES, Rule, in_graph_capture, rule_named
from pcieprof.tune.space import Config, SearchSpace

@dataclass(frozen=True)
class Tried:
    """One attempt as the search sees it.

    Attributes:
        index: the attempt's number in the bundle.
        config: axis -> value.
        outcome: its outcome value (`ok`, `nan_in_decode`, ...; `interrupted` is no result).
        excerpt: the log lines around the decisive one (the decisive line starts with ">").
        last_progress: the last progress line of its log ("" if none).
        rule: the rule that chose it (`first` for the first).
        parent: the attempt it was derived from.
        varied: the axes its rule changed (repairs not counted).
    """

    index: int
    config: Config
    outcome: str
    excerpt: str = ""
    last_progress: str = ""
    rule: str = "first"
    parent: int | None = None
    varied: tuple[str, ...] = ()

    @property
    def deciding_line(self) -> str:
        for ln in self.excerpt.splitlines():
            if ln.startswith(">"):
                return ln[1:].strip()
        return self.last_progress


@dataclass(frozen=True)
class Step:
    """The next attempt.

    Attributes:
        config: axis -> value.
        rule: the rule that chose it (`first` for the first attempt).
        parent: the attempt it is derived from (None for the first).
        varied: the axes the rule changed.
        why: the reason, one line.
        changes: one line per changed axis, with the ranking reason or the requirement.
        sources: the source keys behind the chosen values.
    """

    config: Config
    rule: str
    parent: int | None
    varied: tuple[str, ...]
    why: str
    changes: tuple[str, ...]
    sources: tuple[str, ...] = ()


@dataclass(frozen=True)
class End:
    """The search is over without a configuration that serves.

    Attributes:
        status: `stopped` (a rule or the attempt limit) or `exhausted`.
        why: one line.
        hint: what to do next.
        exhausted_axes: axes every value of which was tried or excluded.
        open_axes: axes with values never tried.
    """

    status: str
    why: str
    hint: str = ""
    exhausted_axes: tuple[str, ...] = ()
    open_axes: tuple[str, ...] = ()


@dataclass
class Learned:
    """What the attempts so far taught.

    Attributes:
        excluded: axis -> values out of the search.
        excluded_by: (axis, value, attempt index, rule name) per exclusion.
        rules: attempt index -> the rule that matched its failure.
    """

    excluded: dict[str, set[str]] = field(default_factory=dict)
    excluded_by: list[tuple[str, str, int, str]] = field(default_factory=list)
    rules: dict[int, Rule] = field(default_factory=dict)


class Search:
    """The search over one card's space.

    Args:
        space: the search space (card, architecture, installed SGLang).
        start: axis -> value the first attempt uses (the backends a user gave); the other axes
            take their best-ranked values. Later attempts may change them.
        max_attempts: attempts (results, not interrupted ones) after which it stops.

    Raises:
        BadInput: `start` names an axis the space lacks, or SGLang refuses it whatever the
            other axes are.
    """

    def __init__(self, space: SearchSpace, start: Mapping[str, str] | None = None,
                 max_attempts: int = 16) -> None:
        self.space = space
        self.start = {k: v for k, v in (start or {}).items() if v}
        self.max_attempts = max_attempts
        for a in self.start:
            if not space.has(a):
                raise BadInput(f"--{a.replace('_', '-')} is not an axis of {space.card}'s search "
                               f"({', '.join(x.name for x in space.axes)})")

    # -- learning ----------------------------------------------------------------------------------

    def learn(self, history: list[Tried]) -> Learned:
        """Replay the attempts: which rule each failure matched, what left the search."""
        done = [t for t in history if t.outcome not in NOT_A_RESULT]
        out = Learned()
        for i, t in enumerate(done):
            if t.outcome == "ok":
                continue
            rule = self._match(t, done[:i], out)
            out.rules[t.index] = rule
            if rule.action == "exclude":
                for ax, v in self._blamed(t, rule, done):
                    if v not in out.excluded.setdefault(ax, set()):
                        out.excluded[ax].add(v)
                        out.excluded_by.append((ax, v, t.index, rule.name))
        return out

    def _match(self, t: Tried, before: list[Tried], learned: Learned) -> Rule:
        for rule in RULES:
            if rule.covers(t.outcome) and self._holds(rule, t, before, learned):
                return rule
        return RULES[-1]

    def _holds(self, rule: Rule, t: Tried, before: list[Tried], learned: Learned) -> bool:
        if rule.when == "":
            return True
        if rule.when == "names_value":
            return bool(self.space.named_in(_deciding_text(t.excerpt), t.config))
        if rule.when == "one_axis_changed":
            return len(_changed_from_parent(t, before)) == 1
        if rule.when == "in_graph_capture":
            return in_graph_capture(t.last_progress, t.excerpt)
        if rule.when == "survived_attention_change":
            if any(_together(b.rule) for b in [*before, t]):
                return False  # the GEMM/MoE/KV group was tried once already
            for b in before:
                if b.outcome != t.outcome:
                    continue
                diff = {a for a in t.config if t.config[a] != b.config.get(a, "")}
                if diff and diff <= set(ATTENTION_AXES) and "attention_backend" in diff:
                    return True
            return False
        return False

    def _blamed(self, t: Tried, rule: Rule, done: list[Tried]) -> list[tuple[str, str]]:
        if rule.when == "names_value":
            return self.space.named_in(_deciding_text(t.excerpt), t.config)
        if rule.when == "one_axis_changed":
            return [(a, t.config[a]) for a in _changed_from_parent(t, done)]
        return []

    # -- choosing ------------------------------------------------------------------------------------

    def next(self, history: list[Tried]) -> Step | End:
        """The next attempt after `history` (None of it `ok`), or the end of the search."""
        done = [t for t in history if t.outcome not in NOT_A_RESULT]
        if not done:
            return self._first()
        learned = self.learn(done)
        last = done[-1]
        rule = learned.rules[last.index]
        if rule.action == "stop":
            return End("stopped", f"attempt {last.index} ended {last.outcome}: {rule.why}",
                       rule.hint, *self.coverage(done, learned))
        if len(done) >= self.max_attempts:
            return End("stopped", f"{len(done)} attempts made (the limit, --max-attempts)",
                       "raise --max-attempts, or pin the axes you know with their flags",
                       *self.coverage(done, learned))
        tried = [t.config for t in history if t.outcome not in NOT_A_RESULT]
        base, base_index = self._base(last, done, learned)
        first_axes: tuple[str, ...] = rule.axes
        if rule.action == "exclude":
            first_axes = tuple(dict.fromkeys(ax for ax, _v, i, _r in learned.excluded_by
                                             if i == last.index))
        why = f"attempt {last.index} ended {last.outcome}: {rule.why} (rule {rule.name})"
        if rule.action == "vary_together":
            step = self._together(base, base_index, rule, why, learned, tried)
            if step is not None:
                return step
        order = list(first_axes) + [a.name for a in self.space.axes if a.name not in first_axes]
        alike: dict[str, set[str]] = {}
        for t in done:
            if t.outcome == last.outcome:
                for a, v in t.config.items():
                    alike.setdefault(a, set()).add(v)
        step = self._neighbour(base, base_index, order, rule, why, learned, tried, alike)
        if step is not None:
            return step
        for t in reversed(done):  # nothing left next to the last one: next to an earlier one
            step = self._neighbour(t.config, t.index, order, rule,
                                   why + f"; nothing untried next to attempt {base_index}, so "
                                         f"next to attempt {t.index}", learned, tried, alike)
            if step is not None:
                return step
        ex, op = self.coverage(done, learned)
        return End("exhausted", f"no untried configuration left after {len(done)} attempts "
                                f"(axes exhausted: {', '.join(ex) or 'none'})",
                   "pin an axis to a value this card does not list (serve-bench --<axis> ...)"
                   " or add one to the card's [search]", ex, op)

    def _first(self) -> Step:
        if self.start:
            given = self.space.applicable(self.start)
            got = self.space.repair(given, given, {})
            if got is None:
                raise BadInput(f"SGLang refuses the backends given ({_show(self.start)}) "
                               f"whatever the other axes are",
                               hint="; ".join(r.text() for r in self.space.requirements
                                              if r.applies({**self.space.first()[0],
                                                            **self.start})) or None)
            cfg, repaired = got
            why = f"the backends given ({_show(self.start)}); the other axes best-ranked"
        else:
            cfg, repaired = self.space.first()
            why = "the best-ranked value on every axis"
        changes = []
        sources = []
        for a in self.space.axes:
            v = cfg.get(a.name, "")
            if not v:
                continue
            r = self.space.rank_of(a.name, v)
            if a.name in self.start:
                reason = "given"
            elif a.name in repaired:
                reason = f"({repaired[a.name]})"
            else:
                reason = r.why if r else ""
            changes.append(f"{a.name} = {v}: {reason}")
            if r and r.source and a.name not in repaired and a.name not in self.start:
                sources.append(r.source)
        return Step(cfg, "first", None, tuple(self.start), why, tuple(changes),
                    tuple(dict.fromkeys(sources)))

    def _base(self, last: Tried, done: list[Tried], learned: Learned) -> tuple[Config, int]:
        """Where the next change starts: the last attempt, except after a group change that did
        not help (back to the configuration before it)."""
        if _together(last.rule) and last.parent is not None:
            parent = next((t for t in done if t.index == last.parent), None)
            if parent is not None and parent.outcome == last.outcome:
                return parent.config, parent.index
        return last.config, last.index

    def _allowed(self, cfg: Mapping[str, str], learned: Learned, tried: list[Config]) -> bool:
        if any(cfg.get(a, "") in vals for a, vals in learned.excluded.items()):
            return False
        return dict(cfg) not in tried

    def _neighbour(self, base: Config, base_index: int, order: list[str], rule: Rule, why: str,
                   learned: Learned, tried: list[Config], failed_alike: dict[str, set[str]]
                   ) -> Step | None:
        """The first single-axis change of `base`, axes in `order`, values by rank. Values that
        already ended the same way on that axis come last (they were tried and failed alike)."""
        for ax in order:
            if not self.space.has(ax) or not self.space.axis(ax).applies(base):
                continue
            ranked = self.space.ranked(ax)
            seen = failed_alike.get(ax, set())
            for r in [r for r in ranked if r.value not in seen] + \
                     [r for r in ranked if r.value in seen]:
                if r.value == base.get(ax) or r.value in learned.excluded.get(ax, set()):
                    continue
                got = self.space.repair({**base, ax: r.value}, (ax,), learned.excluded)
                if got is None or not self._allowed(got[0], learned, tried):
                    continue
                cfg, repaired = got
                return Step(cfg, rule.name, base_index, (ax,), why,
                            self._changes(base, cfg, {ax: r.why}, repaired),
                            (r.source,) if r.source else ())
        return None

    def _together(self, base: Config, base_index: int, rule: Rule, why: str, learned: Learned,
                  tried: list[Config]) -> Step | None:
        cfg = dict(base)
        reasons, sources = {}, []
        for ax in rule.axes:
            if not self.space.has(ax) or not self.space.axis(ax).applies(cfg):
                continue
            r = next((r for r in self.space.ranked(ax) if r.value != base.get(ax)
                      and r.value not in learned.excluded.get(ax, set())), None)
            if r is None:
                continue
            cfg[ax] = r.value
            reasons[ax] = r.why
            if r.source:
                sources.append(r.source)
        others = [a.name for a in self.space.axes if a.name not in rule.axes]
        got = self.space.repair(cfg, others, learned.excluded)
        if got is None or not self._allowed(got[0], learned, tried) or got[0] == base:
            return None
        cfg, repaired = got
        varied = tuple(ax for ax in reasons if cfg.get(ax) != base.get(ax))
        return Step(cfg, rule.name, base_index, varied, why,
                    self._changes(base, cfg, reasons, repaired), tuple(dict.fromkeys(sources)))

    def _changes(self, base: Config, cfg: Config, reasons: dict[str, str],
                 repaired: dict[str, str]) -> tuple[str, ...]:
        """One line per axis that differs from `base`: the ranking reason for a chosen value, the
        requirement for one a repair set."""
        out = []
        for a in self.space.axes:
            old, new = base.get(a.name, ""), cfg.get(a.name, "")
            if old == new:
                continue
            reason = reasons.get(a.name) if a.name in reasons and a.name not in repaired \
                else f"({repaired.get(a.name, 'follows from the other changes')})"
            out.append(f"{a.name}: {old or '-'} -> {new or '-'}: {reason}")
        return tuple(out)

    def coverage(self, done: list[Tried], learned: Learned) -> tuple[tuple[str, ...],
                                                                       tuple[str, ...]]:
        """(axes every value of which was tried or excluded, axes with values never tried)."""
        exhausted: list[str] = []
        open_: list[str] = []
        for a in self.space.axes:
            seen = {t.config.get(a.name, "") for t in done} | learned.excluded.get(a.name, set())
            (exhausted if set(a.values) <= seen else open_).append(a.name)
        return tuple(exhausted), tuple(open_)

    # -- the plan for --dry-run ----------------------------------------------------------------------

    def plan(self, n: int) -> list[Step | End]:
        """The first `n` attempts when every one ends without a recognised cause (`crashed`):
        the order the search tries things before it learns anything."""
        history: list[Tried] = []
        out: list[Step | End] = []
        for i in range(n):
            nxt = self.next(history)
            out.append(nxt)
            if isinstance(nxt, End):
                break
            history.append(Tried(i, nxt.config, "crashed", rule=nxt.rule, parent=nxt.parent,
                                 varied=nxt.varied))
        return out


# -- the bundle document -------------------------------------------------------------------------


def search_document(search: Search, tried: list[Tried], attempts: list[Attempt], *,
                    status: str, why: str, winner: Winner | None, end: End | None,
                    sources: Mapping[str, str], sglang: str | None) -> ServeSearch:
    """serve/search.json: the search's space and rules, what the attempts taught, the attempts.

    Args:
        search: the search.
        tried: the attempts as the search sees them (to replay what they taught).
        attempts: the attempts as serve/attempts.jsonl records them.
        status: `running`, `found`, `exhausted`, `stopped` or `interrupted`.
        why: one line.
        winner: the configuration that served, or None.
        end: how the search ended without a winner, if it did.
        sources: the card's source keys.
        sglang: the SGLang version whose parser the flags were checked against.
    """
    sp = search.space
    done = [t for t in tried if t.outcome not in NOT_A_RESULT]
    learned = search.learn(done)
    exhausted, open_ = search.coverage(done, learned)
    return ServeSearch(
        card=sp.card, like=sp.like, arch=sp.arch, sglang=sglang, status=status, why=why,
        axes=[SearchAxis(a.name, {k: list(v) for k, v in a.only_when.items()},
                         [AxisValue(r.value, r.verdict, r.why) for r in sp.ranked(a.name)])
              for a in sp.axes],
        notes=list(sp.notes),
        rules=[SearchRule(r.name, list(r.outcomes), r.when, r.action, list(r.axes), r.why)
               for r in RULES],
        excluded=[Exclusion(a, v, i, n) for a, v, i, n in learned.excluded_by],
        attempts=list(attempts), winner=winner,
        end=SearchEnd(end.status, end.why, end.hint) if end else None,
        exhausted_axes=list(end.exhausted_axes if end else exhausted),
        open_axes=list(end.open_axes if end else open_), sources=dict(sources))


def _deciding_text(excerpt: str) -> str:
    """The decisive log line and the lines before it in the excerpt (a traceback's frames name
    the library; what follows is other ranks' noise)."""
    lines = excerpt.splitlines()
    for i, ln in enumerate(lines):
        if ln.startswith(">"):
            return "\n".join(lines[:i + 1])
    return ""


def _changed_from_parent(t: Tried, others: list[Tried]) -> list[str]:
    """The axes whose value `t` changed from its parent, when the change set a value."""
    parent = next((b for b in others if b.index == t.parent), None)
    if parent is None:
        return []
    return [a for a, v in t.config.items() if v and v != parent.config.get(a, "")]


def _together(rule_name: str) -> bool:
    r = rule_named(rule_name)
    return r is not None and r.action == "vary_together"


def _show(cfg: Mapping[str, str]) -> str:
    return ", ".join(f"{a}={v}" for a, v in cfg.items())

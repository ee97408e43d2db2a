"""The launch search as serve-bench's plan: the search (pcieprof.tune.search) decides which
configuration to launch next, the pipeline (pcieprof.serve.run) launches it.

The two live in layers that do not import each other (deciding never measures, measuring never
decides), so the commands join them here: attempts go to the search as `Tried`, its steps come
back as `SweepEntry`s, and after every attempt serve/search.json is written from both.
"""

from __future__ import annotations

import shlex
from typing import Mapping

from pcieprof.bundle import Bundle
from pcieprof.bundle.serve_search import Attempt, SearchEnd, SearchStep, Winner
from pcieprof.serve.run import Plan
from pcieprof.serve.sglang_cmd import LaunchConfig
from pcieprof.serve.sweep import SweepEntry
from pcieprof.tune.search import End, Search, Tried, search_document


class SearchPlan(Plan):
    """serve-bench --sweep: each next configuration from the launch search.

    Args:
        search: the search over the card's space.
        base: the launch configuration the search's axis values are applied to.
        sources: the card's source keys (recorded in serve/search.json).
        sglang: the SGLang version whose parser the flags were checked against, or None.
    """

    searched = True

    def __init__(self, search: Search, base: LaunchConfig, *, sources: Mapping[str, str],
                 sglang: str | None) -> None:
        self.search = search
        self.base = base
        self.sources = dict(sources)
        self.sglang = sglang
        self._end: End | None = None  # the search's own end (it names the exhausted axes)

    def next(self, attempts: list[Attempt]) -> SweepEntry | SearchEnd:
        step = self.search.next([_tried(a) for a in attempts])
        if isinstance(step, End):
            self._end = step
            return SearchEnd(step.status, step.why, step.hint)
        label = self.search.space.label(step.config)
        cfg = self.base.with_axes(step.config, label)
        return SweepEntry(cfg, why=step.why, source=", ".join(step.sources), search=SearchStep(
            config=dict(step.config), label=label, rule=step.rule, parent=step.parent,
            varied=list(step.varied), why=step.why, changes=list(step.changes)))

    def record(self, bundle: Bundle, attempts: list[Attempt], *, status: str = "",
               why: str = "", end: SearchEnd | None = None) -> None:
        winner = next((a for a in reversed(attempts) if a.ok and a.search), None)
        if not status:
            status = "found" if winner else (end.status if end else "running")
        if not why:
            why = (f"attempt {winner.index} served correct tokens: {winner.label}"
                   if winner else (end.why if end else "searching"))
        ours = [a for a in attempts if a.search]
        bundle.write_doc(search_document(
            self.search, [_tried(a) for a in ours], ours, status=status,
            why=why, winner=_winner(winner) if winner else None,
            end=(self._end or End(end.status, end.why, end.hint)) if end else None,
            sources=self.sources, sglang=self.sglang))


def _tried(a: Attempt) -> Tried:
    s = a.search or SearchStep(rule="first")
    return Tried(index=a.index, config=dict(s.config), outcome=a.outcome, excerpt=a.excerpt,
                 last_progress=a.last_progress, rule=s.rule or "first", parent=s.parent,
                 varied=tuple(s.varied))


def _winner(a: Attempt) -> Winner:
    cmd = a.command
    argv, env = list(cmd.argv), dict(cmd.env)
    line = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    return Winner(index=a.index, label=a.label,
                  config=dict(a.search.config) if a.search else {}, argv=argv, env=env,
                  command=(line + " " if line else "") + shlex.join(argv),
                  launch_prefix=list(cmd.prefix or []))

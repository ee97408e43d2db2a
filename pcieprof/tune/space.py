"""The launch search space of a model card: axes, what is known about each value, and the rules
SGLang itself enforces, for one GPU architecture.

A card's `[search]` table (see pcieprof/cards/glm5-nvfp4.toml) lists:

- `axes`: the launch choices a user varies, in the order they are varied when nothing says
  otherwise; each `[search.axis.<name>]` gives its candidate values (in the order to try them
  when no claim says more) and `only_when` (e.g. the DSA backends only matter with
  `--attention-backend dsa`). Axis names are `LaunchConfig` fields; `cuda_graph` takes "on"/"off".
- `[[search.claim]]`: one statement about one value on one architecture: `says` "works",
  "fails" (with the `outcome` seen) or "default" (SGLang picks it by itself), its `evidence` kind
  and `source`. Kinds, strongest first: `own` (the user's own stack: their field report), `report`
  (someone else's launch on the same GPU: issue threads, write-ups), `source` (the pinned SGLang's
  code), `docs`, `assumed`. Where claims disagree the strongest kind decides; every claim is kept
  and printed.
- `[[search.requires]]`: combinations the pinned SGLang refuses at start (a ValueError in its
  source): when the `when` values are chosen, the `need` values must be too.
- `[search.log_names]`: words that name a value in a server log (a kernel or library name), so an
  `Unsupported architecture` line can be pinned on the value that caused it.

A card may instead say `like = "<card>"` to use another card's search, optionally without some
evidence kinds (`drop_evidence`): the reference server plays glm5-nvfp4's search without the field
report, so that the search has something to learn.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import combinations, product
from typing import Any, Callable, Iterable, Mapping

from pcieprof.errors import BadInput

#: Evidence kinds, strongest first.
EVIDENCE = ("own", "report", "source", "docs", "assumed")
#: What a claim can say about a value.
SAYS = ("works", "default", "fails")
#: Verdict groups, tried in this order.
VERDICTS = ("works", "unknown", "fails")
#: The SGLang flag of each axis (cuda_graph is written by the command builder).
FLAGS = {
    "attention_backend": "--attention-backend",
    "dsa_prefill_backend": "--dsa-prefill-backend",
    "dsa_decode_backend": "--dsa-decode-backend",
    "fp8_gemm_backend": "--fp8-gemm-backend",
    "fp4_gemm_backend": "--fp4-gemm-backend",
    "moe_runner_backend": "--moe-runner-backend",
    "kv_cache_dtype": "--kv-cache-dtype",
    "cuda_graph": "",
}

Config = dict[str, str]


@dataclass(frozen=True)
class Claim:
    """One statement about a value on an architecture.

    Attributes:
        axis: the axis (a LaunchConfig field).
        value: the value it is about.
        arch: `sm120`, `sm100`, ... or `any`.
        says: `works`, `fails` or `default`.
        evidence: its kind (see EVIDENCE).
        source: where it comes from (a URL, a file of the pinned SGLang, the field report).
        outcome: for `fails`: the outcome seen (nan_in_decode, unsupported_architecture, hang).
        note: the circumstances (other model, patched image, KV dtype).
    """

    axis: str
    value: str
    arch: str
    says: str
    evidence: str
    source: str
    outcome: str = ""
    note: str = ""

    def text(self) -> str:
        """`fails (nan_in_decode), own: <source> (<note>)`."""
        what = self.says + (f" ({self.outcome})" if self.outcome else "")
        return f"{what}, {self.evidence}: {self.source}" + (f" ({self.note})" if self.note else "")


@dataclass(frozen=True)
class Requirement:
    """A combination SGLang refuses at start: choosing `when` needs `need`.

    Attributes:
        arch: the architecture it holds on (`any` for all).
        when: axis -> values; applies when every axis has one of its values.
        need: axis -> values every axis must then have.
        source: where the pinned SGLang enforces it.
    """

    arch: str
    when: dict[str, tuple[str, ...]]
    need: dict[str, tuple[str, ...]]
    source: str

    def applies(self, cfg: Mapping[str, str]) -> bool:
        return all(cfg.get(a, "") in v for a, v in self.when.items())

    def violated(self, cfg: Mapping[str, str]) -> bool:
        """True when `cfg` chooses `when` without `need` (an empty `need`: `when` is refused)."""
        return self.applies(cfg) and (not self.need
                                      or not all(cfg.get(a, "") in v for a, v in self.need.items()))

    def text(self) -> str:
        return f"{_show(self.when)} needs {_show(self.need)} ({self.source})"


def _show(cond: Mapping[str, tuple[str, ...]]) -> str:
    return ", ".join(f"{a}={'|'.join(v)}" for a, v in cond.items())


@dataclass(frozen=True)
class Axis:
    """One launch choice.

    Attributes:
        name: the LaunchConfig field (or `cuda_graph`).
        values: candidates, in the card's order.
        only_when: axis -> values under which this axis applies (else it is left unset).
    """

    name: str
    values: tuple[str, ...]
    only_when: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def applies(self, cfg: Mapping[str, str]) -> bool:
        return all(cfg.get(a, "") in v for a, v in self.only_when.items())


@dataclass(frozen=True)
class Ranked:
    """A value with its verdict and the claims behind it.

    Attributes:
        value: the value.
        verdict: `works`, `unknown` or `fails` (by the strongest evidence kind among its claims).
        claims: every claim about it on this architecture, strongest first.
        why: one line: the verdict and, where claims disagree, which one decided and why.
    """

    value: str
    verdict: str
    claims: tuple[Claim, ...]
    why: str

    @property
    def source(self) -> str:
        """The source of the deciding claim ("" when there is none)."""
        return self.claims[0].source if self.claims else ""

    def short(self) -> str:
        """A few words: `works (own F1; outranks report S8, S11)`, `fails (report S12)`."""
        if not self.claims:
            return "no claim"
        top = self.claims[0]
        head = "default" if self.verdict == "unknown" and top.says == "default" else self.verdict
        same = [c for c in self.claims if c.evidence == top.evidence]
        if self.verdict == "unknown" and len({c.says for c in same}) > 1:
            head = "disputed"
        keys = ", ".join(dict.fromkeys(c.source for c in same))
        out = f"{head} ({top.evidence} {keys}"
        against = [c for c in self.claims if c.evidence != top.evidence
                   and _opposes(c.says, self.verdict)]
        if against:
            out += f"; outranks {against[0].evidence} " + ", ".join(
                dict.fromkeys(c.source for c in against if c.evidence == against[0].evidence))
        return out + ")"


@dataclass
class SearchSpace:
    """The search space of one card on one architecture.

    Attributes:
        card: the card's name.
        arch: the GPU architecture (`sm120`, `sm100`, ...).
        axes: the axes in the order they are varied by default.
        claims: every claim for this architecture.
        requirements: SGLang's refusals for this architecture.
        log_names: value -> words naming it in a log.
        notes: what was dropped and why (values the installed SGLang lacks, evidence left out).
        like: the card whose search this is, when borrowed.
    """

    card: str
    arch: str
    axes: list[Axis]
    claims: list[Claim]
    requirements: list[Requirement]
    log_names: dict[str, tuple[str, ...]]
    notes: list[str] = field(default_factory=list)
    like: str = ""
    _ranked: dict[str, list[Ranked]] = field(default_factory=dict, repr=False)

    # -- reading a card ---------------------------------------------------------------------------

    @classmethod
    def from_card(cls, name: str, data: Mapping[str, Any], *, arch: str | None = None,
                  choices: Mapping[str, Iterable[str] | None] | None = None,
                  version: str = "",
                  load_other: Callable[[str], Mapping[str, Any]] | None = None) -> "SearchSpace":
        """Build the space from a card's `[search]` table.

        Args:
            name: the card's name.
            data: its `[search]` table.
            arch: the architecture (default: the card's `arch`).
            choices: flag -> the values the installed SGLang's parser accepts (None: the flag is
                unknown to it); values it lacks are dropped with a note. None: no parser.
            version: that SGLang's version, for the notes.
            load_other: card name -> its `[search]` table, for `like`.

        Raises:
            BadInput: no search table, unknown axes or evidence kinds.
        """
        like = str(data.get("like", ""))
        drop = set(data.get("drop_evidence", []))
        base = data
        if like:
            if load_other is None:
                raise BadInput(f"card {name}: [search] like = {like!r} needs that card")
            base = {**load_other(like), **{k: v for k, v in data.items()
                                           if k not in ("like", "drop_evidence")}}
        arch = arch or str(base.get("arch", ""))
        if not arch or not base.get("axes"):
            raise BadInput(f"card {name} has no launch search ([search] axes and arch)",
                           hint="give --sweep-file FILE with [[sweep]] entries instead")
        axes = []
        for a in base["axes"]:
            spec = dict(base.get("axis", {}).get(a, {}))
            if a not in FLAGS:
                raise BadInput(f"card {name}: unknown search axis {a!r}",
                               hint=f"known: {', '.join(FLAGS)}")
            axes.append(Axis(a, tuple(str(v) for v in spec.get("values", [])),
                             _cond(spec.get("only_when", {}))))
        claims = []
        for c in base.get("claim", []):
            cl = Claim(axis=str(c["axis"]), value=str(c["value"]), arch=str(c.get("arch", "any")),
                       says=str(c["says"]), evidence=str(c["evidence"]),
                       source=str(c.get("source", "")), outcome=str(c.get("outcome", "")),
                       note=str(c.get("note", "")))
            if cl.says not in SAYS or cl.evidence not in EVIDENCE:
                raise BadInput(f"card {name}: claim about {cl.axis}={cl.value}: says must be one of "
                               f"{SAYS} and evidence one of {EVIDENCE}")
            if cl.arch in (arch, "any") and cl.evidence not in drop:
                claims.append(cl)
        reqs = [Requirement(str(r.get("arch", "any")), _cond(r["when"]), _cond(r["need"]),
                            str(r.get("source", "")))
                for r in base.get("requires", []) if str(r.get("arch", "any")) in (arch, "any")]
        names = {str(k): tuple(str(x) for x in v) for k, v in base.get("log_names", {}).items()}
        space = cls(card=name, arch=arch, axes=axes, claims=claims, requirements=reqs,
                    log_names=names, like=like)
        if drop:
            space.notes.append(f"evidence left out: {', '.join(sorted(drop))} (card {name})")
        if choices is not None:
            space._keep_installed(choices, version)
        return space

    def _keep_installed(self, choices: Mapping[str, Iterable[str] | None], version: str) -> None:
        kept = []
        for ax in self.axes:
            flag = FLAGS[ax.name]
            if not flag:
                kept.append(ax)
                continue
            if flag not in choices:
                self.notes.append(f"axis {ax.name} left out: SGLang {version} has no {flag}")
                continue
            allowed = choices[flag]
            if allowed is None:
                kept.append(ax)
                continue
            allowed = {str(x) for x in allowed}
            gone = [v for v in ax.values if v not in allowed]
            if gone:
                self.notes.append(f"{ax.name}: {', '.join(gone)} not among SGLang {version}'s "
                                  f"{flag} choices")
            kept.append(Axis(ax.name, tuple(v for v in ax.values if v in allowed), ax.only_when))
        self.axes = kept

    # -- ranking ----------------------------------------------------------------------------------

    def axis(self, name: str) -> Axis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(name)

    def has(self, name: str) -> bool:
        return any(a.name == name for a in self.axes)

    def ranked(self, name: str) -> list[Ranked]:
        """The values of an axis in the order to try them: works, unknown, fails (each by the
        strongest evidence kind), ties in the card's order."""
        if name not in self._ranked:
            ax = self.axis(name)
            rows = [self._rank(name, v) for v in ax.values]
            order = {v: i for i, v in enumerate(ax.values)}
            rows.sort(key=lambda r: (VERDICTS.index(r.verdict), _certainty(r), order[r.value]))
            self._ranked[name] = rows
        return self._ranked[name]

    def rank_of(self, name: str, value: str) -> Ranked | None:
        for r in self.ranked(name):
            if r.value == value:
                return r
        return None

    def _rank(self, axis: str, value: str) -> Ranked:
        claims = sorted((c for c in self.claims if c.axis == axis and c.value == value),
                        key=lambda c: (_strength(c), SAYS.index(c.says)))
        if not claims:
            return Ranked(value, "unknown", (), "no claim on " + self.arch)
        top = claims[0].evidence
        says = {c.says for c in claims if c.evidence == top}
        if says == {"works"} or says == {"works", "default"}:
            verdict = "works"
        elif "fails" in says and "works" not in says:
            verdict = "fails"
        else:
            verdict = "unknown"  # SGLang's own default, or the strongest sources disagree
        why = f"{verdict} on {self.arch}: {claims[0].text()}"
        if "works" in says and "fails" in says:
            why = f"unknown on {self.arch}: {top} sources disagree ({claims[0].text()})"
        against = [c for c in claims if c.evidence != top and _opposes(c.says, verdict)]
        if against:
            why += (f"; kept against {against[0].text()}: {top} evidence outranks "
                    f"{against[0].evidence}")
        return Ranked(value, verdict, tuple(claims), why)

    # -- configurations ---------------------------------------------------------------------------

    def normalise(self, cfg: Mapping[str, str], excluded: Mapping[str, set[str]] | None = None,
                  keep: Iterable[str] = ()) -> Config:
        """Unset the axes that do not apply; give the ones that apply but are unset their best
        allowed value (axes in `keep` are left as they are)."""
        out = {a.name: cfg.get(a.name, "") for a in self.axes}
        keep = set(keep)
        for a in self.axes:
            if not a.applies(out):
                out[a.name] = ""
            elif not out[a.name] and a.name not in keep:
                best = self.best(a.name, excluded or {})
                out[a.name] = best or ""
        return out

    def applicable(self, given: Mapping[str, str]) -> Config:
        """`given` plus what makes each given axis apply (the DSA backends need
        `--attention-backend dsa`), at the best value allowed, where not given itself."""
        out = dict(given)
        for a in self.axes:
            if not out.get(a.name):
                continue
            for cond, vals in a.only_when.items():
                if out.get(cond, "") not in vals and cond not in given:
                    out[cond] = self.best(cond, {}, among=vals) or vals[0]
        return out

    def best(self, axis: str, excluded: Mapping[str, set[str]],
             among: Iterable[str] | None = None) -> str | None:
        """The best-ranked value of `axis` not excluded (and in `among` when given)."""
        allowed = set(among) if among is not None else None
        for r in self.ranked(axis):
            if r.value in excluded.get(axis, set()):
                continue
            if allowed is not None and r.value not in allowed:
                continue
            return r.value
        return None

    def violated(self, cfg: Mapping[str, str]) -> Requirement | None:
        """The first requirement `cfg` breaks, or None."""
        for r in self.requirements:
            if r.violated(cfg):
                return r
        return None

    def repair(self, cfg: Mapping[str, str], fixed: Iterable[str],
               excluded: Mapping[str, set[str]], most: int = 3) -> tuple[Config, dict[str, str]] | None:
        """Make `cfg` acceptable to SGLang by changing as few axes other than `fixed` as possible.

        Among the repairs that change the fewest axes, the one with the best-ranked values wins,
        then the one that changes axes later in the card's order (the less central ones).

        Returns:
            (the configuration, changed axis -> the requirement that made it change), or None
            when no change of up to `most` free axes satisfies every requirement.
        """
        fixed = set(fixed)
        start = self.normalise(cfg, excluded, keep=fixed)
        if any(start.get(f) != cfg.get(f) for f in fixed if cfg.get(f)):
            return None  # a fixed value that does not apply with the other fixed ones
        if self.violated(start) is None:
            return start, {}
        free = [a for a in self.axes if a.name not in fixed]
        pos = {a.name: i for i, a in enumerate(self.axes)}
        choices = {a.name: [(i, r.value) for i, r in enumerate(self.ranked(a.name))
                            if r.value not in excluded.get(a.name, set())
                            and r.value != start.get(a.name)] for a in free}
        for k in range(1, most + 1):
            best: tuple[tuple[int, int], Config] | None = None
            for names in combinations([a.name for a in free], k):
                for picks in product(*(choices[n] for n in names)):
                    trial = dict(start)
                    for n, (_i, v) in zip(names, picks):
                        trial[n] = v
                    trial = self.normalise(trial, excluded, keep=fixed | set(names))
                    if self.violated(trial) is not None \
                            or any(trial.get(f) != start.get(f) for f in fixed):
                        continue  # a repair may not drop the value it repairs for
                    cost = (sum(i for i, _v in picks), -sum(pos[n] for n in names))
                    if best is None or cost < best[0]:
                        best = (cost, trial)
            if best is not None:
                out = best[1]
                return out, {a.name: self._needs(a.name, start, out) for a in self.axes
                             if out.get(a.name) != start.get(a.name)}
        return None

    def _needs(self, axis: str, start: Mapping[str, str], out: Mapping[str, str]) -> str:
        """Why a repair changed `axis`: the requirement broken without that change."""
        trial = {**out, axis: start.get(axis, "")}
        r = self.violated(trial)
        if r is None:
            return "follows from the other changes" if self.axis(axis).applies(out) \
                else f"does not apply with {_show(self.axis(axis).only_when)} unset"
        return "needed: " + r.text()

    def first(self) -> tuple[Config, dict[str, str]]:
        """The best-ranked acceptable configuration (and the repairs it needed)."""
        cfg = {a.name: "" for a in self.axes}
        for a in self.axes:
            if a.applies(cfg):
                cfg[a.name] = self.best(a.name, {}) or ""
        got = self.repair(cfg, (), {})
        if got is None:
            raise BadInput(f"card {self.card}: no configuration satisfies its [[search.requires]] "
                           f"on {self.arch}")
        return got

    def named_in(self, text: str, cfg: Mapping[str, str]) -> list[tuple[str, str]]:
        """(axis, value) pairs of `cfg` that `text` names (see log_names), each with the other
        values of the same axis that share the matching word (one library, one verdict)."""
        low = text.lower()
        out: list[tuple[str, str]] = []
        for ax in self.axes:
            v = cfg.get(ax.name, "")
            if not v:
                continue
            flag = FLAGS[ax.name]
            if flag and re.search(re.escape(flag) + r"[\s:=]+(?:invalid choice:\s*)?'?"
                                  + re.escape(v) + r"\b", text):
                out.append((ax.name, v))  # a refusal that quotes the flag and its value
                continue
            words = [w for w in self.log_names.get(v, ()) if w.lower() in low]
            if not words:
                continue
            for other in ax.values:
                if any(w in self.log_names.get(other, ()) for w in words) \
                        and (ax.name, other) not in out:
                    out.append((ax.name, other))
        return out

    def label(self, cfg: Mapping[str, str]) -> str:
        """A short name: the set values in axis order."""
        parts = []
        for a in self.axes:
            v = cfg.get(a.name, "")
            if v:
                parts.append(f"graph-{v}" if a.name == "cuda_graph" else v)
        return "/".join(parts)

    def describe(self) -> list[str]:
        """One line per axis: its values in order, with verdicts."""
        out = []
        for a in self.axes:
            vals = ", ".join(f"{r.value} ({r.verdict})" for r in self.ranked(a.name))
            when = f" [only with {_show(a.only_when)}]" if a.only_when else ""
            out.append(f"{a.name}{when}: {vals}")
        return out


def _cond(d: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(d, dict):
        raise BadInput("a search condition must be a table of axis = [values]")
    return {str(k): tuple(str(x) for x in (v if isinstance(v, list) else [v]))
            for k, v in d.items()}


def _certainty(r: Ranked) -> int:
    """Tie-break inside a verdict group: stronger evidence first, except among failures, where
    the least certain failure comes first (it is the likeliest to be wrong)."""
    if not r.claims:
        return len(EVIDENCE)
    s = _strength(r.claims[0])
    return len(EVIDENCE) - s if r.verdict == "fails" else s


def _strength(c: Claim) -> int:
    return EVIDENCE.index(c.evidence)


def _opposes(says: str, verdict: str) -> bool:
    return (says == "fails" and verdict != "fails") or (says == "works" and verdict == "fails")

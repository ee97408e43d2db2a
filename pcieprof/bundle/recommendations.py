"""recommendations.json: the tuner's output, as `pcieprof recommend` saves it (and `report` and
`topology` through it, pcieprof.commands.recommend.save).

The principal bottleneck, the recommendations (each with its evidence and its gain per decode
all-reduce and per decode step), the searched ring, the inferred fabric, the ranked parallel
layouts, what would need measuring, and, after `recommend --verify`, what re-running found.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pcieprof.bundle.document import Document
from pcieprof.units import GIB
from pcieprof.errors import BadInput


@dataclass
class Risk:
    """A known way a recommendation can fail on this box, how to check it safely before use,
    and the change only the host can make instead.

    Attributes:
        id: a stable name (`nccl_p2p_hang_translated_iommu`; the fabric profile's known issue).
        title: what can happen, one line.
        check: how to find out before relying on it (a command and what it guards against).
        host_alternative: the host-side change that avoids the risk, with its expected gain and
            provenance where the bundle knows it.
        sources: where the failure is reported.
    """

    id: str
    title: str
    check: str = ""
    host_alternative: str = ""
    sources: list[str] = field(default_factory=list)


#: How the scores of `Recommendation.ranked_by` compare (pcieprof.tune.rules.base.ranking and
#: the rules' fixed keys), said once above the cards.
SCORE_SCALE = ("a change with a gain scores 10 per ms of mean decode-step gain; fixed scores: "
               "wrong data and hangs 900-1000, faults of the box 100-500, findings without a "
               "gain of their own below 100")


@dataclass
class Recommendation:
    """One change (or one warning) with its evidence and its expected gain.

    Attributes:
        rule: the rule module that made it.
        title: one line.
        kind: `env` (NCCL/SGLang environment), `launch` (CUDA_VISIBLE_DEVICES, files),
            `host` (kernel/BIOS/hypervisor settings), `warn` (a problem without a setting),
            `info` (what the stack does anyway).
        env: environment variables to set.
        action: the exact lines to apply (shell), if any.
        gain_us_per_allreduce: {batch: us saved per decode all-reduce}, from the bundle's curves.
        gain_ms_per_step: {batch: ms saved per decode step} (all-reduces per step x the above).
        gain_fraction: relative improvement of what the rule changes (at decode sizes), or None.
        gain_text: one line for people.
        evidence: what in the bundle supports it (numbers with units and provenance).
        caveats: what it costs elsewhere, what was assumed.
        confidence: `measured` (the setting itself was measured in this bundle), `predicted`
            (from a model of this bundle's numbers), `simulated`, `reported` (a number published
            for another box, its source named in gain_text), `advice` (no number).
        priority: ordering key (larger first).
        ranked_by: how `priority` was scored, in words with its numbers (`score 22.7 = 10 x the
            mean decode-step gain over batch 1-64, 2.27 ms`); the report shows it on every card.
            Empty in files written before it.
        verified: what `recommend --verify` found re-running it (pcieprof.tune.verify), or None.
        risks: known failures of the change on this box (e.g. an NCCL hang with P2P through a
            translating IOMMU), each with its check and the host-side alternative; empty in
            files written before it.
    """

    rule: str
    title: str
    kind: str
    env: dict[str, str] = field(default_factory=dict)
    action: str = ""
    gain_us_per_allreduce: dict[int, float] = field(default_factory=dict)
    gain_ms_per_step: dict[int, float] = field(default_factory=dict)
    gain_fraction: float | None = None
    gain_text: str = ""
    evidence: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    confidence: str = "measured"
    priority: float = 0.0
    ranked_by: str = ""
    verified: dict[str, Any] | None = None
    risks: list[Risk] = field(default_factory=list)


@dataclass
class RingChoice:
    """The searched ring: GPU order, its slowest link (GB/s), summed link latency (us)."""

    order: list[int]
    bottleneck_gbps: float
    latency_sum_us: float | None = None
    exact: bool = True
    gap: float | None = 0.0
    cuda_visible_devices: str = ""


@dataclass
class LayoutPoint:
    """A layout's predicted decode step at one concurrency (ms, tok/s)."""

    concurrency: int
    batch_per_replica: float
    step_ms: float | None
    compute_ms: float | None
    comm_ms: float | None
    tok_s: float | None
    fits: bool


@dataclass
class LayoutAdvice:
    """One parallel layout, as ranked by pcieprof.tune.layout.

    Attributes:
        label: `TP8`, `PP2xTP4`, `2 replicas x TP4`, ...
        tp, pp, ep, dp_attention, replicas: the layout.
        fits: the weights and one request's KV fit the GPU memory.
        weights_gib, kv_gib_per_request, gpu_memory_gib: per GPU, GiB (2**30 bytes, the unit
            the console and the report show); files written before VERSION 2 stored them as
            `weights_gb` etc. in 1e9 bytes, which `Recommendations.from_json` converts.
        memory_source: where the GPU memory came from.
        gpu_memory_gib_low: the low end of an assumed GPU memory's range (GiB; `gpu_memory_gib`
            is its high end), None when the memory is not a range.
        fit_uncertain: the layout fits at the high end of that range and not at its low end.
        mem_fraction: SGLang's --mem-fraction-static assumed.
        context_tokens: tokens per request of the KV fit.
        max_concurrency: requests whose KV fits (at the high end of an assumed range).
        max_concurrency_low: the same at the range's low end, None when not a range.
        per_concurrency: the predicted step at each concurrency.
        command, env: the SGLang launch (empty when none was built) and its environment.
        notes: assumptions and caveats.
        compute_source, comm_source: where the compute and communication predictions came from.
        why: on the first layout, why it ranks first.
    """

    label: str
    tp: int
    pp: int = 1
    ep: int = 1
    dp_attention: bool = False
    replicas: int = 1
    fits: bool = False
    weights_gib: float = 0.0
    kv_gib_per_request: float = 0.0
    gpu_memory_gib: float = 0.0
    memory_source: str = ""
    mem_fraction: float = 0.0
    context_tokens: int = 0
    max_concurrency: int = 0
    gpu_memory_gib_low: float | None = None
    fit_uncertain: bool = False
    max_concurrency_low: int | None = None
    per_concurrency: list[LayoutPoint] = field(default_factory=list)
    command: str = ""
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    compute_source: str = ""
    comm_source: str = ""
    why: str = ""

    def memory_assumed(self) -> bool:
        """True when the GPU memory is the card's, not the box's own."""
        return self.memory_source.startswith("assumed")

    def concurrency_text(self) -> str:
        """`34`, or `33-34` across an assumed memory's range (low end first)."""
        low = self.max_concurrency_low
        if low is not None and low != self.max_concurrency:
            return f"{low}-{self.max_concurrency}"
        return str(self.max_concurrency)

    def memory_text(self) -> str:
        """`96 GiB`, or `95.6-96 GiB` across an assumed memory's range."""
        low = self.gpu_memory_gib_low
        if low is not None and round(low, 1) != round(self.gpu_memory_gib, 1):
            return f"{low:.1f}-{self.gpu_memory_gib:g} GiB"
        return f"{self.gpu_memory_gib:g} GiB"

    def peak(self) -> tuple[float, int]:
        """(highest predicted tok/s within memory, at which concurrency); (0, 0) when none."""
        fit = [p for p in self.per_concurrency if p.fits and p.tok_s is not None
               and p.tok_s == p.tok_s]
        if not fit:
            return 0.0, 0
        best = max(fit, key=lambda p: p.tok_s or 0.0)
        return float(best.tok_s or 0.0), int(best.concurrency)


@dataclass
class Recommendations(Document):
    """recommendations.json.

    Attributes:
        model: the model card used for decode sizes and layouts.
        bottleneck: one sentence naming the principal bottleneck.
        provenance: of the all-reduce numbers used.
        recommendations: most valuable first.
        needs_measuring: what the data could not decide.
        ring: the searched ring, or None without a P2P matrix.
        inferred: the inferred fabric (pcieprof.analysis.infer.InferredTopology.as_dict), or None.
        layouts: ranked parallel layouts, best first (unless `layouts_unranked`).
        layouts_unranked: why the layouts are not ranked (then they are listed in a fixed
            order and none is launched); "" when they are ranked, as in files written before it.
        env: the merged environment of every env/launch recommendation.
        verify: after --verify: {bundle, backend, source, rules}.

    Files written before the report read only saved recommendations hold `computed_by_report`
    (false) and `error` (null), which the report's in-memory run alone set; read, they are
    dropped.
    """

    FILE = "recommendations.json"
    FORMAT = "pcieprof.recommendations"
    #: 2: the layouts' memory in GiB under `*_gib` names (1: `*_gb` in 1e9 bytes)
    VERSION = 2

    model: str = ""
    bottleneck: str = ""
    provenance: str = ""
    recommendations: list[Recommendation] = field(default_factory=list)
    needs_measuring: list[str] = field(default_factory=list)
    ring: RingChoice | None = None
    inferred: dict[str, Any] | None = None
    layouts: list[LayoutAdvice] = field(default_factory=list)
    layouts_unranked: str = ""
    env: dict[str, str] = field(default_factory=dict)
    verify: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> "Recommendations":
        """Read it (Document.from_json), and check the shape of `inferred`, which is kept as a
        plain object: the report walks its levels and groups. A layout's memory written in
        1e9 bytes under the old `*_gb` names (VERSION 1) is read as GiB."""
        if isinstance(data, dict) and isinstance(data.get("layouts"), list):
            data = {**data, "layouts": [_gib_layout(lay) for lay in data["layouts"]]}
        doc = super().from_json(data, where)
        if doc.inferred is not None:
            _check_inferred(doc.inferred, f"{where or cls.FILE}: inferred")
        return doc


#: VERSION 1's layout fields in 1e9 bytes -> their GiB names
_GB_TO_GIB = {"weights_gb": "weights_gib", "kv_gb_per_request": "kv_gib_per_request",
              "gpu_memory_gb": "gpu_memory_gib"}


def _gib_layout(layout: Any) -> Any:
    """A layout object with its old `*_gb` numbers (1e9 bytes) as `*_gib`; anything else (a
    layout already in GiB, a value of the wrong type, left for the reader to refuse) as is."""
    if not isinstance(layout, dict) or not _GB_TO_GIB.keys() & layout.keys():
        return layout
    out = dict(layout)
    for old, new in _GB_TO_GIB.items():
        value = out.pop(old, None)
        if new not in out and isinstance(value, (int, float)) and not isinstance(value, bool):
            out[new] = value * 1e9 / GIB
    return out


def _check_inferred(inferred: dict[str, Any], where: str) -> None:
    """InferredTopology.as_dict's shape, or BadInput naming the first key that differs."""
    def ints(v: Any) -> bool:
        return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                           for x in v)

    if not isinstance(inferred.get("metric"), str):
        raise BadInput(f"{where}: metric: expected a string")
    if not ints(inferred.get("gpus")):
        raise BadInput(f"{where}: gpus: expected a list of GPU indices")
    levels = inferred.get("levels")
    if not isinstance(levels, list):
        raise BadInput(f"{where}: levels: expected a list")
    for k, lv in enumerate(levels):
        if not isinstance(lv, dict):
            raise BadInput(f"{where}: levels[{k}]: expected an object")
        if not isinstance(lv.get("name"), str):
            raise BadInput(f"{where}: levels[{k}].name: expected a string")
        groups = lv.get("groups")
        if not (isinstance(groups, list) and all(ints(g) for g in groups)):
            raise BadInput(f"{where}: levels[{k}].groups: expected lists of GPU indices")
        if not isinstance(lv.get("value"), (int, float, type(None))):
            raise BadInput(f"{where}: levels[{k}].value: expected a number or null")

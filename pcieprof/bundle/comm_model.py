"""comm_model.json: the analytic model's collectives of a decode step, priced per batch with a
topology bundle's all-reduce curves, next to the measured step and the traced communication.

Written by `pcieprof attribute --model --topology` (pcieprof.analysis.comm_model computes it);
the report's attribution section draws it as it is saved.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pcieprof.bundle.document import Document


@dataclass
class CommModelRow:
    """One batch size. Times in milliseconds.

    Attributes:
        model, layout, batch: what was priced.
        n_collectives: collectives of one decode step.
        measured_step_ms: the step as measured (decode_curve.csv, else the trace), or None.
        measured_step_from: `decode_curve.csv`, `trace`, or None.
        predicted_comm_ms: the collectives priced with the curves.
        predicted_comm_share_pct: predicted comm / measured step x 100, or None.
        compute_share_pct: 100 - the above, or None.
        trace_comm_ms: the traced communication of a step of this batch
            (attribution.json's decode_share_by_batch), or None.
        exposed_comm_ms: of it, the part with no compute running, or None.
        disagreement_pct: (trace - predicted) / predicted x 100, or None.
        priced_source, priced_backend, variant: where the curve comes from.
        notes: what the pricing assumed or extrapolated.
    """

    model: str = ""
    layout: str = ""
    batch: int = 0
    n_collectives: int = 0
    measured_step_ms: float | None = None
    measured_step_from: str | None = None
    predicted_comm_ms: float = 0.0
    predicted_comm_share_pct: float | None = None
    compute_share_pct: float | None = None
    trace_comm_ms: float | None = None
    exposed_comm_ms: float | None = None
    disagreement_pct: float | None = None
    priced_source: str = ""
    priced_backend: str = ""
    variant: str = ""
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class CommModel(Document):
    """comm_model.json.

    Attributes:
        topology: the bundle whose all-reduce curves priced it (its directory name).
        table: one row per batch size.
        detail_batch: the batch whose collectives `detail` lists.
        detail: the priced collectives of one step at `detail_batch`
            (pcieprof.analysis.comm_model.predict_step_comm).
    """

    FILE = "comm_model.json"
    FORMAT = "pcieprof.comm_model"
    VERSION = 1

    topology: str = ""
    table: list[CommModelRow] = field(default_factory=list)
    detail_batch: int = 1
    detail: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

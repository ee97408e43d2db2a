"""Report-wide settings passed to every section."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pcieprof.analysis.decode_band import DecodeBand, band_for


@dataclass
class ReportContext:
    """What every section may need besides its bundle.

    Attributes:
        band: decode-message band marked on all-reduce plots (its model names the card).
        tune: run the tuner (in memory) for bundles without recommendations.json.
        recommendations: per bundle path, the tuner's output as a dict (filled on first use).
        views: every bundle of the report (set by the builder), for sections that combine them.
    """

    band: DecodeBand = field(default_factory=band_for)
    tune: bool = True
    recommendations: dict[str, Any] = field(default_factory=dict)
    views: list[Any] = field(default_factory=list)

    def recommendations_for(self, view: Any) -> dict[str, Any] | None:
        """recommendations.json of the bundle, else the tuner run in memory (when `tune`)."""
        key = str(view.path)
        if key not in self.recommendations:
            doc = view.json("recommendations.json")
            if not doc and self.tune:
                doc = _run_tuner(view.bundle, self.band)
            self.recommendations[key] = doc or None
        return self.recommendations[key]


def _run_tuner(bundle: Any, band: DecodeBand) -> dict[str, Any] | None:
    from pcieprof.tune.recommend import recommend

    if bundle.read_table("p2p").empty and bundle.read_table("allreduce").empty:
        return None
    try:
        result = recommend(bundle, model=band.model, batch_max=band.batch_max, write_files=False)
    except Exception as exc:  # the report must render even when the tuner cannot run
        return {"error": f"{type(exc).__name__}: {exc}", "recommendations": [],
                "needs_measuring": [], "layouts": []}
    doc = result.as_dict()
    doc["computed_by_report"] = True
    return doc

"""Report-wide settings passed to every section."""

from __future__ import annotations

from dataclasses import dataclass, field

from pcieprof.analysis.decode_band import DecodeBand, band_for
from pcieprof.bundle.recommendations import Recommendations
from pcieprof.report.model import BundleView


@dataclass
class ReportContext:
    """What every section may need besides its bundle.

    Attributes:
        band: decode-message band marked on all-reduce plots (its model names the card).
        recommendations: per bundle path, the tuner's output computed by the command for bundles
            without recommendations.json, or whose stored one is superseded (made without the
            launch search of a serve bundle in the same report); the report never runs the
            tuner.
        views: every bundle of the report (set by the builder), for sections that combine them.
    """

    band: DecodeBand = field(default_factory=band_for)
    recommendations: dict[str, Recommendations] = field(default_factory=dict)
    views: list[BundleView] = field(default_factory=list)

    def recommendations_for(self, view: BundleView) -> Recommendations | None:
        """What the command computed for the bundle, else its recommendations.json, else None."""
        return self.recommendations.get(str(view.path)) or view.doc(Recommendations)

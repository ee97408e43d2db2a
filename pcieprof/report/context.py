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
        unsaved: per bundle path, why the bundle's recommendations are left out (the command
            could not save current ones into it: pcieprof.commands.recommend.save_for_report);
            the page says why instead. The report reads recommendations.json alone and never
            runs the tuner.
        views: every bundle of the report (set by the builder), for sections that combine them.
    """

    band: DecodeBand = field(default_factory=band_for)
    unsaved: dict[str, str] = field(default_factory=dict)
    views: list[BundleView] = field(default_factory=list)

    def recommendations_for(self, view: BundleView) -> Recommendations | None:
        """The bundle's recommendations.json, None without one or when it is left out."""
        if str(view.path) in self.unsaved:
            return None
        return view.doc(Recommendations)

    def unsaved_why(self, view: BundleView) -> str | None:
        """Why the bundle's recommendations are left out, None when they are not."""
        return self.unsaved.get(str(view.path))

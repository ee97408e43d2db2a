"""Report-wide settings passed to every section."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pcieprof.report.decode_band import DecodeBand, band_for


@dataclass
class ReportContext:
    """What every section may need besides its bundle.

    Attributes:
        band: decode-message band marked on all-reduce plots.
        recommendations: per bundle path, the tuner's output (filled by the builder).
    """

    band: DecodeBand = field(default_factory=band_for)
    recommendations: dict[str, Any] = field(default_factory=dict)

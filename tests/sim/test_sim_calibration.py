"""The model against every published reference point: fails when a point drifts past its bound,
and keeps the README's error table equal to what the model computes now."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcieprof.sim import calibration as C

ROOT = Path(__file__).resolve().parents[2]
POINTS = C.load_points()


def test_points_are_well_formed() -> None:
    ids = [p.id for p in POINTS]
    assert len(ids) == len(set(ids))
    assert {p.use for p in POINTS} == {"fit", "check", "input"}
    assert all(p.source and p.bound_pct is not None and p.measured > 0 for p in POINTS)
    checks = [p for p in POINTS if p.use == "check"]
    fits = [p for p in POINTS if p.use == "fit"]
    assert len(checks) > 2 * len(fits)
    # some held-out points are on boxes that no fitted point comes from
    assert {p.box for p in checks} - {p.box for p in fits}


@pytest.mark.parametrize("point", POINTS, ids=[p.id for p in POINTS])
def test_model_error_within_bound(point: C.Point) -> None:
    err = C.error_pct(point)
    assert abs(err) <= point.bound_pct, (f"{point.id}: model {C.predict(point):.4g} vs measured "
                                         f"{point.measured:.4g} {point.unit} ({err:+.1f}%, bound "
                                         f"±{point.bound_pct:g}%; source {point.source})")


def test_fit_reads_only_fit_points(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    real = C.predict

    def spy(p: C.Point) -> float:
        seen.append(p.use)
        return real(p)

    monkeypatch.setattr(C, "predict", spy)
    monkeypatch.setattr(C, "_nelder_mead", lambda f, x0, **kw: (f(x0), x0)[1])
    C.fit(POINTS)
    assert seen and set(seen) == {"fit"}


def test_readme_table_is_current() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = C.markdown()
    assert table.strip() in readme, ("README's calibration table is stale: regenerate it with "
                                     "`python -m pcieprof.sim.calibration`")

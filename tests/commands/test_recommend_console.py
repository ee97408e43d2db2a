"""`pcieprof recommend` prints each recommendation's caveats and risks under it, briefly
(issue 22): recommendations.json kept them, the console did not, so a user pasting the launch
line never read "the command is for the TP8 layout" or "needs a checkpoint that carries the
MTP layer"."""

from __future__ import annotations

from pathlib import Path

from builders.cli import cli

from pcieprof.bundle import Bundle
from pcieprof.bundle.recommendations import Recommendation, Recommendations, Risk
from pcieprof.commands.recommend import CAVEAT_CHARS, summary_lines
from pcieprof.tune.assumed import RESTS_ON


def _under(lines: list[str], title: str) -> list[str]:
    """The indented lines printed under the recommendation titled `title`."""
    i = next(i for i, ln in enumerate(lines) if ln.endswith(title))
    out = []
    for ln in lines[i + 1:]:
        if not ln.startswith("   "):
            break
        out.append(ln.strip())
    return out


def test_caveats_and_risks_are_printed_under_their_recommendation() -> None:
    long = "x" * (CAVEAT_CHARS + 50)
    rec = Recommendation(rule="r", title="Do the thing", kind="env", action="export A=1",
                         caveats=["only at TP8", f"{RESTS_ON}a = 1 (assumed)", long,
                                  "first line\nsecond line"],
                         risks=[Risk(id="k", title="it can hang", check="run --verify")])
    other = Recommendation(rule="o", title="Another", kind="info")
    lines = summary_lines(Recommendations(recommendations=[rec, other]))
    under = _under(lines, "Do the thing")
    assert "caveat: only at TP8" in under
    assert "range: a = 1 (assumed)" in under
    assert f"caveat: {'x' * CAVEAT_CHARS}... (in full: recommendations.json)" in under
    assert "caveat: first line... (in full: recommendations.json)" in under
    assert "RISK: it can hang" in under and "check: run --verify" in under
    assert not any("caveat" in ln for ln in _under(lines, "Another"))


def test_every_caveat_of_the_demo_box_reaches_the_console(sim_vm_bundle: Path,
                                                          tmp_path: Path) -> None:
    r = cli("recommend", str(sim_vm_bundle), "--out", str(tmp_path / "b"), "-q")
    assert r.returncode == 0, r.stderr
    doc = Bundle.open(tmp_path / "b").read_doc(Recommendations)
    assert doc is not None
    lines = r.stdout.splitlines()
    seen = 0
    for rec in doc.recommendations:
        under = _under(lines, rec.title)
        for c in rec.caveats:
            if not c.startswith(RESTS_ON) and len(c) <= CAVEAT_CHARS and "\n" not in c:
                assert f"caveat: {c}" in under, (rec.rule, c)
                seen += 1
        for risk in rec.risks:
            assert f"RISK: {risk.title}" in under
    assert seen  # the launch line's "the command is for the TP8 layout" at least

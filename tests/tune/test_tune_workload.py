"""A global setting priced on the whole workload (issue 22, point 4): decode over the card's
concurrency range and prefill in the card's chunks. A setting that slows any phase is not
offered as global (NCCL_PROTO=LL on the bare-metal demo box: faster at decode sizes, slower at
a 16K-token prefill chunk) and the size-aware route (NCCL's tuner plugin) is offered instead.
The walk over the demo's bundles and every ../shared/samples import checks that no setting a
launch line carries slows any phase in pcieprof's own numbers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from builders.cli import cli
from tune.test_tune_shared_samples import CASES

from pcieprof.analysis.curves import Curves
from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.bundle import Bundle
from pcieprof.bundle.recommendations import Recommendations
from pcieprof.cards import load_card
from pcieprof.commands.tuning import tune
from pcieprof.tune.launch import launch_line, launch_recommendation
from pcieprof.tune.recommend import collectives_counter
from pcieprof.analysis.virtualization import from_topology
from pcieprof.bundle.topology import Topology
from pcieprof.tune.workload import SLOWER, UNPRICED, price, slowed

GLM5 = load_card("glm5-nvfp4")
BAND = DecodeBand.of_card(GLM5)


def _settings_slowing_a_phase(b: Bundle, doc: Recommendations) -> list[str]:
    """Every NCCL setting the recommended environment or a launch line carries that slows a
    phase in the bundle's own numbers (a curve measured with exactly that environment, or the
    fabric model's price of the host change that names it), and every one that has no price
    and whose card does not say so, with why (UNPRICED): none may pass silently."""
    curves = Curves(b.read_table("allreduce"))
    base = curves.default()
    carried: dict[str, str] = dict(doc.env)
    rec = launch_recommendation(doc)
    lines = [rec.action.splitlines()[0]] if rec is not None and rec.action else []
    lines += [launch_line(doc, lay) for lay in doc.layouts if lay.command]
    for line in lines:
        for word in line.split():
            if word.startswith("NCCL_") and "=" in word:
                k, v = word.split("=", 1)
                carried.setdefault(k, v)
    said = [c for r in doc.recommendations for c in r.caveats]
    cost = from_topology(b.read_doc(Topology) or Topology())
    bad = []
    for k, v in carried.items():
        new = curves.find({k: v}) if base is not None else None
        if new is base and new is not None:
            continue
        if new is not None and base is not None:
            count = collectives_counter(GLM5, base.nranks)
            for t in slowed(price(BAND, count, base, new)):
                bad.append(f"{b.path.name}: {k}={v} slows {t.text()}")
            continue
        change = next((h for h in cost.host_changes if k in h.how), None) if cost else None
        if change is not None:
            for before, after in (change.step_default_us, change.step_best_safe_us):
                if after > before * (1 + SLOWER):
                    bad.append(f"{b.path.name}: {k}={v} slows the decode step "
                               f"{before / 1e3:.2f} -> {after / 1e3:.2f} ms ({change.id})")
            continue
        if not any(c.startswith(f"{UNPRICED}{k}") and len(c) > len(f"{UNPRICED}{k}=") + 20
                   for c in said):
            bad.append(f"{b.path.name}: {k}={v} is carried with no price and no card saying "
                       f"it is unpriced, and why")
    return bad


def test_ll_that_slows_prefill_is_not_global(demo_bundles: dict[str, Path],
                                             tmp_path: Path) -> None:
    box = tmp_path / "bare"
    shutil.copytree(demo_bundles["rtxpro6000-8x-switch"], box)
    doc = tune(Bundle.open(box), GLM5, BAND, write_files=False)
    ll = next(r for r in doc.recommendations if r.rule == "proto_ll")
    assert ll.kind == "info" and ll.env == {} and "NCCL_PROTO" not in doc.env
    assert "slower in prefill" in ll.title and "tuner plugin" in ll.title
    # the tuner plugin's configuration is a file of the bundle, named in the card
    assert f"export NCCL_TUNER_CONFIG_FILE={box / 'tune' / 'nccl_tuner.conf'}   # written by: " \
        "pcieprof recommend BUNDLE" in ll.action
    assert not (box / "tune" / "nccl_tuner.conf").exists()  # write_files=False writes nothing
    assert any("forces the ring algorithm" in c for c in ll.caveats)
    said = next(e for e in ll.evidence if e.startswith("whole workload"))
    assert "prefill in chunks of 16384 tokens (192 MiB" in said and "ranked by" in said
    assert "prefill chunk of 16384 tokens (192 MiB)" in said and "(+" in said  # slower there
    for rec in doc.recommendations:  # every global setting states the workload it was priced on
        if rec.kind == "env" and rec.env and Curves(
                Bundle.open(box).read_table("allreduce")).find(rec.env) is not None:
            assert any(e.startswith("whole workload") for e in rec.evidence), rec.rule
    assert all("NCCL_PROTO=LL" not in launch_line(doc, lay) for lay in doc.layouts)


def test_no_recommended_setting_slows_a_phase_on_the_demo_boxes(
        demo_bundles: dict[str, Path]) -> None:
    bad = []
    for path in demo_bundles.values():
        b = Bundle.open(path)
        bad += _settings_slowing_a_phase(b, tune(b, GLM5, BAND, write_files=False))
    assert not bad, bad


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_recommended_setting_slows_a_phase_on_the_samples(samples: Path, tmp_path: Path,
                                                            case: str) -> None:
    files = CASES[case][0]
    r = cli("import", *(str(samples / f) for f in files), "--out", str(tmp_path / "b"), "-q")
    assert r.returncode == 0, r.stderr
    b = Bundle.open(tmp_path / "b")
    assert not _settings_slowing_a_phase(b, tune(b, GLM5, BAND, write_files=False))


def test_the_tuner_configuration_is_written_into_the_bundle(demo_bundles: dict[str, Path],
                                                             tmp_path: Path) -> None:
    box = tmp_path / "bare"
    shutil.copytree(demo_bundles["rtxpro6000-8x-switch"], box)
    doc = tune(Bundle.open(box), GLM5, BAND)
    ll = next(r for r in doc.recommendations if r.rule == "proto_ll")
    conf = box / "tune" / "nccl_tuner.conf"
    assert f"export NCCL_TUNER_CONFIG_FILE={conf}" in ll.action.splitlines()
    rows = [ln for ln in conf.read_text().splitlines() if ln and not ln.startswith("#")]
    # NVIDIA/nccl ext-tuner/example/README.md: collective_type,min_bytes,max_bytes,algorithm,
    # protocol,channels,nNodes,nRanks; 4294967295 covers all sizes
    assert len(rows) == 2 and all(len(r.split(",")) == 8 for r in rows)
    small, large = (r.split(",") for r in rows)
    assert small[:2] == ["allreduce", "0"] and small[3:] == ["ring", "ll", "-1", "1", "-1"]
    assert large[1] == str(int(small[2]) + 1) and large[2] == "4294967295"
    assert large[3:] == ["ring", "simple", "-1", "1", "-1"]
    assert f"0-{small[2]} bytes ring/ll" in ll.action


def test_the_prefill_verdict_at_both_ends_of_sglangs_assumed_chunk(
        demo_bundles: dict[str, Path], tmp_path: Path) -> None:
    """A card naming no --chunked-prefill-size is priced at SGLang's default, an assumed
    number: the prefill change is shown at both ends of its (assumed) range."""
    from dataclasses import replace

    flags = list(GLM5.sglang.recommended_flags)
    i = flags.index("--chunked-prefill-size")
    card = replace(GLM5, sglang=replace(GLM5.sglang,
                                        recommended_flags=tuple(flags[:i] + flags[i + 2:])))
    box = tmp_path / "bare"
    shutil.copytree(demo_bundles["rtxpro6000-8x-switch"], box)
    doc = tune(Bundle.open(box), card, DecodeBand.of_card(card), write_files=False)
    ll = next(r for r in doc.recommendations if r.rule == "proto_ll")
    line = next(c for c in ll.caveats if "--chunked-prefill-size = 8192" in c)
    assert line.startswith("the gain rests on SGLang's default --chunked-prefill-size = 8192 "
                           "tokens (assumed: the card names none; range 2048-16384 tokens, "
                           "itself assumed): prefill all-reduce ")
    assert " at 2048 (" in line and " at 16384 (slowed)" in line  # +35-40% at 128+ MiB
    # the card's own chunk is a fact of the launch: no range
    doc = tune(Bundle.open(box), GLM5, BAND, write_files=False)
    ll = next(r for r in doc.recommendations if r.rule == "proto_ll")
    assert not any("--chunked-prefill-size =" in c for c in ll.caveats)

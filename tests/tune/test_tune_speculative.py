"""Multi-token prediction where the card has the layer (issue 22 pt 8): the SGLang flags parse with
the pinned release's own parser, the MTP weights are counted in the fit, the gain is reported
with its source, and a model without the layer gets nothing."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest

from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.bundle import Bundle
from pcieprof.cards import load_card
from pcieprof.commands import tuning
from pcieprof.commands.tuning import tune
from pcieprof.serve.sglang_cmd import (PINNED_SGLANG, ParserSpec, load_parser,
                                       parse_many_with_sglang, sglang_search_path)
from pcieprof.tune import speculative

GLM5 = load_card("glm5-nvfp4")


@pytest.fixture
def vm(demo_bundles: dict[str, Path]) -> Bundle:
    """The demo's simulated VM box (made once per session; read only here)."""
    return Bundle.open(demo_bundles["rtxpro6000-8x-vm"])


def _mtp(vm: Bundle, card=GLM5):  # type: ignore[no-untyped-def]
    doc = tune(vm, card, DecodeBand.of_card(card, 1, 64), write_files=False)
    return doc, next((r for r in doc.recommendations if r.rule == speculative.RULE), None)


def test_mtp_is_offered_with_its_reported_gain_and_memory(vm: Bundle) -> None:
    doc, rec = _mtp(vm)
    assert rec is not None and rec.confidence == "reported" and rec.kind == "launch"
    assert rec.gain_text.startswith("reported: 35-44 -> 97-105 tok/s at c=1, ~2.6x")
    assert "voipmonitor/rtx6kpro optimization/speculative-decoding.md" in rec.gain_text
    assert "8x RTX PRO 6000" in rec.evidence[1] and "0 tokens of context" in rec.evidence[1]
    top = doc.layouts[0]
    assert rec.action.startswith(shlex.split(rec.action)[0]) and top.command in rec.action
    assert rec.action.endswith("--speculative-algorithm NEXTN --speculative-num-steps 3 "
                               "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4")
    # the BF16 MTP layer (~19 GB, rtx6kpro) split over TP8: ~2.3 GiB more per GPU
    assert speculative.mtp_bytes(GLM5, 2.0) / 1e9 == pytest.approx(19.8, abs=1.0)
    assert "(+2.3 GiB)" in rec.evidence[0]


def test_a_card_without_the_layer_gets_no_mtp(vm: Bundle) -> None:
    _, rec = _mtp(vm, dataclasses.replace(GLM5, mtp_layers=0))
    assert rec is None


def test_mtp_flags_parse_with_the_pinned_sglang_parser(vm: Bundle) -> None:
    path = sglang_search_path()
    if path is None:
        pytest.skip(f"pinned SGLang {PINNED_SGLANG} parser not installed (see .ci/run)")
    _, rec = _mtp(vm)
    assert rec is not None
    argv = shlex.split(rec.action)
    args = argv[argv.index("sglang.launch_server") + 1:]
    (ns,) = parse_many_with_sglang([args], path)
    assert ns["speculative_algorithm"] == "NEXTN"
    assert (ns["speculative_num_steps"], ns["speculative_eagle_topk"],
            ns["speculative_num_draft_tokens"]) == (3, 1, 4)


def test_mtp_flags_are_checked_by_the_parser_recommend_reads(
        vm: Bundle, monkeypatch: pytest.MonkeyPatch) -> None:
    """recommend checks the MTP card's flags with SGLang's own parser, as the layouts' commands;
    flags a release does not know leave the card without a line."""
    path = sglang_search_path()
    if path is None:
        pytest.skip(f"pinned SGLang {PINNED_SGLANG} parser not installed (see .ci/run)")
    real = load_parser(path)
    assert real is not None
    monkeypatch.setattr(tuning, "sglang_parser", lambda: real)
    _, rec = _mtp(vm)
    assert rec is not None and rec.evidence[-1].endswith(
        f"checked against SGLang {real.version}'s own parser")
    older = ParserSpec(real.version, {k: v for k, v in real.options.items()
                                      if not k.startswith("--speculative-")}, real.source)
    monkeypatch.setattr(tuning, "sglang_parser", lambda: older)
    _, rec = _mtp(vm)
    assert rec is not None and rec.action == "" and rec.kind == "info"
    assert rec.caveats[0].startswith("no SGLang command: SGLang ")
    assert "does not know --speculative-algorithm" in rec.caveats[0]

"""The launch backends of the printed SGLang commands (pcieprof.tune.launch with the commands'
choice, pcieprof.commands.tuning.launch_choice): the search's first-ranked configuration,
labelled not yet served, where no search has run; refusals of serve bundles that cannot say.
The search's winner flowing into recommend and report, end to end on the reference server, is
tests/report/test_report_launch_search.py."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from builders.cli import cli

from pcieprof.analysis.box import box_of
from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.bundle import Bundle
from pcieprof.bundle.recommendations import Recommendations
from pcieprof.bundle.serve_search import Attempt, SearchStep, ServeSearch
from pcieprof.cards import load_card
from pcieprof.commands.tuning import builder, launch_choice, tune
from pcieprof.errors import BadInput
from pcieprof.tune.launch import NOT_YET, launch_recommendation, searched_in
from pcieprof.tune.layout import Candidate
from pcieprof.tune.search import Search, Step
from pcieprof.tune.space import SearchSpace

ROOT = Path(__file__).resolve().parents[2]
SIM = ROOT / "tests" / "data" / "bundle_schema2" / "sim_vm_4gpu"
SERVE_NO_SEARCH = ROOT / "tests" / "data" / "bundle_schema2" / "tiny_cpu_serve"
GLM5 = load_card("glm5-nvfp4")


def _first(arch: str | None = None) -> dict[str, str]:
    step = Search(SearchSpace.from_card(GLM5.name, GLM5.search, arch=arch)).next([])
    assert isinstance(step, Step)
    return step.config


def _search_bundle(path: Path, **doc: object) -> Bundle:
    b = Bundle.create(path, command="serve-bench", source="measured", backend="cuda")
    b.write_doc(ServeSearch(**doc))  # type: ignore[arg-type]
    return b


def test_without_a_search_the_first_ranked_backends_not_yet_served() -> None:
    choice = launch_choice(GLM5)
    assert not choice.served and choice.label.startswith(NOT_YET)
    assert "first-ranked configuration for sm120" in choice.label
    assert choice.config == _first()
    # the field report's serving pair, not the plain FlashInfer launch the card's notes call
    # NaN-prone
    assert (choice.config["attention_backend"], choice.config["dsa_decode_backend"]) \
        == ("dsa", "trtllm")
    assert any(e.startswith("dsa_decode_backend = trtllm") for e in choice.evidence)
    other = launch_choice(GLM5, arch="sm100")
    assert other.config == _first("sm100") and "for sm100" in other.label


def test_recommend_prints_the_first_ranked_command_labelled(tmp_path: Path) -> None:
    box = tmp_path / "box"
    shutil.copytree(SIM, box)
    r = cli("recommend", str(box))
    assert r.returncode == 0, r.stderr[-2000:]
    doc = Bundle.open(box).read_doc(Recommendations)
    assert doc is not None
    rec = launch_recommendation(doc)
    assert rec is not None and rec.confidence == "advice" and searched_in(doc) is None
    assert NOT_YET in rec.title and NOT_YET in r.stdout
    line, bench = rec.action.splitlines()  # the command, then serve-bench's for the same
    printed = [ln.strip() for ln in r.stdout.splitlines()]
    assert line in printed and bench in printed  # each on its own line
    assert "python3 -m sglang.launch_server" in rec.action
    for lay in doc.layouts:
        if not lay.fits:  # a layout that does not fit is offered no command
            assert lay.command == ""
            continue
        assert "--attention-backend dsa" in lay.command, lay.command
        assert "--dsa-decode-backend trtllm" in lay.command
        assert "--attention-backend flashinfer" not in lay.command
        assert lay.notes[0].startswith("launch backends: ") and NOT_YET in lay.notes[0]
    script = (box / "tune" / "sglang_command.sh").read_text().splitlines()
    assert f"# launch backends: {NOT_YET}" in "\n".join(script)
    assert script[-1] == line  # the top layout's line, as printed


def test_a_serve_bundle_without_a_search_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="has no launch search"):
        launch_choice(GLM5, Bundle.open(SERVE_NO_SEARCH))
    box = tmp_path / "box"
    shutil.copytree(SIM, box)
    r = cli("recommend", str(box), "--serve", str(SERVE_NO_SEARCH))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr
    before = json.loads((SIM / "recommendations.json").read_text())
    assert json.loads((box / "recommendations.json").read_text()) == before  # nothing written


def test_a_search_of_another_model_or_architecture_is_refused(tmp_path: Path) -> None:
    other = _search_bundle(tmp_path / "other", card="tiny-cpu", status="running")
    with pytest.raises(BadInput, match="searched launches of tiny-cpu, not of glm5-nvfp4"):
        launch_choice(GLM5, other)
    sm120 = _search_bundle(tmp_path / "sm120", card="glm5-nvfp4", arch="sm120",
                           status="running")
    with pytest.raises(BadInput, match="searched for sm120"):
        launch_choice(GLM5, sm120, arch="sm100")
    r = cli("recommend", str(SIM), "--arch", "blackwell")
    assert r.returncode == 2 and "smXY" in r.stderr


def test_a_search_without_a_winner_says_so_and_how_to_go_on(tmp_path: Path) -> None:
    first = _first()
    b = _search_bundle(tmp_path / "s", card="tiny-cpu", like="glm5-nvfp4", arch="sm120",
                       status="interrupted", why="interrupted (Ctrl-C)", attempts=[
                           Attempt(index=0, name="first", outcome="nan_in_decode",
                                   time_to_failure_s=2.5,
                                   excerpt="> RuntimeError: probability tensor contains either "
                                           "`inf`, `nan`",
                                   search=SearchStep(config=first, label="first")),
                           Attempt(index=1, name="second", outcome="interrupted",
                                   search=SearchStep(label="second"))])
    choice = launch_choice(GLM5, b)
    assert not choice.served and choice.config == first
    assert "is interrupted after 1 attempt(s) without one" in choice.label
    assert f"serve-bench --sweep --resume --out {b.path}" in choice.label
    assert choice.caveats and "failed there: attempt 0 nan_in_decode" in choice.caveats[0]
    doc = tune(Bundle.open(SIM), GLM5, DecodeBand.of_card(GLM5), write_files=False,
               choice=choice)
    rec = launch_recommendation(doc)
    assert rec is not None and rec.confidence == "advice"
    assert searched_in(doc) == str(b.path.resolve())


def test_a_disabled_p2p_transport_drops_the_cards_p2p_level_from_the_line(tmp_path: Path,
                                                                          samples: Path) -> None:
    """simpleP2P on the 2x4090 box returned NaN: the commands disable P2P and do not also carry
    the card's NCCL_P2P_LEVEL=SYS (moot once P2P is disabled, and a contradiction to read). GLM-5
    does not fit that box (2 x 24 GiB): no launch line at all, and the reason in GiB."""
    out = tmp_path / "b"
    r = cli("import", str(samples / "tool-outputs-more" /
                              "simpleP2P_2x4090_trpro5995wx_driver525_nan_verification.txt"),
                "--out", str(out), "-q")
    assert r.returncode == 0, r.stderr
    doc = tune(Bundle.open(out), GLM5, DecodeBand.of_card(GLM5, 1, 64), write_files=False)
    assert doc.env.get("NCCL_P2P_DISABLE") == "1"
    rec = launch_recommendation(doc)
    assert rec is not None and rec.action == "" and rec.kind == "info"
    assert rec.title.startswith("glm5-nvfp4 at TP2: does not fit this box (needs 210.")
    assert "has 20.4 = 24.0 GiB" in rec.title
    # simpleP2P's output does not tell the fabric: given here as PCIe (two RTX 4090s, which
    # have no NVLink), so the card's PCIe settings are in play
    box = box_of(Bundle.open(out))
    assert box.fabric == ""
    pcie = replace(box.target(), fabric="pcie", fabric_source="given by the test")
    built = builder(launch_choice(GLM5, box=box), pcie)(
        GLM5, Candidate("TP2", tp=2), dict(doc.env))
    assert built.env.get("NCCL_P2P_DISABLE") == "1" and "NCCL_P2P_LEVEL" not in built.env
    assert built.env.get("NCCL_IB_DISABLE") == "1"  # the card's other settings stay
    # sm89: the card has no launch evidence there, so no architecture-specific backend
    assert "--attention-backend" not in built.command and "--dsa-" not in built.command

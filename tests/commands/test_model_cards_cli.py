"""Any served model from its config.json through the commands: `topology --backend sim --model`
measures the card's decode sizes and records the card in the bundle; `recommend`, `report` and
`compare` read the bundle for that card unless --model says otherwise, and then say so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders.cli import cli

from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.bundle import Bundle
from pcieprof.cards import load_card

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "cards"
OLD = Path(__file__).resolve().parents[1] / "data" / "bundle_schema2" / "sim_vm_4gpu"  # no card
ARCHITECTURES = ("glm-5", "qwen3-235b-a22b", "gpt-oss-120b", "llama-3.1-70b")


def _topology(out: Path, model: str, *extra: str) -> Bundle:
    r = cli("topology", "--backend", "sim", "--quick", "--variants", "default", "--no-report",
            "--model", model, "--out", str(out), "-q", *extra)
    assert r.returncode == 0, r.stderr
    return Bundle.open(out)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_topology_and_recommend_for_a_config(tmp_path: Path, arch: str) -> None:
    config = CONFIGS / arch / "config.json"
    card = load_card(config)
    b = _topology(tmp_path / "b", str(config))
    rec = b.model()
    assert rec is not None and (rec.name, rec.hash) == (arch, card.content_hash)
    sizes = set(b.read_table("allreduce")["size_bytes"])
    assert set(DecodeBand.of_card(card).sizes()) <= sizes  # the card's decode band is measured
    r = cli("recommend", str(b.path), "--model", str(config), "-q")
    assert r.returncode == 0, r.stderr
    assert "model:" not in r.stderr  # the card the bundle was made for: nothing to say
    doc = json.loads((b.path / "recommendations.json").read_text())
    assert doc["model"] == arch
    launch = (b.path / "tune" / "sglang_command.sh").read_text()
    assert "--model-path" not in launch
    if arch == "glm-5":  # 1.5 TB of bf16 weights: no layout of the simulated 8-GPU box holds it
        assert "does not fit" in launch
    else:  # no compute anchor for a config.json card: the layouts are not ranked, none launched
        assert doc["layouts_unranked"].startswith(f"not ranked: no compute anchor for {arch}")
        assert "No launch layout chosen" in launch
        assert launch.splitlines()[1] == ("# pcieprof recommend: no launch: the parallel layouts "
                                          "are not ranked")
    labels = [lay["label"] for lay in doc["layouts"]]
    assert ("TP8+EP8" in labels) is (card.num_routed_experts > 0)  # no EP for dense Llama
    assert ("TP8 DP-attention8" in labels) is (arch != "llama-3.1-70b")


def test_recommend_says_the_layouts_are_not_ranked(tmp_path: Path) -> None:
    """The console says a config.json card's layouts are not ranked, and does not call one best."""
    config = CONFIGS / "llama-3.1-70b" / "config.json"
    b = _topology(tmp_path / "b", str(config), "--sim-profile", "rtxpro6000-8x-switch")
    r = cli("recommend", str(b.path), "--model", str(config))
    assert r.returncode == 0, r.stderr
    assert "parallel layouts (not ranked: no compute anchor for llama-3.1-70b" in r.stdout
    assert "best first" not in r.stdout and "EP8" not in r.stdout
    assert "No launch layout chosen for llama-3.1-70b" in r.stdout


def test_two_cards_two_sweeps(tmp_path: Path) -> None:
    """The sweep adds each card's decode sizes (batch x hidden x 2 B) to the powers of two."""
    glm = _topology(tmp_path / "glm", "glm5-nvfp4")
    oss = _topology(tmp_path / "oss", str(CONFIGS / "gpt-oss-120b"))
    g, o = (set(b.read_table("allreduce")["size_bytes"]) for b in (glm, oss))
    assert {12 << 10, 24 << 10, 96 << 10, 768 << 10} <= g - o  # hidden 6144
    assert {5760, 11520, 92160, 368640} <= o - g  # hidden 2880


def test_a_vm_profile_prices_the_cards_decode_step(tmp_path: Path) -> None:
    b = _topology(tmp_path / "vm", str(CONFIGS / "llama-3.1-70b"), "--sim-profile",
                  "rtxpro6000-8x-vm")
    vm = json.loads((b.path / "topology.json").read_text())["sim"]["vm"]
    assert (vm["model"], vm["step_allreduces"], vm["hidden"]) == ("llama-3.1-70b", 161, 8192)


def test_readers_use_the_recorded_card_and_say_when_told_another(tmp_path: Path) -> None:
    qwen = str(CONFIGS / "qwen3-235b-a22b")
    b = _topology(tmp_path / "b", qwen)
    r = cli("report", str(b.path), "-o", str(tmp_path / "r.html"), "--no-tune")
    assert r.returncode == 0, r.stderr
    assert "model:" not in r.stderr
    html = (tmp_path / "r.html").read_text()
    assert "qwen3-235b-a22b" in html and "glm5-nvfp4" not in html
    r = cli("recommend", str(b.path), "--model", "glm5-nvfp4", "--no-layouts")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("model:")]
    assert len(lines) == 1 and "glm5-nvfp4" in lines[0] and "qwen3-235b-a22b" in lines[0]
    assert Bundle.open(b.path).model().name == "glm5-nvfp4"  # now tuned for that card
    other = _topology(tmp_path / "c", qwen)
    r = cli("compare", str(other.path), str(b.path))
    assert r.returncode == 0, r.stderr
    assert "time_us@8KiB" in r.stdout  # hidden 4096 x bf16 at batch 1: qwen's, the first bundle's
    assert "glm5-nvfp4" in r.stderr  # the other bundle's card is named
    # a bundle that records no card was made for the default one: given first, it decides
    r = cli("compare", str(OLD), str(other.path), "--all")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("model:")]
    assert len(lines) == 1 and "records no card" in lines[0] and "qwen3-235b-a22b" in lines[0]
    assert "time_us@12KiB" in r.stdout  # hidden 6144 x bf16 at batch 1: the default card's


def test_a_recorded_card_that_is_gone(tmp_path: Path) -> None:
    """The config a bundle was made for is not on this machine: the copy of the card the bundle
    holds is read (said in one line); without that copy it is one line and exit 2."""
    config = tmp_path / "model" / "config.json"
    config.parent.mkdir()
    config.write_text((CONFIGS / "llama-3.1-70b" / "config.json").read_text())
    b = _topology(tmp_path / "b", str(config))
    card = load_card(config)
    config.unlink()
    kept = b.model_card()
    assert kept is not None and kept.content_hash == card.content_hash
    r = cli("recommend", str(b.path), "--no-layouts")
    assert r.returncode == 0, r.stderr
    assert "is not here; reading" in r.stderr and "time_us" not in r.stderr
    (b.path / "model_card.json").unlink()
    r = cli("recommend", str(b.path))
    assert r.returncode == 2
    assert "was made for model model" in r.stderr and "--model" in r.stderr
    assert "Traceback" not in r.stderr

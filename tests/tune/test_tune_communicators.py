"""SGLang's NCCL communicators per layout (pcieprof.tune.communicators) against the pinned
SGLang's own `initialize_model_parallel` (run in a child process, tests/builders/
sglang_groups.py), and NCCL_GRAPH_FILE offered only for layouts whose every communicator it
covers (issue 22, point 5)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from builders.bundles import AR_DEFAULT, add_allreduce, two_switch, write_matrix_bundle

from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.cards import load_card
from pcieprof.commands.tuning import tune
from pcieprof.serve.sglang_cmd import sglang_search_path
from pcieprof.tune.communicators import communicators, server_groups, uncovered
from pcieprof.tune.launch import launch_line

ROOT = Path(__file__).resolve().parents[2]
GLM5 = load_card("glm5-nvfp4")
#: (tp, pp, ep, attn_dp): every layout pcieprof ranks on 8 and 4 GPUs (tune.layout), and more
LAYOUTS = [(8, 1, 1, 1), (8, 1, 8, 1), (8, 1, 1, 8), (4, 2, 1, 1), (2, 4, 1, 1), (4, 1, 1, 1),
           (4, 1, 4, 1), (4, 1, 1, 4), (2, 2, 1, 1), (8, 1, 4, 1), (8, 1, 2, 4), (4, 2, 4, 2)]


@pytest.fixture(scope="module")
def sglang() -> dict[str, dict[str, list[list[int]]]]:
    """SGLang's groups of every layout of LAYOUTS, by "tp,pp,ep,attn_dp"."""
    path = sglang_search_path()
    if path is None or not (Path(path) / "sglang" / "srt" / "distributed").is_dir():
        pytest.skip("the pinned SGLang is not installed (.ci/run puts it in "
                    "~/.cache/pcieprof/sglang-0.5.23)")
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "builders" / "sglang_groups.py"),
                        *(",".join(map(str, x)) for x in LAYOUTS)], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHONPATH": path})
    assert r.returncode == 0, r.stderr[-3000:]
    out: dict[str, dict[str, list[list[int]]]] = json.loads(r.stdout.splitlines()[-1])
    return out


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: "tp{}-pp{}-ep{}-adp{}".format(*x))
def test_the_groups_are_sglangs(layout: tuple[int, int, int, int],
                                sglang: dict[str, dict[str, list[list[int]]]]) -> None:
    theirs = sglang[",".join(map(str, layout))]
    ours = server_groups(*layout)

    def multi(groups: dict[str, list[list[int]]]) -> set[tuple[int, ...]]:
        return {tuple(g) for name, gs in groups.items() if name != "world" for g in gs
                if len(g) > 1}

    # SGLang reuses its TP group where a group equals it; every group of 2+ ranks is ours too
    assert multi(theirs) | {tuple(g) for g in theirs["tp"]} == multi(ours)
    for name in ("tp", "pp"):
        assert theirs[name] == ours[name]


def test_a_graph_file_of_all_gpus_covers_only_full_width_layouts() -> None:
    every = set(range(8))
    assert not uncovered(communicators(8), every)
    assert not uncovered(communicators(8, ep=8), every)
    assert not uncovered(communicators(8, attn_dp=8), every)
    pp2 = uncovered(communicators(4, pp=2), every)
    assert {c.group for c in pp2} == {"tp", "pp"}  # TP4 halves and the stage pairs
    assert (0, 4) in {c.gpus for c in pp2}
    two = uncovered(communicators(4, replicas=2), every)
    assert {c.gpus for c in two} >= {(0, 1, 2, 3), (4, 5, 6, 7)}
    assert uncovered(communicators(8, ep=4), every)  # MoE EP4 / TP2 sub-groups


def _file_gpus(path: Path) -> set[int]:
    """The GPUs an NCCL graph file names (`<gpu dev="0x..">`, read as NCCL does: base 16)."""
    return {int(m, 16) for m in re.findall(r'<gpu dev="([0-9a-fx]+)"', path.read_text())}


def test_the_graph_file_goes_only_into_layouts_it_covers(
        tmp_path: Path, sglang: dict[str, dict[str, list[list[int]]]]) -> None:
    # two hidden switches seen from a VM: the ring search crosses them twice, so the tuner
    # recommends its ring as an NCCL_GRAPH_FILE
    bw, lat = two_switch(([0, 2, 4, 6], [1, 3, 5, 7]), seed=9)
    b = write_matrix_bundle(tmp_path / "vm", bw, lat, flat_vm=True)
    add_allreduce(b, "default", {}, AR_DEFAULT)
    doc = tune(b, GLM5, DecodeBand.of_card(GLM5))
    ring = next(r for r in doc.recommendations if r.rule == "ring_order")
    assert "CUDA_VISIBLE_DEVICES" not in ring.action  # it only renumbers ranks: no alternative
    assert "for TP8, TP8+EP8, TP8 DP-attention8 only" in ring.title
    assert any("XML Import Channel : dev N not found" in c for c in ring.caveats)
    named = _file_gpus(b.path / "tune" / "nccl_graph.xml")
    offered = []
    for lay in doc.layouts:
        if not lay.command:
            continue
        # SGLang's own communicators of this layout (2+ ranks), per server
        key = f"{lay.tp},{lay.pp},{lay.ep},{lay.tp if lay.dp_attention else 1}"
        size = lay.tp * lay.pp
        comms = [{r * size + x for x in g} for r in range(lay.replicas)
                 for gs in [*sglang[key].values(), [list(range(size))]] for g in gs if len(g) > 1]
        line = launch_line(doc, lay)
        if "NCCL_GRAPH_FILE" in lay.env or "NCCL_GRAPH_FILE" in line:
            offered.append(lay.label)
            assert all(c == named for c in comms), (lay.label, comms)
        else:
            assert any(c != named for c in comms), lay.label
            assert any("NCCL_GRAPH_FILE left out of this layout" in n for n in lay.notes)
    assert offered == [lab for lab in ("TP8", "TP8+EP8", "TP8 DP-attention8")
                       if lab in [x.label for x in doc.layouts if x.command]]
    assert "PP2xTP4" in [x.label for x in doc.layouts if x.command]  # and it has no file

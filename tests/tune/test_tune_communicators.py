"""SGLang's NCCL communicators per layout (pcieprof.tune.communicators) against the pinned
SGLang's own `initialize_model_parallel` (run in a child process, tests/builders/
sglang_groups.py), and NCCL_GRAPH_FILE offered only for layouts whose every communicator it
covers (issue 22, point 5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pcieprof.serve.sglang_cmd import sglang_search_path
from pcieprof.tune.communicators import communicators, server_groups, uncovered

ROOT = Path(__file__).resolve().parents[2]
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

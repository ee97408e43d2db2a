"""What node 1 takes from node 0's plan (pcieprof.peer_plan): a fake node 0 can neither set
node 1's launch environment nor its deadlines, nor ask for what node 1's own command line
could not (issue 25, point 7)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pcieprof.errors import BadInput
from pcieprof.peer_plan import accept_cases
from probes import variants as V
from pcieprof.bundle.plan import Plan
from probes.plan import build_plan


def _own() -> Plan:
    return build_plan("cpu", [0, 1], quick=True, group_kinds=[], timeout_s=10.0, max_size=64,
                      nnodes=2)


def _theirs(own: Plan, **change: object) -> Plan:
    hostile = Plan.from_json({**own.to_json(), "timeout_s": 1e12})
    hostile.allreduce = [replace(c, **change) for c in hostile.allreduce]  # type: ignore[arg-type]
    return hostile


def test_node0_sets_neither_the_environment_nor_the_deadline() -> None:
    own = _own()
    theirs = _theirs(own, env={"PYTHONPATH": "/tmp/evil", "LD_PRELOAD": "/tmp/evil.so"})
    got = accept_cases(own, theirs.allreduce)
    assert [c.variant for c in got] == [c.variant for c in own.allreduce]
    for c in got:
        assert c.env == V.VARIANTS[c.variant].env
        assert "PYTHONPATH" not in c.env and "LD_PRELOAD" not in c.env


@pytest.mark.parametrize("change, says", [
    ({"variant": "evil"}, "no known variant"),
    ({"ranks": [0, 7]}, "devices"),
    ({"ranks": [0, 0]}, "devices"),
    ({"sizes": [8, 1 << 40]}, "sizes outside"),
    ({"sizes": ["8"]}, "sizes outside"),
    ({"dtypes": ["int8"]}, "dtypes"),
    ({"iters": 10 ** 9}, "repeats"),
])
def test_what_node1_could_not_ask_for_itself_is_refused(change: dict[str, object],
                                                        says: str) -> None:
    own = _own()
    with pytest.raises(BadInput, match=says):
        accept_cases(own, _theirs(own, **change).allreduce)

"""A full run says before it starts how long it will take (issue 23, "Also"; issue 24)."""

from __future__ import annotations

from pathlib import Path

from builders.cli import cli
from probes.plan import build_plan
from probes.plan_time import LAUNCH_S, estimate, minutes

EIGHT = list(range(8))


def test_the_default_8_gpu_plan_aims_at_about_ten_minutes() -> None:
    # the sim profile's box has 8 GPUs; the estimate uses the assumed rates of plan_time.py
    full = estimate(build_plan("cuda", EIGHT))
    assert full.launches == 2 * full.allreduce_cases + 1
    assert 5 * 60 < full.seconds < 11 * 60, full.describe()
    # every pair (the old default) is 24 more cases, 48 more launches: over 20 minutes
    pairs = estimate(build_plan("cuda", EIGHT, group_kinds=["pairs", "tp4"]))
    assert pairs.seconds > 20 * 60
    assert pairs.seconds - full.seconds > 48 * LAUNCH_S["cuda"]


def test_quick_and_cpu_plans_are_minutes_not_hours() -> None:
    assert estimate(build_plan("cuda", EIGHT, quick=True)).seconds < 4 * 60
    cpu = estimate(build_plan("cpu", [0, 1], quick=True))
    assert cpu.launches == 3 + 1 and cpu.seconds < 5 * 60


def test_minutes_reads_as_a_person_would_say_it() -> None:
    assert (minutes(40), minutes(630), minutes(7200)) == ("~40 s", "~10.5 min", "~2.0 h")


def test_topology_says_the_expected_time_before_it_measures(tmp_path: Path) -> None:
    res = cli("topology", "--backend", "sim", "--no-report", "--out", str(tmp_path / "b"),
              process=True)
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stderr.splitlines() if ln.startswith("plan:"))
    assert "on these GPUs (cuda)" in line and "expected ~" in line and "launches" in line


def test_a_ring_order_costs_its_cases_in_the_estimate() -> None:
    # issue 23 pt 3: an order adds its NCCL_ALGO=Ring case (and the full plan already has the
    # baseline, algo_ring over every GPU): the estimate says so before the run starts
    plain, ordered = build_plan("cuda", EIGHT), build_plan("cuda", EIGHT, orders=[[0, 2, 4, 6, 7, 5, 3, 1]])
    a, b = estimate(plain), estimate(ordered)
    assert b.allreduce_cases == a.allreduce_cases + 2  # default and algo_ring in that order
    assert b.launches == a.launches + 4
    assert b.seconds > a.seconds + 4 * LAUNCH_S["cuda"]
    assert b.seconds < 13 * 60, b.describe()

"""A full run says before it starts how long it will take (issue 23, "Also"; issue 24)."""

from __future__ import annotations

import re
from pathlib import Path

from builders.cli import cli
from probes import variants as V
from probes.plan import build_plan
from probes.plan_time import LAUNCH_S, estimate, minutes

EIGHT = list(range(8))


def test_the_default_8_gpu_plan_takes_under_ten_minutes() -> None:
    # issue 23: a default full run on 8 GPUs aims under 10 minutes (the sim profile's box has 8
    # GPUs; the estimate uses the assumed rates of plan_time.py). Its decode sizes join the sweep.
    full = estimate(build_plan("cuda", EIGHT, extra_sizes=[12 << 10, 24 << 10, 384 << 10]))
    assert full.launches == 2 * full.allreduce_cases + 1 == 23
    assert 5 * 60 < full.seconds < 10 * 60, full.describe()
    # every variant (the old default) is 4 more cases, 8 more launches: over 10 minutes
    every = estimate(build_plan("cuda", EIGHT, variants=V.parse_variants("all"),
                                extra_sizes=[12 << 10, 24 << 10, 384 << 10]))
    assert every.launches == full.launches + 8 and every.seconds > 10 * 60
    # every pair is 24 more cases, 48 more launches: over 20 minutes
    pairs = estimate(build_plan("cuda", EIGHT, group_kinds=["pairs", "tp4"]))
    assert pairs.seconds > 20 * 60
    assert pairs.seconds - estimate(build_plan("cuda", EIGHT)).seconds > 48 * LAUNCH_S["cuda"]


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
    # the sim profile's 8-GPU box, its model's decode sizes included: under 10 minutes
    said = re.search(r"(\d+) launches, .* expected ~([\d.]+) min", line)
    assert said is not None and int(said[1]) == 23 and float(said[2]) < 10, line


def test_a_ring_order_costs_its_cases_in_the_estimate() -> None:
    # issue 23 pt 3: an order adds its own case, its NCCL_ALGO=Ring case and that one's
    # baseline, algo_ring over every GPU in plain order (--variants all has it already)
    order = [[0, 2, 4, 6, 7, 5, 3, 1]]
    a, b = estimate(build_plan("cuda", EIGHT)), estimate(build_plan("cuda", EIGHT, orders=order))
    assert b.allreduce_cases == a.allreduce_cases + 3
    assert b.launches == a.launches + 6
    assert b.seconds > a.seconds + 6 * LAUNCH_S["cuda"]
    assert b.seconds < 11 * 60, b.describe()
    every = V.parse_variants("all")
    c = estimate(build_plan("cuda", EIGHT, variants=every))
    d = estimate(build_plan("cuda", EIGHT, variants=every, orders=order))
    assert (d.allreduce_cases, d.launches) == (c.allreduce_cases + 2, c.launches + 4)

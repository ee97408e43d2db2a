"""How the all-reduce probe times (issue 15, defect 4): nccl-tests' way, `iters` collectives back to
back between one pair of CUDA events, checked against the stand-in of the CUDA API; and the
NCCL log that prints one line per collective (TUNING) kept out of the timed launch."""

from __future__ import annotations

import pytest

from builders.cuda import CudaStandin
from probes.allreduce_worker import TRIALS, allreduce_row, time_back_to_back, time_graph
from pcieprof.bundle.plan import AllReduceCase
from probes.variants import NCCL_DEBUG_ENV, NCCL_TUNING_LOG_ENV


def test_one_event_pair_around_back_to_back_collectives() -> None:
    # each host call costs 5 us, a collective runs 10 us on the GPU: with an event pair per
    # collective the start event fires on an idle stream and the issue time is inside every
    # measurement (15 us); back to back, the GPU runs them one after the other (10 us each)
    api = CudaStandin([0], host_us=5.0, gpu_us=10.0)
    times = time_back_to_back(lambda: None, 20, 3, api=api, device=0)
    assert len(times) == 3
    for t in times:
        assert t * 1e6 == pytest.approx(10.0, rel=0.05)
    records = [what for what, _ in api.log if what == "record"]
    assert len(records) == 2 * 3  # one start and one end per trial
    assert [d for what, d in api.log if what == "synchronize"] == [0, 0, 0]  # each trial starts empty


def test_host_clock_trials_divide_by_the_collectives_in_them() -> None:
    calls: list[str] = []
    times = time_back_to_back(lambda: calls.append("op"), 7, 2,
                              start=lambda: calls.append("barrier"))
    assert calls == (["barrier"] + ["op"] * 7) * 2
    assert len(times) == 2 and all(t > 0 for t in times)


def test_row_keeps_median_over_trials_and_iters_per_trial() -> None:
    case = AllReduceCase("default", {}, [0, 1], [1024], ["bf16"], 2, 10)
    row = allreduce_row(case, "cuda", 1024, "bf16", [3e-6, 1e-6, 2e-6], True, iters=10)
    assert (row.time_us, row.time_us_min, row.time_us_max) == pytest.approx((2.0, 1.0, 3.0))
    assert row.iters == 10 and TRIALS >= 3


def test_the_timed_launch_logs_no_line_per_collective() -> None:
    subsys = set(NCCL_DEBUG_ENV["NCCL_DEBUG_SUBSYS"].split(","))
    assert "TUNING" not in subsys and {"INIT", "GRAPH"} <= subsys
    assert "TUNING" in NCCL_TUNING_LOG_ENV["NCCL_DEBUG_SUBSYS"].split(",")


def test_small_collectives_are_timed_as_a_cuda_graph_not_the_hosts_dispatch() -> None:
    # issue 23 pt 6: 20 us of host time per Python call, 5 us per collective on the GPU (decode
    # sizes on PCIe GPUs): called from Python the stream drains between calls and the loop times
    # the host (20 us); captured once and replayed, as SGLang's decode runs, the GPU's 5 us
    api = CudaStandin([0], host_us=20.0, gpu_us=5.0)
    eager = time_back_to_back(lambda: None, 20, 3, api=api, device=0)
    graph = time_graph(lambda: None, 20, 3, api=api, device=0)
    assert all(t * 1e6 == pytest.approx(20.0, rel=0.05) for t in eager)
    assert all(t * 1e6 == pytest.approx(5.0, rel=0.05) for t in graph)
    assert [w for w, _ in api.log].count("capture") == 1  # captured once, replayed per trial
    assert [w for w, _ in api.log].count("replay") == 3
    case = AllReduceCase("default", {}, [0, 1], [1024], ["bf16"], 2, 20)
    row = allreduce_row(case, "cuda", 1024, "bf16", graph, True, iters=20, eager_s=eager)
    assert row.time_us == pytest.approx(5.0, rel=0.05)
    assert row.time_us_eager == pytest.approx(20.0, rel=0.05)


def test_the_data_check_is_exact_in_bf16_whatever_order_the_ring_adds_in() -> None:
    # issue 23 pt 8: with rank + 1 from each rank, a ring that starts adding at another rank
    # reaches odd partial sums above 256, which bf16 (8 bits of mantissa) rounds: a false error
    # from 23 ranks on. Ones from every rank sum exactly in any order.
    import torch

    from probes.allreduce_worker import check_sum

    def ring_sum(values: list[float], start: int) -> float:
        acc = torch.zeros(1, dtype=torch.bfloat16)
        for i in range(len(values)):
            acc += torch.tensor([values[(start + i) % len(values)]], dtype=torch.bfloat16)
        return float(acc)

    for world in (2, 8, 23, 64, 256):
        assert all(ring_sum([1.0] * world, s) == check_sum(world) for s in range(world))
    old = [float(r + 1) for r in range(23)]
    assert any(ring_sum(old, s) != 23 * 24 / 2 for s in range(23))

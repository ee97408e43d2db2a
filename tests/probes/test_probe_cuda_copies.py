"""The cuda copy probe's timing, synchronisation and data check, on the CPU against the stand-in of
the CUDA stream/event API (tests/builders/cuda.py): issue 15, defects 2, 4 and 5."""

from __future__ import annotations

from typing import Any

import pytest

from probes.p2p_worker import CudaCopier, concurrent_rows, p2p_result_row, p2p_row
from pcieprof.bundle.plan import ConcurrentCase, P2PCase, Plan
from probes.plan import KiB, build_plan
from builders.cuda import CudaStandin, PeerCopies, StandinEvent, Stream


def _copier(devices: list[int], cases: list[P2PCase], **kw: Any) -> tuple[CudaCopier, CudaStandin]:
    api = CudaStandin(devices, **kw)
    return CudaCopier(Plan(backend="cuda", devices=devices, p2p=cases), api, PeerCopies()), api


def test_d2h_reads_the_pattern_only_after_its_fill_completed() -> None:
    # the fill runs on device 0's default stream, the copy on a non-blocking stream of device 0;
    # enabling peer access left device 1 current, so synchronising "the current device" did not
    # order the two
    case = P2PCase(0, -1, "d2h", "uni", "bandwidth", 64 * KiB, 2, 2)
    copier, api = _copier([0, 1], [case])
    times, ok, _ = copier.run_p2p(0, case)
    assert ok, "the copy read the source before the pattern fill had run"
    assert times and all(t > 0 for t in times)


def test_concurrent_flows_are_waited_for_on_every_device() -> None:
    case = ConcurrentCase("ring", "write", [(0, 1), (1, 0)], 64 * KiB, 3)
    copier, api = _copier([0, 1], [])
    spans, ok, why, _ = copier.run_concurrent(0, case)  # raised "device not ready" before the fix
    assert spans is not None and ok == [True, True], why
    assert api.synchronized() >= {0, 1}
    rows = concurrent_rows(case, "cuda", spans, ok)
    assert all(r["status"] == "ok" and r["bandwidth_gbps"] > 0 for r in rows)


@pytest.mark.parametrize("host_flag", [True, False])
def test_copy_latency_excludes_host_enqueue_time(host_flag: bool) -> None:
    # host: 10 us per call; the GPU: 2 us per copy. Without holding the stream until every copy is
    # queued, the start event fires on an idle stream and the copies run at the host's pace
    # (10 us each). p2pBandwidthLatencyTest holds the stream with a delay kernel first; the
    # copier holds it on a host flag, or (no flag) a spin kernel and a gate event.
    case = P2PCase(-1, 0, "h2d", "uni", "latency", 8, 100, 3)
    copier, api = _copier([0], [case], host_us=10.0, gpu_us=2.0, host_flag=host_flag)
    times, ok, detail = copier.run_p2p(0, case)
    assert ok and times
    row = p2p_row(case, "cuda", times)
    assert row["latency_us"] == pytest.approx(2.0, rel=0.01)
    held = [what for what, _ in api.log if what in ("block", "flag_write")]
    assert len(held) >= case.trials + 1  # warm-up and every trial held
    assert set(held) == {"flag_write" if host_flag else "block"}
    assert ("gate event" in detail) is not host_flag


def test_a_hold_too_short_for_the_queueing_is_lengthened() -> None:
    # 1000 copies at 50 us of host time each (50 ms of queueing) outlast the first hold (20 ms):
    # the start event has fired before the host finished, so the round is repeated, held longer
    case = P2PCase(-1, 0, "h2d", "uni", "latency", 8, 1000, 1)
    copier, api = _copier([0], [case], host_us=50.0, gpu_us=2.0, host_flag=False)
    times, ok, detail = copier.run_p2p(0, case)
    assert ok and times
    assert p2p_row(case, "cuda", times)["latency_us"] == pytest.approx(2.0, rel=0.01)
    assert sum(what == "block" for what, _ in api.log) > case.trials + 1
    assert "includes host queueing" not in detail


def _old_seed_collision(plan: Plan) -> tuple[int, int]:
    """Two cases where the later one expects exactly what the earlier one wrote into the same GPU
    buffer under the seeds before the fix (case index + 1 + source GPU)."""
    last: dict[int, tuple[int, int, int]] = {}  # destination GPU -> (seed, bytes, case)
    for j, c in enumerate(plan.p2p):
        if c.path not in ("p2p", "host_staged"):
            continue
        dirs = [(c.src, c.dst)] + ([(c.dst, c.src)] if c.direction == "bi" else [])
        writes = [(b, j + 1 + a) for a, b in dirs]
        for b, seed in writes:
            prev = last.get(b)
            if prev and prev[0] == seed and prev[1] >= c.size_bytes:
                return prev[2], j
        for b, seed in writes:
            last[b] = (seed, c.size_bytes, j)
    raise AssertionError("no colliding cases in this plan")


def test_dropped_peer_writes_are_caught_even_over_an_earlier_identical_copy() -> None:
    # `--quick --devices 0,1,2,3`: a later case into GPU 0 expected exactly the bytes an earlier
    # one had left there; the later copy drops its last 4 KiB, as a write a VM's IOMMU discards
    plan = build_plan("cuda", [0, 1, 2, 3], quick=True, max_size=64 * KiB)
    i, j = _old_seed_collision(plan)
    rt = PeerCopies()
    copier = CudaCopier(plan, CudaStandin([0, 1, 2, 3]), rt)
    assert copier.run_p2p(i, plan.p2p[i])[1]
    rt.drop = 4 * KiB
    assert not copier.run_p2p(j, plan.p2p[j])[1], "a copy that lost 4 KiB was recorded ok"


def test_a_copy_that_drops_bytes_is_an_error_row_on_its_own() -> None:
    case = P2PCase(0, 1, "p2p", "bi", "bandwidth", 64 * KiB, 2, 2)
    api = CudaStandin([0, 1])
    copier = CudaCopier(Plan(backend="cuda", devices=[0, 1], p2p=[case]), api, PeerCopies(drop=1))
    assert not copier.run_p2p(0, case)[1]


def test_a_pair_whose_peer_enable_fails_is_marked_and_the_rest_runs() -> None:
    # issue 23 pt 4: the constructor raised, the runner read "died before the first case" and
    # the whole copy part failed, host-staged and H2D/D2H included
    devices = [0, 1, 2]
    cases = [P2PCase(0, 1, "p2p", "uni", "bandwidth", 64 * KiB, 2, 2),
             P2PCase(0, 1, "p2p", "bi", "bandwidth", 64 * KiB, 2, 2),
             P2PCase(1, 2, "p2p", "uni", "bandwidth", 64 * KiB, 2, 2),
             P2PCase(0, 1, "host_staged", "uni", "bandwidth", 64 * KiB, 2, 2),
             P2PCase(-1, 0, "h2d", "uni", "bandwidth", 64 * KiB, 2, 2)]
    api = CudaStandin(devices)
    copier = CudaCopier(Plan(backend="cuda", devices=devices, p2p=cases), api,
                        PeerCopies(refuse=((0, 1),)))
    rows = [p2p_result_row(c, "cuda", copier.run_p2p(i, c)) for i, c in enumerate(cases)]
    assert [r["status"] for r in rows] == ["error", "error", "ok", "ok", "ok"]
    assert "cudaDeviceEnablePeerAccess(0->1) failed with cudaError 217" in rows[0]["detail"]
    spans, ok, why, _ = copier.run_concurrent(0, ConcurrentCase("ring", "write", [(0, 1), (1, 2)],
                                                             64 * KiB, 2))
    assert spans is None and ok == [False, False] and "0->1" in why


def test_concurrent_flows_are_released_together_whatever_each_gpus_clock() -> None:
    # issue 23 pt 7: each flow's stream was held by its own spin kernel sized from the clock
    # rate; a GPU at an idle clock spins 6x longer, so its flow started later while the totals
    # assume every flow starts at 0. One hold and a gate event every stream waits for release
    # them at one moment.
    case = ConcurrentCase("ring", "write", [(0, 1), (1, 0)], 64 * KiB, 3)
    copier, api = _copier([0, 1], [], host_flag=False)
    api.hold_scale = {1: 6.0}
    spans, ok, why, _ = copier.run_concurrent(0, case)
    assert spans is not None and ok == [True, True], why
    flow_streams = {name for name, _ in api.starts if name != "default"}
    first = {}
    for name, t in api.starts:
        if name in flow_streams and name not in first:
            first[name] = t
    starts = sorted(first.values())[-2:]  # the last round's two flows (after warm-up rounds)
    assert len(first) == 2 and abs(starts[1] - starts[0]) <= api.gpu_us


def test_a_flow_that_starts_late_widens_the_concurrent_total() -> None:
    # issue 23 pt 7: spans were (0, own event time) for every flow, so a flow that started late
    # still counted as starting at 0 and the total, first start to last end, came out short.
    # Each flow's start and end are now timed from the release.
    case = ConcurrentCase("fan", "write", [(0, 1), (0, 2)], 64 * KiB, 3)
    copier, api = _copier([0, 1, 2], [], host_flag=False)
    late_us = 500.0
    waits = api.wait

    def late_wake(stream: Stream, event: StandinEvent) -> None:
        waits(stream, event)
        stream.ready_us += late_us  # this stream passes the gate late

    api.wait = late_wake  # type: ignore[method-assign]
    spans, ok, why, _ = copier.run_concurrent(0, case)
    assert spans is not None and ok == [True, True], why
    (a0, a1), (b0, b1) = spans
    assert b0 - a0 == pytest.approx(late_us / 1e6)  # the late flow's start is its own
    assert (a1 - a0) == pytest.approx(b1 - b0)  # each flow's own duration is unchanged
    rows = concurrent_rows(case, "cuda", spans, ok)
    total = next(r for r in rows if r["flow"] == -1)
    moved = 2 * case.size_bytes * case.iters
    assert total["bandwidth_gbps"] == pytest.approx(moved / (b1 - a0) / 1e9)


def _first_starts(api: CudaStandin) -> dict[str, float]:
    first: dict[str, float] = {}
    for name, t in api.starts:
        if name != "default":
            first.setdefault(name, t)
    return first


def test_flows_wait_on_a_host_flag_the_host_writes_once_all_are_queued() -> None:
    # issue 23 pt 7: the streams were released by a spin kernel and a gate event on one device
    # (whose hold was sized from a clock rate); now every stream waits on one word of pinned
    # host memory that the host writes after queueing everything: one host moment for all GPUs
    case = ConcurrentCase("ring", "write", [(0, 1), (1, 2), (2, 0)], 64 * KiB, 3)
    copier, api = _copier([0, 1, 2], [], hold_scale={1: 6.0})
    spans, ok, why, timing = copier.run_concurrent(0, case)
    assert spans is not None and ok == [True, True, True], why
    assert timing is not None and timing.release == "host_flag" and timing.held
    assert not any(what == "block" for what, _ in api.log)  # no spin kernel
    write = api.log.index(("flag_write", -1))
    assert all(i < write for i, (what, _) in enumerate(api.log) if what == "enqueue")
    released = api.flags[0].written_at[-1]
    starts = _first_starts(api)
    assert len(starts) == 3 and all(t >= released for t in starts.values())
    assert max(starts.values()) - min(starts.values()) <= api.gpu_us
    rows = concurrent_rows(case, "cuda", spans, ok, why, timing=timing)
    assert {r["release"] for r in rows} == {"host_flag"} and {r["held"] for r in rows} == {"yes"}
    # each flow's start after the first, from its anchor; the aggregate holds the largest
    skews = [r["start_skew_us"] for r in rows]
    assert min(skews) == 0.0 and skews[-1] == max(skews) <= api.gpu_us
    assert "assumed simultaneous" not in why


def test_each_devices_anchor_is_bounded_by_its_acknowledgement() -> None:
    # issue 23 pt 7: the anchors of different devices were assumed simultaneous. Device 1 sees
    # the host's write 3 us late; each device acknowledges right after its anchor and the host
    # reads that 1 us later (ack_us), so the bounds are 1 us (device 0) and 4 us (device 1)
    case = ConcurrentCase("ring", "write", [(0, 1), (1, 0)], 64 * KiB, 3)
    copier, api = _copier([0, 1], [], flag_lag_us={1: 3.0}, ack_us=1.0)
    spans, ok, why, timing = copier.run_concurrent(0, case)
    assert spans is not None and all(ok) and timing is not None
    assert timing.anchor_us == {0: pytest.approx(1.0), 1: pytest.approx(4.0)}
    rows = concurrent_rows(case, "cuda", spans, ok, why, timing=timing)
    by_flow = {r["flow"]: r for r in rows}
    assert by_flow[0]["release_to_anchor_us_max"] == pytest.approx(1.0)  # writes from GPU 0
    assert by_flow[1]["release_to_anchor_us_max"] == pytest.approx(4.0)
    assert by_flow[-1]["release_to_anchor_us_max"] == pytest.approx(4.0)
    # each flow is timed from its own device's anchor: device 1's late release is not in its span
    (a0, a1), (b0, b1) = spans
    assert a1 - a0 == pytest.approx(b1 - b0)


def test_without_a_host_flag_the_gate_event_releases_and_the_rows_say_so() -> None:
    case = ConcurrentCase("ring", "write", [(0, 1), (1, 0)], 64 * KiB, 3)
    copier, api = _copier([0, 1], [], host_flag=False)
    spans, ok, why, timing = copier.run_concurrent(0, case)
    assert spans is not None and all(ok) and timing is not None
    assert timing.release == "gate_event" and timing.anchor_us == {}
    assert "CAN_MAP_HOST_MEMORY" in why and "assumed simultaneous" in why
    rows = concurrent_rows(case, "cuda", spans, ok, why, timing=timing)
    assert {r["release"] for r in rows} == {"gate_event"}
    assert all("release_to_anchor_us_max" not in r for r in rows)


def test_a_refused_wait_releases_the_waiting_streams_and_falls_back_to_the_gate() -> None:
    # streams that already wait on the flag must not stay blocked when a later wait fails
    case = ConcurrentCase("ring", "write", [(0, 1), (1, 0)], 64 * KiB, 3)
    copier, api = _copier([0, 1], [])
    flag = api.flags[0]
    flag.fail_wait_at = 3  # the two anchor streams wait, the first flow's wait is refused
    spans, ok, why, timing = copier.run_concurrent(0, case)
    assert spans is not None and all(ok) and timing is not None
    assert timing.release == "gate_event" and flag.closed
    assert flag.written_at and not flag.held  # the waiting anchor streams were released
    assert "the host flag failed" in why and "CUresult 801" in why


def test_a_dropped_middle_iteration_is_caught() -> None:
    # issue 23 pt 8: every iteration copied the same source over the same destination, so the
    # check after the round proved only that some copy landed. Call 9 is trial 2's third copy
    # (call 1 is the warm-up, 2-6 trial 1): later copies used to rewrite the same bytes over it.
    case = P2PCase(0, 1, "p2p", "uni", "bandwidth", 64 * KiB, 5, 2)
    rt = PeerCopies(lose=(9,))
    copier = CudaCopier(Plan(backend="cuda", devices=[0, 1], p2p=[case]), CudaStandin([0, 1]), rt)
    times, ok, detail = copier.run_p2p(0, case)
    assert rt.calls == 11 and times is not None
    assert not ok, "a round that lost its third copy was recorded ok"
    assert "trial 2: iteration(s) 3 of 5 did not land in GPU 1" in detail
    row = p2p_result_row(case, "cuda", (times, ok, detail))
    assert row["status"] == "error" and "iteration(s) 3 of 5" in row["detail"]


def test_every_iteration_of_a_clean_round_lands_in_its_own_slot() -> None:
    case = P2PCase(0, 1, "p2p", "bi", "latency", 8, 50, 3)
    copier, _ = _copier([0, 1], [case])
    times, ok, detail = copier.run_p2p(0, case)
    assert ok and times and "did not land" not in detail


def test_a_dropped_down_copy_of_a_host_staged_round_is_caught_through_the_bounce_buffer() -> None:
    # the bounce buffer held the right bytes from the round before: the up copy would have
    # carried them on and the destination passed; it is filled before each round now
    case = P2PCase(0, 1, "host_staged", "uni", "bandwidth", 64 * KiB, 4, 2)
    copier, api = _copier([0, 1], [case])
    api.drop = {copier.streams[0].name: {1 + 4 + 2}}  # trial 2 (after warm-up and trial 1), copy 2
    times, ok, detail = copier.run_p2p(0, case)
    assert not ok
    assert "trial 2: iteration(s) 2 of 4 did not land in GPU 1 (down or up copy)" in detail


@pytest.mark.parametrize("path", ["h2d", "d2h"])
def test_a_dropped_middle_host_copy_is_caught(path: str) -> None:
    case = (P2PCase(-1, 0, "h2d", "uni", "latency", 8, 20, 2) if path == "h2d"
            else P2PCase(0, -1, "d2h", "uni", "latency", 8, 20, 2))
    copier, api = _copier([0], [case])
    api.drop = {copier.streams[0].name: {1 + 10}}  # trial 1's tenth copy
    times, ok, detail = copier.run_p2p(0, case)
    assert not ok and "trial 1: iteration(s) 10 of 20 did not land" in detail


def test_a_concurrent_flow_that_drops_a_middle_iteration_is_the_only_error() -> None:
    # the stand-in makes the copies when the host waits for them, stream by stream: calls 1-3
    # are flow 0's, call 5 is flow 1's second
    case = ConcurrentCase("ring", "write", [(0, 1), (1, 0)], 64 * KiB, 3)
    copier = CudaCopier(Plan(backend="cuda", devices=[0, 1]), CudaStandin([0, 1]),
                        PeerCopies(lose=(5,)))
    spans, ok, why, timing = copier.run_concurrent(0, case)
    assert spans is not None and ok == [True, False]
    assert "iteration(s) 2 of 3 did not land in GPU 0 (flow 1)" in why
    rows = concurrent_rows(case, "cuda", spans, ok, why, timing=timing)
    assert [r["status"] for r in rows] == ["ok", "error", "error"]


def test_a_flag_that_did_not_hold_bounds_no_anchor_and_says_so() -> None:
    # as when the timer wrote the flag because queueing blocked: the streams ran before the
    # host's own write, so the acknowledgements after that write bound nothing
    case = ConcurrentCase("ring", "write", [(0, 1), (1, 0)], 64 * KiB, 3)
    copier, api = _copier([0, 1], [])
    api.flags[0].value = 1 << 20  # already past every round's value: no stream waits
    spans, ok, why, timing = copier.run_concurrent(0, case)
    assert spans is not None and all(ok) and timing is not None
    assert timing.release == "host_flag" and not timing.held
    assert timing.anchor_us == {0: None, 1: None} and "includes host queueing" in why
    rows = concurrent_rows(case, "cuda", spans, ok, why, timing=timing)
    assert all("release_to_anchor_us_max" not in r for r in rows)
    assert {r["held"] for r in rows} == {"no"}

"""The NCCL all-reduce model: NCCL's default choices, the variants, and decode-sized messages."""

from __future__ import annotations

import pytest

from pcieprof.errors import BadInput
from pcieprof.sim.collectives import busbw_gbps, predict_allreduce

ALL8 = list(range(8))
KiB, MiB = 1024, 1 << 20


def test_vm_small_allreduce_much_slower_with_p2p_off(vm) -> None:
    for size in (8, 4 * KiB, 12 * KiB, 64 * KiB):
        off, c_off = predict_allreduce(vm, ALL8, size, "bf16", {"NCCL_P2P_DISABLE": "1"})
        on, c_on = predict_allreduce(vm, ALL8, size, "bf16", {"NCCL_P2P_LEVEL": "SYS"})
        assert off > 1.5 * on, size
        assert set(c_off["transport"].values()) == {"SHM/direct/direct"}
        assert set(c_on["transport"].values()) == {"P2P/CUMEM"}


def test_vm_default_uses_host_memory_because_the_guest_sees_phb(vm, bare) -> None:
    _, c = predict_allreduce(vm, ALL8, 12 * KiB, "bf16", {})
    assert set(c["transport"].values()) == {"SHM/direct/direct"}
    _, c = predict_allreduce(bare, ALL8, 12 * KiB, "bf16", {})
    # bare metal: P2P inside a switch (PIX), SHM for NODE and SYS pairs, as its owners logged
    assert c["transport"]["0->1"] == "P2P/CUMEM" and c["transport"]["1->2"] == "SHM/direct/direct"


def test_dual_turin_defaults_two_channels_simple_and_the_fixes(bare) -> None:
    t, c = predict_allreduce(bare, ALL8, 32 * KiB, "bf16", {})
    assert (c["channels"], c["proto"], c["algo"]) == (2, "Simple", "Ring")
    ll, c_ll = predict_allreduce(bare, ALL8, 32 * KiB, "bf16", {"NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "SYS"})
    assert c_ll["proto"] == "LL" and ll < 0.75 * t
    big = {k: busbw_gbps(32 * MiB, predict_allreduce(bare, ALL8, 32 * MiB, "bf16", env)[0], 8)
           for k, env in {"default": {"NCCL_P2P_LEVEL": "SYS"},
                          "nch8": {"NCCL_P2P_LEVEL": "SYS", "NCCL_MIN_NCHANNELS": "8"}}.items()}
    assert big["nch8"] > 1.4 * big["default"]
    _, c8 = predict_allreduce(bare, ALL8, 32 * MiB, "bf16", {"NCCL_MIN_NCHANNELS": "8"})
    assert c8["channels"] == 8
    _, cg = predict_allreduce(bare, ALL8, 32 * KiB, "bf16", {"NCCL_GRAPH_FILE": "/x.xml"})
    assert cg["channels"] == 4 and cg["proto"] == "LL"


def test_time_grows_with_size_and_busbw_saturates(vm) -> None:
    times = [predict_allreduce(vm, ALL8, s, "bf16", {})[0] for s in (8, 64 * KiB, MiB, 64 * MiB, 256 * MiB)]
    assert times == sorted(times)
    bw = busbw_gbps(256 * MiB, times[-1], 8)
    assert 5 < bw < 55


def test_decode_sized_allreduce_for_the_analytic_model(vm, bare) -> None:
    # GLM-5 TP8 decode: ~12 KiB all-reduces; public figures are 25-50 us on 8 PCIe GPUs
    tuned, _ = predict_allreduce(bare, ALL8, 12 * KiB, "bf16", {"NCCL_P2P_LEVEL": "SYS", "NCCL_PROTO": "LL"})
    assert 20 < tuned < 50
    for f in (vm, bare):
        t, _ = predict_allreduce(f, ALL8, 12 * KiB, "bf16", {})
        assert 25 < t < 100


def test_explicit_choices_and_bad_env(bare) -> None:
    _, c = predict_allreduce(bare, ALL8, MiB, "fp32", {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"})
    assert (c["algo"], c["proto"]) == ("Tree", "Simple")
    _, c = predict_allreduce(bare, [0, 1], 4 * KiB, "bf16", {})
    assert c["p2p_level"] == "SYS"  # NCCL allows P2P at any distance for 2 GPUs on AMD
    t1, c1 = predict_allreduce(bare, [3], MiB, "bf16", {})
    assert c1["algo"] == "none" and t1 > 0
    for env in ({"NCCL_PROTO": "LL256"}, {"NCCL_P2P_LEVEL": "FAR"}, {"NCCL_MIN_NCHANNELS": "x"}):
        with pytest.raises(BadInput):
            predict_allreduce(bare, ALL8, MiB, "bf16", env)
    with pytest.raises(BadInput):
        predict_allreduce(bare, [0, 0], MiB, "bf16", {})
    with pytest.raises(BadInput):
        predict_allreduce(bare, ALL8, MiB, "int3", {})

"""The proof's `one_gpu` step (probes/gpu_proof.py, issue 23 pt 11) run on the CPU: its peer copy
and data check through the CUDA stand-in (builders.cuda), NVML's answers replayed from the
committed snapshot, and its timed loop on a one-rank gloo group, so that a broken step fails here
and not first on the GPU machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from builders.cuda import CudaStandin, PeerCopies, Stream
from pcieprof.discover.nvml import Nvml
from pcieprof.discover.nvml_snapshot import NvmlReplay
from probes.gpu_proof import one_gpu

SNAPSHOT = Path(__file__).resolve().parents[1] / "data" / "nvml_snapshot_rtxpro6000_8x" / "snapshot.json"


class QueuedPeerCopies(PeerCopies):
    """The stand-in's peer runtime with the copy queued on its stream, as cudaMemcpyPeerAsync
    is: its bytes land only when the host waits for the stream, so a step that reads the
    destination before synchronizing reads the poison."""

    def __init__(self, api: CudaStandin, **kw: Any) -> None:
        super().__init__(**kw)
        self.api = api

    def memcpy_peer(self, dst: torch.Tensor, src: torch.Tensor, nbytes: int, stream: Any) -> None:
        assert isinstance(stream, Stream) and stream.name != "default"  # a stream of its own
        copy = super().memcpy_peer
        self.api.enqueue(stream, lambda: copy(dst, src, nbytes, stream))


def replayed(self_answers: dict[str, dict[str, Any]]) -> Nvml:
    """The RTX PRO 6000 box's snapshot with answers for GPU 0 with itself. The snapshot (built
    from that box's logs) holds none: what NVML answers for (h, h) is what the step records on
    a real GPU; these are invented for the test, one per kind (a value, an error, none)."""
    snap = json.loads(SNAPSHOT.read_text())
    snap["calls"].update({f"nvmlDeviceGetP2PStatus(gpu0,gpu0,{k})": v for k, v in self_answers.items()})
    return Nvml(NvmlReplay(snap))


SELF = {"0": {"value": 0}, "1": {"value": 0}, "2": {"error": 3}}  # 3: NVML_ERROR_NOT_SUPPORTED


def test_one_gpu_passes_with_bytes_that_land_and_reads_the_p2p_status() -> None:
    api = CudaStandin([0])
    rt = QueuedPeerCopies(api)
    res = one_gpu(0, api=api, rt=rt, nvml=replayed(SELF), backend="gloo")
    assert res["problems"] == [], res
    assert res["same_device_peer_copy"] == {"bytes": 4 << 20, "data_check": True}
    assert rt.calls == 1
    # read/write: OK; nvlink: refused (NOT_SUPPORTED); atomics: not in the snapshot
    assert res["nvml_p2p_status_self"] == {"read": "OK", "write": "OK", "nvlink": "not_supported",
                                           "atomics": "unknown"}
    loop = res["allreduce_one_rank_16KiB"]
    # the graph replays queue 20 all-reduces at the stand-in's 2 us each: 2 us per all-reduce on
    # its virtual clock, whatever this machine's load
    assert loop["time_us_graph"] == pytest.approx([2.0] * 3)
    assert len(loop["time_us_eager"]) == 3 and all(t > 0 for t in loop["time_us_eager"])


@pytest.mark.parametrize("kw", [{"drop": 64}, {"lose": (1,)}], ids=["last_bytes_dropped", "copy_lost"])
def test_one_gpu_fails_when_the_copy_corrupts_or_never_lands(kw: dict[str, Any]) -> None:
    api = CudaStandin([0])
    res = one_gpu(0, api=api, rt=QueuedPeerCopies(api, **kw), nvml=replayed(SELF), backend="gloo")
    assert res["same_device_peer_copy"]["data_check"] is False
    assert res["problems"] == ["the same-device peer copy moved wrong bytes"]


def test_one_gpu_says_when_nvml_does_not_start() -> None:
    snap = json.loads(SNAPSHOT.read_text())
    snap["init"] = {"error": 9}  # NVML_ERROR_DRIVER_NOT_LOADED
    api = CudaStandin([0])
    res = one_gpu(0, api=api, rt=QueuedPeerCopies(api), nvml=Nvml(NvmlReplay(snap)),
                  backend="gloo")
    assert set(res["nvml_p2p_status_self"]) == {"nvml"}
    assert len(res["problems"]) == 1 and res["problems"][0].startswith("NVML: error")

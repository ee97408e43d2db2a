"""The GPU self-test (pcieprof.selftest) describes the GPU it measures (issue 15, defect 10): the CUDA ordinal of an NVML
index is found by PCI bus id, since CUDA numbers GPUs fastest-first unless told otherwise."""

from __future__ import annotations

from builders.cuda import CudaStandin
from pcieprof.selftest import cuda_ordinal


class _Bus(CudaStandin):
    def __init__(self, bus: dict[int, str | None]) -> None:
        super().__init__(list(bus))
        self.bus = bus

    def bus_id(self, device: int) -> str | None:
        return self.bus[device]


def test_the_ordinal_is_the_one_at_nvmls_bus_id() -> None:
    # CUDA's default (fastest first) put NVML's GPU 0 (bus 06) second
    api = _Bus({0: "0000:07:00.0", 1: "0000:06:00.0"})
    assert cuda_ordinal("00000000:06:00.0", api, 2) == (1, "PCI bus id 0000:06:00.0")


def test_no_match_says_why() -> None:
    assert cuda_ordinal("0000:99:00.0", _Bus({0: "0000:06:00.0"}), 1)[0] is None
    ordinal, why = cuda_ordinal("0000:06:00.0", _Bus({0: None}), 1)
    assert ordinal is None and "no PCI ids" in why
    assert cuda_ordinal(None, _Bus({0: None}), 1) == (None, "NVML gave no bus id")

"""The host flag's driver calls (probes/host_flag.py) against a stand-in for libcuda, which this
machine lacks: the entry points and flags CUDA documents, the device pointer of each device, the
fallbacks, and the acknowledgements the host times. What a GPU does with them only a GPU run
shows (probes/gpu_proof.py, step host_flag)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from probes import host_flag as hf
from probes.host_flag import DriverHostFlag, FlagError

#: Where the stand-in maps host memory for device d: host address + (d + 1) * OFFSET.
OFFSET = 1 << 48  # above every x86-64 user address (47 bits)


@dataclass
class FakeStream:
    device_index: int
    cuda_stream: int


class FakeDriver:
    """libcuda as far as the host flag calls it. `attrs[(attr, device)]` answers
    cuDeviceGetAttribute (1 where not given); `v2=False` is a driver before CUDA 11.7; `gpu_acks`
    makes cuStreamWriteValue32 write at once (the GPU at the point of the ack), else never."""

    def __init__(self, *, v2: bool = True, attrs: dict[tuple[int, int], int] | None = None,
                 wait_result: int = 0, gpu_acks: bool = True) -> None:
        self.attrs = attrs or {}
        self.current = 0
        self.calls: list[tuple[str, Any]] = []
        self.buffers: list[Any] = []
        self.wait_result = wait_result
        self.gpu_acks = gpu_acks
        suffix = "_v2" if v2 else ""

        def wait(*args: Any) -> int:  # plain functions: the flag sets argtypes on them
            return self._wait(*args)

        def write(*args: Any) -> int:
            return self._write(*args)

        setattr(self, f"cuStreamWaitValue32{suffix}", wait)
        setattr(self, f"cuStreamWriteValue32{suffix}", write)

    def cuInit(self, flags: Any) -> int:  # noqa: N802 - the driver's names
        return 0

    def cuDeviceGet(self, dev: Any, ordinal: Any) -> int:  # noqa: N802
        dev._obj.value = ordinal.value
        return 0

    def cuDeviceGetAttribute(self, val: Any, attr: Any, dev: Any) -> int:  # noqa: N802
        val._obj.value = self.attrs.get((attr.value, dev.value), 1)
        return 0

    def cuMemHostAlloc(self, pp: Any, size: Any, flags: Any) -> int:  # noqa: N802
        buf = ctypes.create_string_buffer(size.value)
        self.buffers.append(buf)
        pp._obj.value = ctypes.addressof(buf)
        self.calls.append(("cuMemHostAlloc", flags.value))
        return 0

    def cuMemHostGetDevicePointer_v2(self, pd: Any, p: Any, flags: Any) -> int:  # noqa: N802
        pd._obj.value = p.value + (self.current + 1) * OFFSET
        return 0

    def cuMemFreeHost(self, p: Any) -> int:  # noqa: N802
        self.calls.append(("cuMemFreeHost", p.value))
        return 0

    def _host(self, addr: int) -> int:
        return addr - (self.device_of(addr) + 1) * OFFSET

    @staticmethod
    def device_of(addr: int) -> int:
        return addr // OFFSET - 1

    def _wait(self, stream: Any, addr: Any, value: Any, flags: Any) -> int:
        self.calls.append(("wait", (stream.value, addr.value, value.value, flags.value)))
        return self.wait_result

    def _write(self, stream: Any, addr: Any, value: Any, flags: Any) -> int:
        self.calls.append(("write", (stream.value, addr.value, value.value, flags.value)))
        if self.gpu_acks:
            ctypes.c_uint32.from_address(self._host(addr.value)).value = value.value
        return 0


@pytest.fixture
def driver() -> FakeDriver:
    return FakeDriver()


def _flag(fake: FakeDriver, monkeypatch: pytest.MonkeyPatch, devices: list[int]) -> DriverHostFlag:
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: setattr(fake, "current", d))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    return DriverHostFlag(devices, lib=fake)


def test_streams_wait_geq_on_their_own_devices_address_of_one_mapped_word(
        driver: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    flag = _flag(driver, monkeypatch, [0, 3])
    assert flag.version == "v2"
    # pinned for every context and mapped into the devices' address space
    assert ("cuMemHostAlloc", hf.CU_MEMHOSTALLOC_PORTABLE | hf.CU_MEMHOSTALLOC_DEVICEMAP) in driver.calls
    flag.wait(FakeStream(3, 0xBEEF), 7)
    _, (stream, addr, value, flags) = driver.calls[-1]
    assert (stream, value, flags) == (0xBEEF, 7, hf.CU_STREAM_WAIT_VALUE_GEQ)
    assert driver.device_of(addr) == 3 and driver._host(addr) == flag.host
    flag.write(7)
    assert ctypes.c_uint32.from_address(flag.host).value == 7


def test_release_writes_then_times_each_devices_acknowledgement(
        driver: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    flag = _flag(driver, monkeypatch, [0, 1])
    flag.ack(FakeStream(0, 1), 1)
    flag.ack(FakeStream(1, 2), 1)
    acks = [a for what, a in driver.calls if what == "write"]
    assert {driver.device_of(addr) for _, addr, _, _ in acks} == {0, 1}
    assert len({driver._host(addr) for _, addr, _, _ in acks}) == 2  # a word per device
    bounds = flag.release(1)
    assert set(bounds) == {0, 1} and all(b is not None and 0 <= b < 1e6 for b in bounds.values())
    assert flag.release(2) == {}  # nothing was to acknowledge round 2


def test_an_acknowledgement_never_seen_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeDriver(gpu_acks=False)
    monkeypatch.setattr(hf, "ACK_TIMEOUT_S", 0.01)
    flag = _flag(fake, monkeypatch, [0])
    flag.ack(FakeStream(0, 1), 1)
    assert flag.release(1) == {0: None}


def test_the_counter_wraps_as_the_drivers_cyclic_geq() -> None:
    assert hf._cyclic_geq(5, 5) and hf._cyclic_geq(6, 5) and not hf._cyclic_geq(4, 5)
    assert hf._cyclic_geq(0, 0xFFFFFFFF)  # (int32_t)(0 - 0xFFFFFFFF) = 1 >= 0


@pytest.mark.parametrize(("fake", "why"), [
    (FakeDriver(attrs={(hf.CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1): 0}),
     "device 1 cannot map host memory"),
    (FakeDriver(v2=False, attrs={(hf.CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, 0): 0}),
     "NVreg_EnableStreamMemOPs"),
])
def test_devices_that_cannot_wait_on_host_memory_are_a_flag_error(
        fake: FakeDriver, why: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FlagError, match=why):
        _flag(fake, monkeypatch, [0, 1])


def test_a_v1_driver_with_memops_enabled_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    flag = _flag(FakeDriver(v2=False), monkeypatch, [0])
    assert flag.version == "v1"


def test_a_refused_wait_names_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    flag = _flag(FakeDriver(wait_result=801), monkeypatch, [0])
    with pytest.raises(FlagError, match="cuStreamWaitValue32_v2 failed with CUresult 801"):
        flag.wait(FakeStream(0, 1), 1)
    flag.close()
    flag.close()  # once only

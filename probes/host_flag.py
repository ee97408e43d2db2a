"""The host flag that releases a timed copy round: a 32-bit word of pinned host memory that every
GPU of the plan can read, which each stream waits on and the host writes once all are queued
(issue 23 pt 7).

CUDA driver API, from the libcuda torch has loaded (facts from the CUDA Driver API reference,
"Stream Memory Operations" and "Memory Management"; values from cuda.h):
- `cuStreamWaitValue32(stream, addr, value, flags)`: work queued on `stream` after it waits until
  the word at device address `addr` satisfies the condition; CU_STREAM_WAIT_VALUE_GEQ (0) is
  `(int32_t)(*addr - value) >= 0`, a cyclic greater-or-equal. The V2 entry points
  (`cuStreamWaitValue32_v2`, CUDA 11.7+, what cuda.h maps the name to from CUDA 12) "are
  available by default on all platforms"; the V1 ones need the driver's NVreg_EnableStreamMemOPs=1
  and say so in CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 (92). CU_DEVICE_ATTRIBUTE_CAN_USE_
  STREAM_WAIT_VALUE_NOR only concerns the NOR condition, which is not used here.
- `cuStreamWriteValue32(stream, addr, value, flags)` (same versions): the GPU writes `value` when
  the stream reaches it; used for each device's acknowledgement.
- the memory: `cuMemHostAlloc(&p, n, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP)`
  (0x1 | 0x2: pinned for every context, mapped into the devices' address space), and per device
  `cuMemHostGetDevicePointer_v2(&dptr, p, 0)` with that device's context current, as the wait's
  documentation asks; a device must report CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY (19).

Why GEQ and a counter rather than EQ and a reset: round g waits for `flag >= g` and the host
writes g, so the flag only grows; resetting it for the next round could race with a stream of the
last round that has not yet read it.

The documentation's warning (a wait is not visible to CUDA's scheduler, which may serialize
streams that share a hardware queue behind it) cannot deadlock here: the release depends on no
GPU work, only on the host's store, and every stream waits for that same store.

Acknowledgements: each device writes the round's value into its own word right after its anchor
event (on the same stream, after the wait). The host writes the flag at host time t0 and spins
until it reads each device's acknowledgement at t_d, so that device's anchor lies between t0 and
t_d: `release` returns t_d - t0 per device, an upper bound on how long after the host's write each
device's anchor fired (and so on how far apart two devices' anchors can be). A point value would
need the GPU's clock read against the host's, which no API here gives.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

import torch

CUDA_SUCCESS = 0
CU_STREAM_WAIT_VALUE_GEQ = 0
CU_STREAM_WRITE_VALUE_DEFAULT = 0
CU_MEMHOSTALLOC_PORTABLE = 0x1
CU_MEMHOSTALLOC_DEVICEMAP = 0x2
CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY = 19
CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 = 92
#: Bytes between two words the GPUs write (one cache line each, so no word shares a line).
WORD_STRIDE = 64
#: Seconds the host waits for a device's acknowledgement before giving the bound up (None).
ACK_TIMEOUT_S = 1.0


def _current(device: int) -> None:
    """Make `device`'s primary context (torch's) current on this thread: cudaSetDevice, and a
    runtime call that needs the context, in case nothing on this device created it yet."""
    torch.cuda.set_device(device)
    torch.cuda.synchronize(device)


class FlagError(RuntimeError):
    """A driver call of the host flag failed (the copier falls back to its gate event)."""


def _cyclic_geq(a: int, b: int) -> bool:
    """`(int32_t)(a - b) >= 0`, the condition of CU_STREAM_WAIT_VALUE_GEQ."""
    return ((a - b) & 0xFFFFFFFF) < 0x80000000


class DriverHostFlag:
    """The release flag and one acknowledgement word per device, through the CUDA driver API.

    Raises FlagError (with the failing call) where the devices cannot wait on host memory: the
    copier then releases rounds with a gate event and records why.
    """

    def __init__(self, devices: list[int], lib: Any = None) -> None:
        self.lib = lib if lib is not None else ctypes.CDLL("libcuda.so.1")
        self.devices = list(devices)
        # torch has initialised the driver when it made its first tensor; cuInit again is a no-op
        self._check(self.lib.cuInit(ctypes.c_uint(0)), "cuInit")
        self.wait_fn, self.write_fn, self.version = self._memops()
        for d in self.devices:
            if self._attribute(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, d) != 1:
                raise FlagError(f"device {d} cannot map host memory "
                                   "(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY = 0)")
            if self.version == "v1" and \
                    self._attribute(CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, d) != 1:
                raise FlagError("only the V1 stream memory operations are present and device "
                                   f"{d} has them disabled (NVreg_EnableStreamMemOPs=0)")
        nbytes = WORD_STRIDE * (1 + len(self.devices))
        host = ctypes.c_void_p()
        _current(self.devices[0])  # cuMemHostAlloc needs a current context
        self._check(self.lib.cuMemHostAlloc(ctypes.byref(host), ctypes.c_size_t(nbytes),
                                            ctypes.c_uint(CU_MEMHOSTALLOC_PORTABLE
                                                          | CU_MEMHOSTALLOC_DEVICEMAP)),
                    "cuMemHostAlloc")
        assert host.value is not None
        self.host = host.value
        ctypes.memset(self.host, 0, nbytes)
        self.flag = ctypes.c_uint32.from_address(self.host)
        self.acks = {d: ctypes.c_uint32.from_address(self.host + WORD_STRIDE * (1 + i))
                     for i, d in enumerate(self.devices)}
        #: device -> device addresses of (the flag, its acknowledgement word)
        self.dptr: dict[int, tuple[int, int]] = {}
        for i, d in enumerate(self.devices):
            _current(d)
            dptr = ctypes.c_uint64()
            self._check(self.lib.cuMemHostGetDevicePointer_v2(ctypes.byref(dptr),
                                                              ctypes.c_void_p(self.host),
                                                              ctypes.c_uint(0)),
                        f"cuMemHostGetDevicePointer (device {d})")
            self.dptr[d] = (dptr.value, dptr.value + WORD_STRIDE * (1 + i))
        self.expect: set[int] = set()

    def _memops(self) -> tuple[Any, Any, str]:
        for suffix, version in (("_v2", "v2"), ("", "v1")):
            wait = getattr(self.lib, f"cuStreamWaitValue32{suffix}", None)
            write = getattr(self.lib, f"cuStreamWriteValue32{suffix}", None)
            if wait is not None and write is not None:
                for fn in (wait, write):
                    fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32,
                                   ctypes.c_uint]
                    fn.restype = ctypes.c_int
                return wait, write, version
        raise FlagError("libcuda has no cuStreamWaitValue32 (driver older than CUDA 8)")

    def _attribute(self, attr: int, device: int) -> int:
        dev, val = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(device)), "cuDeviceGet")
        self._check(self.lib.cuDeviceGetAttribute(ctypes.byref(val), ctypes.c_int(attr), dev),
                    f"cuDeviceGetAttribute({attr})")
        return int(val.value)

    def _check(self, err: int, call: str) -> None:
        if err != CUDA_SUCCESS:
            raise FlagError(f"{call} failed with CUresult {err}")

    def wait(self, stream: torch.cuda.Stream, value: int) -> None:
        """Hold work queued on `stream` from now on until the host writes `value` (or more)."""
        addr = self.dptr[int(stream.device_index)][0]
        self._check(self.wait_fn(ctypes.c_void_p(stream.cuda_stream), ctypes.c_uint64(addr),
                                 ctypes.c_uint32(value), ctypes.c_uint(CU_STREAM_WAIT_VALUE_GEQ)),
                    f"cuStreamWaitValue32_{self.version}")

    def ack(self, stream: torch.cuda.Stream, value: int) -> None:
        """When `stream` gets here, its device writes `value` into its acknowledgement word."""
        d = int(stream.device_index)
        self._check(self.write_fn(ctypes.c_void_p(stream.cuda_stream),
                                  ctypes.c_uint64(self.dptr[d][1]), ctypes.c_uint32(value),
                                  ctypes.c_uint(CU_STREAM_WRITE_VALUE_DEFAULT)),
                    f"cuStreamWriteValue32_{self.version}")
        self.expect.add(d)

    def write(self, value: int) -> None:
        """The host's store (x86 keeps stores in order; the GPUs read the word over PCIe)."""
        self.flag.value = value & 0xFFFFFFFF

    def release(self, value: int) -> dict[int, float | None]:
        """Write `value`, then per device that was to acknowledge it, microseconds from the write
        to the host reading the acknowledgement (None: not seen within ACK_TIMEOUT_S)."""
        expect, self.expect = self.expect, set()
        t0 = time.perf_counter_ns()
        self.write(value)
        seen: dict[int, float | None] = {d: None for d in expect}
        pending = set(expect)
        deadline = t0 + int(ACK_TIMEOUT_S * 1e9)
        while pending:
            done = [d for d in pending if _cyclic_geq(self.acks[d].value, value)]
            now = time.perf_counter_ns()  # after the read: an upper bound
            for d in done:
                seen[d] = (now - t0) / 1e3
                pending.discard(d)
            if now > deadline:
                break
        return seen

    def close(self) -> None:
        """Free the pinned words (after every stream that waits on them has finished)."""
        if self.host:
            self.lib.cuMemFreeHost(ctypes.c_void_p(self.host))
            self.host = 0

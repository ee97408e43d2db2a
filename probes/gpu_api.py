"""The CUDA calls the probes make, behind one small interface.

`TorchCuda` is the real thing (torch.cuda); `Cudart` the few CUDA runtime calls torch does not
expose, from the libcudart torch has loaded (the one place libcudart is opened). The interface exists so that the timing and
synchronisation logic of the probes, which this project's CI cannot run on a GPU, can be run on a
CPU against a stand-in that keeps CUDA's ordering rules (tests/builders/cuda.py): work on
one stream is ordered, streams are not ordered with each other (torch's streams are created
non-blocking, so not even with the default stream), an event's time exists only once the event
has completed, and `synchronize(device)` waits for that device alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

#: Assumed SM clock when the device does not report one (cycles per second), to size spin kernels.
FALLBACK_CLOCK_HZ = 2.0e9


class Event(Protocol):
    """A CUDA timing event (torch.cuda.Event(enable_timing=True))."""

    def record(self, stream: Any = None) -> None: ...

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end_event: Any) -> float: ...


class HostFlag(Protocol):
    """A 32-bit word of pinned host memory the GPUs of the plan wait on (probes.host_flag)."""

    def wait(self, stream: Any, value: int) -> None:
        """Hold work queued on `stream` from now on until the word is `value` or more."""

    def ack(self, stream: Any, value: int) -> None:
        """When `stream` gets here, its device writes `value` where the host can read it."""

    def write(self, value: int) -> None:
        """The host's store of `value` into the word (releases every stream waiting for it)."""

    def release(self, value: int) -> dict[int, float | None]:
        """`write(value)`, then per device that was to acknowledge it, microseconds from the
        write to the host reading its acknowledgement (None: not seen in time)."""

    def close(self) -> None:
        """Free the word."""


class CudaApi(Protocol):
    """What the probes ask of CUDA. Devices are CUDA ordinals."""

    def new_stream(self, device: int) -> Any:
        """A new stream on `device` (not ordered with any other stream)."""

    def current_stream(self, device: int) -> Any:
        """The stream work on `device` goes to when none is chosen."""

    def event(self) -> Event:
        """A new timing event."""

    def enqueue(self, stream: Any, op: Callable[[], object]) -> None:
        """Issue `op` (which launches GPU work) on `stream`."""

    def block(self, stream: Any, seconds: float) -> None:
        """Hold `stream` for about `seconds` (a spin kernel), so work queued behind it starts
        together once the host has queued all of it."""

    def synchronize(self, device: int) -> None:
        """Wait for all work on `device` (that device only, as cudaDeviceSynchronize)."""

    def device_of(self, stream: Any) -> int:
        """The device `stream` belongs to (events of two devices cannot be timed against each
        other: torch.cuda.Event.elapsed_time)."""

    def wait(self, stream: Any, event: Any) -> None:
        """Make work queued on `stream` from now on wait for `event` (which may belong to
        another device: cudaStreamWaitEvent)."""

    def capture(self, device: int, op: Callable[[], object], iters: int) -> Any:
        """`iters` calls of `op` on `device` captured once as a CUDA graph (after one warm-up
        call on a side stream, as torch.cuda.graphs asks before a capture)."""

    def replay(self, stream: Any, graph: Any) -> None:
        """Launch a captured graph on `stream` (one host call for all its work)."""

    def empty(self, nbytes: int, device: int) -> torch.Tensor:
        """`nbytes` of uninitialised device memory (uint8)."""

    def pinned(self, nbytes: int) -> torch.Tensor:
        """`nbytes` of pinned host memory (uint8), allocated by the calling thread."""

    def can_access_peer(self, device: int, peer: int) -> bool:
        """Whether `device` can map `peer`'s memory."""

    def bus_id(self, device: int) -> str | None:
        """The PCI bus id ("0000:1b:00.0") of `device`, or None when unknown."""

    def host_flag(self, devices: list[int]) -> HostFlag:
        """A release flag every device of `devices` can wait on; probes.host_flag.FlagError or
        OSError (with the reason) where they cannot."""


class TorchCuda:
    """`CudaApi` through torch.cuda."""

    def new_stream(self, device: int) -> torch.cuda.Stream:
        return torch.cuda.Stream(device=device)

    def current_stream(self, device: int) -> torch.cuda.Stream:
        return torch.cuda.current_stream(device)

    def event(self) -> torch.cuda.Event:
        return torch.cuda.Event(enable_timing=True)

    def enqueue(self, stream: torch.cuda.Stream, op: Callable[[], object]) -> None:
        with torch.cuda.stream(stream):
            op()

    def block(self, stream: torch.cuda.Stream, seconds: float) -> None:
        # torch.cuda._sleep launches a kernel that spins for a number of SM clock cycles: the
        # delay kernel of cuda-samples' p2pBandwidthLatencyTest without its host flag. The caller
        # checks afterwards that the hold outlasted the queueing (the start event had not fired).
        clock_khz = getattr(torch.cuda.get_device_properties(stream.device), "clock_rate", 0)
        hz = clock_khz * 1e3 if clock_khz else FALLBACK_CLOCK_HZ
        with torch.cuda.stream(stream):
            torch.cuda._sleep(max(1, int(seconds * hz)))

    def synchronize(self, device: int) -> None:
        torch.cuda.synchronize(device)

    def device_of(self, stream: torch.cuda.Stream) -> int:
        return int(stream.device_index)

    def wait(self, stream: torch.cuda.Stream, event: torch.cuda.Event) -> None:
        stream.wait_event(event)

    def capture(self, device: int, op: Callable[[], object], iters: int) -> torch.cuda.CUDAGraph:
        # torch.cuda.graphs: warm up on a side stream before capturing (lazy initialisation,
        # e.g. NCCL's, must not happen inside the capture)
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            op()
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(device), torch.cuda.graph(graph):
            for _ in range(iters):
                op()
        return graph

    def replay(self, stream: torch.cuda.Stream, graph: torch.cuda.CUDAGraph) -> None:
        with torch.cuda.stream(stream):
            graph.replay()

    def empty(self, nbytes: int, device: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=device)

    def pinned(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def can_access_peer(self, device: int, peer: int) -> bool:
        return bool(torch.cuda.can_device_access_peer(device, peer))

    def bus_id(self, device: int) -> str | None:
        props = torch.cuda.get_device_properties(device)
        # pci_* are on the properties object but not in torch's type stubs (torch/numa/binding.py
        # reads them the same way)
        ids = [getattr(props, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
        if not all(isinstance(v, int) for v in ids):
            return None
        domain, bus, dev = ids
        return f"{domain:04x}:{bus:02x}:{dev:02x}.0"

    def host_flag(self, devices: list[int]) -> HostFlag:
        from probes.host_flag import DriverHostFlag

        return DriverHostFlag(devices)


def find_cudart(maps: Path = Path("/proc/self/maps")) -> str | None:
    """The libcudart this process has mapped (torch's), or None."""
    with open(maps, encoding="utf-8") as f:
        for line in f:
            if "libcudart" in line:
                return line.split()[-1]
    return None


class Cudart:
    """The few CUDA runtime calls torch does not expose, from the libcudart torch has loaded."""

    def __init__(self, maps: Path = Path("/proc/self/maps")) -> None:
        path = find_cudart(maps)
        if path is None:
            path = ctypes.util.find_library("cudart")
        if path is None:
            raise OSError("libcudart not found in this process nor on the library path")
        self.lib = ctypes.CDLL(path)
        self.lib.cudaMemcpyPeerAsync.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                                 ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]

    def memcpy_peer(self, dst: torch.Tensor, src: torch.Tensor, nbytes: int,
                    stream: torch.cuda.Stream) -> None:
        err = self.lib.cudaMemcpyPeerAsync(dst.data_ptr(), dst.device.index, src.data_ptr(),
                                           src.device.index, nbytes, stream.cuda_stream)
        if err != 0:
            raise RuntimeError(f"cudaMemcpyPeerAsync failed with cudaError {err}")

    def enable_peer(self, device: int, peer: int) -> None:
        torch.cuda.set_device(device)
        err = self.lib.cudaDeviceEnablePeerAccess(peer, 0)
        self.lib.cudaGetLastError()  # the failure is not sticky: leave no error behind
        if err not in (0, 704):  # 704 = cudaErrorPeerAccessAlreadyEnabled
            raise RuntimeError(f"cudaDeviceEnablePeerAccess({device}->{peer}) failed with "
                               f"cudaError {err} although the driver reports peer access")

"""A stand-in for the CUDA stream/event API (probes.gpu_api.CudaApi) on the CPU, for hardware this
machine lacks. It measures nothing and claims nothing about a GPU: it keeps CUDA's ordering rules
and a virtual clock, so that the probes' timing and synchronisation logic can be checked here.

The rules kept (CUDA runtime API, "Streams" and "Events"; torch creates its streams with
cudaStreamNonBlocking, so they are not ordered with the default stream either):
- work on one stream runs in issue order; streams are not ordered with each other;
- an idle stream starts work as soon as it is issued; a held stream (spin kernel) starts it when
  the hold ends;
- the effects of queued work (the tensor copies) happen when the host waits for it:
  `synchronize(device)` for every stream of that device only, `event.synchronize()` for the
  event's stream up to the event, or `event.query()` once the event's time has passed;
- `elapsed_time` of an event that has not completed raises, as CUDA's cudaErrorNotReady does.

Virtual time: each call the host makes costs `host_us`, each queued op runs `gpu_us`, a hold lasts
what was asked. `log` records every call, with the device for `synchronize`.

The host flag (probes.host_flag, cuStreamWaitValue32 on pinned host memory): a stream that waits
on it is held until the host writes the value; its work is placed from HELD_US on and moved to its
real time when the flag is written (the device sees the write `flag_lag_us[device]` later, and the
host reads a device's acknowledgement `ack_us` after the GPU wrote it). `host_flag=False` is a
driver that cannot wait on host memory (the copier falls back to its gate event).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from probes.host_flag import FlagError


@dataclass
class Stream:
    device: int
    name: str
    ready_us: float = 0.0  # when the GPU finishes what is queued so far
    queue: list[tuple[float, Callable[[], object]]] = field(default_factory=list)  # (end, effect)
    enqueued: int = 0  # ops issued on it so far

    def drain(self, until_us: float = float("inf")) -> None:
        """Apply the effects of queued work that ends by `until_us`, in issue order."""
        while self.queue and self.queue[0][0] <= until_us:
            self.queue.pop(0)[1]()


#: Where the work of a stream held by the host flag is placed until the flag is written (us).
HELD_US = 1e12


class StandinEvent:
    def __init__(self, api: "CudaStandin") -> None:
        self.api = api
        self.stream: Stream | None = None
        self.t_us: float | None = None
        self.done = False

    def record(self, stream: Stream | None = None) -> None:
        s = stream or self.api.current_stream(0)
        self.api.tick("record", s.device)
        self.stream = s
        self.api.recorded.append(self)
        self.t_us = self.api.start_on(s)
        s.ready_us = self.t_us
        s.queue.append((self.t_us, self._complete))

    def _complete(self) -> None:
        self.done = True

    def query(self) -> bool:
        self.api.tick("query", self.stream.device if self.stream else -1)
        if self.stream is not None and self.t_us is not None and self.api.host_us >= self.t_us:
            self.stream.drain(self.t_us)
        return self.done

    def synchronize(self) -> None:
        assert self.stream is not None and self.t_us is not None, "event never recorded"
        self.api.log.append(("event_sync", self.stream.device))
        self.api.host_us = max(self.api.host_us, self.t_us)
        self.stream.drain(self.t_us)

    def elapsed_time(self, end_event: "StandinEvent") -> float:
        if not (self.done and end_event.done):
            raise RuntimeError("CUDA error: device not ready (elapsed_time on an event that "
                               "has not completed)")
        assert self.t_us is not None and end_event.t_us is not None
        # the probe times only events of one device against each other (the use
        # torch.cuda.Event.elapsed_time is written for); the stand-in holds it to that
        assert self.stream is not None and end_event.stream is not None
        assert self.stream.device == end_event.stream.device, "elapsed_time across devices"
        return (end_event.t_us - self.t_us) / 1e3  # ms, as torch returns it


class CudaStandin:
    """`probes.gpu_api.CudaApi` on the CPU (tensors are CPU tensors; devices are labels)."""

    def __init__(self, devices: list[int], *, host_us: float = 10.0, gpu_us: float = 2.0,
                 peers: bool = True, hold_scale: dict[int, float] | None = None,
                 host_flag: bool = True, flag_lag_us: dict[int, float] | None = None,
                 ack_us: float = 1.0) -> None:
        self.devices = devices
        self.flag_ok = host_flag
        self.flag_lag_us = flag_lag_us or {}
        self.ack_us = ack_us
        self.flags: list[StandinFlag] = []
        #: stream name -> numbers (1-based, in issue order) of the ops on it whose effect is lost,
        #: as a copy a DMA engine or a VM's IOMMU silently drops
        self.drop: dict[str, set[int]] = {}
        self.recorded: list[StandinEvent] = []
        # a spin kernel sized from the clock rate lasts longer on a GPU at an idle clock
        self.hold_scale = hold_scale or {}
        self.starts: list[tuple[str, float]] = []  # (stream, when a queued op starts), us
        self.host_us_per_call = host_us
        self.gpu_us = gpu_us
        self.peers = peers
        self.host_us = 0.0
        self.log: list[tuple[str, int]] = []
        self.streams: list[Stream] = []
        self.defaults = {d: self._stream(d, "default") for d in devices}

    def _stream(self, device: int, name: str) -> Stream:
        s = Stream(device, name)
        self.streams.append(s)
        return s

    def tick(self, what: str, device: int) -> None:
        self.log.append((what, device))
        self.host_us += self.host_us_per_call

    def start_on(self, s: Stream) -> float:
        """When work issued now on `s` starts (an idle stream starts at once)."""
        return max(self.host_us, s.ready_us)

    # -- CudaApi ---------------------------------------------------------------------------------
    def new_stream(self, device: int) -> Stream:
        return self._stream(device, f"s{len(self.streams)}")

    def current_stream(self, device: int) -> Stream:
        return self.defaults[device]

    def event(self) -> StandinEvent:
        return StandinEvent(self)

    def enqueue(self, stream: Stream, op: Callable[[], object]) -> None:
        self.tick("enqueue", stream.device)
        stream.enqueued += 1
        if stream.enqueued in self.drop.get(stream.name, ()):
            op = lambda: None  # noqa: E731 - the op's effect is lost
        self.starts.append((stream.name, self.start_on(stream)))
        end = self.start_on(stream) + self.gpu_us
        stream.ready_us = end
        stream.queue.append((end, op))

    def block(self, stream: Stream, seconds: float) -> None:
        self.tick("block", stream.device)
        end = self.start_on(stream) + seconds * 1e6 * self.hold_scale.get(stream.device, 1.0)
        stream.ready_us = end
        stream.queue.append((end, lambda: None))

    def device_of(self, stream: Stream) -> int:
        return stream.device

    def wait(self, stream: Stream, event: StandinEvent) -> None:
        self.tick("wait", stream.device)
        assert event.t_us is not None, "waiting for an event never recorded"
        stream.ready_us = max(stream.ready_us, event.t_us)

    def synchronize(self, device: int) -> None:
        self.log.append(("synchronize", device))
        mine = [s for s in self.streams if s.device == device]
        self.host_us = max([self.host_us] + [s.ready_us for s in mine])
        # the default stream last: an unordered stream that read what the default stream had
        # not yet written has read it already
        for s in sorted(mine, key=lambda s: s.name == "default"):
            s.drain()

    def capture(self, device: int, op: Callable[[], object], iters: int) -> list[Callable[[], object]]:
        self.tick("capture", device)  # one host call: the ops run when the graph is replayed
        return [op] * iters

    def replay(self, stream: Stream, graph: list[Callable[[], object]]) -> None:
        self.tick("replay", stream.device)  # one launch for all of it: no host time per op
        start = self.start_on(stream)
        for i, op in enumerate(graph):
            stream.queue.append((start + (i + 1) * self.gpu_us, op))
        stream.ready_us = start + len(graph) * self.gpu_us

    def empty(self, nbytes: int, device: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def pinned(self, nbytes: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8)

    def can_access_peer(self, device: int, peer: int) -> bool:
        return self.peers

    def bus_id(self, device: int) -> str | None:
        return None

    def host_flag(self, devices: list[int]) -> "StandinFlag":
        if not self.flag_ok:
            raise FlagError("device 0 cannot map host memory "
                               "(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY = 0)")
        flag = StandinFlag(self)
        self.flags.append(flag)
        return flag

    def synchronized(self) -> set[int]:
        """Devices `synchronize` was called for."""
        return {d for what, d in self.log if what == "synchronize"}


class StandinFlag:
    """`probes.gpu_api.HostFlag` on the stand-in's virtual clock. `fail_wait_at`: the wait of
    that number (1 = the first) is refused, as a driver that returns an error from
    cuStreamWaitValue32."""

    def __init__(self, api: CudaStandin, fail_wait_at: int = 0) -> None:
        self.api = api
        self.value = 0
        self.waits = 0
        self.fail_wait_at = fail_wait_at
        self.held: list[tuple[Stream, int, float]] = []  # (stream, value, when the wait began)
        self.expect: dict[int, StandinEvent] = {}  # device -> its acknowledgement
        self.written_at: list[float] = []
        self.closed = False

    @staticmethod
    def _geq(a: int, b: int) -> bool:
        return ((a - b) & 0xFFFFFFFF) < 0x80000000

    def wait(self, stream: Stream, value: int) -> None:
        self.waits += 1
        if self.waits == self.fail_wait_at:
            raise FlagError("cuStreamWaitValue32_v2 failed with CUresult 801")
        self.api.tick("flag_wait", stream.device)
        if self._geq(self.value, value):
            return
        self.held.append((stream, value, self.api.start_on(stream)))
        stream.ready_us = HELD_US

    def ack(self, stream: Stream, value: int) -> None:
        ev = StandinEvent(self.api)
        ev.record(stream)
        self.expect[stream.device] = ev

    def write(self, value: int) -> None:
        self.api.tick("flag_write", -1)
        self.value = value
        now = self.api.host_us
        self.written_at.append(now)
        still = []
        for stream, v, began in self.held:
            if not self._geq(value, v):
                still.append((stream, v, began))
                continue
            start = max(began, now + self.api.flag_lag_us.get(stream.device, 0.0))
            self._shift(stream, start - HELD_US)
        self.held = still

    def _shift(self, stream: Stream, delta: float) -> None:
        """Move the held work of `stream` (placed from HELD_US) to its real time."""
        half = HELD_US / 2
        stream.queue = [(t + delta if t >= half else t, op) for t, op in stream.queue]
        if stream.ready_us >= half:
            stream.ready_us += delta
        for ev in self.api.recorded:
            if ev.stream is stream and ev.t_us is not None and ev.t_us >= half:
                ev.t_us += delta
        self.api.starts = [(n, t + delta if n == stream.name and t >= half else t)
                           for n, t in self.api.starts]

    def release(self, value: int) -> dict[int, float | None]:
        expect, self.expect = self.expect, {}
        self.write(value)
        t0 = self.written_at[-1]
        seen = {d: ev.t_us + self.api.ack_us - t0 for d, ev in expect.items()
                if ev.t_us is not None}
        if seen:  # the host spun until it read the last acknowledgement
            self.api.host_us = max(self.api.host_us, t0 + max(seen.values()))
        return {d: seen.get(d) for d in expect}

    def close(self) -> None:
        self.closed = True


class PeerCopies:
    """The copy probe's peer runtime (cudaMemcpyPeerAsync) for the stand-in: the copy happens when
    its stream's work is applied. `drop` bytes at the end of every copy are silently not written,
    as a write that a VM's IOMMU discards."""

    def __init__(self, drop: int = 0, refuse: tuple[tuple[int, int], ...] = (),
                 lose: tuple[int, ...] = ()) -> None:
        self.drop = drop
        self.lose = set(lose)  # calls (1-based) whose copy is silently not made at all
        self.calls = 0
        self.refuse = set(refuse)  # pairs whose peer enable fails, as Cudart.enable_peer raises
        self.enabled: list[tuple[int, int]] = []

    def memcpy_peer(self, dst: torch.Tensor, src: torch.Tensor, nbytes: int, stream: Any) -> None:
        self.calls += 1
        if self.calls in self.lose:
            return
        n = nbytes - self.drop
        dst[:n].copy_(src[:n])

    def enable_peer(self, device: int, peer: int) -> None:
        if (device, peer) in self.refuse:  # e.g. cudaErrorTooManyPeers (217) on a VM
            raise RuntimeError(f"cudaDeviceEnablePeerAccess({device}->{peer}) failed with "
                               "cudaError 217 although the driver reports peer access")
        self.enabled.append((device, peer))

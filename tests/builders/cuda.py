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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Stream:
    device: int
    name: str
    ready_us: float = 0.0  # when the GPU finishes what is queued so far
    queue: list[tuple[float, Callable[[], object]]] = field(default_factory=list)  # (end, effect)

    def drain(self, until_us: float = float("inf")) -> None:
        """Apply the effects of queued work that ends by `until_us`, in issue order."""
        while self.queue and self.queue[0][0] <= until_us:
            self.queue.pop(0)[1]()


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
                 peers: bool = True, hold_scale: dict[int, float] | None = None) -> None:
        self.devices = devices
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

    def synchronized(self) -> set[int]:
        """Devices `synchronize` was called for."""
        return {d for what, d in self.log if what == "synchronize"}


class PeerCopies:
    """The copy probe's peer runtime (cudaMemcpyPeerAsync) for the stand-in: the copy happens when
    its stream's work is applied. `drop` bytes at the end of every copy are silently not written,
    as a write that a VM's IOMMU discards."""

    def __init__(self, drop: int = 0, refuse: tuple[tuple[int, int], ...] = ()) -> None:
        self.drop = drop
        self.refuse = set(refuse)  # pairs whose peer enable fails, as Cudart.enable_peer raises
        self.enabled: list[tuple[int, int]] = []

    def memcpy_peer(self, dst: torch.Tensor, src: torch.Tensor, nbytes: int, stream: Any) -> None:
        n = nbytes - self.drop
        dst[:n].copy_(src[:n])

    def enable_peer(self, device: int, peer: int) -> None:
        if (device, peer) in self.refuse:  # e.g. cudaErrorTooManyPeers (217) on a VM
            raise RuntimeError(f"cudaDeviceEnablePeerAccess({device}->{peer}) failed with "
                               "cudaError 217 although the driver reports peer access")
        self.enabled.append((device, peer))

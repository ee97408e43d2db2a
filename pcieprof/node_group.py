"""The nodes of a multi-node measurement, and how they keep in step.

`pcieprof topology --nnodes N --node-rank R --rdzv-endpoint HOST:PORT` on every node: node 0
listens at HOST:PORT, the others connect to it, and each node keeps that one TCP connection
(JSON lines) for the cross-node part of the run. Over it:

- joining, once, with a deadline: node 0 waits for every other node's `hello` (rank, host,
  pid, bundle, devices), checks that they run the same backend and devices, and answers
  `welcome` with the members; a node that does not join in time ends the run on every node that
  is there with one line naming the endpoint and the missing node (EnvironmentMissing, exit 3);
- node 0's all-reduce cases (`plan`), so every node runs the same cases in the same order;
- each case in step: node 0 picks a free port for that case's torchrun rendezvous and sends
  `case`; every node starts its torchrun (static rendezvous, `--node-rank`: node 0 holds global
  rank 0, so the rows land in node 0's bundle) and answers `result`. A fresh port per case means
  no launch can meet the store of the case before it. A node whose launch fails says so at once
  (`result` or `abort`) and the others kill theirs instead of waiting for a watchdog;
- loss: a connection that closes (the process died: the kernel closes its sockets) or stays
  silent for LOST_AFTER_S (heartbeats every BEAT_S; a machine that went away) marks that node
  lost; the remaining cross-node cases stop at once.

Every wait here has a bound. The messages carry no secrets (host names, paths, device lists).

Trust: the nodes share a token (PCIEPROF_RDZV_TOKEN, or --rdzv-token-file; at least
MIN_TOKEN bytes) and prove it before anything is accepted: node 0 sends a fresh nonce on
accepting, a node's hello carries HMAC-SHA256(token, its nonce and node 0's), node 0's welcome
one over both nonces the other way. The token itself never crosses the wire. A hello that is
malformed or unproven is refused with one warning on node 0, which goes on waiting. Even then
a node takes from node 0's plan only what its own command line could give
(pcieprof.measurement: variants by name, its own sizes, deadlines and environment).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import queue
import re
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from pcieprof import __version__, progress
from pcieprof.errors import BadInput, EnvironmentMissing

#: Seconds between heartbeats on every connection.
BEAT_S = 1.0
#: Seconds of silence after which a node is taken as lost (its machine went away without
#: closing the connection); a process that dies closes it and is seen at once.
LOST_AFTER_S = 20.0
#: Longest message line read (a plan of every variant and group is a few tens of kB).
MAX_LINE = 1 << 22
#: Seconds between connection attempts of a node waiting for node 0.
RETRY_S = 0.5
#: Fewest bytes of a rendezvous token (128 bits).
MIN_TOKEN = 16
#: Where the token is read from when no --rdzv-token-file is given.
TOKEN_ENV = "PCIEPROF_RDZV_TOKEN"


def read_token(path: str | None) -> bytes:
    """The shared rendezvous token: the file `path` (stripped), else $PCIEPROF_RDZV_TOKEN.

    Raises:
        BadInput: none given, unreadable, or shorter than MIN_TOKEN bytes.
    """
    where = f"--rdzv-token-file {path}" if path else f"${TOKEN_ENV}"
    if path:
        try:
            token = open(path, "rb").read(1 << 16).strip()
        except OSError as exc:
            raise BadInput(f"--rdzv-token-file {path}: cannot read it ({exc.strerror or exc})") \
                from None
    else:
        token = os.environ.get(TOKEN_ENV, "").strip().encode()
    if len(token) < MIN_TOKEN:
        raise BadInput(f"several nodes need a shared rendezvous token of at least {MIN_TOKEN} "
                       f"bytes ({where} holds {len(token)})",
                       hint=f"the same secret on every node: export {TOKEN_ENV}=$(openssl rand "
                            "-hex 16), or --rdzv-token-file on a file both nodes can read")
    return token


def _proof(token: bytes, what: str, n0: str, n1: str) -> str:
    return hmac.new(token, f"pcieprof-rdzv|{what}|{n0}|{n1}".encode(), hashlib.sha256).hexdigest()


def _member_of(hello: dict[str, Any]) -> tuple["Member", int]:
    """The Member and --nnodes of a hello, its fields checked for type.

    Raises:
        ValueError: a field missing or of the wrong type (the text says which).
    """
    m = hello.get("member")
    if not isinstance(m, dict):
        raise ValueError("no member")
    nnodes = hello.get("nnodes")
    ints = {"nnodes": nnodes, "node_rank": m.get("node_rank"), "pid": m.get("pid")}
    for k, v in ints.items():
        if type(v) is not int:  # bool is an int too
            raise ValueError(f"{k} {v!r} is not an integer")
    for k in ("host", "bundle", "backend"):
        if not isinstance(m.get(k), str):
            raise ValueError(f"{k} {m.get(k)!r} is not a string")
    devs = m.get("devices")
    if not isinstance(devs, list) or any(type(d) is not int for d in devs):
        raise ValueError(f"devices {devs!r} is not a list of integers")
    return Member(m["node_rank"], m["host"], m["pid"], m["bundle"], list(devs),
                  m["backend"]), int(ints["nnodes"] or 0)


class NodeLost(Exception):
    """Another node of the run is gone (or stopped answering); `str()` says which and how."""


@dataclass
class Member:
    """What a node tells the others when it joins.

    Attributes:
        node_rank: its rank.
        host: its host name.
        pid: its pcieprof process.
        bundle: its bundle directory (absolute, on its host).
        devices: the devices it runs the probes on.
        backend: `cuda` or `cpu`.
    """

    node_rank: int
    host: str
    pid: int
    bundle: str
    devices: list[int] = field(default_factory=list)
    backend: str = "cpu"

    @classmethod
    def here(cls, node_rank: int, bundle: str, devices: list[int], backend: str) -> "Member":
        return cls(node_rank, socket.gethostname(), os.getpid(), bundle, list(devices), backend)


_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
_V6 = re.compile(r"[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?")


def parse_endpoint(text: str) -> tuple[str, int]:
    """`HOST:PORT` (or `[v6]:PORT`) -> (host, port).

    Raises:
        BadInput: no port, or a port out of range.
    """
    host, sep, port = text.strip().rpartition(":")
    bracketed = len(host) > 2 and host[0] == "[" and host[-1] == "]"
    host = host[1:-1] if bracketed else host
    # a name or IPv4 address; an IPv6 address only in brackets (`h:1:2` is no HOST:PORT)
    shape = _V6 if bracketed else _HOST
    if not sep or not shape.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadInput(f"--rdzv-endpoint {text!r}: expected HOST:PORT (e.g. 10.0.0.1:29400, "
                       "[fd00::1]:29400)")
    return host, int(port)


def free_port(host: str) -> int:
    """A TCP port free on `host` now (the kernel's choice), for one torchrun rendezvous."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class _Peer:
    """One connection to another node: a reader thread queues its messages; EOF, an error or
    silence marks it lost."""

    def __init__(self, sock: socket.socket, node_rank: int | None = None) -> None:
        self.sock = sock
        self.node_rank = node_rank
        self.inbox: queue.Queue[dict[str, Any]] = queue.Queue()
        self.lost: str | None = None
        self.left = False  # said goodbye: a close is not a loss
        self.nonce = ""  # node 0: the challenge sent to this peer
        self.hello_nonce = ""  # node 0: the nonce of this peer's hello
        self._lock = threading.Lock()
        self._ended = threading.Event()  # the reader thread has stopped
        sock.settimeout(LOST_AFTER_S)
        threading.Thread(target=self._read, daemon=True, name="pcieprof-node-peer").start()

    def name(self) -> str:
        return f"node {self.node_rank}" if self.node_rank is not None else "a node"

    def send(self, msg: dict[str, Any]) -> None:
        data = (json.dumps(msg) + "\n").encode()
        with self._lock:
            try:
                self.sock.sendall(data)
            except OSError as exc:
                self._lose(f"connection broken ({exc.strerror or exc})")

    def _lose(self, why: str) -> None:
        if self.lost is None and not self.left:
            self.lost = why
        self.inbox.put({"op": "_lost"})  # wakes a waiter

    def _read(self) -> None:
        try:
            self._read_lines()
        finally:
            self._ended.set()

    def _read_lines(self) -> None:
        f = self.sock.makefile("rb")
        while True:
            try:
                line = f.readline(MAX_LINE)
            except (socket.timeout, TimeoutError):
                self._lose(f"silent for {LOST_AFTER_S:g} s")
                return
            except (OSError, ValueError) as exc:
                self._lose(f"connection broken ({exc})")
                return
            if not line:
                self._lose("connection closed (its process ended)")
                return
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if not isinstance(msg, dict) or msg.get("op") == "beat":
                continue
            if msg.get("op") == "bye":
                self.left = True
            self.inbox.put(msg)

    def close(self, grace_s: float = 2.0) -> None:
        """Close after what was sent has arrived: FIN first, then wait (up to `grace_s`) for
        the other side to close too, so that no reset can overtake the last message."""
        self.left = True
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self._ended.wait(grace_s)
        self.sock.close()


class NodeGroup:
    """This node's view of the run's nodes (create with `NodeGroup.join`).

    Attributes:
        endpoint: HOST:PORT of node 0.
        nnodes: nodes in the run.
        node_rank: this node.
        members: every node's `Member`, by rank (after the join).
    """

    def __init__(self, endpoint: str, nnodes: int, node_rank: int, timeout_s: float,
                 token: bytes = b"") -> None:
        self.token = token
        self.endpoint = endpoint
        self.host, self.port = parse_endpoint(endpoint)
        self.nnodes = nnodes
        self.node_rank = node_rank
        self.timeout_s = timeout_s
        self.members: dict[int, Member] = {}
        self.peers: dict[int, _Peer] = {}  # node 0: every other node; the others: node 0
        self._got: list[dict[str, Any]] = []  # messages read, not yet taken
        self._closed = threading.Event()
        self.ended = False  # node 0 said `end`

    @property
    def leader(self) -> bool:
        return self.node_rank == 0

    # -- joining ---------------------------------------------------------------------------------

    @classmethod
    def join(cls, endpoint: str, nnodes: int, node_rank: int, me: Member,
             timeout_s: float, *, token: bytes) -> "NodeGroup":
        """Meet the other nodes within `timeout_s` seconds, each proving `token` (read_token).

        Raises:
            EnvironmentMissing: a node did not join (or node 0 did not answer) in time, or the
                endpoint cannot be listened on.
            BadInput: the nodes disagree (node ranks, number of nodes, backend, devices).
        """
        if len(token) < MIN_TOKEN:
            raise BadInput(f"rendezvous token shorter than {MIN_TOKEN} bytes")
        group = cls(endpoint, nnodes, node_rank, timeout_s, token)
        if group.leader:
            group._lead(me)
        else:
            group._follow(me)
        threading.Thread(target=group._beat, daemon=True, name="pcieprof-node-beat").start()
        return group

    def _lead(self, me: Member) -> None:
        try:
            server = socket.create_server((self.host, self.port),
                                          family=socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        except OSError as exc:
            raise EnvironmentMissing(
                f"rendezvous {self.endpoint}: node 0 cannot listen there ({exc.strerror or exc})",
                hint="give node 0's own address and a free port in --rdzv-endpoint") from None
        self.members[0] = me
        waiting: list[_Peer] = []
        deadline = time.monotonic() + self.timeout_s
        server.settimeout(0.2)
        progress.info(f"rendezvous {self.endpoint}: waiting up to {self.timeout_s:g} s for "
                      f"{self.nnodes - 1} more node(s)")
        try:
            while len(self.members) < self.nnodes:
                if time.monotonic() > deadline:
                    missing = [r for r in range(self.nnodes) if r not in self.members]
                    why = (f"rendezvous {self.endpoint}: node{'s' if len(missing) > 1 else ''} "
                           f"{', '.join(map(str, missing))} of {self.nnodes} did not join within "
                           f"{self.timeout_s:g} s")
                    self._refuse_all(why)
                    raise EnvironmentMissing(why, hint=(
                        f"start `pcieprof topology --nnodes {self.nnodes} --node-rank "
                        f"{missing[0]} --rdzv-endpoint {self.endpoint} ...` there, and check "
                        f"that it reaches {self.endpoint}"))
                try:
                    conn, _ = server.accept()
                    fresh = _Peer(conn)
                    fresh.nonce = os.urandom(16).hex()
                    fresh.send({"op": "challenge", "nonce": fresh.nonce})
                    waiting.append(fresh)
                except (socket.timeout, TimeoutError):
                    pass
                for peer in list(waiting):
                    msg = _take(peer, "hello")
                    if msg is None and peer.lost is None:
                        continue
                    waiting.remove(peer)
                    if msg is not None:
                        self._admit(peer, msg)
        finally:
            server.close()
        members = [asdict(m) for _, m in sorted(self.members.items())]
        for peer in self.peers.values():
            peer.send({"op": "welcome", "members": members,
                       "proof": _proof(self.token, "welcome", peer.nonce, peer.hello_nonce)})
        progress.info(f"rendezvous {self.endpoint}: {self.nnodes} nodes joined")

    def _admit(self, peer: _Peer, hello: dict[str, Any]) -> None:
        """Check one node's hello: one that is malformed or does not prove the token is refused
        with a warning (node 0 goes on waiting); a proven node that disagrees ends the run on
        every node (BadInput)."""
        nonce = hello.get("nonce")
        proof = hello.get("proof")
        try:
            if not isinstance(nonce, str) or not isinstance(proof, str) or not hmac.compare_digest(
                    proof, _proof(self.token, "hello", peer.nonce, nonce)):
                raise ValueError("it does not hold this run's rendezvous token")
            m, nnodes = _member_of(hello)
        except ValueError as exc:
            why: str | None = f"refused a hello: {exc}"
            progress.warn(f"rendezvous {self.endpoint}: {why}")
            peer.send({"op": "refused", "why": why, "setup": False})
            peer.close(0.5)
            return
        peer.hello_nonce = nonce
        me = self.members[0]
        why = None
        if nnodes != self.nnodes:
            why = f"node {m.node_rank} was started with --nnodes {nnodes}, node 0 with {self.nnodes}"
        elif not 0 < m.node_rank < self.nnodes:
            why = f"node rank {m.node_rank} is not in 1..{self.nnodes - 1}"
        elif m.node_rank in self.members:
            why = f"two nodes were started with --node-rank {m.node_rank}"
        elif m.backend != me.backend:
            why = f"node {m.node_rank} runs the {m.backend} backend, node 0 the {me.backend} backend"
        elif m.devices != me.devices:
            why = (f"node {m.node_rank} runs devices {m.devices}, node 0 {me.devices}: every node "
                   "needs the same --devices / --nranks")
        if why:
            peer.send({"op": "refused", "why": why, "setup": False})
            peer.close()
            self._refuse_all(why, setup=False)
            raise BadInput(f"rendezvous {self.endpoint}: {why}")
        peer.node_rank = m.node_rank
        self.members[m.node_rank] = m
        self.peers[m.node_rank] = peer
        progress.info(f"rendezvous {self.endpoint}: node {m.node_rank} ({m.host}) joined")

    def _refuse_all(self, why: str, setup: bool = True) -> None:
        """Tell every node that joined why the run ends (`setup`: a node missing, exit 3)."""
        for peer in self.peers.values():
            peer.send({"op": "refused", "why": why, "setup": setup})
        for peer in self.peers.values():
            peer.close()

    def _follow(self, me: Member) -> None:
        deadline = time.monotonic() + self.timeout_s
        progress.info(f"rendezvous {self.endpoint}: joining as node {self.node_rank} of "
                      f"{self.nnodes} (up to {self.timeout_s:g} s)")
        sock = None
        while sock is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise EnvironmentMissing(
                    f"rendezvous {self.endpoint}: node 0 did not answer within {self.timeout_s:g} s",
                    hint=f"start node 0 (--node-rank 0) on {self.host}, and check the address "
                         "and that the port is open")
            try:
                sock = socket.create_connection((self.host, self.port), timeout=min(left, 5.0))
            except OSError:
                time.sleep(min(RETRY_S, max(0.0, deadline - time.monotonic())))
        peer = self.peers[0] = _Peer(sock, 0)
        nonce = os.urandom(16).hex()
        try:
            challenge = self._wait(0, ("challenge",), max(0.0, deadline - time.monotonic()),
                                   f"{self.endpoint} sent no rendezvous challenge")
        except NodeLost as exc:
            raise EnvironmentMissing(f"rendezvous {self.endpoint}: {exc}") from None
        n0 = str(challenge.get("nonce", ""))
        peer.send({"op": "hello", "nnodes": self.nnodes, "version": __version__,
                   "member": asdict(me), "nonce": nonce,
                   "proof": _proof(self.token, "hello", n0, nonce)})
        try:  # node 0 decides, by its own deadline: at most one more timeout from now
            msg = self._wait(0, ("welcome", "refused"),
                             max(0.0, deadline - time.monotonic()) + self.timeout_s,
                             f"node 0 at {self.endpoint} did not welcome node {self.node_rank}")
        except NodeLost as exc:
            raise EnvironmentMissing(f"rendezvous {self.endpoint}: {exc}") from None
        if msg["op"] == "refused":
            peer.close()
            if msg.get("setup"):
                raise EnvironmentMissing(str(msg["why"]))
            raise BadInput(f"rendezvous {self.endpoint}: {msg['why']}")
        proof = msg.get("proof")
        if not isinstance(proof, str) or not hmac.compare_digest(
                proof, _proof(self.token, "welcome", n0, nonce)):
            peer.close(0.5)
            raise BadInput(f"rendezvous {self.endpoint}: the node there does not hold this "
                           "run's rendezvous token", hint=f"give every node the same "
                           f"${TOKEN_ENV} or --rdzv-token-file")
        try:
            self.members = {}
            for m in msg.get("members") or []:
                member, _ = _member_of({"member": m, "nnodes": self.nnodes})
                self.members[member.node_rank] = member
        except (ValueError, AttributeError) as exc:
            peer.close(0.5)
            raise BadInput(f"rendezvous {self.endpoint}: node 0's welcome is malformed ({exc})") \
                from None
        progress.info(f"rendezvous {self.endpoint}: joined ({self.nnodes} nodes)")

    def _beat(self) -> None:
        while not self._closed.wait(BEAT_S):
            for peer in list(self.peers.values()):
                if peer.lost is None and not peer.left:
                    peer.send({"op": "beat"})

    # -- messages --------------------------------------------------------------------------------

    def _drain(self) -> None:
        for r, peer in self.peers.items():
            while True:
                try:
                    msg = peer.inbox.get_nowait()
                except queue.Empty:
                    break
                if msg.get("op") != "_lost":
                    self._got.append({**msg, "_from": r})

    def _find(self, node: int, ops: tuple[str, ...], step: str | None = None
              ) -> dict[str, Any] | None:
        self._drain()
        for i, msg in enumerate(self._got):
            if msg["_from"] == node and msg.get("op") in ops and \
                    (step is None or msg.get("step") == step):
                return self._got.pop(i)
        return None

    def _wait(self, node: int, ops: tuple[str, ...], timeout_s: float, what: str,
              step: str | None = None) -> dict[str, Any]:
        """The next message `ops` from `node` (about launch `step`), within `timeout_s`.

        Raises:
            NodeLost: the node is lost, or said nothing in time.
        """
        peer = self.peers[node]
        deadline = time.monotonic() + timeout_s
        while True:
            msg = self._find(node, ops, step)
            if msg is not None:
                return msg
            if peer.lost is not None:
                raise NodeLost(self.describe_loss(node))
            left = deadline - time.monotonic()
            if left <= 0:
                raise NodeLost(f"{what} within {timeout_s:g} s")
            try:  # sleep until something arrives (the reader thread queues it)
                got = peer.inbox.get(timeout=min(left, 0.5))
                if got.get("op") != "_lost":
                    self._got.append({**got, "_from": node})
            except queue.Empty:
                pass

    def describe_loss(self, node: int) -> str:
        """`node 1 (host h) lost: connection closed (its process ended)`."""
        m = self.members.get(node)
        where = f" ({m.host}, pid {m.pid})" if m else ""
        return f"node {node}{where} lost: {self.peers[node].lost}"

    def lost(self) -> str | None:
        """Why another node is lost, or None while every node is there."""
        for r, peer in sorted(self.peers.items()):
            if peer.lost is not None:
                return self.describe_loss(r)
        return None

    def failed_peer(self, step: str) -> str | None:
        """Why launch `step` cannot finish here: another node lost, or one whose own launch of
        it already failed (its `result` or `abort`). None while every node runs it."""
        lost = self.lost()
        if lost:
            return lost
        self._drain()
        for msg in self._got:
            if msg.get("step") == step and msg.get("op") in ("result", "abort") and \
                    msg.get("status") != "ok":
                return f"node {msg['_from']}'s launch failed: {msg.get('why')}"
        return None

    # -- node 0 ----------------------------------------------------------------------------------

    def send_plan(self, plan: dict[str, Any]) -> None:
        """Node 0: the all-reduce cases every node runs."""
        for peer in self.peers.values():
            peer.send({"op": "plan", "plan": plan})

    def start(self, k: int, stage: str, port: int) -> str:
        """Node 0: every node launches `stage` (`untimed`, `timed`) of all-reduce case `k`, its
        torchrun rendezvous at node 0's `port`. Returns the launch's step id."""
        step = f"{k}/{stage}"
        for peer in self.peers.values():
            peer.send({"op": "case", "k": k, "stage": stage, "step": step, "port": port})
        return step

    def abort(self, step: str, why: str) -> None:
        """This node's launch `step` failed: the others stop theirs."""
        for peer in self.peers.values():
            peer.send({"op": "abort", "step": step, "status": "error", "why": why})

    def results(self, step: str, timeout_s: float) -> dict[int, dict[str, Any]]:
        """Node 0: every other node's outcome of launch `step`.

        Raises:
            NodeLost: a node is lost or did not answer within `timeout_s`.
        """
        return {r: self._wait(r, ("result",), timeout_s, f"node {r} did not report {step}",
                              step)
                for r in sorted(self.peers)}

    def end(self, summary: dict[str, Any]) -> None:
        """Node 0: the cross-node part is over; `summary` is the all-reduce part's record."""
        self.ended = True
        for peer in self.peers.values():
            peer.send({"op": "end", "summary": summary})
        for r in list(self.peers):
            try:
                self._wait(r, ("bye",), 10.0, f"node {r} did not say goodbye")
            except NodeLost:
                pass
        self.close()

    # -- the other nodes -------------------------------------------------------------------------

    def plan(self, timeout_s: float) -> dict[str, Any]:
        """Node 0's plan (the others)."""
        return dict(self._wait(0, ("plan",), timeout_s, "node 0 sent no plan")["plan"])

    def next_step(self, timeout_s: float) -> dict[str, Any]:
        """The others: node 0's next `case` (k, stage, step, port) or its `end` (summary)."""
        return self._wait(0, ("case", "end"), timeout_s, "node 0 started no launch")

    def send_result(self, step: str, status: str, why: str) -> None:
        """The others: how this node's launch `step` ended."""
        self.peers[0].send({"op": "result", "step": step, "status": status, "why": why})

    def leave(self) -> None:
        """The others: goodbye to node 0, and close."""
        if 0 in self.peers and self.peers[0].lost is None:
            # leaving before the bye: node 0 closes the connection as soon as it has read it,
            # and that close, seen before close() below, is no loss
            self.peers[0].left = True
            self.peers[0].send({"op": "bye"})
        self.close()

    def close(self) -> None:
        self._closed.set()
        for peer in self.peers.values():
            peer.close()


def _take(peer: _Peer, op: str) -> dict[str, Any] | None:
    """The first queued message `op` of a peer not yet admitted (others are dropped)."""
    while True:
        try:
            msg = peer.inbox.get_nowait()
        except queue.Empty:
            return None
        if msg.get("op") == op:
            return msg

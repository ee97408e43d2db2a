"""pcieprof.node_group over real loopback sockets, nodes as threads of this process: the join
and its deadline, disagreements refused on both sides, launches in step, a lost node seen at
once."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import asdict
from typing import Any

import pytest

from pcieprof.errors import BadInput, EnvironmentMissing
from pcieprof.node_group import (TOKEN_ENV, Member, NodeGroup, NodeLost, free_port,
                                 parse_endpoint, read_token)


#: The shared rendezvous token of these tests.
TOKEN = b"test-token-0123456789abcdef"


def _endpoint() -> str:
    return f"127.0.0.1:{free_port('127.0.0.1')}"


def _member(rank: int, devices: list[int] | None = None, backend: str = "cpu") -> Member:
    return Member.here(rank, f"/bundles/n{rank}", devices if devices is not None else [0, 1],
                       backend)


#: How long a wait for the other side may take here: both sides are threads of this process and
#: answer at once, unless a loaded machine keeps this process off the CPU. Waits end when the
#: answer comes, so a long bound costs nothing.
WAIT_S = 60.0


def _join_both(endpoint: str, follower: Member, timeout_s: float = WAIT_S
               ) -> tuple[NodeGroup | BaseException, NodeGroup | BaseException]:
    """Node 0 in a thread, node 1 here; each side's group or the error it raised."""
    got: dict[str, Any] = {}

    def lead() -> None:
        try:
            got["0"] = NodeGroup.join(endpoint, 2, 0, _member(0), timeout_s, token=TOKEN)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            got["0"] = exc

    t = threading.Thread(target=lead)
    t.start()
    try:
        one: NodeGroup | BaseException = NodeGroup.join(endpoint, 2, 1, follower, timeout_s, token=TOKEN)
    except BaseException as exc:  # noqa: BLE001
        one = exc
    t.join(timeout_s + 10)
    return got["0"], one


def test_two_nodes_join_and_run_a_launch_in_step() -> None:
    zero, one = _join_both(_endpoint(), _member(1))
    assert isinstance(zero, NodeGroup) and isinstance(one, NodeGroup)
    try:
        assert sorted(zero.members) == sorted(one.members) == [0, 1]
        assert one.members[0].bundle == "/bundles/n0" and zero.members[1].devices == [0, 1]
        zero.send_plan({"allreduce": [], "nnodes": 2})
        assert one.plan(WAIT_S)["nnodes"] == 2
        step = zero.start(0, "timed", 12345)
        msg = one.next_step(WAIT_S)
        assert (msg["op"], msg["k"], msg["stage"], msg["port"], msg["step"]) == \
            ("case", 0, "timed", 12345, step)
        assert zero.failed_peer(step) is None
        one.send_result(step, "error", "torchrun exited with status 1")
        deadline = time.monotonic() + WAIT_S
        while zero.failed_peer(step) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "node 1's launch failed: torchrun exited with status 1" in str(zero.failed_peer(step))
        assert zero.results(step, WAIT_S)[1]["status"] == "error"
        ending = threading.Thread(target=zero.end, args=({"status": "ok"},))
        ending.start()  # node 0 waits for the goodbye
        assert one.next_step(WAIT_S) == {"op": "end", "summary": {"status": "ok"}, "_from": 0}
        t0 = time.monotonic()
        one.leave()
        ending.join(WAIT_S)
        # under the 10 s node 0 waits for a goodbye: it read this one, it did not time out
        assert not ending.is_alive() and time.monotonic() - t0 < 9
        assert zero.lost() is None  # a goodbye is not a loss
    finally:
        zero.close()
        one.close()


def test_node0_closing_right_after_the_goodbye_is_no_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """Node 0 closes as soon as it reads node 1's goodbye; node 1 may see that close before its
    own close() runs (a loaded machine): still no loss, so its bundle does not end `partial`."""
    zero, one = _join_both(_endpoint(), _member(1))
    assert isinstance(zero, NodeGroup) and isinstance(one, NodeGroup)
    try:
        ending = threading.Thread(target=zero.end, args=({"status": "ok"},))
        ending.start()
        assert one.next_step(WAIT_S)["op"] == "end"

        def close_after_node0() -> None:  # the widest window: node 0 already closed
            ending.join(WAIT_S)
            time.sleep(0.2)  # its FIN has reached node 1's reader
            NodeGroup.close(one)

        monkeypatch.setattr(one, "close", close_after_node0)
        one.leave()
        assert not ending.is_alive()
        assert one.lost() is None and zero.lost() is None
    finally:
        zero.close()
        NodeGroup.close(one)


def test_a_node_that_disagrees_is_refused_on_both_sides() -> None:
    zero, one = _join_both(_endpoint(), _member(1, devices=[0, 1, 2]))
    assert isinstance(zero, BadInput) and isinstance(one, BadInput)
    for exc in (zero, one):
        assert "node 1 runs devices [0, 1, 2], node 0 [0, 1]" in str(exc)
    zero, one = _join_both(_endpoint(), _member(1, backend="cuda"))
    assert isinstance(zero, BadInput) and "cuda backend" in str(one)


def test_node0_alone_names_the_missing_node_within_its_deadline() -> None:
    endpoint = _endpoint()
    t0 = time.monotonic()
    with pytest.raises(EnvironmentMissing) as exc:
        NodeGroup.join(endpoint, 3, 0, _member(0), 0.5, token=TOKEN)
    assert time.monotonic() - t0 < 15  # its 0.5 s deadline, plus a loaded machine's delays
    assert exc.value.one_line().startswith(
        f"rendezvous {endpoint}: nodes 1, 2 of 3 did not join within 0.5 s")
    assert "--node-rank 1" in exc.value.one_line()


def test_a_node_alone_names_node0() -> None:
    endpoint = _endpoint()
    t0 = time.monotonic()
    with pytest.raises(EnvironmentMissing, match=f"rendezvous {endpoint}: node 0 did not answer "
                                                 "within 0.5 s"):
        NodeGroup.join(endpoint, 2, 1, _member(1), 0.5, token=TOKEN)
    assert time.monotonic() - t0 < 15  # its 0.5 s deadline, plus a loaded machine's delays


def test_node0_cannot_listen_on_a_port_in_use() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        endpoint = f"127.0.0.1:{busy.getsockname()[1]}"
        with pytest.raises(EnvironmentMissing, match="node 0 cannot listen there"):
            NodeGroup.join(endpoint, 2, 0, _member(0), 0.5, token=TOKEN)


def test_a_node_whose_connection_closes_is_lost_at_once() -> None:
    zero, one = _join_both(_endpoint(), _member(1))
    assert isinstance(zero, NodeGroup) and isinstance(one, NodeGroup)
    try:
        step = zero.start(0, "timed", 1)
        one.peers[0].sock.shutdown(socket.SHUT_RDWR)  # as a process that died: no goodbye
        deadline = time.monotonic() + WAIT_S
        while zero.lost() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert zero.lost() is not None and zero.lost().startswith("node 1 (")
        assert "connection closed" in str(zero.failed_peer(step))
        with pytest.raises(NodeLost, match="node 1 .* lost"):
            zero.results(step, 30.0)  # no waiting for a node that is gone
    finally:
        zero.close()
        one.close()


@pytest.mark.parametrize("text, want", [("10.0.0.1:29400", ("10.0.0.1", 29400)),
                                        ("[::1]:5", ("::1", 5)), ("h:65535", ("h", 65535))])
def test_endpoints(text: str, want: tuple[str, int]) -> None:
    assert parse_endpoint(text) == want


@pytest.mark.parametrize("text", ["host", ":80", "h:0", "h:70000", "h:x", "127.0.0.1:41303:5",
                                  "[]:80", "a b:80", "-h:80"])
def test_bad_endpoints(text: str) -> None:
    with pytest.raises(BadInput, match="expected HOST:PORT"):
        parse_endpoint(text)


def _hello(sock: socket.socket, hello: dict[str, Any]) -> dict[str, Any]:
    """Read node 0's challenge, send `hello` (a hostile node 1), and return node 0's answer."""
    f = sock.makefile("rb")
    challenge = json.loads(f.readline())
    assert challenge["op"] == "challenge"
    sock.sendall((json.dumps(hello) + "\n").encode())
    while True:
        msg = json.loads(f.readline())
        if msg.get("op") != "beat":
            return dict(msg)


@pytest.mark.parametrize("bad", [
    {"nnodes": 2, "member": {**asdict(_member(1)), "node_rank": "1"}},
    {"nnodes": None, "member": asdict(_member(1))},
    {"nnodes": 2},
    {"nnodes": 2, "member": asdict(_member(1)), "nonce": "x", "proof": "0" * 64},
])
def test_bad_hellos_are_refused_and_node0_goes_on(bad: dict[str, Any],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    endpoint = _endpoint()
    host, port = parse_endpoint(endpoint)
    got: dict[str, Any] = {}

    def lead() -> None:
        try:
            got["0"] = NodeGroup.join(endpoint, 2, 0, _member(0), WAIT_S, token=TOKEN)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            got["0"] = exc

    t = threading.Thread(target=lead)
    t.start()
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=10)
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    with sock:
        answer = _hello(sock, {"op": "hello", **bad})
    assert answer["op"] == "refused" and "refused a hello" in answer["why"]
    one = NodeGroup.join(endpoint, 2, 1, _member(1), WAIT_S, token=TOKEN)  # node 0 still waits
    t.join(WAIT_S + 10)
    assert isinstance(got["0"], NodeGroup), got["0"]
    assert "refused a hello" in capsys.readouterr().err
    # both ends close at once: each close waits (up to 2 s) for the other end's
    leaving = threading.Thread(target=one.leave)
    leaving.start()
    got["0"].close()
    leaving.join(WAIT_S)


def test_a_node0_without_the_token_is_not_believed() -> None:
    """A fake node 0 (another token) gets node 1's hello but cannot forge the welcome: node 1
    ends with one line, having taken nothing from it."""
    endpoint = _endpoint()
    got: dict[str, Any] = {}

    def fake_lead() -> None:
        try:
            # it waits its whole deadline (no node it believes comes): long enough for node 1 to
            # connect on a loaded machine, short enough not to slow the suite much
            got["0"] = NodeGroup.join(endpoint, 2, 0, _member(0), 15.0, token=b"another-token-" * 2)
        except BaseException as exc:  # noqa: BLE001
            got["0"] = exc

    t = threading.Thread(target=fake_lead)
    t.start()
    with pytest.raises(BadInput, match="rendezvous token"):
        NodeGroup.join(endpoint, 2, 1, _member(1), WAIT_S, token=TOKEN)
    t.join(WAIT_S)


def test_no_token_or_a_short_one_is_refused(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Any) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(BadInput, match="shared rendezvous token"):
        read_token(None)
    monkeypatch.setenv(TOKEN_ENV, "short")
    with pytest.raises(BadInput, match="holds 5"):
        read_token(None)
    f = tmp_path / "tok"
    f.write_text("x" * 16 + "\n")
    assert read_token(str(f)) == b"x" * 16

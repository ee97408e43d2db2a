"""Every socket the reference server listens on is a loopback one (issue 13): its HTTP port, the
rendezvous store of its TP ranks (torch's TCPStore listens on every interface unless handed a
bound socket) and gloo's connections between ranks. Read from /proc (builders.procs.listening): the
listening TCP sockets of the server's own processes."""

from __future__ import annotations

import pytest

from builders.procs import LOOPBACK, listening

pytest.importorskip("pcieprof.refserver.server")


def test_tp2_server_listens_on_loopback_only(start_server) -> None:
    s = start_server([], tp=2)
    s.wait_ready()
    pids = {s.proc.pid} | s.ranks
    assert len(pids) == 2, pids  # rank 0 and its one worker
    socks = listening(pids)
    ports = {p for _, _, p in socks}
    # the HTTP port, the rendezvous store and gloo's listeners of both ranks
    assert s.port in ports and len(socks) >= 3, socks
    wide = [x for x in socks if x[1] not in LOOPBACK]
    assert not wide, f"listening beyond loopback: {wide}"

"""Every socket the reference server listens on is a loopback one (issue 13): its HTTP port, the
rendezvous store of its TP ranks (torch's TCPStore listens on every interface unless handed a
bound socket) and gloo's connections between ranks. Read from /proc: the listening TCP sockets of
the server's own processes, matched by socket inode."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import pytest

pytest.importorskip("pcieprof.refserver.server")

LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


def _address(hex_addr: str) -> str:
    """/proc/net/tcp{,6} local address (little-endian words) as text, without the port."""
    raw = bytes.fromhex(hex_addr.split(":")[0])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        return ".".join(str(b) for b in words)
    return str(ipaddress.IPv6Address(words))


def listening(pids: set[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket in LISTEN state that one of `pids` holds."""
    rows = []
    for pid in pids:
        inodes = _socket_inodes(pid)
        for table in ("tcp", "tcp6"):
            try:
                lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                f = line.split()
                if f[3] == "0A" and f[9] in inodes:  # 0A: TCP_LISTEN
                    rows.append((pid, _address(f[1]), int(f[1].split(":")[1], 16)))
    return rows


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

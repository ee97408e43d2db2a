"""Loopback, for every socket a one-node run opens: nothing pcieprof starts listens beyond it
unless the user asks (a multi-node rendezvous endpoint, a server `--host`).

`HOST` is the address; `interface()` the name of the interface that holds it (what
GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME take); `listening_socket()` a socket already bound to
it and listening, for a library that would otherwise listen on every interface (torch's
TCPStore ignores its host argument for listening and takes such a socket as `master_listen_fd`);
`free_port()` a port free on it now.
"""

from __future__ import annotations

import socket
from pathlib import Path

HOST = "127.0.0.1"
#: IFF_LOOPBACK, linux/if.h: the flag bit of /sys/class/net/<name>/flags.
IFF_LOOPBACK = 0x8


def interface() -> str:
    """The name of the loopback interface (the first with IFF_LOOPBACK set in
    /sys/class/net/*/flags; `lo` where sysfs does not say)."""
    for _index, name in sorted(socket.if_nameindex()):
        try:
            flags = int(Path(f"/sys/class/net/{name}/flags").read_text().strip(), 16)
        except (OSError, ValueError):
            continue
        if flags & IFF_LOOPBACK:
            return name
    return "lo"


def listening_socket(backlog: int = 64) -> socket.socket:
    """A TCP socket bound to HOST at a port the kernel picks, listening."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((HOST, 0))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


def free_port() -> int:
    """A TCP port free on HOST now (the kernel's choice; bound, never listened on)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])

"""NCCL logs of older releases keep their rings, transports and channels: lines printed before
any line naming the communicator, `via direct shared memory`, channel lines without `/N`, and
`comm ... - Init COMPLETE` as the only communicator line. Real excerpts (tests/data/importers/
NOTE.md); the expected values are read from the files by the test."""

from __future__ import annotations

import re
from pathlib import Path

from pcieprof.bundle.nccl_choices import NcclParsed
from pcieprof.importers.nccl_log import parse_nccl_log, summarize

DATA = Path(__file__).resolve().parents[1] / "data" / "importers"
TRANSPORT = re.compile(r"Channel (\d+)(?:/\d+)? : (\d+)\[\w+\] -> (\d+)\[\w+\].* via (.+)$")


def transports_in(line: str) -> set[tuple[int, int, int, str]]:
    m = TRANSPORT.search(line)
    return {(int(m[1]), int(m[2]), int(m[3]), m[4].strip())} if m else set()


def lines_with(text: str, word: str) -> list[str]:
    return [ln for ln in text.splitlines() if word in ln]


def kept(choices: NcclParsed) -> set[tuple[int, int, int, str]]:
    return {(e.channel, e.src, e.dst, e.via) for c in choices.comms
            for e in c.transports}


def test_direct_shared_memory_without_a_communicator_line() -> None:
    text = (DATA / "nccl_log_2.10_8gpu_direct_shared_memory_no_init_pytorch72835.log").read_text()
    c = parse_nccl_log(text, "x")
    want = {t for ln in text.splitlines() for t in transports_in(ln)}
    assert want and kept(c) == want
    assert c.transport_families == ["SHM"]  # `direct shared memory` is NCCL's SHM transport
    coll = int(lines_with(text, "coll channels")[0].split("NCCL INFO ")[1].split()[0])
    assert c.nchannels == coll
    assert c.comms[0].connected_rings


def test_channels_before_init_complete_join_that_communicator() -> None:
    text = (DATA / "nccl_log_old_16rank_channels_before_init_complete_nccl429.log").read_text()
    c = parse_nccl_log(text, "x")
    (comm,) = c.comms
    inits = lines_with(text, "Init COMPLETE")
    assert comm.nranks == int(inits[0].split(" nranks ")[1].split()[0])
    assert sorted(comm.ranks) == sorted(ln.split(" rank ")[1].split()[0] for ln in inits)
    want = {t for ln in text.splitlines() for t in transports_in(ln)}
    assert kept(c) == want
    assert c.transport_families == ["NET", "P2P"] and comm.connected_rings
    assert comm.nchannels == int(lines_with(text, "coll channels")[0].split("NCCL INFO ")[1]
                                    .split()[0])


def test_channel_lines_without_n() -> None:
    text = (DATA / "nccl_log_old_4gpu_channels_without_n_nccl671.log").read_text()
    c = parse_nccl_log(text, "x")
    assert kept(c) == {t for ln in text.splitlines() for t in transports_in(ln)}
    assert c.nranks == 4 and "P2P/direct pointer" in summarize(c)


def test_rings_before_any_communicator_line() -> None:
    text = (DATA / "nccl_log_8gpu_rings_before_comm_line_nccl1027.log").read_text()
    c = parse_nccl_log(text, "x")
    rings = {int(ln.split("Channel ")[1][:2]): [int(x) for x in ln.split(" : ")[1].split()]
             for ln in lines_with(text, "/02 :")}
    assert {int(k): v for k, v in c.rings.items()} == rings
    assert c.nchannels == len(rings) == 2
    assert kept(c) == {t for ln in text.splitlines() for t in transports_in(ln)}
    assert c.transport_families == ["P2P", "SHM"]
    # each Trees line kept under the rank it is about (`up->R->down`), no process names a rank
    tree_ranks = {m for ln in lines_with(text, "Trees [0]")
                  for m in re.findall(r"\[0\] \S*?->(\d+)->", ln)}
    assert set(c.comms[0].trees) == tree_ranks


def test_init_complete_means_connected_only_in_old_releases() -> None:
    """A 2.29 log (runtime connection may come after init) without its own "Connected all
    rings" line is not read as connected from its Init COMPLETE line."""
    text = (DATA / "nccl_log_2.29.2_2rank_socket_warn_timestamp.log").read_text()
    assert "Init COMPLETE" in text and "Connected all rings" not in text
    c = parse_nccl_log(text, "x")
    assert c.comms and not any(x.connected_rings for x in c.comms)

"""NCCL_DEBUG logs and nccl-tests output as people paste them, one test per variant.

Each variant is made from a real file: the real log with its `host:pid:tid [dev]` prefix cut
away, as a grep of its transport lines, with launcher tags, CRLF and colour codes, its ranks
interleaved line by line; the real nccl-tests block without its trailer, header, device lines or
column header, cut inside its last row. What the variant must give is what the real file gives.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Callable

import pytest

from pcieprof.errors import BadInput
from pcieprof.importers.formats import detect
from pcieprof.bundle.nccl_choices import NcclParsed
from pcieprof.importers.nccl_log import parse_nccl_log
from pcieprof.importers.nccl_tests import parse_nccl_tests
from pcieprof.importers.formats import parse_text

DATA = Path(__file__).resolve().parents[1] / "data" / "importers"
LOG = "tool-outputs/nccl_debug_info_4x5060ti_p2p_cumem.log"
TINYBOX = "tool-outputs/all_reduce_perf_6x4090_tinybox_p2p_patched_driver.txt"
PREFIX = re.compile(r"^\S+?:\d+:\d+ \[\d+\] ")


@pytest.fixture(scope="module")
def log_text(samples: Path) -> str:
    return (samples / LOG).read_text()


@pytest.fixture(scope="module")
def real(log_text: str) -> NcclParsed:
    return parse_nccl_log(log_text, "real.log")


def strip_prefix(text: str) -> str:
    return "\n".join(PREFIX.sub("", l) for l in text.splitlines()) + "\n"


def test_prefix_cut_away(log_text: str, real: NcclParsed) -> None:
    stripped = strip_prefix(log_text)
    assert "proxmox:113060" not in stripped.splitlines()[0]
    assert detect(stripped) == "nccl-log"
    c = parse_nccl_log(stripped, "s.log")
    for key in ("nccl_version", "nranks", "nchannels", "rings", "peer_transport", "transports",
                "env"):
        assert getattr(c, key) == getattr(real, key), key
    main = c.comms[0]
    assert main.comm_id == "0xecf1aa0ad32ab8b2" and main.attribution == "order"
    assert set(main.ranks) == {"0", "1", "2", "3"}
    assert c.lines["without_prefix"] > 190


def test_grep_of_the_transport_lines(log_text: str, real: NcclParsed) -> None:
    # `grep via` of the log, the prefix cut away: what people paste to show the transports
    grep = "\n".join(l for l in strip_prefix(log_text).splitlines() if " via " in l) + "\n"
    assert detect(grep) == "nccl-log"
    c = parse_nccl_log(grep, "grep.log")
    assert c.peer_transport == real.peer_transport and c.transports == ["P2P/CUMEM"]
    assert c.nranks == 4 and c.comms[0].attribution == "none"
    assert c.comms[0].comm_id is None


def interleave_ranks(text: str) -> str:
    """The lines of the four processes dealt round robin, as ranks writing to one terminal."""
    by_pid: dict[str, list[str]] = {}
    for l in text.splitlines():
        m = re.match(r"^\S+?:(\d+):", l)
        by_pid.setdefault(m.group(1) if m else "", []).append(l)
    out: list[str] = []
    queues = [q for _k, q in sorted(by_pid.items())]
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return "\n".join(out) + "\n"


TAGS: dict[str, Callable[[str], str]] = {
    "ranks_interleaved": interleave_ranks,
    "mpirun_tag_output": lambda t: "".join(f"[1,0]<stdout>:{l}" for l in t.splitlines(True)),
    "rank_tag": lambda t: "".join(f"[0] {l}" for l in t.splitlines(True)),
    "vllm_worker_tag": lambda t: "".join(f"(VllmWorker rank=0 pid=113060) {l}"
                                         for l in t.splitlines(True)),
    "crlf": lambda t: t.replace("\n", "\r\n"),
    "colour_codes": lambda t: "".join(f"\x1b[36m{l.rstrip(chr(10))}\x1b[0m\n"
                                      for l in t.splitlines(True)),
}


@pytest.mark.parametrize("variant", sorted(TAGS))
def test_log_variants_give_what_the_real_log_gives(log_text: str, real: NcclParsed, variant: str) -> None:
    text = TAGS[variant](log_text)
    assert detect(text) == "nccl-log"
    c = parse_nccl_log(text, "v.log")
    for key in ("nccl_version", "nranks", "nchannels", "rings", "peer_transport", "env"):
        assert getattr(c, key) == getattr(real, key), key
    assert [x.comm_id for x in c.comms] == [x.comm_id for x in real.comms]
    assert c.comms[0].ranks == real.comms[0].ranks


def test_real_warn_lines() -> None:
    # NCCL prints `host:pid:tid [dev] file.cc:N NCCL WARN msg` after a blank line
    # (src/debug.cc); these are real ones from NVIDIA/nccl-tests issue #166.
    f = DATA / "nccl_warn_lines_nccl_tests_issue166.log"
    c = parse_nccl_log(f.read_text(), f.name)
    assert [(w["line"], w["source"], w["dev"], w["pid"]) for w in c.warnings] == [
        (1, "misc/socket.cc:483", 0, 39964), (9, "proxy.cc:1519", 0, 39964),
        (13, "misc/socket.cc:49", 0, 39964), (16, "proxy.cc:1143", 0, 39964)]
    assert c.warnings[0]["text"] == ("socketStartConnect: Connect to 10.0.0.2<45763> failed : "
                                        "Software caused connection abort")
    assert c.warnings[1]["text"].startswith("[Proxy Service 0] Failed to execute operation")
    # the INFO lines between them are not warnings, and the transport lines still count
    assert len(c.warnings) == 4


def test_timestamped_warn_of_a_full_2_29_log() -> None:
    f = DATA / "nccl_log_2.29.2_2rank_socket_warn_timestamp.log"
    c = parse_nccl_log(f.read_text(), f.name)
    assert c.nccl_version == "2.29.2+cuda12.8" and c.cuda_driver_version == "12080"
    assert c.env == {"NCCL_COMM_ID": "172.17.16.64:23456", "NCCL_P2P_DISABLE": "1",
                        "NCCL_SHM_DISABLE": "1"}
    main = c.comms[0]
    assert main.comm_id == "0x2ef13c5ed0553a05"  # from '[Rank 0] ncclCommInitRank ...'
    assert main.ranks["0"].init == "COMPLETE" and main.nnodes == 2
    assert c.peer_transport == {"0->1": "NET/Socket/0/Shared"}
    [w] = c.warnings
    assert (w["line"], w["time"], w["host"], w["pid"], w["rank"], w["source"]) == (
        46, "2026-03-18 11:13:09", "VM-16-64-ubuntu", 28471, 0, "misc/socket.cc:537")
    assert w["text"].startswith("ncclSocketInit: connecting to address")


def test_warn_forms_from_ncclDebugLog() -> None:
    # The real line of nccl-tests #166 in the other forms NCCL's debug.cc prints or people paste:
    # with the function name (newer NCCL), cut down to `[dev]`, behind a timestamp.
    line = ("ubuntu:39964:40075 [0] misc/socket.cc:483 NCCL WARN socketStartConnect: Connect to "
            "10.0.0.2<45763> failed : Software caused connection abort")
    forms = [line.replace("socket.cc:483 ", "socket.cc:483 (socketStartConnect) "),
             line[len("ubuntu:39964:40075 "):],
             "[2024-05-01 10:00:00] " + line]
    for text in forms:
        [w] = parse_nccl_log("\n" + text + "\n", "w.log").warnings
        assert w["source"] == "misc/socket.cc:483" and w["text"].endswith("connection abort")


def test_prose_that_mentions_nccl_is_not_a_log() -> None:
    text = "We looked for NCCL WARN lines and NCCL INFO lines but saw none.\nNothing else.\n"
    assert detect(text) is None
    with pytest.raises(BadInput):
        parse_nccl_log(text, "p.txt")


# --- nccl-tests --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def block(samples: Path) -> list[str]:
    return (samples / TINYBOX).read_text().splitlines()


def rows_of(parsed) -> list[tuple]:
    return [(c.variant, c.size_bytes, c.time_us, c.algbw_gbps, c.busbw_gbps, c.wrong)
            for c in parsed.collectives]


def test_without_trailer_header_devices_or_columns(block: list[str]) -> None:
    full = parse_nccl_tests("\n".join(block) + "\n", "full.txt")
    want = rows_of(full)
    assert want == [("imported:out_of_place", 33554432, 2275.1, 14.75, 24.58, 0),
                    ("imported:in_place", 33554432, 2282.5, 14.70, 24.50, 0)]
    assert "warnings" not in full.facts
    variants = {
        "no trailer": ([l for l in block if not l.startswith(("# Out of", "# Avg"))],
                       "the '# Avg bus bandwidth' trailer"),
        "no header": ([l for l in block if "nThread" not in l],
                      "the '# nThread ... iters: N' header (timed iterations unknown)"),
        "no device lines": ([l for l in block if "Rank" not in l],
                            "the '#  Rank ... device ...' lines (GPUs unknown)"),
        "rows only": ([l for l in block if not l.startswith("#")],
                      "the column header (layout read from the rows)"),
    }
    for what, (lines, missing) in variants.items():
        p = parse_nccl_tests("\n".join(lines) + "\n", "v.txt")
        assert rows_of(p) == want, what
        [warning] = p.facts["warnings"]
        assert warning.startswith("v.txt: 1 complete rows kept; not in the file: ") and missing in warning
        # without device lines the rank count comes from busbw/algbw = 2(n-1)/n: 6 GPUs
        assert {c.nranks for c in p.collectives} == {6}, what


def test_rows_only_paste_of_another_box() -> None:
    f = DATA / "all_reduce_perf_rows_only_tinygrad_pr22.txt"
    assert detect(f.read_text()) == "nccl-tests"
    p = parse_nccl_tests(f.read_text(), f.name)
    assert len(p.collectives) == 22 and p.collectives[0].collective == "all_reduce"
    last = [c for c in p.collectives if c.size_bytes == 33554432]
    assert [(c.time_us, c.algbw_gbps, c.busbw_gbps) for c in last] == [(3966.7, 8.46, 12.69),
                                                                      (3942.4, 8.51, 12.77)]
    assert {c.nranks for c in p.collectives} == {4}  # 12.77 / 8.51 = 1.5 = 2(n-1)/n


def test_cut_inside_the_last_row_keeps_the_complete_ones() -> None:
    text = (DATA / "all_reduce_perf_16x_2node_nccl_tests_2.18.3.txt").read_text()
    lines = text.splitlines()
    k = next(i for i, l in enumerate(lines) if l.strip().startswith("4194304 "))
    cut = "\n".join(lines[:k]) + "\n" + lines[k][:40]
    p = parse_nccl_tests(cut, "cut.txt")
    sizes = sorted({c.size_bytes for c in p.collectives})
    assert sizes[0] == 1024 and sizes[-1] == 2097152 and len(sizes) == 12
    assert f"the end of the row at line {k + 1} (cut short, dropped)" in p.facts["warnings"][0]


def test_a_bad_row_in_the_middle_is_an_error_naming_it(block: list[str]) -> None:
    text = (DATA / "all_reduce_perf_16x_2node_nccl_tests_2.18.3.txt").read_text()
    lines = text.splitlines()
    k = next(i for i, l in enumerate(lines) if l.strip().startswith("8192 "))
    lines[k] = lines[k][:50]
    with pytest.raises(BadInput) as e:
        parse_nccl_tests("\n".join(lines) + "\n", "bad.txt")
    assert e.value.one_line().startswith(f"bad.txt:{k + 1}: expected 13 fields")


@pytest.mark.parametrize("wrap", ["crlf", "srun_label", "prompt_and_prose"])
def test_block_wrappers(block: list[str], wrap: str) -> None:
    text = "\n".join(block) + "\n"
    text = {"crlf": text.replace("\n", "\r\n"),
            "srun_label": "".join(f"0: {l}" for l in text.splitlines(True)),
            "prompt_and_prose": ("$ ./build/all_reduce_perf -b 32M -e 32M -g 6\n" + text
                                 + "$ echo ok\nok\n")}[wrap]
    p = parse_text(text, "w.txt")
    assert p.format == "nccl-tests"
    assert rows_of(p) == [("imported:out_of_place", 33554432, 2275.1, 14.75, 24.58, 0),
                          ("imported:in_place", 33554432, 2282.5, 14.70, 24.50, 0)]
    assert p.facts["runs"][0]["avg_busbw_gbps"] == 24.5413 and p.facts["runs"][0]["iters"] == 20


def test_rows_in_random_prose_are_not_claimed() -> None:
    rng = random.Random(7)
    words = ["float", "sum", "GPU", "bandwidth", "12", "3.4"]
    text = "\n".join(" ".join(rng.choice(words) for _ in range(8)) for _ in range(50)) + "\n"
    assert detect(text) is None

"""p2pBandwidthLatencyTest's `--sm_copy` mode is recorded, and two modes of one box never mix:
a paste holding a copy-engine run and an SM-copy run keeps the first run's rows; two files of
different modes are refused in one bundle. Real file: tests/data/importers/
p2pbwlat_8xA100sxm4_ce_then_sm_copy_runs.txt (NOTE.md); values read from it by the test."""

from __future__ import annotations

from pathlib import Path

from builders.cli import cli

from pcieprof.importers.p2p_bandwidth_latency import parse_p2p_bandwidth_latency

DATA = Path(__file__).resolve().parents[1] / "data" / "importers"
BOTH = DATA / "p2pbwlat_8xA100sxm4_ce_then_sm_copy_runs.txt"
WRITES = "Unidirectional P2P=Enabled Bandwidth (P2P Writes) Matrix (GB/s)"


def cell(text: str, a: int, b: int) -> float:
    """Row a, column b of the first WRITES matrix in text."""
    lines = text.splitlines()
    i = lines.index(WRITES)
    return float(lines[i + 2 + a].split()[1 + b])


def runs() -> tuple[str, str]:
    text = BOTH.read_text()
    k = text.index("./p2pBandwidthLatencyTest --sm_copy")
    return text[:k], text[k:]


def writes_0_1(parsed_p2p: list) -> list[float]:
    return [r.bandwidth_gbps for r in parsed_p2p if r.src == 0 and r.dst == 1
            and r.path == "p2p" and r.direction == "uni" and WRITES in r.detail]


def test_each_run_says_its_copy_mode() -> None:
    ce, sm = runs()
    p_ce = parse_p2p_bandwidth_latency(ce, "ce.txt")
    p_sm = parse_p2p_bandwidth_latency(sm, "sm.txt")
    assert p_ce.facts["copy_mode"] == "ce" and p_sm.facts["copy_mode"] == "sm"
    assert writes_0_1(p_ce.p2p) == [cell(ce, 0, 1)] and writes_0_1(p_sm.p2p) == [cell(sm, 0, 1)]
    assert all("[SM copy, --sm_copy]" in r.detail for r in p_sm.p2p)
    assert "SM copy" in p_sm.summary
    # the same file without its command line: nothing says the mode
    bare = sm[sm.index("[P2P"):]
    assert parse_p2p_bandwidth_latency(bare, "bare.txt").facts["copy_mode"] == "unknown"


def test_two_modes_in_one_paste_do_not_mix() -> None:
    ce, _sm = runs()
    p = parse_p2p_bandwidth_latency(BOTH.read_text(), BOTH.name)
    assert p.facts["copy_mode"] == "ce"
    assert writes_0_1(p.p2p) == [cell(ce, 0, 1)]  # one value per pair: the first run's
    assert len(p.gpus) == 8
    (warning,) = p.facts["warnings"]
    assert "two copy modes" in warning and "--sm_copy" in warning


def test_two_files_of_two_modes_are_refused(tmp_path: Path) -> None:
    ce, sm = runs()
    (tmp_path / "ce.txt").write_text(ce)
    (tmp_path / "sm.txt").write_text(sm)
    r = cli("import", str(tmp_path / "ce.txt"), str(tmp_path / "sm.txt"), "--out",
            str(tmp_path / "b"))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]  # the lines before it: progress, one per file
    assert "--sm_copy" in last and "compare" in last

"""A communicator that dies on `failed to extend /dev/shm/nccl-... to N bytes` is named for what
it is: /dev/shm too small (a container's), with the fix. Real excerpts (tests/data/importers/
NOTE.md): one with NCCL's timestamp and `error: No space left on device`, one of an older
release inside a Ray worker's output."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from builders.cli import cli

from pcieprof.importers.nccl_log import parse_nccl_log, summarize

DATA = Path(__file__).resolve().parents[1] / "data" / "importers"
FILES = ["nccl_warn_shm_extend_no_space_timestamp_pytorch_ci_infra490.log",
         "nccl_warn_shm_extend_ray_worker_kserve3791.log"]


@pytest.mark.parametrize("name", FILES)
def test_shm_extend_failure_is_named(name: str) -> None:
    text = (DATA / name).read_text()
    seg, size = re.search(r"failed to extend (\S+) to (\d+) bytes", text).groups()  # type: ignore[union-attr]
    c = parse_nccl_log(text, name)
    (f,) = c.failures
    assert f["kind"] == "shm_too_small" and f["segment"] == seg and f["bytes"] == int(size)
    enospc = [ln for ln in text.splitlines() if "failed to extend" in ln or (
        "creating shared memory segment" in ln and "No space left on device" in ln)]
    assert f["count"] == len(enospc)  # every WARN line that says it, each rank its own
    line = summarize(c)
    assert "/dev/shm too small" in line and "--shm-size" in line and "--ipc=host" in line


def test_other_warnings_name_no_failure() -> None:
    c = parse_nccl_log((DATA / "nccl_warn_lines_nccl_tests_issue166.log").read_text(), "x")
    assert c.warnings and c.failures == []


def test_import_keeps_the_failure_in_nccl_choices(tmp_path: Path) -> None:
    r = cli("import", str(DATA / FILES[0]), "--out", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    assert "/dev/shm too small" in r.stdout
    doc = json.loads((tmp_path / "b" / "nccl_choices.json").read_text())
    failures = [f for case in doc.values() for f in (case["parsed"] or {})["failures"]]
    assert [f["kind"] for f in failures] == ["shm_too_small"]


def test_the_enospc_segment_line_alone_names_it_too() -> None:
    """An excerpt that starts after the `failed to extend` line (the same real log, cut there)."""
    text = (DATA / FILES[0]).read_text()
    cut = text[text.index("\n", text.index("failed to extend")) + 1:]
    (f,) = parse_nccl_log(cut, "cut.log").failures
    assert f["kind"] == "shm_too_small" and f["error"].startswith("No space left on device")

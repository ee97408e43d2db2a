"""The launch search, run once for the tests that read it: `serve-bench --sweep` on the real
reference server failing by its launch flags (the fault matrix shaped like the issue 11 field
report), Ctrl-C while the third attempt is under way, then `--resume` to the end.

The run takes minutes (a server start per attempt, a hang waited out to the stall timeout), so
tests/conftest.py makes it once per session (`launch_search`): the search's own end-to-end test
asserts on how it went, the report's tests read the bundle it left (copy it before changing it).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builders.cli import cli, pcieprof_argv

MATRIX = Path(__file__).resolve().parents[1] / "data" / "fault_matrix" / "field_report_sm120.toml"
#: what the field report's user began with
FIELD_START = {"attention_backend": "dsa", "dsa_prefill_backend": "flashmla_sparse",
               "dsa_decode_backend": "flashmla_kv"}
FAST = ["--num-requests", "4", "--warmup", "1", "--input-len", "16", "--output-len", "12",
        "--concurrency", "1", "--decode-batches", "none", "--no-profile"]
# The card's stall timeout (30 s): the refserver imports torch before its first progress line,
# which on a loaded machine has taken more than 15 s (a false hang then misleads the search).
SEARCH = ["serve-bench", "--model", "tiny-cpu", "--tp", "2", "--sweep",
          *[f"--{a.replace('_', '-')}={v}" for a, v in FIELD_START.items()], *FAST]


def attempt_rows(out: Path) -> list[dict[str, Any]]:
    """The rows of `out`/serve/attempts.jsonl so far ([] before the first)."""
    path = out / "serve" / "attempts.jsonl"
    if not path.is_file():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


@dataclass(frozen=True)
class SearchRun:
    """What the interrupted and resumed search left and said."""

    out: Path  # the bundle
    interrupted: subprocess.CompletedProcess[str]  # the run stopped by Ctrl-C
    before: list[dict[str, Any]]  # attempts.jsonl right after the Ctrl-C
    search_before: Any  # serve/search.json right after the Ctrl-C (None: not written)
    manifest_before: Any  # manifest.json right after the Ctrl-C (None: not written)
    resumed: subprocess.CompletedProcess[str]  # the --resume run
    first_part_s: float  # start to the end of the interrupted run, s
    resumed_s: float  # the resumed run, s


def run_interrupted_and_resumed(out: Path) -> SearchRun:
    """Run the search into `out`, Ctrl-C it while its third attempt runs (two results recorded),
    then resume it. Asserts only what the resume needs (the Ctrl-C came in the third attempt)."""
    argv = pcieprof_argv(*SEARCH, "--out", str(out), "--", "--inject-matrix", str(MATRIX))
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            rows = attempt_rows(out)
            if len(rows) >= 3 and rows[2]["outcome"] == "running":
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the search ended before the third attempt"
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    interrupted = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    first_part = time.monotonic() - t0
    before = attempt_rows(out)
    search_before, manifest_before = (_json(out / "serve" / "search.json"),
                                      _json(out / "manifest.json"))
    t1 = time.monotonic()
    resumed = cli(*SEARCH, "--resume", "--out", str(out), "--", "--inject-matrix", str(MATRIX),
                  process=True, timeout=600)
    return SearchRun(out, interrupted, before, search_before, manifest_before, resumed,
                     first_part, time.monotonic() - t1)


def _json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None

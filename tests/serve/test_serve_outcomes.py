"""Crash classification on real log excerpts (tests/data/sglang_logs, sources in each file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcieprof.bundle.serve_search import Outcome
from pcieprof.serve.outcomes import classify

LOGS = Path(__file__).resolve().parents[1] / "data" / "sglang_logs"
FIXTURES = sorted(LOGS.glob("*.log"))


def _read(path: Path) -> tuple[str, str, str]:
    head, body = [], []
    for ln in path.read_text(encoding="utf-8").splitlines():
        (head if ln.startswith("# ") and not body else body).append(ln)
    meta = dict(h[2:].split(": ", 1) for h in head)
    return meta["source"], meta["expect"], "\n".join(body)


def test_every_category_has_a_real_fixture() -> None:
    expected = {_read(p)[1] for p in FIXTURES}
    for o in (Outcome.NAN_IN_DECODE, Outcome.CUDA_DEVICE_ASSERT, Outcome.OOM, Outcome.NCCL_ERROR,
              Outcome.NCCL_TIMEOUT, Outcome.UNSUPPORTED_ARCH, Outcome.PORT_IN_USE,
              Outcome.MISSING_MODEL):
        assert o.value in expected, o
    assert all(_read(p)[0].startswith("https://") for p in FIXTURES)


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_real_log_is_classified(path: Path) -> None:
    _, expect, body = _read(path)
    # As a launch would see it: some ordinary startup lines before, the process exited 1.
    log = "[2026-03-11 13:53:23] server_args=ServerArgs(model_path='x')\n" \
          "[2026-03-11 13:53:40 TP0] Load weight begin.\n" + body
    c = classify(log, exit_code=1)
    assert c.outcome.value == expect, c.one_line()
    assert c.line is not None and c.line > 2
    line = c.one_line()
    assert "\n" not in line and line.startswith(expect)
    assert ">" in c.excerpt


def test_hang_ok_and_unknown_crash() -> None:
    log = "[x TP0] Load weight begin.\n[x TP0] Capture cuda graph begin.\n"
    hang = classify(log, exit_code=None, hung=True)
    assert hang.outcome is Outcome.HANG and "Capture cuda graph" in hang.excerpt
    assert classify(log, exit_code=0, served=True).outcome is Outcome.OK
    crash = classify(log + "Traceback (most recent call last):\nKeyError: 'x'\n", exit_code=1)
    assert crash.outcome is Outcome.CRASHED and "KeyError" in crash.one_line()
    assert "exit 1" in crash.one_line()

from __future__ import annotations

import subprocess
import sys


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pcieprof", *args], capture_output=True, text=True)


def test_help_lists_commands() -> None:
    r = run("--help")
    assert r.returncode == 0
    assert "PCIe" in r.stdout


def test_unknown_command_is_one_line_error() -> None:
    r = run("no-such-command")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr

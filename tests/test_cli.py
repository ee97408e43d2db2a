from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from builders.cli import cli


def test_help_lists_commands() -> None:
    r = cli("--help", process=True)  # the real entry point, python -m pcieprof
    assert r.returncode == 0
    assert "PCIe" in r.stdout


def test_unknown_command_is_one_line_error() -> None:
    r = cli("no-such-command", process=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr


def test_help_imports_no_command_module() -> None:
    """`pcieprof --help` lists the commands from cli.COMMANDS: no command module, so none of
    torch, pandas or plotly, is imported for it."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "pcieprof", "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "serve-bench" in r.stdout
    imported = {ln.split("|")[-1].strip() for ln in r.stderr.splitlines() if "|" in ln}
    heavy = {m for m in imported if m.split(".")[0] in ("torch", "pandas", "plotly")
             or (m.startswith("pcieprof.commands.") and m != "pcieprof.commands.options")}
    assert not heavy, sorted(heavy)[:10]


def test_each_command_writes_where_the_readme_says() -> None:
    """README: topology, serve-bench, import, attribute, demo and recommend take --out DIR,
    report --out FILE.html; compare and sim only print (no --out)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "`topology`, `serve-bench`, `import`, `attribute` and `demo` write a\nnew bundle to " \
           "`--out DIR`" in readme
    for cmd in ("topology", "serve-bench", "import", "attribute", "demo", "recommend", "report"):
        r = cli(cmd, "--help")
        assert "-o, --out" in r.stdout, cmd
    for cmd in (["compare"], ["sim", "list"], ["sim", "describe"], ["sim", "calibration"]):
        r = cli(*cmd, "--help")
        assert r.returncode == 0 and "--out" not in r.stdout, cmd

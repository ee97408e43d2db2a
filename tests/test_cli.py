from __future__ import annotations

import subprocess
import sys
from pathlib import Path


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
        r = subprocess.run([sys.executable, "-m", "pcieprof", cmd, "--help"], capture_output=True,
                           text=True, timeout=60)
        assert "-o, --out" in r.stdout, cmd
    for cmd in (["compare"], ["sim", "list"], ["sim", "describe"], ["sim", "calibration"]):
        r = subprocess.run([sys.executable, "-m", "pcieprof", *cmd, "--help"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "--out" not in r.stdout, cmd

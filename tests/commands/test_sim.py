"""`pcieprof sim list | describe | calibration`."""

from __future__ import annotations

from pathlib import Path

from builders.cli import cli


def test_describe_prints_the_switch_box_as_a_tree() -> None:
    r = cli("sim", "describe", "rtxpro6000-8x-switch")
    assert r.returncode == 0
    assert r.stdout.count("switch vs") == 4 and r.stdout.count("root port 0000:") == 4
    assert "GPU0 0000:06:00.0 via port 0000:02:03.0" in r.stdout
    assert "GPU7 0000:f5:00.0" in r.stdout
    assert "chip A" in r.stdout and "Gen5 x16 (63.0 GB/s raw" in r.stdout
    assert "posted-write collapse: 2.7 GB/s" in r.stdout
    # the tree nests: GPUs are indented below their switch, switches below their root port
    lines = r.stdout.splitlines()
    sw = next(i for i, ln in enumerate(lines) if "switch vs01" in ln)
    gpu = next(i for i, ln in enumerate(lines) if "GPU0 0000:06:00.0" in ln)
    indent = lambda ln: len(ln) - len(ln.lstrip(" │├└─"))  # noqa: E731
    assert gpu == sw + 1 and indent(lines[gpu]) > indent(lines[sw])


def test_list_and_errors(tmp_path: Path) -> None:
    r = cli("sim", "list")
    assert r.returncode == 0 and len(r.stdout.strip().splitlines()) == 4
    assert "rtxpro6000-8x-vm" in r.stdout
    r = cli("sim", "describe", "no-such-box")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "unknown sim profile" in r.stderr
    bad = tmp_path / "b.toml"
    bad.write_text('name = "b"\n[[socket]]\nid = 0\n[[root_port]]\nid = "r"\nsocket = 0\nwidth = 3\n'
                   '[[gpu]]\nindex = 0\nbdf = "0000:01:00.0"\nparent = "r"\n')
    r = cli("sim", "describe", str(bad))
    assert r.returncode == 2 and f"{bad}: root_port[0].width:" in r.stderr


def test_calibration_command_prints_the_table() -> None:
    r = cli("sim", "calibration")
    assert r.returncode == 0 and r.stdout.startswith("| point | use |") and "Summary:" in r.stdout

"""`pcieprof sim list | describe | calibration`."""

from __future__ import annotations

import pytest

from pcieprof.cli import main


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_describe_prints_the_switch_box_as_a_tree(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["sim", "describe", "rtxpro6000-8x-switch"], capsys)
    assert code == 0
    assert out.count("switch vs") == 4 and out.count("root port 0000:") == 4
    assert "GPU0 0000:06:00.0 via port 0000:02:03.0" in out and "GPU7 0000:f5:00.0" in out
    assert "chip A" in out and "Gen5 x16 (63.0 GB/s raw" in out
    assert "posted-write collapse: 2.7 GB/s" in out
    # the tree nests: GPUs are indented below their switch, switches below their root port
    lines = out.splitlines()
    sw = next(i for i, ln in enumerate(lines) if "switch vs01" in ln)
    gpu = next(i for i, ln in enumerate(lines) if "GPU0 0000:06:00.0" in ln)
    indent = lambda ln: len(ln) - len(ln.lstrip(" │├└─"))  # noqa: E731
    assert gpu == sw + 1 and indent(lines[gpu]) > indent(lines[sw])


def test_list_and_errors(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    code, out, _ = run(["sim", "list"], capsys)
    assert code == 0 and len(out.strip().splitlines()) == 4 and "rtxpro6000-8x-vm" in out
    code, _, err = run(["sim", "describe", "no-such-box"], capsys)
    assert code == 2 and err.count("\n") == 1 and "unknown sim profile" in err
    bad = tmp_path / "b.toml"
    bad.write_text('name = "b"\n[[socket]]\nid = 0\n[[root_port]]\nid = "r"\nsocket = 0\nwidth = 3\n'
                   '[[gpu]]\nindex = 0\nbdf = "0000:01:00.0"\nparent = "r"\n')
    code, _, err = run(["sim", "describe", str(bad)], capsys)
    assert code == 2 and f"{bad}: root_port[0].width:" in err


def test_calibration_command_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["sim", "calibration"], capsys)
    assert code == 0 and out.startswith("| point | use |") and "Summary:" in out

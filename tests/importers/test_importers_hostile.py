"""Hostile inputs to `pcieprof import`: bounded work and one line with exit 2, within seconds.

Each test runs under a pytest-timeout deadline of 60 s (it was 5-20 s, which counts fixture set-up
too and tripped on a loaded 2-core machine); before the fix, one 200 kB line took minutes in format
detection and /dev/zero or a FIFO never returned, so a regression still fails.
"""

from __future__ import annotations

import os
import resource
import subprocess
import threading
import time
from pathlib import Path

import pytest

from builders.cli import cli, pcieprof_argv
from pcieprof.cli import main
from pcieprof.errors import BadInput
from pcieprof.importers import reading
from pcieprof.importers.formats import FORMATS, detect
from pcieprof.importers.formats import parse_text

#: Lines that made a backtracking pattern quadratic, or that look like a format's first token
#: repeated: every detector and every parser must finish on them quickly.
LONG_LINES = {
    "letters": "a" * 200_000,
    "spaces": "x" + " " * 200_000 + "y",
    "colons_and_digits": ":1" * 100_000,
    "nccl_words": "NCCL INFO " * 20_000,
    "fake_prefixes": "h:1:1 [0] " * 20_000,
    "brackets": "[0] " * 50_000,
    "gpu_headers": "GPU0 " * 40_000,
    "xml_attribute": '<system version="1"><cpu affinity="' + "f" * 200_000,
    "env_value": "h:1:1 [0] NCCL INFO NCCL_X set by environment to " + " " * 100_000 + "a",
    "bare_message_spaces": "NCCL INFO " + " " * 200_000 + "x",
    "ring_of_many": "NCCL INFO Channel 00/02 :" + " 1" * 100_000 + " x",
    "transport_via": "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via " + "P2P " * 50_000,
    "nccl_tests_row": "1024 256 float sum -1 " + "1.0 " * 50_000,
    "p2p_status_row": " GPU0" + "\tOK" * 50_000,
}


def error_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as e:
        main(["import", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


# Speed bounds here are on CPU time (of this thread, or of the child process): the work itself;
# wall-clock time also counts whatever else a loaded machine ran meanwhile. The pytest timeouts
# only end a hang.


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", sorted(LONG_LINES))
def test_detection_is_linear_on_one_long_line(kind: str) -> None:
    text = LONG_LINES[kind] + "\n"
    t0 = time.thread_time()
    detect(text)
    assert time.thread_time() - t0 < 1.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", sorted(LONG_LINES))
def test_every_parser_is_bounded_on_one_long_line(kind: str) -> None:
    text = LONG_LINES[kind] + "\n"
    for fmt in FORMATS:
        t0 = time.thread_time()
        try:
            parse_text(text, "long.txt", fmt)
        except BadInput:
            pass
        assert time.thread_time() - t0 < 1.0, fmt


@pytest.mark.timeout(60)
def test_long_line_file_is_refused_fast(tmp_path: Path, capsys) -> None:
    f = tmp_path / "long.txt"
    f.write_text("a" * 200_000 + "\n")
    assert error_line([str(f)], capsys).startswith(f"pcieprof: error: {f}: expected the output of")


@pytest.mark.timeout(60)
def test_xml_with_a_doctype_is_refused_fast(tmp_path: Path, capsys) -> None:
    f = tmp_path / "doctype.xml"
    f.write_text('<?xml version="1.0"?>\n<!DOCTYPE system>\n<system version="1"><cpu numaid="0" '
                 'affinity="' + "f" * 160_000 + '"/></system>\n')
    assert f"{f}: expected the output of one of" in error_line([str(f)], capsys)


@pytest.mark.timeout(60)
def test_line_over_the_cap_names_its_line(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(reading, "MAX_LINE_CHARS", 1000)
    f = tmp_path / "wide.txt"
    f.write_text("fine\nalso fine\n" + "b" * 1500 + "\n")
    line = error_line([str(f)], capsys)
    assert f"{f}:3: expected a line of tool output" in line and "1500 characters" in line


@pytest.mark.timeout(60)
def test_dev_zero(capsys) -> None:
    line = error_line(["/dev/zero"], capsys)
    assert line.startswith("pcieprof: error: /dev/zero: expected a text file (tool output), got "
                           "binary data")


@pytest.mark.timeout(60)
def test_fifo_without_a_writer(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(reading, "PIPE_TIMEOUT_S", 1.0)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    line = error_line([str(fifo)], capsys)
    assert time.monotonic() - t0 < 1.0 + 20  # its 1 s deadline; without one it never returns
    assert line.startswith(f"pcieprof: error: {fifo}: expected the input to end within 1 s "
                           "(got 0 bytes so far)")


@pytest.mark.timeout(60)
def test_empty_pipe(tmp_path: Path, capsys) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    stop = threading.Event()
    threading.Thread(target=_writer, args=(fifo, b"", 0, stop), daemon=True).start()
    assert error_line([str(fifo)], capsys).endswith(f"{fifo}: expected tool output, got an empty pipe")


def _writer(fifo: Path, data: bytes, hold_s: float, stop: threading.Event) -> None:
    with open(fifo, "wb", buffering=0) as fh:
        try:
            fh.write(data)
        except BrokenPipeError:
            return
        stop.wait(hold_s)


@pytest.mark.timeout(180)
def test_fifo_that_never_ends(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(reading, "PIPE_TIMEOUT_S", 1.0)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    stop = threading.Event()
    # the writer holds the pipe open 120 s: far past the 1 s deadline plus a loaded machine's
    # delays, so the time it took tells the deadline from the writer's end
    t = threading.Thread(target=_writer, args=(fifo, b"GPU0\tGPU1\n", 120, stop), daemon=True)
    t.start()
    try:
        t0 = time.monotonic()
        line = error_line([str(fifo)], capsys)
        assert time.monotonic() - t0 < 1.0 + 20
        assert f"{fifo}: expected the input to end within 1 s (got 10 bytes so far)" in line
    finally:
        stop.set()


@pytest.mark.timeout(60)
def test_fifo_that_floods(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(reading, "MAX_BYTES", 1 << 20)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    stop = threading.Event()
    t = threading.Thread(target=_writer, args=(fifo, b"x" * (4 << 20), 0, stop), daemon=True)
    t.start()
    line = error_line([str(fifo)], capsys)
    assert f"{fifo}: expected at most 1 MiB of tool output, got more" in line
    stop.set()


@pytest.mark.timeout(60)
def test_a_pipe_with_real_output_is_read(tmp_path: Path, samples: Path) -> None:
    # `pcieprof import <(cat topo.txt)`: a pipe that ends is read like a file.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    data = (samples / "tool-outputs/topo_m_5gpu_5060ti_5070_proxmox_host.txt").read_bytes()
    stop = threading.Event()
    t = threading.Thread(target=_writer, args=(fifo, data, 0, stop), daemon=True)
    t.start()
    time.sleep(0.2)  # the writer is connected, as a shell's process substitution is
    raw, text = reading.read_input(fifo)
    assert raw == data and "GPU4" in text


@pytest.mark.timeout(60)
def test_directory_and_oversized_file(tmp_path: Path, capsys, monkeypatch) -> None:
    assert error_line([str(tmp_path)], capsys).endswith(
        f"{tmp_path}: expected a file of tool output, got a directory")
    monkeypatch.setattr(reading, "MAX_BYTES", 1000)
    f = tmp_path / "big.txt"
    f.write_text("x" * 5000)
    assert f"{f}: expected at most 1000 bytes of tool output, got 5000 bytes" in error_line([str(f)], capsys)


#: The cases of issue 13 as a user types them, each in its own process under a wall-clock
#: deadline (before: 10k / 40k / 200k characters in one line took 2 / 16 / 461 s in detection;
#: /dev/zero read until memory ran out). {t} is the test's tmp dir.
PROCESS_CASES = {
    "line_10k": (["{t}/line10k.txt"], "{t}/line10k.txt: expected the output of one of"),
    "line_200k": (["{t}/line200k.txt"], "{t}/line200k.txt: expected the output of one of"),
    "xml_doctype_160k": (["{t}/doctype.xml"], "{t}/doctype.xml: expected the output of one of"),
    "dev_zero": (["/dev/zero"], "/dev/zero: expected a text file (tool output), got binary data"),
    "dev_urandom": (["/dev/urandom"], "/dev/urandom: expected a text file (tool output), got "
                    "binary data"),
    "endless_pipe": (["/dev/stdin"], "/dev/stdin: expected at most 64 MiB of tool output, got "
                     "more"),
    "directory": (["{t}"], "{t}: expected a file of tool output, got a directory"),
    "missing": (["{t}/nope.txt"], "{t}/nope.txt: cannot read (No such file or directory)"),
}


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's children waited for so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(PROCESS_CASES))
def test_as_a_user_runs_it(case: str, tmp_path: Path) -> None:
    (tmp_path / "line10k.txt").write_text("a" * 10_000 + "\n")
    (tmp_path / "line200k.txt").write_text("a" * 200_000 + "\n")
    (tmp_path / "doctype.xml").write_text('<?xml version="1.0"?>\n<!DOCTYPE system>\n<system '
                                          'version="1"><cpu affinity="' + "f" * 160_000
                                          + '"/></system>\n')
    args, expected = PROCESS_CASES[case]
    args = [a.format(t=tmp_path) for a in args]
    argv = ["import", *args, "-q", "-o", str(tmp_path / "out")]
    cpu0 = _children_cpu_s()
    if case == "endless_pipe":  # `yes | pcieprof import /dev/stdin`: text that never ends
        yes = subprocess.Popen(["yes", "GPU0 GPU1"], stdout=subprocess.PIPE)
        try:
            # the wall-clock timeout only ends a hang (a read that blocks costs no CPU)
            r = subprocess.run(pcieprof_argv(*argv), stdin=yes.stdout, capture_output=True,
                               text=True, timeout=120)
            took = _children_cpu_s() - cpu0  # before `yes` is waited for and counted
        finally:
            yes.kill()
            yes.wait()
    else:
        r = cli(*argv, process=True, timeout=120)
        took = _children_cpu_s() - cpu0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    assert lines[0].startswith("pcieprof: error: ") and expected.format(t=tmp_path) in lines[0]
    assert took < 10, f"{case}: {took:.1f} s of CPU"
    assert not (tmp_path / "out").exists()  # refused before a bundle is made

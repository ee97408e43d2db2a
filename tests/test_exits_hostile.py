"""Exit codes as the README documents them (issue 25 point 11): a full disk is exit 2 with one
line in every command that writes, and the bundle it cut short reads as partial; a report that
alone could not be written leaves a run whose data is all there at exit 0; click's usage errors
are one line; `--concurrency` is checked against the open-file limit before anything starts.

The disk fills for real: each command runs in a child process under a file size limit
(RLIMIT_FSIZE, SIGXFSZ ignored), where the kernel refuses the write that would pass it (EFBIG).
"""

from __future__ import annotations

import importlib.util
import json
import resource
import signal
import subprocess
from pathlib import Path
from typing import Callable

import pytest
from builders.bundles import make_bundle
from builders.cli import cli, pcieprof_argv

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "importers"


def _limits(fsize: int | None = None, nofile: int | None = None) -> Callable[[], None]:
    """A preexec_fn: no file may grow past `fsize` bytes; at most `nofile` open files."""
    def apply() -> None:
        if fsize is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    return apply


def _run(args: list[str], preexec: Callable[[], None]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(pcieprof_argv(*args), capture_output=True, text=True, timeout=300,
                          preexec_fn=preexec, stdin=subprocess.DEVNULL)


def _one_line_exit_2(r: subprocess.CompletedProcess[str], *words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.startswith("pcieprof: ")]
    assert len(lines) == 1 and "internal error" not in lines[0], r.stderr[-2000:]
    assert lines[0] == r.stderr.strip().splitlines()[-1]
    assert all(w in lines[0] for w in words), lines[0]


def _trace(tmp_path: Path) -> Path:
    spec = importlib.util.spec_from_file_location(
        "mst", ROOT / "benchmarks" / "make_synthetic_trace.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    info = mod.main(["--out", str(tmp_path / "tr"), "--ranks", "1", "--target-mb", "0.3",
                     "--layers", "2", "--gzip"])
    return Path(info[0]["path"])


@pytest.mark.parametrize("command", ["topology", "import", "attribute", "report", "serve-bench"])
def test_a_full_disk_is_exit_2_one_line_and_the_bundle_partial(tmp_path: Path,
                                                               command: str) -> None:
    out = tmp_path / "out"
    args = {
        "topology": ["topology", "--backend", "sim", "--quick", "--out", str(out)],
        "import": ["import", str(DATA / "nvbandwidth_8x4090_h2d_d2h.txt"), "--out", str(out)],
        "attribute": ["attribute", str(_trace(tmp_path)) if command == "attribute" else "",
                      "--out", str(out)],
        "report": ["report", str(make_bundle(tmp_path / "b").path) if command == "report"
                   else "", "-o", str(tmp_path / "r.html")],
        "serve-bench": ["serve-bench", "--model", "tiny-cpu", "--tp", "1", "--out", str(out),
                        "--num-requests", "2", "--warmup", "0", "--input-len", "8",
                        "--output-len", "4", "--concurrency", "1", "--decode-batches", "none",
                        "--no-profile", "--probe-tokens", "4"],
    }[command]
    r = _run(args, _limits(fsize=2500))  # a manifest fits; the first bigger file does not
    _one_line_exit_2(r, "File too large")
    if command != "report":
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["status"] == "partial", manifest.get("why")
        assert str(out) in r.stderr.strip().splitlines()[-1]  # the line names the bundle


def test_topology_whose_report_alone_failed_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = _run(["topology", "--backend", "sim", "--quick", "--out", str(out)],
             _limits(fsize=600_000))  # every data file fits; report.html (~1.8 MB) does not
    assert r.returncode == 0, r.stderr[-2000:]
    assert "report: cannot write" in r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest["parts"]["report"]["status"] == "failed"
    assert not (out / "report.html").exists()


@pytest.mark.parametrize("args, words", [
    (["topology", "--no-such-option"], "No such option"),
    (["topology", "--backend", "gpu"], "--backend"),
    (["no-such-command"], "No such command"),
    (["report"], "Missing argument"),
])
def test_usage_errors_are_one_line(args: list[str], words: str) -> None:
    r = cli(*args)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr
    assert r.stderr.startswith("pcieprof: error: ") and "--help" in r.stderr


@pytest.mark.parametrize("level", ["0", "none", "0,0"])
def test_concurrency_0_is_refused(tmp_path: Path, level: str) -> None:
    r = cli("serve-bench", "--model", "tiny-cpu", "--out", str(tmp_path / "b"),
            "--concurrency", level)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--concurrency" in r.stderr and not (tmp_path / "b").exists()


def test_concurrency_past_the_open_file_limit_is_refused_before_the_run(tmp_path: Path) -> None:
    out = tmp_path / "b"
    r = _run(["serve-bench", "--model", "tiny-cpu", "--out", str(out), "--concurrency",
              "1,25000"], _limits(nofile=1024))
    _one_line_exit_2(r, "--concurrency 25000", "open files")
    assert not out.exists()  # nothing was started


def test_a_bad_rdzv_endpoint_is_exit_2_before_any_bundle(tmp_path: Path) -> None:
    out = tmp_path / "b"
    r = cli("topology", "--backend", "cpu", "--nnodes", "2", "--node-rank", "1",
            "--rdzv-endpoint", "127.0.0.1:41303:5", "--out", str(out))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--rdzv-endpoint" in r.stderr and not out.exists()


def test_nccl_xml_nested_1000_deep_is_one_line_exit_2(tmp_path: Path) -> None:
    f = tmp_path / "topo.xml"
    f.write_text('<system version="1">' + "<pci busid='0000:01:00.0'>" * 1000
                 + "</pci>" * 1000 + "</system>\n")
    r = cli("import", str(f), "--out", str(tmp_path / "b"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert "nested at most" in r.stderr and "internal error" not in r.stderr


@pytest.mark.parametrize("kind", ["bz2", "xz", "zst"])
def test_a_trace_compressed_other_than_gzip_is_named_so(tmp_path: Path, kind: str) -> None:
    import bz2
    import lzma

    body = b'{"traceEvents": []}'
    data = {"bz2": bz2.compress(body), "xz": lzma.compress(body),
            "zst": b"\x28\xb5\x2f\xfd" + b"\x00" * 16}[kind]  # a zstd frame's magic (RFC 8878)
    f = tmp_path / f"rank0.trace.json.{kind}"
    f.write_bytes(data)
    r = cli("attribute", str(f), "--out", str(tmp_path / "b"), "-q")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    assert "gzipped" in r.stderr and "malformed" not in r.stderr, r.stderr

"""Hostile bundles and output paths: each is refused where it enters, with exit 2 and one line
naming the file (or path) and what was expected; never a traceback or an "internal error".

Before: `schema_version "one"`, `parts: null`, a non-numeric cell, a wrong-typed topology.json
and an --out under /proc, /sys, below a file or with a too long name ended as "internal error"
(exit 1); a CSV with a wrong header was read as "no rows". Also here: one file mode for every
file of a bundle, and `compare`'s warning about a bundle that is not `ok`.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest

from builders.cli import cli
from pcieprof.bundle import Bundle, writer
from pcieprof.errors import BadInput


@pytest.fixture(scope="module")
def sim_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real bundle: the quick simulated topology run, with its report."""
    out = tmp_path_factory.mktemp("sim") / "topo"
    r = cli("topology", "--backend", "sim", "--quick", "-q", "-o", str(out), process=True,
            timeout=120)  # a real process: the command installs signal handlers
    assert r.returncode == 0, r.stderr
    return out


def _copy(src: Path, tmp: Path, change: Callable[[Path], Any]) -> Path:
    d = tmp / "bad"
    shutil.copytree(src, d)
    change(d)
    return d


def _json(name: str, **kw: Any) -> Callable[[Path], None]:
    """Set top-level keys of one JSON file of the bundle."""
    def change(d: Path) -> None:
        doc = json.loads((d / name).read_text())
        doc.update(kw)
        (d / name).write_text(json.dumps(doc))
    return change


def _manifest(**kw: Any) -> Callable[[Path], None]:
    return _json("manifest.json", **kw)


def _text(name: str, text: str) -> Callable[[Path], None]:
    return lambda d: (d / name).write_text(text)


def _cell(name: str, column: str, value: str) -> Callable[[Path], None]:
    def change(d: Path) -> None:
        with (d / name).open() as f:
            rows = list(csv.DictReader(f))
        rows[0][column] = value
        with (d / name).open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return change


def _header(name: str, header: str) -> Callable[[Path], None]:
    def change(d: Path) -> None:
        lines = (d / name).read_text().splitlines()
        (d / name).write_text("\n".join([header, *lines[1:]]) + "\n")
    return change


def _topology(**kw: Any) -> Callable[[Path], None]:
    return _json("topology.json", **kw)


#: case -> (how the bundle is broken, the file named, what the line says was expected)
BROKEN: dict[str, tuple[Callable[[Path], Any], str, str]] = {
    "schema_version_word": (_manifest(schema_version="one"), "manifest.json",
                            "schema_version: expected an integer >= 0, got \"one\""),
    "schema_version_null": (_manifest(schema_version=None), "manifest.json",
                            "schema_version: expected an integer >= 0, got null"),
    "schema_version_newer": (_manifest(schema_version=99), "", "bundle schema 99 is newer"),
    "parts_null": (_manifest(parts=None), "manifest.json", "parts: expected an object, got null"),
    "parts_list": (_manifest(parts=[1]), "manifest.json", "parts: expected an object, got [1]"),
    "part_string": (_manifest(parts={"p2p": "ok"}), "manifest.json",
                    "parts.p2p: expected an object, got \"ok\""),
    "part_status_number": (_manifest(parts={"p2p": {"status": 1}}), "manifest.json",
                           "parts.p2p.status: expected a string or null, got 1"),
    "status_number": (_manifest(status=5), "manifest.json",
                      "status: expected a string or null, got 5"),
    "files_string": (_manifest(files="p2p.csv"), "manifest.json", "files: expected a list"),
    "nodes_garbage": (_manifest(nodes={"nnodes": "two"}), "manifest.json",
                      "nodes: nnodes: expected an integer, got \"two\""),
    "manifest_list": (_text("manifest.json", "[1, 2]"), "manifest.json",
                      "not a pcieprof manifest"),
    "manifest_truncated": (_text("manifest.json", '{"schema_version": 3, "par'),
                           "manifest.json", "unreadable manifest"),
    "allreduce_word_cell": (_cell("allreduce.csv", "time_us", "fast"), "allreduce.csv",
                            "row 1, column time_us: expected a number, got 'fast'"),
    "allreduce_size_word": (_cell("allreduce.csv", "size_bytes", "12KiB"), "allreduce.csv",
                            "row 1, column size_bytes: expected a number, got '12KiB'"),
    "p2p_word_cell": (_cell("p2p.csv", "bandwidth_gbps", "n/a"), "p2p.csv",
                      "row 1, column bandwidth_gbps: expected a number, got 'n/a'"),
    "concurrent_word_cell": (_cell("concurrent.csv", "flow", "first"), "concurrent.csv",
                             "row 1, column flow: expected a number, got 'first'"),
    "allreduce_wrong_header": (_header("allreduce.csv", "a,b,c"), "allreduce.csv",
                               "expected a header with the columns nranks, size_bytes, time_us, "
                               "got 'a,b,c'"),
    "p2p_header_lacks_dst": (_header("p2p.csv", "backend,src,path,size_bytes"), "p2p.csv",
                             "(no dst)"),
    "env_cell_not_json": (_cell("allreduce.csv", "env", "NCCL_ALGO=ring"), "allreduce.csv",
                          "env cell is not a JSON object"),
    "topology_list": (_text("topology.json", "[1]"), "topology.json",
                      "expected a JSON object, got a list"),
    "topology_truncated": (_text("topology.json", '{"gpus": ['), "topology.json",
                           "not valid JSON"),
    "topology_gpus_string": (_topology(gpus="x"), "topology.json",
                             "gpus: expected a list, got a string"),
    "topology_gpu_number": (_topology(gpus=[1]), "topology.json",
                            "gpus: expected an object, got a number"),
    "topology_gpu_index_word": (_topology(gpus=[{"index": "zero"}]), "topology.json",
                                "gpus: index: expected an integer, got 'zero'"),
    "topology_memory_list": (_topology(gpus=[{"index": 0, "memory_bytes": [1]}]),
                             "topology.json", "gpus: memory_bytes: expected an integer, got a list"),
    "topology_newer_format": (_topology(format="pcieprof.topology/99"), "topology.json",
                              "is newer than this pcieprof reads"),
    "nccl_choices_list": (_text("nccl_choices.json", "[]"), "nccl_choices.json",
                          "not a JSON object"),
    "nccl_case_null_rank": (_text("nccl_choices.json", '{"default": {"ranks": [0, null]}}'),
                            "nccl_choices.json", "default: ranks: expected an integer, got null"),
    "recommendations_inferred_no_levels": (
        _text("recommendations.json", json.dumps({"format": "pcieprof.recommendations/1",
                                                  "inferred": {"metric": "bandwidth_gbps",
                                                               "gpus": [0, 1]}})),
        "recommendations.json", "inferred: levels: expected a list"),
    "recommendations_inferred_bad_group": (
        _text("recommendations.json", json.dumps({"inferred": {
            "metric": "bandwidth_gbps", "gpus": [0, 1],
            "levels": [{"name": "switch", "groups": [[0, "one"]], "value": 50.0}]}})),
        "recommendations.json", "inferred: levels[0].groups: expected lists of GPU indices"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_bundle_is_refused_on_open(case: str, sim_bundle: Path, tmp_path: Path) -> None:
    change, name, expected = BROKEN[case]
    d = _copy(sim_bundle, tmp_path, change)
    with pytest.raises(BadInput) as e:
        Bundle.open(d).check()
    line = e.value.one_line()
    assert line.startswith(str(d / name)) and expected in line, line


def one_error(argv: list[str]) -> str:
    """Run the CLI in-process; the one stderr line of a refusal (exit 2)."""
    r = cli(*argv, "-q")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    return lines[0]


def _commands(bad: Path, good: Path, tmp: Path) -> dict[str, list[str]]:
    return {
        "report": ["report", str(bad), "-o", str(tmp / "r.html")],
        "recommend": ["recommend", str(bad), "-o", str(tmp / "rec")],
        "compare": ["compare", str(good), str(bad)],
        "attribute": ["attribute", "--model", "glm5-nvfp4", "--topology", str(bad),
                      "-o", str(tmp / "attr")],
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ["report", "recommend", "compare", "attribute"])
@pytest.mark.parametrize("case", ["schema_version_word", "parts_null", "allreduce_word_cell",
                                  "allreduce_wrong_header", "topology_gpus_string"])
def test_every_reader_of_bundles_exits_2_with_one_line(case: str, command: str, sim_bundle: Path,
                                                       tmp_path: Path) -> None:
    change, name, expected = BROKEN[case]
    bad = _copy(sim_bundle, tmp_path, change)
    line = one_error(_commands(bad, sim_bundle, tmp_path)[command])
    assert line.startswith(f"pcieprof: error: {bad / name}") and expected in line, line
    # refused before any output: recommend -o made no copy, attribute no bundle
    assert not (tmp_path / "rec").exists() and not (tmp_path / "attr").exists()
    assert not (tmp_path / "r.html").exists()


def _sys_dir() -> Path:
    if not Path("/sys/kernel").is_dir():
        pytest.skip("no /sys here")
    return Path("/sys/pcieprof-hostile-test")


#: case -> (argv after the command word, what the line says); {t} is the test's tmp dir, {b}
#: the sim bundle.
OUT_PATHS: dict[str, tuple[list[str], str]] = {
    "topology_out_in_proc": (["topology", "--backend", "sim", "--quick", "-o", "/proc/pcieprof-x"],
                             "/proc/pcieprof-x: cannot create the output directory"),
    "topology_out_below_a_file": (["topology", "--backend", "sim", "--quick", "-o",
                                   "{t}/afile/sub"],
                                  "{t}/afile/sub: cannot create the output directory "
                                  "({t}/afile is a file)"),
    "topology_out_is_a_file": (["topology", "--backend", "sim", "--quick", "-o", "{t}/afile"],
                               "{t}/afile: expected a directory for the output, got an "
                               "existing file"),
    "topology_out_name_too_long": (["topology", "--backend", "sim", "--quick", "-o",
                                    "{t}/" + "n" * 300],
                                   "cannot create the output directory (File name too long)"),
    "import_out_below_a_file": (["import", "{t}/nvbandwidth.txt", "-o", "{t}/afile/x"],
                                "({t}/afile is a file)"),
    "attribute_out_in_proc": (["attribute", "--model", "glm5-nvfp4", "--topology", "{b}", "-o",
                               "/proc/pcieprof-x"],
                              "/proc/pcieprof-x: cannot create the output directory"),
    "recommend_out_in_proc": (["recommend", "{b}", "-o", "/proc/pcieprof-x"],
                              "/proc/pcieprof-x: cannot create the output directory"),
    "demo_out_below_a_file": (["demo", "--no-serve", "-o", "{t}/afile/demo"],
                              "({t}/afile is a file)"),
    "report_out_a_directory": (["report", "{b}", "-o", "{t}"],
                               "{t}: expected a file name to write, got a directory"),
    "report_out_in_proc": (["report", "{b}", "-o", "/proc/pcieprof-x.html"],
                           "/proc/pcieprof-x.html: cannot write the output file"),
    "report_out_below_a_file": (["report", "{b}", "-o", "{t}/afile/r.html"],
                                "({t}/afile is a file)"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(OUT_PATHS))
def test_an_unwritable_out_is_one_line(case: str, sim_bundle: Path, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    shutil.copy(Path(__file__).parents[1] / "data" / "importers" / "nvbandwidth_2x2080ti_waived.txt",
                tmp_path / "nvbandwidth.txt")
    argv, expected = OUT_PATHS[case]
    fill = {"t": str(tmp_path), "b": str(sim_bundle)}
    line = one_error([a.format(**fill) for a in argv])
    assert line.startswith("pcieprof: error: ") and expected.format(**fill) in line, line


@pytest.mark.timeout(60)
def test_an_out_under_sys_is_one_line() -> None:
    target = _sys_dir()
    line = one_error(["topology", "--backend", "sim", "--quick", "-o", str(target)])
    assert f"{target}: cannot create the output directory" in line


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mode & 0o777
            for p in root.rglob("*") if p.is_file()}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_every_file_of_a_bundle_has_one_mode(umask: int, tmp_path: Path) -> None:
    """0666 minus the umask, as `open()` makes a file: before, report.html, manifest.json and
    topology.json were 0600 (temporary files) and the CSVs 0644."""
    old = os.umask(umask)
    try:
        topo, imp = tmp_path / "topo", tmp_path / "imp"
        for argv in (["topology", "--backend", "sim", "--quick", "-q", "-o", str(topo)],
                     ["import", str(Path(__file__).parents[1] / "data" / "importers"
                                    / "nvbandwidth_2x2080ti_waived.txt"), "-q", "-o", str(imp)],
                     ["report", str(topo), str(imp), "-q", "-o", str(tmp_path / "both.html")]):
            r = cli(*argv, process=True, timeout=120)  # the child inherits the umask
            assert r.returncode == 0, r.stderr
    finally:
        os.umask(old)
    modes = {**{f"topo/{k}": v for k, v in _modes(topo).items()},
             **{f"imp/{k}": v for k, v in _modes(imp).items()},
             "both.html": _modes(tmp_path)["both.html"]}
    assert {"topo/report.html", "topo/manifest.json", "topo/topology.json", "topo/p2p.csv",
            "imp/manifest.json", "both.html"} <= set(modes)
    assert any(k.startswith("imp/imported/") for k in modes)
    assert {k: v for k, v in modes.items() if v != 0o666 & ~umask} == {}


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.mark.timeout(60)
def test_compare_warns_once_per_bundle_that_is_not_ok(sim_bundle: Path, tmp_path: Path) -> None:
    partial = tmp_path / "partial"
    shutil.copytree(sim_bundle, partial)
    _manifest(status="partial", why="did not finish")(partial)
    failed = tmp_path / "failed"
    shutil.copytree(sim_bundle, failed)
    m = json.loads((failed / "manifest.json").read_text())
    m["status"] = "failed"
    m["parts"]["allreduce"].update(status="failed", why="all sizes hung")
    (failed / "manifest.json").write_text(json.dumps(m))
    r = cli("compare", str(partial), str(failed), "-q")
    assert r.returncode == 0, r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert err == [
        f"warning: A {partial}: bundle partial (did not finish); its metrics may be missing or "
        "incomplete",
        f"warning: B {failed}: bundle failed (parts not ok: allreduce failed); its metrics may "
        "be missing or incomplete"]
    # a bundle whose writer died (SIGKILL) while a part was running reads as interrupted
    dead = tmp_path / "dead"
    shutil.copytree(sim_bundle, dead)
    m = json.loads((dead / "manifest.json").read_text())
    m.update(status="partial", end_time=None,
             writer={**writer.record(), "pid": _dead_pid(), "host": socket.gethostname()})
    m["parts"]["allreduce"]["status"] = "running"
    (dead / "manifest.json").write_text(json.dumps(m))
    r = cli("compare", str(sim_bundle), str(dead), "-q")
    assert r.returncode == 0, r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith(f"warning: B {dead}: bundle interrupted ("), err
    assert "left running: allreduce" in err[0]


@pytest.mark.timeout(60)
def test_null_where_a_field_has_a_default_reads_as_absent(sim_bundle: Path, tmp_path: Path
                                                         ) -> None:
    """Before: `gpus`, `pairs`, `iommu` or `virtualization` null in topology.json made the
    report an internal error; now the field reads as not known and the report is written."""
    d = _copy(sim_bundle, tmp_path, _topology(gpus=None, pairs=None, iommu=None,
                                              virtualization=None))
    r = cli("report", str(d), "-q", "-o", str(tmp_path / "r.html"))
    assert r.returncode == 0, r.stderr
    assert "internal error" not in r.stderr and (tmp_path / "r.html").stat().st_size > 0

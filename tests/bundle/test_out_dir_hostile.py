"""An --out as a careless user or a second writer would have it (issue 25 points 4 and 5):
`--force` replaces only a pcieprof bundle and only its own files, never an input, never through a
symbolic link; two writers on one --out cannot both succeed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from builders.bundles import make_bundle
from builders.cli import cli

from pcieprof.bundle import Bundle

DATA = Path(__file__).parent.parent / "data" / "importers"


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def _one_line_exit_2(r: subprocess.CompletedProcess[str], words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr


def _user_files(d: Path) -> None:
    """What a user keeps in a directory: a document and a git repository."""
    (d / "thesis.tex").write_text("\\documentclass{article}\n")
    (d / ".git" / "objects").mkdir(parents=True)
    (d / ".git" / "HEAD").write_text("ref: refs/heads/main\n")


# -- an --out that holds an input ---------------------------------------------------------------


def test_attribute_does_not_replace_its_own_traces(tmp_path: Path) -> None:
    run1 = tmp_path / "run1"
    make_bundle(run1)
    (run1 / "traces").mkdir()
    trace = run1 / "traces" / "rank0.trace.json"
    trace.write_text('{"traceEvents": []}')
    before = _files(run1)
    r = cli("attribute", str(run1 / "traces"), "--out", str(run1), "--force")
    _one_line_exit_2(r, "holds the input")
    assert _files(run1) == before


def test_recommend_does_not_replace_the_bundle_it_copies(tmp_path: Path) -> None:
    run4 = tmp_path / "run4"
    run4.mkdir()
    make_bundle(run4 / "topo")
    before = _files(run4)
    r = cli("recommend", str(run4 / "topo"), "--out", str(run4), "--force", "--no-layouts")
    _one_line_exit_2(r, "holds the input")
    assert _files(run4) == before


def test_import_does_not_replace_the_files_it_imports(tmp_path: Path) -> None:
    d = tmp_path / "logs"
    d.mkdir()
    (d / "nvbandwidth.txt").write_bytes((DATA / "nvbandwidth_2x2080ti_waived.txt").read_bytes())
    _user_files(d)
    before = _files(d)
    r = cli("import", str(d / "nvbandwidth.txt"), "--out", str(d), "--force")
    _one_line_exit_2(r, "holds the input")
    assert _files(d) == before


# -- --force: a bundle's own files only -----------------------------------------------------------


def test_force_refuses_a_directory_that_is_not_a_bundle(tmp_path: Path) -> None:
    d = tmp_path / "thesis"
    d.mkdir()
    _user_files(d)
    before = _files(d)
    r = cli("recommend", str(make_bundle(tmp_path / "b").path), "--out", str(d), "--force",
            "--no-layouts")
    _one_line_exit_2(r, "not a pcieprof bundle")
    assert _files(d) == before


def test_force_keeps_the_users_files_beside_a_bundle(tmp_path: Path) -> None:
    src = make_bundle(tmp_path / "src")
    out = tmp_path / "out"
    assert cli("recommend", str(src.path), "--out", str(out), "--no-layouts").returncode == 0
    _user_files(out)
    (out / "tune" / "my-notes.txt").write_text("mine")  # inside a bundle's own directory
    mine = {k: v for k, v in _files(out).items() if "thesis" in k or ".git" in k or "my-" in k}
    r = cli("recommend", str(src.path), "--out", str(out), "--force", "--no-layouts")
    assert r.returncode == 0, r.stderr
    assert {k: v for k, v in _files(out).items() if k in mine} == mine
    assert Bundle.open(out).manifest.status == "ok"


def test_force_never_deletes_through_a_symbolic_link(tmp_path: Path) -> None:
    real = make_bundle(tmp_path / "real").path
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "server-0.log").write_text("not pcieprof's to delete")
    (real / "serve").symlink_to(elsewhere, target_is_directory=True)  # a link inside
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)  # --out itself a link
    before = _files(real)
    src = make_bundle(tmp_path / "src").path
    r = cli("recommend", str(src), "--out", str(link), "--force", "--no-layouts")
    _one_line_exit_2(r, "symbolic link")
    assert _files(real) == before
    r = cli("recommend", str(src), "--out", str(real), "--force", "--no-layouts")
    assert r.returncode == 0, r.stderr
    assert (elsewhere / "server-0.log").read_text() == "not pcieprof's to delete"


def test_a_manifest_naming_files_outside_is_not_followed(tmp_path: Path) -> None:
    b = make_bundle(tmp_path / "b")
    victim = tmp_path / "victim.csv"
    victim.write_text("precious")
    m = json.loads((b.path / "manifest.json").read_text())
    m["files"] += ["../victim.csv", str(victim)]
    (b.path / "manifest.json").write_text(json.dumps(m))
    r = cli("recommend", str(make_bundle(tmp_path / "src").path), "--out", str(b.path),
            "--force", "--no-layouts")
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "precious"


# -- two writers ---------------------------------------------------------------------------------


_HOLDER = """
import sys
from pathlib import Path
from pcieprof.bundle import Bundle
b = Bundle.create(Path(sys.argv[1]), command="topology", source="measured", backend="cpu")
b.append_rows("p2p", [{"src": 0, "dst": 1, "bandwidth_gbps": 11.0}])
b.set_part("p2p", "ok")
Path(sys.argv[2]).write_text("writing")
sys.stdin.read()  # until the test closes it
b.finish()
"""


def test_a_second_writer_on_one_out_is_refused(tmp_path: Path) -> None:
    out, ready = tmp_path / "out", tmp_path / "ready"
    first = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out), str(ready)],
                             stdin=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), "the first writer never started"
        src = make_bundle(tmp_path / "src").path
        for force in ([], ["--force"]):
            r = cli("recommend", str(src), "--out", str(out), *force, "--no-layouts")
            _one_line_exit_2(r, "another pcieprof is writing")
        assert first.stdin is not None
        first.stdin.close()
        assert first.wait(timeout=60) == 0
    finally:
        if first.poll() is None:
            first.kill()
    b = Bundle.open(out)  # the first writer's bundle, alone
    assert b.manifest.status == "ok" and b.manifest.command == "topology"
    assert len(b.read_table("p2p")) == 1
    # once it has ended, --force replaces it
    r = cli("recommend", str(src), "--out", str(out), "--force", "--no-layouts")
    assert r.returncode == 0, r.stderr

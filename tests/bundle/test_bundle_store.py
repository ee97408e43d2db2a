from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pcieprof.bundle import Bundle
from pcieprof.bundle.manifest import Manifest
from pcieprof.errors import BadInput
from pcieprof.schema import SCHEMA_VERSION


def test_create_append_read_roundtrip(tmp_path: Path) -> None:
    b = Bundle.create(tmp_path / "b", command="topology", source="measured", backend="cpu")
    assert b.manifest.status == "partial"  # until finish(): a killed run reads as partial
    b.set_part("p2p", "running")
    b.append_rows("p2p", [{"backend": "cpu", "src": 0, "dst": 1, "path": "p2p",
                           "direction": "uni", "size_bytes": 1024, "bandwidth_gbps": 1.5}])
    b.append_rows("p2p", [{"backend": "cpu", "src": 1, "dst": 0, "path": "host_staged",
                           "direction": "uni", "size_bytes": 1024, "bandwidth_gbps": float("nan"),
                           "status": "error", "detail": "data mismatch"}])
    df = Bundle.open(b.path).read_table("p2p")
    assert list(df["src"]) == [0, 1]
    assert df.loc[0, "bandwidth_gbps"] == 1.5
    assert math.isnan(df.loc[1, "bandwidth_gbps"])
    assert df.loc[1, "detail"] == "data mismatch"
    b.set_part("p2p", "ok")
    assert b.finish() == "ok"
    assert json.loads((b.path / "manifest.json").read_text())["status"] == "ok"


def test_unfinished_part_makes_bundle_partial(tmp_path: Path) -> None:
    b = Bundle.create(tmp_path / "b", command="topology", source="measured", backend="cpu")
    b.set_part("p2p", "ok")
    b.set_part("allreduce", "running")
    assert b.finish() == "partial"
    assert Bundle.open(b.path).part("allreduce").status == "partial"


def test_unknown_column_is_rejected(tmp_path: Path) -> None:
    b = Bundle.create(tmp_path / "b", command="t", source="measured", backend="cpu")
    with pytest.raises(ValueError, match="no column"):
        b.append_rows("p2p", [{"bogus": 1}])


def test_non_empty_dir_needs_force(tmp_path: Path) -> None:
    old = Bundle.create(tmp_path / "x", command="t", source="measured", backend="cpu")
    old.append_rows("p2p", [{"src": 0, "dst": 1}])
    old.finish()
    (tmp_path / "x" / "f").write_text("keep?")
    with pytest.raises(BadInput, match="not empty"):
        Bundle.create(tmp_path / "x", command="t", source="measured", backend="cpu")
    Bundle.create(tmp_path / "x", command="t", source="measured", backend="cpu", force=True)
    # the bundle's own files are replaced; a file it did not write stays
    assert (tmp_path / "x" / "f").read_text() == "keep?"
    assert not (tmp_path / "x" / "p2p.csv").exists()


def test_old_schema_gets_defaults(tmp_path: Path) -> None:
    d = tmp_path / "old"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"schema_version": 0, "parts": {"p2p": {"status": "ok"}}}))
    (d / "p2p.csv").write_text("src,dst,path,direction,size_bytes,bandwidth_gbps,latency_us,iters,status\n"
                               "0,1,p2p,uni,1048576,50.0,,10,ok\n")
    b = Bundle.open(d)
    assert b.manifest.parts["p2p"].source == "measured"
    df = b.read_table("p2p")
    assert df.loc[0, "bandwidth_gbps"] == 50.0
    assert df.loc[0, "backend"] == ""  # filled default
    assert "trials" in df.columns


#: Every bundle committed under tests/ (schemas 1 to 3), by its manifest.
COMMITTED = sorted(Path(__file__).parents[1].glob("**/manifest.json"))


@pytest.mark.parametrize("mpath", COMMITTED, ids=lambda p: str(p.parent.relative_to(
    Path(__file__).parents[1])))
def test_committed_manifests_read_and_write_back_what_they_hold(mpath: Path) -> None:
    """The typed manifest keeps every key and value of an older bundle (no upgrade loses or
    changes one; what it adds are the keys the file lacked), and reads its own output again."""
    raw = json.loads(mpath.read_text())
    m = Manifest.from_json(raw, str(mpath))
    out = m.to_json()
    assert {k: v for k, v in out.items() if k in raw} == raw
    assert Manifest.from_json(json.loads(json.dumps(out))) == m


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "new"
    d.mkdir()
    (d / "manifest.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(BadInput, match="newer"):
        Bundle.open(d)


def test_truncated_last_row_is_dropped(tmp_path: Path) -> None:
    b = Bundle.create(tmp_path / "b", command="t", source="measured", backend="cpu")
    b.append_rows("allreduce", [{"variant": "default", "nranks": 2, "size_bytes": 8, "time_us": 3.0}])
    with (b.path / "allreduce.csv").open("a") as f:
        f.write("cpu,default,{},2,\"0,1\",16,float32,4.0")  # a row cut off mid-write, no newline
    df = Bundle.open(b.path).read_table("allreduce")
    assert df.loc[0, "time_us"] == 3.0

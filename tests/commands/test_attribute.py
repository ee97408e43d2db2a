"""`pcieprof attribute --model ... --topology ...`: the model table from the command line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
from builders.cli import cli

from pcieprof.bundle import Bundle
from pcieprof.schema import busbw_factor_allreduce

DATA = Path(__file__).resolve().parents[1] / "data" / "comm_model_rtx6kpro_8gpu"


def _topology(path: Path) -> Path:
    b = Bundle.create(path, command="import", source="imported", backend="imported")
    pts = pd.read_csv(DATA / "allreduce_points.csv")
    rows = []
    for _, r in pts.iterrows():
        t = r["time_us"] if not pd.isna(r["time_us"]) else \
            r["size_bytes"] / (r["busbw_gbps"] / busbw_factor_allreduce(8) * 1e3)
        rows.append({"backend": "imported", "variant": "default", "nranks": 8,
                     "size_bytes": int(r["size_bytes"]), "dtype": "bf16", "time_us": float(t), "status": "ok"})
    b.append_rows("allreduce", rows)
    b.set_part("allreduce", "ok")
    b.finish()
    return path


def test_model_table_from_cli(tmp_path: Path) -> None:
    topo = _topology(tmp_path / "topo")
    serve = Bundle.create(tmp_path / "serve", command="serve-bench", source="imported", backend="imported")
    shutil.copy(DATA / "decode_curve_public.csv", serve.file("serve/decode_curve.csv"))
    out = tmp_path / "out"
    r = cli("attribute", "--model", "glm5-nvfp4", "--topology", str(topo), "--serve",
            str(serve.path), "--batches", "1,8,64", "--out", str(out), "-q")
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert "glm5-nvfp4 TP8" in text and "158" in text
    doc = json.loads((out / "comm_model.json").read_text())
    rows = {r["batch"]: r for r in doc["table"]}
    assert rows[1]["measured_step_ms"] == 19.4
    assert 10 < rows[1]["predicted_comm_share_pct"] < 40  # a few ms of the ~19 ms step
    assert rows[64]["predicted_comm_ms"] > rows[1]["predicted_comm_ms"]
    assert (out / "attribution" / "comm_model.csv").is_file()
    man = json.loads((out / "manifest.json").read_text())
    assert man["parts"]["comm_model"]["source"] == "imported"
    assert man["model"]["name"] == "glm5-nvfp4" and man["model"]["ref"] == "glm5-nvfp4"


def test_cli_refuses_half_a_model_request(tmp_path: Path) -> None:
    r = cli("attribute", "--model", "glm5-nvfp4", "--out", str(tmp_path / "o"))
    assert r.returncode == 2
    assert "--model and --topology go together" in r.stderr
    r = cli("attribute", "--out", str(tmp_path / "o2"))
    assert r.returncode == 2

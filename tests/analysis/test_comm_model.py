"""The analytic decode-step communication model: counts from the model card and layout, prices
from an allreduce.csv (here: public 8-GPU RTX PRO 6000 reference points, imported)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from pcieprof.analysis.comm_model import (ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, P2P, Layout, Pricer,
                                          comparison_table, count_collectives, predict_step_comm)
from pcieprof.bundle import Bundle
from pcieprof.bundle.attribution import Attribution
from pcieprof.cards import load_card
from pcieprof.errors import BadInput
from pcieprof.schema import busbw_factor_allreduce

DATA = Path(__file__).resolve().parents[1] / "data" / "comm_model_rtx6kpro_8gpu"


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    b = Bundle.create(tmp_path_factory.mktemp("imp") / "b", command="import", source="imported",
                      backend="imported")
    pts = pd.read_csv(DATA / "allreduce_points.csv")
    rows = []
    for _, r in pts.iterrows():
        t = r["time_us"]
        if pd.isna(t):  # only busbw published: time from the nccl-tests formulas
            t = r["size_bytes"] / (r["busbw_gbps"] / busbw_factor_allreduce(8) * 1e3)
        rows.append({"backend": "imported", "variant": "default", "nranks": 8, "ranks": "0,1,2,3,4,5,6,7",
                     "size_bytes": int(r["size_bytes"]), "dtype": "bf16", "time_us": float(t),
                     "busbw_gbps": r["busbw_gbps"], "status": "ok"})
    b.append_rows("allreduce", rows)
    b.set_part("allreduce", "ok", source="imported", backend="imported")
    return b


def _count(cs, op=None, where=None):
    return sum(c.count for c in cs if (op is None or c.op == op) and (where is None or where in c.where))


def test_glm5_tp8_batch1_counts() -> None:
    card = load_card("glm5-nvfp4")
    cs = count_collectives(card, Layout(tp=8), 1)
    ar = [c for c in cs if c.op == ALL_REDUCE]
    # 78 layers x 2 (attention, MLP/MoE) + the embedding: "about 156" of 12 KiB each
    assert _count(ar) == 2 * 78 + 1
    assert {c.size_bytes for c in ar} == {6144 * 2}
    assert _count(cs, ALL_GATHER) == 1
    assert [c for c in cs if c.op == ALL_GATHER][0].size_bytes == 154880 * 2
    # message scales with batch
    assert {c.size_bytes for c in count_collectives(card, Layout(tp=8), 16) if c.op == ALL_REDUCE} == {16 * 12288}


def test_layouts_change_the_collectives() -> None:
    card = load_card("glm5-nvfp4")
    ep = count_collectives(card, Layout(tp=8, ep=8, moe_a2a="deepep"), 4)
    assert _count(ep, ALL_TO_ALL) == 2 * 75
    assert _count(ep, ALL_REDUCE, "moe") == 0 and _count(ep, ALL_REDUCE, "mlp") == 3
    pp = count_collectives(card, Layout(tp=4, pp=2), 1)
    assert _count(pp, P2P) == 1 and {c.group_size for c in pp if c.op == ALL_REDUCE} == {4}
    dpa = count_collectives(card, Layout(tp=8, dp_attention=True), 8)
    assert _count(dpa, ALL_REDUCE, "dp gather") == 78 and _count(dpa, ALL_REDUCE, "attn TP") == 0
    mtp = count_collectives(card, Layout(tp=8, speculative=True, spec_steps=3, draft_tokens=4), 2)
    verify = [c for c in mtp if c.phase == "verify" and c.op == ALL_REDUCE]
    assert {c.size_bytes for c in verify} == {2 * 4 * 12288}
    assert _count([c for c in mtp if c.phase == "draft"], ALL_REDUCE) == 3 * 3
    tp1 = count_collectives(card, Layout(tp=1), 1)
    assert tp1 == []
    with pytest.raises(BadInput):
        Layout(tp=8, ep=16)
    with pytest.raises(BadInput):
        count_collectives(card, Layout(tp=8), 0)


def test_pricing_interpolates_log_log(imported: Bundle) -> None:
    p = Pricer(imported)
    assert p.allreduce_us(8, 65536)[0] == pytest.approx(18.13)
    assert p.allreduce_us(8, 1024)[0] == pytest.approx(23.93)  # latency floor below 4 KB
    mid = p.allreduce_us(8, 2 ** 19)[0]  # between 256 KB (25.09) and 1 MB (81.08), log-log
    assert mid == pytest.approx((25.09 * 81.08) ** 0.5, rel=1e-6)
    t, n = p.allreduce_us(4, 65536)  # no 4-rank rows: nearest curve, and a note says so
    assert n == 8 and p.notes


def test_glm5_tp8_batch1_is_milliseconds(imported: Bundle) -> None:
    card = load_card("glm5-nvfp4")
    pred = predict_step_comm(card, Layout(tp=8), 1, Pricer(imported))
    # 157 all-reduces of 12 KiB at ~20 us on the public curve: a few ms of a ~20 ms step
    assert 2.5e3 < pred["total_us"] < 8e3
    assert pred["by_op"][ALL_REDUCE] == pytest.approx(157 * pred["collectives"][0]["time_us_each"], rel=1e-9)
    assert pred["source"] == "imported"
    big = predict_step_comm(card, Layout(tp=8), 64, Pricer(imported))
    assert big["total_us"] > pred["total_us"]


def test_comparison_table_with_measurements(imported: Bundle, tmp_path: Path) -> None:
    card = load_card("glm5-nvfp4")
    serve = Bundle.create(tmp_path / "s", command="serve-bench", source="measured", backend="cuda")
    serve.append_rows("decode_curve", [{"batch_size": 1, "step_time_ms": 19.4},
                                       {"batch_size": 8, "step_time_ms": 28.9}])
    attribution = Attribution.from_json({"steps": [
        {"rank": r, "kind": "DECODE", "bs": 1, "comm_us": 4000.0 + r, "exposed_comm_us": 3500.0,
         "span_us": 19000.0} for r in range(8)]})
    rows = comparison_table(card, Layout(tp=8), [1, 8], Pricer(imported), serve, attribution)
    r1, r8 = rows
    assert r1["measured_step_ms"] == 19.4 and r1["measured_step_from"] == "decode_curve.csv"
    assert r1["trace_comm_ms"] == pytest.approx(4.0035)
    assert r1["disagreement_pct"] == pytest.approx(100 * (4.0035 - r1["predicted_comm_ms"]) / r1["predicted_comm_ms"])
    assert 0 < r1["compute_share_pct"] < 100
    assert r8["trace_comm_ms"] is None and r8["disagreement_pct"] is None

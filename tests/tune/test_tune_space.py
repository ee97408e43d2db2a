"""The launch search space read from the cards: value order by evidence, disagreements kept,
SGLang's refusals, the installed parser's choices, borrowed searches."""

from __future__ import annotations

import pytest

from pcieprof.cards import load_card
from pcieprof.errors import BadInput
from pcieprof.tune.space import EVIDENCE, SearchSpace

GLM = load_card("glm5-nvfp4")


def _space(**kw) -> SearchSpace:
    return SearchSpace.from_card(GLM.name, GLM.search,
                                 load_other=lambda n: load_card(n).search, **kw)


def test_field_report_outranks_general_statements_on_sm120() -> None:
    sp = _space()
    assert sp.arch == "sm120"
    decode = sp.ranked("dsa_decode_backend")
    top = decode[0]
    assert top.value == "trtllm" and top.verdict == "works"
    # both sides are kept and the order is explained
    kinds = {(c.says, c.evidence) for c in top.claims}
    assert ("works", "own") in kinds and ("fails", "report") in kinds
    assert "own evidence outranks report" in top.why and "S8" in top.why
    assert top.short().startswith("works (own F1; outranks report S8")
    # what the user's own launches died of comes last, after values only reports blame
    order = [r.value for r in decode]
    assert order.index("fa3") < order.index("flashmla_kv")
    att = {r.value: r for r in sp.ranked("attention_backend")}
    assert att["flashinfer"].verdict == "fails" and "outranks report" in att["flashinfer"].why
    assert sp.ranked("attention_backend")[0].value == "dsa"  # SGLang's own default for DSA
    first, _ = sp.first()
    assert first["dsa_decode_backend"] == "trtllm" and first["attention_backend"] == "dsa"
    assert first["kv_cache_dtype"] == "bf16"


def test_without_the_field_report_trtllm_is_a_last_resort() -> None:
    tiny = load_card("tiny-cpu")
    sp = SearchSpace.from_card(tiny.name, tiny.search, load_other=lambda n: load_card(n).search)
    assert sp.like == "glm5-nvfp4" and any("own" in n for n in sp.notes)
    assert all(c.evidence != "own" for c in sp.claims)
    trt = sp.rank_of("dsa_decode_backend", "trtllm")
    assert trt is not None and trt.verdict == "fails"
    assert sp.first()[0]["attention_backend"] == "flashinfer"  # S6's way, before the report


def test_disagreeing_reports_are_disputed() -> None:
    r = _space().rank_of("dsa_decode_backend", "flashinfer_sparse_mla")
    assert r is not None and r.verdict == "unknown" and r.short().startswith("disputed")
    assert "disagree" in r.why


def test_sglang_refusals_are_repaired_with_few_changes() -> None:
    sp = _space()
    base, _ = sp.first()
    # flashinfer_sparse_mla needs FP8 KV on SM120, and FP8 KV then needs a matching prefill
    got = sp.repair({**base, "dsa_decode_backend": "flashinfer_sparse_mla"},
                    ("dsa_decode_backend",), {})
    assert got is not None
    cfg, why = got
    assert cfg["kv_cache_dtype"] == "fp8_e4m3"
    assert cfg["dsa_prefill_backend"] in ("flashinfer_sparse_mla", "triton_sparse_mla")
    assert set(why) == {"kv_cache_dtype", "dsa_prefill_backend"}
    assert "flash_mla_sm120.py" in why["kv_cache_dtype"]
    assert sp.violated(cfg) is None
    # a repair never gets rid of the value it repairs for (e.g. by leaving DSA attention)
    assert cfg["attention_backend"] == "dsa"
    # and no repair exists when every way out is excluded
    assert sp.repair({**base, "dsa_decode_backend": "flashinfer_sparse_mla"},
                     ("dsa_decode_backend",), {"kv_cache_dtype": {"fp8_e4m3"}}) is None


def test_sm100_has_its_own_defaults_and_refusals() -> None:
    sp = _space(arch="sm100")
    first, _ = sp.first()
    assert first["dsa_decode_backend"] == "trtllm" and first["kv_cache_dtype"] == "fp8_e4m3"
    assert sp.violated({**first, "dsa_decode_backend": "flashinfer_sparse_mla"}) is not None


def test_installed_parser_choices_drop_values_and_axes() -> None:
    choices = {"--attention-backend": ["dsa", "flashinfer"], "--dsa-decode-backend": None,
               "--dsa-prefill-backend": None, "--fp4-gemm-backend": None,
               "--moe-runner-backend": ["cutlass"], "--kv-cache-dtype": None}
    sp = _space(choices=choices, version="9.9")
    names = [a.name for a in sp.axes]
    assert "fp8_gemm_backend" not in names and "cuda_graph" in names
    assert [r.value for r in sp.ranked("attention_backend")] == ["dsa", "flashinfer"]
    assert sp.axis("moe_runner_backend").values == ("cutlass",)
    assert any("SGLang 9.9 has no --fp8-gemm-backend" in n for n in sp.notes)
    assert any("triton not among SGLang 9.9's --attention-backend" in n for n in sp.notes)


def test_log_lines_name_values_of_the_configuration() -> None:
    sp = _space()
    cfg, _ = sp.first()
    line = ("tvm.error.InternalError: Error in function 'TllmGenFmhaRunner' at "
            "flashinfer/trtllm/fmha/fmhaRunner.cuh:37: Unsupported architecture")
    assert sp.named_in(line, cfg) == [("dsa_decode_backend", "trtllm")]
    both = {**cfg, "dsa_prefill_backend": "flashmla_sparse", "dsa_decode_backend": "flashmla_kv"}
    # "flash_mla" is one library: both FlashMLA values of each axis it names go together
    named = sp.named_in("RuntimeError: flash_mla: Unsupported architecture", both)
    assert ("dsa_prefill_backend", "flashmla_sparse") in named
    assert ("dsa_prefill_backend", "flashmla_kv") in named
    assert ("dsa_decode_backend", "flashmla_kv") in named
    refusal = "error: argument --moe-runner-backend: invalid choice: 'cutlass' (choose from ...)"
    assert sp.named_in(refusal, cfg) == [("moe_runner_backend", "cutlass")]
    assert sp.named_in("Unsupported architecture", cfg) == []


def test_bad_search_tables_are_one_line() -> None:
    with pytest.raises(BadInput, match="no launch search"):
        SearchSpace.from_card("x", {})
    with pytest.raises(BadInput, match="unknown search axis"):
        SearchSpace.from_card("x", {"arch": "sm120", "axes": ["warp_size"]})
    with pytest.raises(BadInput, match="evidence one of"):
        SearchSpace.from_card("x", {"arch": "sm120", "axes": ["kv_cache_dtype"],
                                    "claim": [{"axis": "kv_cache_dtype", "value": "bf16",
                                               "says": "works", "evidence": "rumour"}]})
    assert EVIDENCE[0] == "own"


def test_every_claim_cites_a_listed_source() -> None:
    for c in _space().claims + _space(arch="sm100").claims:
        assert c.source in GLM.sources, c
    for r in _space().requirements:
        assert r.source.split()[0] in GLM.sources, r

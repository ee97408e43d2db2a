"""The correctness probe's verdict on /generate answers, in SGLang's answer shape
(tokenizer_manager: text, output_ids, meta_info.completion_tokens, output_token_logprobs)."""

from __future__ import annotations

from pcieprof.serve.sweep import _check_output


def _answer(ids: list[int], logprobs: list[float | None] | None = None) -> dict:
    meta: dict = {"completion_tokens": len(ids)}
    if logprobs is not None:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(logprobs, ids)]
    return {"text": "x", "output_ids": ids, "meta_info": meta}


def test_probe_accepts_varied_finite_tokens() -> None:
    seen: list[int] = []
    assert _check_output(_answer([1, 2, 3, 2], [-0.1, -2.0, -3.5, -0.7]), 4, seen) == []
    assert seen == [3]


def test_probe_refuses_short_degenerate_and_non_finite_output() -> None:
    assert "3 tokens instead of 4" in _check_output(_answer([1, 2, 3]), 4, [])[0]
    assert "degenerate" in _check_output(_answer([7, 7, 7, 7]), 4, [])[0]
    # NaN logprobs come back as null from SGLang's JSON encoder, or as NaN
    assert "non-finite" in _check_output(_answer([1, 2, 3, 4], [-1.0, None, -1.0, -1.0]), 4, [])[0]
    assert "non-finite" in _check_output(_answer([1, 2, 3, 4], [-1.0, float("nan"), -1, -1]), 4,
                                         [])[0]
    assert "not a JSON object" in _check_output([1, 2], 2, [])[0]
    # without output_ids, the text must not be one character repeated
    assert "degenerate" in _check_output({"text": "!!!!!!!!", "meta_info": {"completion_tokens": 8}},
                                         8, [])[0]

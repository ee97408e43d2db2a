"""One test per learning rule (pcieprof.tune.learn.RULES): a failure, classified from a real log
excerpt (tests/data/sglang_logs) as a launch would classify it, and what the search does next
over the GLM-5 card's space."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from pcieprof.cards import load_card
from pcieprof.serve.outcomes import classify
from pcieprof.tune.learn import GEMM_MOE_KV_AXES, RULES
from pcieprof.tune.search import End, Search, Step, Tried
from pcieprof.tune.space import SearchSpace

LOGS = Path(__file__).resolve().parents[1] / "data" / "sglang_logs"
CARD = load_card("glm5-nvfp4")
PRELUDE = "[2026-03-11 13:53:40 TP0] Load weight begin.\n"
CAPTURE = "[2026-03-11 13:55:02 TP0] Capturing batches (bs=16 avail_mem=10.20 GB): 33%| 2/6\n"


def _log(name: str) -> str:
    return "\n".join(ln for ln in (LOGS / name).read_text().splitlines()
                     if not ln.startswith("# "))


def _search() -> Search:
    return Search(SearchSpace.from_card(CARD.name, CARD.search))


def _ended(search: Search, history: list[Tried], log: str, *, exit_code: int | None = 1,
           hung: bool = False, progress: str = "Load weight begin.") -> tuple[Tried, Step | End]:
    """Launch the search's next step, end it with `log` (classified as serve-bench does), and
    return (that attempt, what the search does next)."""
    step = search.next(history)
    assert isinstance(step, Step)
    c = classify(PRELUDE + log, exit_code, hung=hung)
    t = Tried(len(history), step.config, c.outcome.value, c.excerpt, progress, step.rule,
              step.parent, step.varied)
    history.append(t)
    return t, search.next(history)


def _rule(search: Search, history: list[Tried]) -> str:
    return search.learn(history).rules[history[-1].index].name


def arch_named() -> None:
    s, h = _search(), []
    t, nxt = _ended(s, h, _log("unsupported_arch_trtllm_fmha_sm120.log"))
    assert t.config["dsa_decode_backend"] == "trtllm" and _rule(s, h) == "arch-named"
    assert s.learn(h).excluded == {"dsa_decode_backend": {"trtllm"}}
    assert isinstance(nxt, Step) and nxt.varied == ("dsa_decode_backend",)
    h2 = list(h)  # trtllm never comes back in this search
    for _ in range(6):
        st = s.next(h2)
        if isinstance(st, End):
            break
        assert st.config["dsa_decode_backend"] != "trtllm"
        h2.append(Tried(len(h2), st.config, "crashed", rule=st.rule, parent=st.parent,
                        varied=st.varied))


def arch_changed() -> None:
    s, h = _search(), []
    _ended(s, h, "RuntimeError: probability tensor contains either `inf`, `nan` or element < 0")
    # the next attempt changed one value; its architecture error names no kernel
    t, nxt = _ended(s, h, _log("unsupported_arch_nsa_sm120.log"))
    assert _rule(s, h) == "arch-changed" and len(t.varied) == 1
    assert s.learn(h).excluded == {t.varied[0]: {t.config[t.varied[0]]}}
    assert isinstance(nxt, Step) and nxt.varied == t.varied


def refused_value() -> None:
    s, h = _search(), []
    t, nxt = _ended(s, h, "sglang.launch_server: error: argument --moe-runner-backend: invalid "
                          "choice: 'cutlass' (choose from 'auto', 'triton')", exit_code=2)
    assert t.outcome == "bad_arguments" and _rule(s, h) == "refused-value"
    assert s.learn(h).excluded == {"moe_runner_backend": {"cutlass"}}
    assert isinstance(nxt, Step) and nxt.config["moe_runner_backend"] != "cutlass"


def nan_survived_attention() -> None:
    s = _search()
    h = [Tried(0, {**s.space.first()[0], "attention_backend": "flashinfer",
                   "dsa_decode_backend": "", "dsa_prefill_backend": ""},
               "nan_in_decode", "> RuntimeError: probability tensor contains either `inf`, "
               "`nan` or element < 0")]
    h.append(Tried(1, s.space.first()[0], "nan_in_decode", h[0].excerpt, rule="nan-in-decode",
                   parent=0, varied=("attention_backend",)))
    nxt = s.next(h)
    assert _rule(s, h) == "nan-survived-attention"
    assert isinstance(nxt, Step) and nxt.rule == "nan-survived-attention"
    assert nxt.varied and set(nxt.varied) <= set(GEMM_MOE_KV_AXES)
    for a in ("attention_backend", "dsa_decode_backend", "dsa_prefill_backend"):
        assert nxt.config[a] == h[1].config[a]
    # NaN survives the group change too: back to the configuration before it, and to the
    # decode kernel; the group is not tried again
    h.append(Tried(2, nxt.config, "nan_in_decode", h[0].excerpt, rule=nxt.rule, parent=1,
                   varied=nxt.varied))
    after = s.next(h)
    assert _rule(s, h) == "nan-in-decode" and isinstance(after, Step)
    assert after.parent == 1 and after.varied == ("dsa_decode_backend",)
    for a in GEMM_MOE_KV_AXES:
        if a != "kv_cache_dtype":
            assert after.config[a] == h[1].config[a]


def nan_in_decode() -> None:
    s, h = _search(), []
    _t, nxt = _ended(s, h, _log("nan_decode_glm5_sm120.log"))
    assert _rule(s, h) == "nan-in-decode"
    assert isinstance(nxt, Step) and nxt.varied == ("dsa_decode_backend",)


def device_assert() -> None:
    s, h = _search(), []
    _t, nxt = _ended(s, h, _log("device_assert_mtp_glm5.log"))
    assert _rule(s, h) == "device-assert"
    assert isinstance(nxt, Step) and nxt.varied == ("dsa_decode_backend",)


def bad_output() -> None:
    s = _search()
    h = [Tried(0, s.space.first()[0], "bad_output", "> 12 tokens instead of 32")]
    nxt = s.next(h)
    assert _rule(s, h) == "bad-output"
    assert isinstance(nxt, Step) and nxt.varied == ("kv_cache_dtype",)


def hang_in_capture() -> None:
    s, h = _search(), []
    _t, nxt = _ended(s, h, CAPTURE, exit_code=None, hung=True, progress=CAPTURE.strip())
    assert _rule(s, h) == "hang-in-capture"
    assert isinstance(nxt, Step) and nxt.varied == ("cuda_graph",)
    assert nxt.config["cuda_graph"] == "off"


def oom_in_capture() -> None:
    s, h = _search(), []
    _t, nxt = _ended(s, h, CAPTURE + _log("oom_cuda_sglang.log"), progress=CAPTURE.strip())
    assert _rule(s, h) == "oom-in-capture"
    assert isinstance(nxt, Step) and nxt.config["cuda_graph"] == "off"


def oom() -> None:
    s, h = _search(), []
    _t, nxt = _ended(s, h, _log("oom_mem_fraction_sglang.log"))
    assert _rule(s, h) == "oom"
    assert isinstance(nxt, End) and nxt.status == "stopped" and "mem-fraction" in nxt.hint


def nccl() -> None:
    s, h = _search(), []
    _t, nxt = _ended(s, h, _log("nccl_system_error_sglang.log"))
    assert _rule(s, h) == "nccl"
    assert isinstance(nxt, End) and nxt.status == "stopped" and "topology" in nxt.hint


def environment() -> None:
    s, h = _search(), []
    _t, nxt = _ended(s, h, _log("port_in_use_uvicorn.log"))
    assert _rule(s, h) == "environment"
    assert isinstance(nxt, End) and nxt.status == "stopped"


def arch_unattributed() -> None:
    # the first attempt (no parent) fails with a line that names none of its kernels
    s, h = _search(), []
    _t, nxt = _ended(s, h, _log("unsupported_arch_nsa_sm120.log"))
    assert _rule(s, h) == "arch-unattributed" and s.learn(h).excluded == {}
    assert isinstance(nxt, Step) and nxt.varied == (s.space.axes[0].name,)


def hang() -> None:
    s, h = _search(), []
    _t, nxt = _ended(s, h, "[x TP0] Load weight begin.\n", exit_code=None, hung=True)
    assert _rule(s, h) == "hang"
    assert isinstance(nxt, Step) and nxt.varied == (s.space.axes[0].name,)


def other() -> None:
    s, h = _search(), []
    _t, nxt = _ended(s, h, "Traceback (most recent call last):\nKeyError: 'x'\n")
    assert h[-1].outcome == "crashed" and _rule(s, h) == "other"
    assert isinstance(nxt, Step) and nxt.varied == (s.space.axes[0].name,)


CASES: dict[str, Callable[[], None]] = {
    "arch-named": arch_named, "arch-changed": arch_changed, "refused-value": refused_value,
    "nan-survived-attention": nan_survived_attention, "nan-in-decode": nan_in_decode,
    "device-assert": device_assert, "bad-output": bad_output,
    "hang-in-capture": hang_in_capture, "oom-in-capture": oom_in_capture, "oom": oom,
    "nccl": nccl, "environment": environment, "arch-unattributed": arch_unattributed,
    "hang": hang, "other": other,
}


def test_every_rule_has_a_test() -> None:
    assert set(CASES) == {r.name for r in RULES}


@pytest.mark.parametrize("name", list(CASES))
def test_rule(name: str) -> None:
    CASES[name]()

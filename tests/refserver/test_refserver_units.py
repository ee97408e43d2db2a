"""Flags, names, tokenizer and the model's collective pattern, without starting a server."""

from __future__ import annotations


import pytest
from builders.cli import cli

from pcieprof.refserver.args import ArgsError, Injection, parse_args, parse_injection
from pcieprof.refserver.names import trace_file_name
from pcieprof.refserver.tokenizer import Tokenizer


def test_sglang_flag_names_and_aliases() -> None:
    a = parse_args(["--tp", "4", "--port", "30001", "--model", "tiny-cpu", "--seed", "7",
                    "--attention-backend", "triton", "--disable-cuda-graph"])
    assert (a.tp_size, a.port, a.random_seed, a.host) == (4, 30001, 7, "127.0.0.1")
    assert a.ignored_flags == {"attention-backend": "triton", "disable-cuda-graph": True}


@pytest.mark.parametrize("argv, words", [
    (["--model-path", "zai-org/GLM-5"], "built-in model"),
    (["--tp-size", "3"], "8 heads"),
    (["--dp-size", "2"], "is not supported by the pcieprof reference server"),
    (["--inject", "explode"], "not understood"),
])
def test_refusals_are_one_line(argv: list[str], words: str) -> None:
    with pytest.raises(ArgsError) as err:
        parse_args(argv)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_injection_forms() -> None:
    assert parse_injection("nan-after 20") == Injection("nan-after", 20)
    assert parse_injection("nan-after=5") == Injection("nan-after", 5)
    assert parse_injection("hang") == Injection("hang", 0)
    assert parse_injection("hang-after 3") == Injection("hang", 3)
    assert parse_injection("crash-on-start") == Injection("crash-on-start")
    assert parse_injection(None) == Injection()


def test_cli_wrapper_refuses_unknown_flag_with_exit_2() -> None:
    r = cli("reference-server", "--bogus", process=True, timeout=120)
    assert r.returncode == 2
    assert "unrecognized arguments: --bogus" in r.stderr


def test_trace_names_are_sglangs() -> None:
    assert trace_file_name("1700000000.5", 1) == "1700000000.5-TP-1.trace.json.gz"
    assert trace_file_name("17.5", 0, "DECODE", "run") == "run-17.5-TP-0-DECODE.trace.json.gz"


def test_tokenizer_round_trips() -> None:
    tok = Tokenizer()
    text = "the capital city of France is Paris! ünïcode €"
    ids = tok.encode(text)
    assert tok.decode(ids).encode("latin-1", errors="ignore")  # pieces are single chars
    assert tok.decode(tok.encode("hello world")) == "hello world"
    assert len(tok.encode("hello world")) == 6  # bigrams
    assert all(0 <= i < tok.vocab_size for i in ids)


def test_model_does_the_tp_collectives_sglang_does() -> None:
    """Per forward step at TP>1: 1 + 2 x layers all-reduces and one all-gather, whatever the
    batch."""
    import torch

    from pcieprof.refserver.model import TinyMoEConfig, TinyMoEModel, TPGroup

    class Counting(TPGroup):
        def __init__(self) -> None:
            super().__init__(rank=0, size=2)
            self.calls: list[tuple[str, tuple[int, ...]]] = []

        def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
            self.calls.append(("all_reduce", tuple(x.shape)))
            return x

        def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
            self.calls.append(("all_gather", tuple(x.shape)))
            return torch.cat([x, x], dim=-1)

    cfg = TinyMoEConfig()
    tp = Counting()
    model = TinyMoEModel(cfg, tp, seed=0, max_positions=64)
    caches = [model.new_cache(16) for _ in range(3)]
    model.forward([1, 2, 3, 4, 5, 6], [(0, 2), (0, 3), (0, 1)], caches)
    tp.calls.clear()
    logits = model.forward([7, 8, 9], [(2, 1), (3, 1), (1, 1)], caches)
    kinds = [k for k, _ in tp.calls]
    assert kinds.count("all_reduce") == 1 + 2 * cfg.num_layers
    assert kinds.count("all_gather") == 1
    assert all(shape == (3, cfg.hidden_size) for k, shape in tp.calls if k == "all_reduce")
    assert logits.shape == (3, cfg.vocab_size)


def test_start_profile_bodies_that_cannot_be_served(tmp_path) -> None:
    from pcieprof.refserver.scheduler import _profile_request_problem

    ok = {"output_dir": str(tmp_path / "t"), "num_steps": 4, "profile_by_stage": True}
    assert _profile_request_problem(ok) is None and (tmp_path / "t").is_dir()
    assert "needs num_steps" in _profile_request_problem({**ok, "num_steps": None})
    assert "start_step" in _profile_request_problem({**ok, "start_step": 10})
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert "cannot create output_dir" in _profile_request_problem(
        {**ok, "output_dir": str(blocker / "sub")})

"""pcieprof.redact: every way a secret arrives is masked, nothing else is, and hostile text costs
linear time."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pcieprof.bundle import Bundle
from pcieprof.redact import MASK, is_secret_name, redact, remember
from pcieprof.report.builder import manifest_facts, open_views


@pytest.mark.parametrize("name", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "MY_API_KEY",
                                  "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "PGPASSWORD",
                                  "--api-key", "--hf-token", "--token", "--password",
                                  "CLIENT_SECRET", "--admin-api-key"])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["TOKENIZERS_PARALLELISM", "--max-total-tokens",
                                  "NCCL_IB_HCA", "SSH_AUTH_SOCK", "--ssl-keyfile",
                                  "--tokenizer-path", "KEYBOARD", "--kv-cache-dtype"])
def test_not_secret_names(name: str) -> None:
    assert not is_secret_name(name)


def test_argv_every_shape() -> None:
    argv = ["pcieprof", "serve-bench", "--env", "HF_TOKEN=hf_aaaa1111", "--env=MY_API_KEY=kkkk2222",
            "--url", "http://user:pppp3333@127.0.0.1:1", "--launch-prefix",
            "docker run -e HF_TOKEN=dddd4444 img", "--", "--api-key", "sk-ssss5555",
            "--hf-token=tttt6666", "--port", "30000", "--max-total-tokens", "8"]
    out = redact(argv)
    joined = " ".join(out)
    for secret in ("aaaa1111", "kkkk2222", "pppp3333", "dddd4444", "ssss5555", "tttt6666"):
        assert secret not in joined, joined
    assert out[out.index("--api-key") + 1] == MASK
    assert out[-4:] == ["--port", "30000", "--max-total-tokens", "8"]  # the rest untouched
    assert "HF_TOKEN=***" in out and "http://***@127.0.0.1:1" in out


def test_text_shapes_and_remembered_values() -> None:
    assert redact("export MY_API_KEY='a b c'") == "export MY_API_KEY='***'"
    assert redact('{"HF_TOKEN": "zzzz7777"}') == '{"HF_TOKEN": "***"}'
    # SGLang logs its arguments as a repr: api_key='...'
    assert "vvvv8888" not in redact("server_args=ServerArgs(api_key='vvvv8888', port=1)")
    # once seen, the value is masked wherever it shows up again
    assert redact("Authorization failed for vvvv8888") == f"Authorization failed for {MASK}"
    assert redact("--host 127.0.0.1 --port 3 TOKENIZERS_PARALLELISM=false") == \
        "--host 127.0.0.1 --port 3 TOKENIZERS_PARALLELISM=false"


def test_mappings_and_documents() -> None:
    remember("xxxx9999")
    doc = {"env": {"HF_TOKEN": "h", "NCCL_DEBUG": "INFO"}, "argv": ["--password", "p"],
           "note": "uses xxxx9999", "n": 3}
    assert redact(doc) == {"env": {"HF_TOKEN": MASK, "NCCL_DEBUG": "INFO"},
                           "argv": ["--password", MASK], "note": f"uses {MASK}", "n": 3}


@pytest.mark.parametrize("text", ["a" * 200_000, "x=" * 100_000, "password" * 25_000,
                                  " --a" * 50_000, "a://" * 50_000, "HF_TOKEN=" * 20_000,
                                  "a_" * 100_000])
def test_hostile_text_is_linear(text: str) -> None:
    t0 = time.perf_counter()
    redact(text)
    assert time.perf_counter() - t0 < 2.0


def test_report_masks_an_old_bundles_argv(tmp_path: Path) -> None:
    # A bundle written before masking existed holds its argv in clear; the report masks it.
    b = Bundle.create(tmp_path / "old", command="serve-bench", source="measured", backend="cpu")
    b.manifest["argv"] = ["pcieprof", "serve-bench", "--env", "HF_TOKEN=oldsecret1234"]
    b.finish()
    view = open_views([b.path])[0]
    facts = dict(manifest_facts(view))
    assert facts["command"] == "pcieprof serve-bench --env HF_TOKEN=***"

"""pcieprof.redact: every way a secret arrives is masked, nothing else is, and hostile text costs
linear time."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pcieprof.bundle import Bundle
from pcieprof.redact import (MASK, is_secret_name, redact, remember, remember_environ,
                             unfinished_at)
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
    b.manifest.argv = ["pcieprof", "serve-bench", "--env", "HF_TOKEN=oldsecret1234"]
    b.finish()
    view = open_views([b.path])[0]
    facts = dict(manifest_facts(view))
    assert facts["command"] == "pcieprof serve-bench --env HF_TOKEN=***"


# -- issue 25: values with punctuation, URLs with `@` or `/`, counters -------------------------

#: Every character a masked value must not stop at (issue 25 points 1 and 3).
PUNCT = " ,;&)]}@/"


def _planted(tag: str) -> list[str]:
    """One value per character of PUNCT, each with the character inside it."""
    return [f"{tag}{i}a{c}b{c}tail{i}" for i, c in enumerate(PUNCT)]


def _leaked(text: str, values: list[str]) -> list[str]:
    """The values, or any part of one past its first punctuation, that `text` still holds."""
    return [v for v in values if v in text or v.split(v[len(v) // 2 - 1], 1)[-1] in text]


def test_argv_values_with_punctuation_are_masked_whole() -> None:
    values = _planted("argv")
    argv = ["pcieprof", "serve-bench"]
    for i, v in enumerate(values):
        argv += (["--env", f"MY_PASSWORD{i}={v}"] if i % 3 == 0 else
                 [f"--api-key={v}"] if i % 3 == 1 else ["--hf-token", v])
    out = redact(argv)
    assert not _leaked(" ".join(out), values), out
    assert "MY_PASSWORD0=***" in out and "--api-key=***" in out
    # once seen whole, each is masked whole wherever it is quoted again
    line = " ".join(f"DB_PASSWORD={v} echoed {v}" for v in values)
    assert not _leaked(redact(line), values), redact(line)


def test_inherited_values_with_punctuation_are_masked_when_echoed() -> None:
    values = _planted("env")
    env = {f"PARENT{i}_TOKEN": v for i, v in enumerate(values)}
    remember_environ(env)
    log = "\n".join(f"{k}={v}" for k, v in env.items())
    assert not _leaked(redact(log), values), redact(log)


@pytest.mark.parametrize("url, secret", [
    ("http://user:pa@ss@w0rd@host:8000/v1", "pa@ss@w0rd"),
    ("s3://AKIAXYZ:sec/ret/key@bucket/path", "sec/ret/key"),
    ("redis://:p,;&)]}x@cache:6379/0", "p,;&)]}x"),
    ("https://bot:tok3n/with/slash@host/x", "tok3n/with/slash"),
])
def test_url_credentials_with_at_or_slash_are_masked_whole(url: str, secret: str) -> None:
    out = redact(f"connecting to {url} now")
    assert secret not in out and secret.split("@")[-1].split("/")[-1] not in out, out
    assert "***@" in out and out.endswith(" now")


def test_a_path_at_sign_after_a_plain_host_is_kept() -> None:
    assert redact("see https://example.com/u/a@b.org") == "see https://example.com/u/a@b.org"


def test_sglang_counters_are_not_secrets() -> None:
    line = ("Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, "
            "#running-req: 0, #queue-req: 0")
    assert redact(line) == line


@pytest.mark.parametrize("name", ["SGLANG_PASS", "SGLANG_HOOK", "SLACK_WEBHOOK", "BASIC_AUTH"])
def test_more_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["PWD", "OLDPWD", "NUM_PASSES", "GIT_HOOKS"])
def test_names_that_only_look_like_secrets(name: str) -> None:
    assert not is_secret_name(name)


def test_inherited_pass_and_hook_are_masked() -> None:
    env = {"SGLANG_PASS": "open sesame;42", "SGLANG_HOOK": "https://hooks.example.com/hook/T0/B1x"}
    remember_environ(env)
    out = redact(" ".join(f"{k}={v}" for k, v in env.items()) + " posted to " + env["SGLANG_HOOK"])
    assert "sesame" not in out and "T0/B1x" not in out, out


@pytest.mark.parametrize("text, held", [
    ("using token hf_spl", "hf_spl"),  # the head of a remembered value
    ("export HF_TOKEN=", "HF_TOKEN="),  # a name whose value has not come yet
    ("--api-key 'half of", "--api-key 'half of"),  # an unclosed quote
    ("GET http://u:p@", "http://u:p@"),  # a URL still being written
    ("loading 40%", "40%"),  # the last word: a name may be half written
    ("ready ", ""),
])
def test_unfinished_at_holds_back_a_secret_cut_short(text: str, held: str) -> None:
    remember("hf_splitVALUE99")
    assert text[unfinished_at(text):] == held


def test_a_password_with_at_then_slash_is_masked_whole() -> None:
    out = redact("http://u:pw,;&)]}@/TAILx@nccl.example.com/p")
    assert out == "http://***@nccl.example.com/p", out

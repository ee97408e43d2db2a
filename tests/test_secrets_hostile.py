"""Secrets with punctuation, in every way they reach pcieprof (issue 25 points 1-3): one value
per route, each holding every character a masking pattern could stop at (` ,;&)]}@/`; a URL's
password holds all but the blank), planted in a real serve-bench run (launched through a prefix
that prints the server's whole environment into its log, as `NAME=value`), its --dry-run, its
report, and a topology run; then every file, log and output is searched for any piece of them.

The server is the reference server (`--model tiny-cpu`), the probes run on the cpu backend.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from builders.cli import pcieprof_argv

pytest.importorskip("pcieprof.refserver.server")

PUNCT = " ,;&)]}@/"

#: route -> its value. Each value is `H<n>h<punctuation>T<n>t`: its head and tail are distinct
#: words, so that a value cut at any of its characters still leaves a piece that is found.
ROUTES = ["env_password", "env_token", "sweep_api_key", "sweep_hf_token", "sweep_env",
          "parent_token", "parent_pass", "parent_hook", "parent_url", "nccl_url", "nccl_token"]
URL_ROUTES = {"parent_hook", "parent_url", "nccl_url"}  # no blank inside a URL


def _value(route: str) -> str:
    n = ROUTES.index(route)
    punct = PUNCT.replace(" ", "") if route in URL_ROUTES else PUNCT
    return f"H{n:02d}hq{punct}T{n:02d}tq"


def _pieces() -> dict[str, list[bytes]]:
    """route -> the pieces of its value that must not appear anywhere."""
    out = {}
    for route in ROUTES:
        v = _value(route)
        out[route] = [v[:5].encode(), v[-5:].encode()]  # H00hq ... T00tq
    return out


def _leaks(files: list[Path], *outputs: str) -> list[str]:
    blobs = [(f"output{i}", o.encode()) for i, o in enumerate(outputs)]
    blobs += [(str(f), f.read_bytes()) for f in files]
    return [f"{route}@{place}" for place, data in blobs
            for route, pieces in _pieces().items() if any(p in data for p in pieces)]


def _run(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(pcieprof_argv(*args), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env}, stdin=subprocess.DEVNULL)


def test_planted_secrets_with_punctuation_appear_nowhere(tmp_path: Path) -> None:
    v = _value
    sweep = tmp_path / "sweep.json"
    # the first entry's arguments are refused by the reference server, which quotes them back
    # (attempts.jsonl keeps the excerpt); the second serves, with a secret in its environment
    sweep.write_text(json.dumps([
        {"name": "first", "extra_args": [f"--api-key={v('sweep_api_key')}",
                                         "--hf-token", v("sweep_hf_token")]},
        {"name": "second", "env": {"DB_PASSWORD": v("sweep_env")}}]))
    parent = {"PARENT_TOKEN": v("parent_token"), "SGLANG_PASS": v("parent_pass"),
              "SGLANG_HOOK": f"https://hooks.example.com/hook/{v('parent_hook')}",
              "SERVICE_URL": f"http://svc:{v('parent_url')}@db.example.com:5432/x",
              "NCCL_X_URL": f"http://u:{v('nccl_url')}@nccl.example.com/p",
              "NCCL_PLUGIN_TOKEN": v("nccl_token")}
    out = tmp_path / "serve"
    serve = ["serve-bench", "--model", "tiny-cpu", "--tp", "1", "--out", str(out),
             "--num-requests", "2", "--warmup", "0", "--input-len", "8", "--output-len", "4",
             "--concurrency", "1", "--decode-batches", "none", "--no-profile",
             "--probe-tokens", "4", "--env", f"MY_PASSWORD={v('env_password')}",
             "--env", f"HF_TOKEN={v('env_token')}", "--sweep-file", str(sweep),
             "--launch-prefix", "sh -c 'env; exec \"$@\"' sh"]
    runs = [_run(serve, parent, 300)]
    assert runs[0].returncode == 0, runs[0].stderr[-3000:]
    log = (out / "serve" / "server-1.log").read_text()
    assert "PARENT_TOKEN=***" in log and "SGLANG_PASS=***" in log, log[-3000:]  # it was echoed
    runs.append(_run([*serve[:6], str(tmp_path / "dry"), *serve[6:], "--dry-run"], parent, 120))
    runs.append(_run(["report", str(out), "-o", str(out / "report.html")], parent, 300))
    topo = tmp_path / "topo"
    runs.append(_run(["topology", "--backend", "cpu", "--nranks", "2", "--quick", "--variants",
                      "default", "--out", str(topo)], parent, 400))
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    choices = json.loads((topo / "nccl_choices.json").read_text())
    user_env = choices["default"]["user_env"]["left_out"]  # case name -> its entry
    assert user_env["NCCL_X_URL"] == "http://***@nccl.example.com/p", user_env
    files = [f for d in (out, topo) for f in sorted(d.rglob("*")) if f.is_file()]
    assert (out / "report.html") in files and (topo / "report.html") in files
    assert not _leaks(files, *(r.stdout + r.stderr for r in runs))

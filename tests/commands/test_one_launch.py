"""One launch configuration (issue 22, point 1): `serve-bench --model M` without `--sweep`,
its `--dry-run`, `recommend`'s launch card, the report and the argv serve-bench really launches
are the same command: the launch served last on this machine when a search recorded one, else
the search's first-ranked configuration, never one the card marks failing."""

from __future__ import annotations

import html
import json
import os
import shlex
import shutil
import stat
from pathlib import Path

from builders.cli import cli

from pcieprof.analysis.box import box_of
from pcieprof.bundle import Bundle
from pcieprof.bundle.recommendations import Recommendations
from pcieprof.bundle.serve_search import ServeSearch, Winner
from pcieprof.cards import load_card
from pcieprof.commands.tuning import failing, the_launch
from pcieprof.serve import served
from pcieprof.serve.sglang_cmd import PINNED_SGLANG, sglang_search_path
from pcieprof.tune.launch import BENCH, launch_recommendation

GLM5 = load_card("glm5-nvfp4")


def _dry_run(*args: str) -> tuple[list[str], dict[str, str]]:
    """serve-bench --dry-run's argv (its `# argv:` line) and its exports; no --port: the default
    port is the one recommend prints too."""
    r = cli("serve-bench", *args, "--dry-run")
    assert r.returncode == 0, r.stderr
    argv = next(json.loads(ln[len("# argv: "):]) for ln in r.stdout.splitlines()
                if ln.startswith("# argv: "))
    env = dict(shlex.split(ln[len("export "):])[0].split("=", 1)
               for ln in r.stdout.splitlines() if ln.startswith("export "))
    return argv, env


def _split(line: str) -> tuple[list[str], dict[str, str]]:
    """A printed launch line: leading KEY=VALUE words, then the argv."""
    words = shlex.split(line)
    i = next(i for i, w in enumerate(words) if "=" not in w or w.startswith("-"))
    return words[i:], dict(w.split("=", 1) for w in words[:i])


def _recommend(src: Path, dst: Path) -> Recommendations:
    r = cli("recommend", str(src), "--out", str(dst), "-q")
    assert r.returncode == 0, r.stderr
    doc = Bundle.open(dst).read_doc(Recommendations)
    assert doc is not None
    return doc


def test_serve_bench_launches_what_recommend_prints(sim_vm_bundle: Path, tmp_path: Path) -> None:
    argv, env = _dry_run("--model", "glm5-nvfp4")
    # never the card's plain FlashInfer attention, which it marks NaN in decode on SM120
    assert argv[argv.index("--attention-backend") + 1] == "dsa"
    config = the_launch(GLM5).config
    assert not failing(GLM5, config)
    doc = _recommend(sim_vm_bundle, tmp_path / "box")
    tp8 = next(lay for lay in doc.layouts if lay.label == f"TP{GLM5.sglang.tp_default}")
    assert shlex.split(tp8.command) == argv  # the card's layout, argv for argv
    if sglang_search_path() is not None:  # a parser is here: both commands are checked by it
        assert f"checked against SGLang {PINNED_SGLANG}'s own parser" in tp8.notes
    # the card's environment for this box (SM120, PCIe: its box settings hold), less what the
    # recommended environment sets instead
    card_env = GLM5.sglang.for_box(box_of(Bundle.open(sim_vm_bundle)).target()).env
    assert "NCCL_P2P_LEVEL" in card_env and "SGLANG_ENABLE_JIT_DEEPGEMM" in card_env
    assert {k: v for k, v in env.items() if k in card_env} == \
        {k: v for k, v in card_env.items() if k not in doc.env}

    # recommend's launch card: the SGLang line, and the serve-bench command launching it
    rec = launch_recommendation(doc)
    assert rec is not None
    line, bench = rec.action.splitlines()
    assert bench.startswith(BENCH + "pcieprof serve-bench ")
    bench_args = shlex.split(bench[len(BENCH):])[2:]
    want_argv, want_env = _split(line)
    got_argv, got_env = _dry_run(*bench_args)
    assert got_argv == want_argv
    assert got_env == want_env
    # the script and the report print the same line
    script = (tmp_path / "box" / "tune" / "sglang_command.sh").read_text().splitlines()
    assert script[-1] == line and script[-2] == bench
    page = tmp_path / "r.html"
    assert cli("report", str(tmp_path / "box"), "-o", str(page), "-q").returncode == 0
    assert html.escape(line) in page.read_text()

    # and what serve-bench really launches, recorded by a launch prefix that starts nothing
    log = tmp_path / "launched.json"
    rec_py = tmp_path / "record.py"
    rec_py.write_text("import json, os, sys\n"
                      "if 'sglang.launch_server' in sys.argv:\n"
                      f"    open({str(log)!r}, 'w').write(json.dumps({{'argv': sys.argv[1:], "
                      "'env': dict(os.environ)}))\n"
                      "sys.exit(1)\n")
    prefix = tmp_path / "record"
    prefix.write_text(f"#!/bin/sh\nexec {shlex.quote(os.sys.executable)} {rec_py} \"$@\"\n")
    prefix.chmod(prefix.stat().st_mode | stat.S_IXUSR)
    r = cli("serve-bench", *bench_args, "--launch-prefix", str(prefix),
            "--out", str(tmp_path / "run"), "--startup-timeout", "60", "-q", process=True)
    assert r.returncode == 1, r.stderr  # the "server" exited: a crash
    launched = json.loads(log.read_text())["argv"]  # through a prefix: `env K=V ... argv`
    assert launched[0] == "env"
    got_argv, got_env = _split(shlex.join(launched[1:]))
    # the same port, unless another process holds it here: then the first free one after it
    at = got_argv.index("--port") + 1
    assert int(got_argv[at]) >= int(want_argv[at])
    got_argv[at] = want_argv[at]
    assert got_argv == want_argv
    assert got_env == want_env


def _served_bundle(path: Path, config: dict[str, str]) -> Path:
    b = Bundle.create(path, command="serve-bench", source="measured", backend="cuda")
    b.write_doc(ServeSearch(card="glm5-nvfp4", arch="sm120", status="found",
                            winner=Winner(index=3, label="served", config=config,
                                          command="python3 -m sglang.launch_server ...")))
    b.finish()
    return path


def test_the_launch_served_last_here_wins(sim_vm_bundle: Path, tmp_path: Path) -> None:
    config = dict(the_launch(GLM5).config, dsa_decode_backend="tilelang",
                  fp4_gemm_backend="flashinfer_cutlass")
    served.record("glm5-nvfp4", "sm120", _served_bundle(tmp_path / "serve", config))
    argv, _ = _dry_run("--model", "glm5-nvfp4")
    assert argv[argv.index("--dsa-decode-backend") + 1] == "tilelang"
    assert argv[argv.index("--fp4-gemm-backend") + 1] == "flashinfer_cutlass"
    choice = the_launch(GLM5)
    assert choice.served and choice.config == config

    # recommend on a bundle measured on this machine launches it too; on a simulated box not
    here = tmp_path / "here"
    shutil.copytree(sim_vm_bundle, here)
    manifest = json.loads((here / "manifest.json").read_text())
    manifest.update(source="measured", host=__import__("socket").gethostname())
    (here / "manifest.json").write_text(json.dumps(manifest))
    assert the_launch(GLM5, bundle=Bundle.open(here)).config == config
    assert not the_launch(GLM5, bundle=Bundle.open(sim_vm_bundle)).served

    # a record whose bundle is gone is not launched
    shutil.rmtree(tmp_path / "serve")
    assert not the_launch(GLM5).served


def test_a_failing_value_is_launched_only_when_named(tmp_path: Path) -> None:
    r = cli("serve-bench", "--model", "glm5-nvfp4", "--dry-run", "--attention-backend",
            "flashinfer")
    assert r.returncode == 0, r.stderr
    assert "--attention-backend flashinfer" in r.stdout  # the user's word is launched...
    assert "the card marks attention_backend=flashinfer as failing" in r.stderr  # ...warned

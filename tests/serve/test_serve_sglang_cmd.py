"""Command building without SGLang installed: argv shape, layout checks, old-release translation."""

from __future__ import annotations

import pytest

from pcieprof.errors import BadInput
from pcieprof.cards import LaunchTarget, load_card
from pcieprof.serve.sglang_cmd import LaunchConfig, ParserSpec, build_command, recorded_env

GLM5 = load_card("glm5-nvfp4")
#: The box the card's launch facts were written on: 8x RTX PRO 6000 (sm120) over PCIe.
SOURCE_BOX = LaunchTarget(arch="sm120", arch_source="test", fabric="pcie", fabric_source="test")


def _opt(action: str = "_StoreAction", choices=None, nargs=None) -> dict:
    return {"dest": "", "nargs": nargs, "choices": choices, "action": action, "new_flag": None,
            "help": ""}


def _old_release() -> ParserSpec:
    """The option names of an SGLang release before the DSA rename (as their docs spell them)."""
    flags = ["--model-path", "--tp-size", "--ep-size", "--dp-size", "--quantization",
             "--kv-cache-dtype", "--attention-backend", "--nsa-prefill-backend",
             "--nsa-decode-backend", "--cuda-graph-max-bs", "--host", "--port",
             "--trust-remote-code", "--disable-custom-all-reduce", "--mem-fraction-static",
             "--max-running-requests", "--chunked-prefill-size", "--fp4-gemm-backend",
             "--moe-runner-backend"]
    opts = {f: _opt() for f in flags}
    opts["--disable-cuda-graph"] = _opt(nargs=0)
    opts["--enable-dp-attention"] = _opt(nargs=0)
    opts["--attention-backend"] = _opt(choices=["flashinfer", "nsa", "triton"])
    return ParserSpec(version="0.5.9-like", options=opts, source="test table")


def test_argv_is_a_list_with_card_facts_and_env() -> None:
    cmd = build_command(GLM5, LaunchConfig(), python="python3", target=SOURCE_BOX)
    assert isinstance(cmd.argv, list) and cmd.argv[:3] == ["python3", "-m", "sglang.launch_server"]
    a = cmd.argv
    assert a[a.index("--tp-size") + 1] == "8"
    assert a[a.index("--quantization") + 1] == "modelopt_fp4"
    assert a[a.index("--kv-cache-dtype") + 1] == "bf16"
    assert a[a.index("--host") + 1] == "127.0.0.1"
    assert cmd.env["SGLANG_ENABLE_JIT_DEEPGEMM"] == "0"
    assert "not checked" in cmd.notes[0]
    assert "NCCL_P2P_LEVEL=SYS" in cmd.shell()


def test_user_extras_override_card_flags() -> None:
    cmd = build_command(GLM5, LaunchConfig(extra_args=("--mem-fraction-static", "0.92")))
    a = cmd.argv
    assert a.count("--mem-fraction-static") == 1
    assert a[a.index("--mem-fraction-static") + 1] == "0.92"


def test_multinode_and_layout_checks() -> None:
    cmd = build_command(GLM5, LaunchConfig(nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:5000"))
    a = cmd.argv
    assert a[a.index("--nnodes") + 1] == "2" and a[a.index("--node-rank") + 1] == "1"
    assert a[a.index("--dist-init-addr") + 1] == "10.0.0.1:5000"
    with pytest.raises(BadInput, match="dist-init-addr"):
        build_command(GLM5, LaunchConfig(nnodes=2))
    with pytest.raises(BadInput, match="must divide"):
        build_command(GLM5, LaunchConfig(tp=8, ep=3))
    with pytest.raises(BadInput, match="needs --dp"):
        build_command(GLM5, LaunchConfig(dp_attention=True))


def test_new_spellings_translated_back_for_an_older_release() -> None:
    cfg = LaunchConfig(dsa_prefill_backend="flashinfer", attention_backend="dsa", cuda_graph=False,
                       dp=2, dp_attention=True)
    cmd = build_command(GLM5, cfg, parser=_old_release())
    a = cmd.argv
    assert "--nsa-prefill-backend" in a and "--dsa-prefill-backend" not in a
    assert a[a.index("--attention-backend") + 1] == "nsa"
    assert "--disable-cuda-graph" in a and "--cuda-graph-backend-decode" not in a
    assert "--cuda-graph-max-bs" in a
    assert a[a.index("--dp-size") + 1] == "2" and "--enable-dp-attention" in a
    assert len(cmd.notes) >= 4


def test_reference_server_command() -> None:
    tiny = load_card("tiny-cpu")
    cmd = build_command(tiny, LaunchConfig(tp=2, port=31000, inject="nan-after 20"))
    assert cmd.reference
    assert cmd.argv[1:3] == ["-m", "pcieprof.refserver"]
    assert cmd.argv[3:] == ["--tp-size", "2", "--host", "127.0.0.1", "--port", "31000",
                            "--inject", "nan-after 20"]
    with pytest.raises(BadInput, match="one node"):
        build_command(tiny, LaunchConfig(nnodes=2, dist_init_addr="h:1"))


def test_recorded_env_keeps_nccl_and_sglang_only() -> None:
    cmd = build_command(GLM5, LaunchConfig(env={"NCCL_PROTO": "LL"}))
    env = recorded_env(cmd, base={"NCCL_DEBUG": "INFO", "HOME": "/root", "SGLANG_X": "1"})
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_PROTO"] == "LL" and "HOME" not in env


def test_sglang_commands_say_python3_not_this_interpreter() -> None:
    import sys

    cmd = build_command(GLM5, LaunchConfig())
    assert cmd.argv[0] == "python3" and sys.executable not in cmd.shell()
    # the reference server is pcieprof's own module: this interpreter, unless a prefix runs it
    tiny = load_card("tiny-cpu")
    assert build_command(tiny, LaunchConfig()).argv[0] == sys.executable


def test_reference_server_gets_the_backend_flags_sglang_would() -> None:
    tiny = load_card("tiny-cpu")
    cmd = build_command(tiny, LaunchConfig(attention_backend="dsa", dsa_decode_backend="trtllm",
                                           kv_cache_dtype="bf16", cuda_graph=False))
    a = cmd.argv
    assert a[a.index("--dsa-decode-backend") + 1] == "trtllm"
    assert a[a.index("--cuda-graph-backend-decode") + 1] == "disabled"


def test_launch_prefix_wraps_command_and_environment() -> None:
    from pcieprof.serve.sglang_cmd import LaunchPrefix

    docker = LaunchPrefix.parse("docker run --rm --gpus all --network host lmsysorg/sglang:v0.5.23")
    cmd = build_command(GLM5, LaunchConfig(), prefix=docker, target=SOURCE_BOX)
    ex = cmd.exec_argv()
    assert ex[:6] == ["docker", "run", "--rm", "--gpus", "all", "--network"]
    i = ex.index("env")  # the container does not inherit this shell's environment
    assert "SGLANG_ENABLE_JIT_DEEPGEMM=0" in ex[i:] and ex[ex.index("python3") + 1] == "-m"
    assert cmd.argv[0] == "python3" and (cmd.record().prefix or [""])[0] == "docker"
    # ssh and {cmd} templates get the command as one shell string
    ssh = LaunchPrefix.parse("ssh gpu01").wrap(["python3", "-c", "print('a b')"])
    assert ssh == ["ssh", "gpu01", "python3 -c 'print('\"'\"'a b'\"'\"')'"]
    tpl = LaunchPrefix.parse("srun -N1 bash -lc {cmd}").wrap(["python3", "-V"], {"A": "1"})
    assert tpl == ["srun", "-N1", "bash", "-lc", "env A=1 python3 -V"]
    assert LaunchPrefix.parse("  ") is None
    with pytest.raises(BadInput, match="launch-prefix"):
        LaunchPrefix.parse("docker run 'unclosed")


def test_a_given_setting_leaves_out_the_card_settings_it_makes_moot() -> None:
    """NCCL reads NCCL_P2P_DISABLE before NCCL_P2P_LEVEL: with P2P disabled, the card's
    NCCL_P2P_LEVEL=SYS is left out of the server's environment; the card's other settings stay."""
    assert build_command(GLM5, LaunchConfig(), target=SOURCE_BOX).env["NCCL_P2P_LEVEL"] == "SYS"
    env = build_command(GLM5, LaunchConfig(env={"NCCL_P2P_DISABLE": "1"}), target=SOURCE_BOX).env
    assert env["NCCL_P2P_DISABLE"] == "1" and "NCCL_P2P_LEVEL" not in env
    assert env["NCCL_IB_DISABLE"] == "1"
    assert build_command(GLM5, LaunchConfig(env={"NCCL_P2P_DISABLE": "0"}),
                         target=SOURCE_BOX).env["NCCL_P2P_LEVEL"] == "SYS"


SM120_ENV = {"SGLANG_ENABLE_JIT_DEEPGEMM", "SGLANG_ENABLE_DEEP_GEMM", "NCCL_MIN_NCHANNELS"}
PCIE_ENV = {"NCCL_P2P_LEVEL", "NCCL_IB_DISABLE", "NCCL_MIN_NCHANNELS"}


def test_box_settings_are_set_only_where_their_condition_holds() -> None:
    """The card's SM120/PCIe settings (its source box's) are set on that box only: an NVLink
    H100 box gets none of them, an unknown box none either, and its notes name each one."""
    src = build_command(GLM5, LaunchConfig(), target=SOURCE_BOX)
    assert "--disable-custom-all-reduce" in src.argv and SM120_ENV | PCIE_ENV <= set(src.env)
    h100 = build_command(GLM5, LaunchConfig(), target=LaunchTarget("sm90", "t", "nvlink", "t"))
    assert "--disable-custom-all-reduce" not in h100.argv
    assert not (SM120_ENV | PCIE_ENV) & set(h100.env)
    assert not any(n.startswith("not set:") for n in h100.notes)  # not for it: nothing to say
    # a PCIe box of another architecture: the PCIe settings, not the SM120 ones
    ada = build_command(GLM5, LaunchConfig(), target=LaunchTarget("sm89", "t", "pcie", "t"))
    assert "--disable-custom-all-reduce" in ada.argv
    assert set(ada.env) == {"NCCL_P2P_LEVEL", "NCCL_IB_DISABLE"}
    # unknown: none set, each named in the notes
    unknown = build_command(GLM5, LaunchConfig())
    assert "--disable-custom-all-reduce" not in unknown.argv and not unknown.env
    said = [n for n in unknown.notes if n.startswith("not set:")]
    assert len(said) == len(GLM5.sglang.box_settings)
    assert any("--disable-custom-all-reduce (for PCIe-only boxes, S6" in n
               and "the box's fabric is unknown" in n for n in said)
    assert any("SGLANG_ENABLE_JIT_DEEPGEMM=0" in n and "architecture is unknown" in n
               for n in said)

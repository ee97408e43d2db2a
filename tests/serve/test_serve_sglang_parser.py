"""The generated GLM-5 command against the real argument parser of the pinned SGLang release.

.ci/run installs that release's wheel with --no-deps into its own directory
($PCIEPROF_SGLANG_PATH, default ~/.cache/pcieprof/sglang-<pinned>); without it the test skips.
Building SGLang's parser costs seconds (it imports torch), so the commands are parsed in one batch.
"""

from __future__ import annotations

import pytest

from pcieprof.cards import LaunchTarget, load_card
from pcieprof.errors import BadInput
from pcieprof.serve.sglang_cmd import (PINNED_SGLANG, LaunchConfig, build_command, load_parser,
                                       parse_many_with_sglang, sglang_search_path)
from pcieprof.tune.search import End, Search
from pcieprof.tune.space import FLAGS, SearchSpace

CARD = load_card("glm5-nvfp4")
MAIN = LaunchConfig(attention_backend="flashinfer", fp4_gemm_backend="flashinfer_cutlass",
                    moe_runner_backend="cutlass", dsa_prefill_backend="flashmla_kv",
                    dsa_decode_backend="flashmla_kv", cuda_graph=False, ep=8)
OLD = LaunchConfig(dp=2, dp_attention=True,
                   extra_args=("--nsa-decode-backend", "fa3", "--disable-cuda-graph",
                               "--cuda-graph-max-bs", "16", "--enable-flashinfer-allreduce-fusion"))


@pytest.fixture(scope="module")
def parsed():
    path = sglang_search_path()
    if path is None:
        pytest.skip(f"pinned SGLang {PINNED_SGLANG} parser not installed (see .ci/run)")
    spec = load_parser(path)
    if spec is None:
        pytest.skip(f"SGLang at {path} cannot build its parser here")
    # the card's own box (8x RTX PRO 6000, PCIe only), so its box settings are in the line too
    box = LaunchTarget(arch="sm120", arch_source="the card's", fabric="pcie",
                       fabric_source="the card's")
    cmds = [build_command(CARD, MAIN, parser=spec, target=box),
            build_command(CARD, OLD, parser=spec, target=box)]
    space = SearchSpace.from_card(CARD.name, CARD.search,
                                  choices=spec.choices([f for f in FLAGS.values() if f]),
                                  version=spec.version)
    steps = [st for st in Search(space).plan(12) if not isinstance(st, End)]
    sweep = [build_command(CARD, LaunchConfig().with_axes(st.config, "x"), parser=spec)
             for st in steps]
    results = parse_many_with_sglang([c.argv[3:] for c in cmds] + [["--tp-size", "x"]]
                                     + [c.argv[3:] for c in sweep], path)
    return spec, cmds, results, steps


def test_pinned_release_is_the_one_installed(parsed) -> None:
    spec, _, _, _ = parsed
    assert spec.version == PINNED_SGLANG
    # The renames this module translates exist as such in this release.
    assert spec.knows("--dsa-prefill-backend") and not spec.knows("--nsa-prefill-backend")
    assert spec.deprecated("--disable-cuda-graph")


def test_glm5_command_parses_with_real_sglang_parser(parsed) -> None:
    _, cmds, results, _ = parsed
    cmd, ns = cmds[0], results[0]
    assert cmd.checked_against == PINNED_SGLANG
    assert cmd.argv[1:3] == ["-m", "sglang.launch_server"]
    assert isinstance(ns, dict), ns
    assert ns["model_path"] == "nvidia/GLM-5-NVFP4"
    assert (ns["tp_size"], ns["ep_size"]) == (8, 8)
    assert ns["quantization"] == "modelopt_fp4" and ns["kv_cache_dtype"] == "bf16"
    assert ns["attention_backend"] == "flashinfer"
    assert ns["fp4_gemm_runner_backend"] == "flashinfer_cutlass"
    assert ns["moe_runner_backend"] == "cutlass"
    assert ns["dsa_prefill_backend"] == ns["dsa_decode_backend"] == "flashmla_kv"
    assert ns["cuda_graph_backend_decode"] == ns["cuda_graph_backend_prefill"] == "disabled"
    assert ns["host"] == "127.0.0.1" and ns["disable_custom_all_reduce"] is True
    # The parser itself rejects bad values (the batch's third entry).
    assert isinstance(results[2], str) and "--tp-size" in results[2]


def test_old_spellings_translated(parsed) -> None:
    _, cmds, results, _ = parsed
    cmd, ns = cmds[1], results[1]
    assert any("--nsa-decode-backend -> --dsa-decode-backend" in n for n in cmd.notes)
    assert isinstance(ns, dict), ns
    assert ns["dsa_decode_backend"] == "fa3"
    assert ns["cuda_graph_backend_decode"] == "disabled"
    assert ns["cuda_graph_max_bs_decode"] == 16
    assert ns["attn_dp_size"] == 2


def test_unknown_flags_and_values_refused(parsed) -> None:
    spec, _, _, _ = parsed
    with pytest.raises(BadInput, match="does not know --no-such-flag"):
        build_command(CARD, LaunchConfig(extra_args=("--no-such-flag",)), parser=spec)
    with pytest.raises(BadInput, match="not one of"):
        build_command(CARD, LaunchConfig(kv_cache_dtype="fp9"), parser=spec)


def test_glm5_search_commands_parse(parsed) -> None:
    # Every configuration of the launch search's plan is a command the pinned SGLang accepts,
    # with the values the search chose.
    _, _, results, steps = parsed
    sweep = results[3:]
    assert len(sweep) == len(steps) >= 8
    for ns, st in zip(sweep, steps):
        assert isinstance(ns, dict), (st.config, ns)
        assert ns["kv_cache_dtype"] == st.config["kv_cache_dtype"] and ns["tp_size"] == 8
        assert ns["attention_backend"] == st.config["attention_backend"]
        assert (ns["dsa_decode_backend"] or "") == st.config["dsa_decode_backend"]
        graphs = "disabled" if st.config["cuda_graph"] == "off" else None
        assert (ns["cuda_graph_backend_decode"] == "disabled") == (graphs == "disabled")
    assert steps[0].config["dsa_decode_backend"] == "trtllm"

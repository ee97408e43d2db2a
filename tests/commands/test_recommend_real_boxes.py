"""`recommend` on real imported boxes (the issue 22 audit): the launch line fits the box it is
printed for. Memory the bundle does not tell is the card's, said to be assumed; a card that
names no GPU (a config.json) leaves it unknown rather than 0 GiB; the card's default TP widens
to the narrowest TP that fits."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from builders.cli import cli

DATA = Path(__file__).resolve().parents[1] / "data"
CARD = DATA / "cards" / "gpt-oss-120b"
MORE = Path(__file__).resolve().parents[3] / "shared" / "samples" / "tool-outputs-more"


def _recommend(files: list[Path], tmp_path: Path, *card: str) -> str:
    out = tmp_path / "b"
    r = cli("import", *map(str, files), "--out", str(out), "-q")
    assert r.returncode == 0, r.stderr
    r = cli("recommend", str(out), *card)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    return r.stdout


def _tp(text: str) -> list[int]:
    return [int(m) for m in re.findall(r"sglang\.launch_server .*?--tp-size (\d+)", text)]


def test_unknown_memory_takes_the_cards_assumed_size(tmp_path: Path) -> None:
    # nvidia-smi -q of 2 GPUs whose names the excerpt cuts: GLM-5 NVFP4 at TP2 needs ~210 GiB
    # per GPU; such a box (a 2x RTX 2080 Ti before gpus.toml knew it) got a launch line with
    # "fit not checked"
    out = _recommend([DATA / "host_logs" / "smi_q_d_clock_2gpu_kepler_470.txt"], tmp_path)
    assert not _tp(out)
    assert re.search(r"at TP2: does not fit this box \(needs [\d.]+ GiB per GPU .* \(assumed: "
                     r"card glm5-nvfp4's gpu_memory_gib", out)


def test_older_products_are_known_by_name(tmp_path: Path) -> None:
    # gpus.toml rows for the products the real fixtures name: 2x RTX 2080 Ti is sm75, 11 GiB
    out = _recommend([DATA / "importers" / "nvbandwidth_2x2080ti_waived.txt"], tmp_path)
    assert "2x NVIDIA GeForce RTX 2080 Ti (sm75, 11.0 GiB each)" in out and not _tp(out)


def test_config_json_card_without_memory_is_not_zero_gib(tmp_path: Path) -> None:
    # 4 ranks of all-reduce rows, no GPU named: a config.json card names no GPU memory either;
    # every layout was "does not fit" at "has 0.0 GiB"
    out = _recommend([DATA / "importers" / "all_reduce_perf_rows_only_tinygrad_pr22.txt"],
                     tmp_path, "--model", str(CARD))
    assert "0.0 GiB" not in out and "does not fit" not in out and "nan" not in out
    # no compute anchor for gpt-oss-120b: the layouts are listed, not ranked, none launched
    assert _tp(out) == [] and "not ranked: no compute anchor for gpt-oss-120b" in out
    assert re.search(r"\n  TP4 +weights [\d.]+ GiB/GPU, fit not checked \(GPU memory unknown\)", out)


def test_default_tp_widens_to_the_narrowest_that_fits(tmp_path: Path) -> None:
    # 8x RTX 4090 (24 GiB each): gpt-oss-120b at the card's TP1 needs ~61 GiB; TP4 fits
    out = _recommend([DATA / "importers" / "nvbandwidth_8x4090_h2d_d2h.txt"], tmp_path,
                     "--model", str(CARD))
    assert _tp(out) == [4]
    assert "does not fit" not in out


def test_ada_box_gets_tp2_of_the_small_card(tmp_path: Path) -> None:
    files = sorted(MORE.glob("*rtx6000ada*"))
    if not files:
        pytest.skip("../shared/samples/tool-outputs-more absent")
    out = _recommend(files, tmp_path, "--model", str(CARD))
    assert _tp(out) == [2]  # 4x 48 GiB: TP1 needs ~61 GiB, TP2 ~31


def test_nvfp4_checkpoint_on_ampere_runs_through_marlin_and_says_so(tmp_path: Path) -> None:
    # 8x A100-SXM4-80GB (sm80 from the product name): GLM-5 NVFP4 at TP8 fits the memory and
    # SGLang 0.5.23 loads modelopt_fp4 from compute capability 8.0 (get_min_capability 80), but
    # its native FP4 GEMMs need 10.0: below it `auto` picks Marlin. The line carries that risk
    # and no Blackwell backend.
    out = _recommend([DATA / "importers" / "p2pbwlat_8xA100sxm4_ce_then_sm_copy_runs.txt"],
                     tmp_path)
    assert _tp(out) == [8]
    assert "RISK: --quantization modelopt_fp4 on sm80: SGLang's native kernels for it need " \
           "compute capability 10.0; below that it runs through marlin" in out
    sh = (tmp_path / "b" / "tune" / "sglang_command.sh").read_text()
    assert "launch_server" in sh and "flashinfer" not in sh


def test_nvfp4_is_refused_below_its_minimum_and_warned_below_its_native_kernels() -> None:
    # SGLang 0.5.23: modelopt_fp4 loads from compute capability 8.0; native GEMMs from 10.0
    from pcieprof.analysis.box import Box
    from pcieprof.tune.quant_arch import blocked, fallback

    def box(arch: str) -> Box:
        return Box(gpus=8, arch=arch, arch_source="test")

    assert "needs compute capability 8.0 or newer" in blocked("modelopt_fp4", box("sm70"))
    assert fallback("modelopt_fp4", box("sm70")) is None  # refused, not slowed
    assert blocked("modelopt_fp4", box("sm80")) == ""
    risk = fallback("modelopt_fp4", box("sm89"))
    assert risk is not None and "marlin" in risk.title
    assert fallback("modelopt_fp4", box("sm120")) is None and blocked("modelopt_fp4", box("sm120")) == ""


def test_nvfp4_on_unknown_architecture_says_to_check(tmp_path: Path) -> None:
    out = _recommend([DATA / "importers" / "topo_m_8xA100sxm4_no_nv_no_gpu_numa_id_nvb53.txt"],
                     tmp_path)
    assert _tp(out) == [8]
    assert "RISK: --quantization modelopt_fp4 needs compute capability 8.0 or newer; this " \
           "bundle does not tell the GPUs' architecture" in out
    assert "check: nvidia-smi --query-gpu=compute_cap --format=csv" in out


def test_failed_all_gather_is_not_called_a_hanging_all_reduce(tmp_path: Path) -> None:
    # nccl-tests all_gather_perf with wrong data (error rows, no hang) on a DGX-1: the rule
    # titled it "NCCL's default all-reduce hangs on this box"
    out = _recommend([DATA / "importers" /
                      "all_gather_perf_8xV100_oob_failed_then_topo_m_dgx1_nccltests37.txt"],
                     tmp_path)
    assert "NCCL's default all-gather fails on this box" in out
    assert "hangs" not in out


def test_custom_all_reduce_note_names_no_tp_the_box_lacks(tmp_path: Path) -> None:
    # 4x RTX A4000 (topo -m in an env report): was "At TP4/TP8 ..." and "the NCCL settings
    # above" with no NCCL setting above it
    out = _recommend([DATA / "importers" / "env_report_4xA4000_threadripper_topo_header_twice.md"],
                     tmp_path)
    assert "Above TP2 (4 GPUs here) SGLang sends every all-reduce through NCCL" in out
    assert "TP8" not in out and "settings above" not in out


def test_one_gpu_box_is_not_asked_for_pairs_or_layouts(tmp_path: Path) -> None:
    # nvidia-smi -q of a 1-GPU vGPU guest: was "would need measuring: P2P bandwidth/latency
    # between every GPU pair" and "parallel layouts not ranked"
    out = _recommend([DATA / "host_logs" / "smi_q_vgpu_guest_rtxa6000_24q_535_link_na.txt"],
                     tmp_path)
    assert "would need measuring" not in out and "every GPU pair" not in out


def test_bundle_without_gpus_names_no_0x_box(tmp_path: Path) -> None:
    out = _recommend([DATA / "host_logs" / "cmdline_proxmox_zfs_amd_iommu_on_pt_acs_override.txt"],
                     tmp_path)
    assert "0x GPU" not in out and "no launch line: this bundle shows no GPUs" in out


def test_concurrency_bound_on_assumed_memory_says_so(tmp_path: Path) -> None:
    # 16 ranks of nccl-tests 2.18.3 on 'NVIDIA Graphics Device' GPUs (no memory size): the
    # layouts' concurrency and MTP's KV room rest on the card's 96 GiB; printed unmarked before
    out = _recommend([DATA / "importers" / "all_reduce_perf_16x_2node_nccl_tests_2.18.3.txt"],
                     tmp_path)
    rows = [ln for ln in out.splitlines() if "max concurrency" in ln]
    # the assumed size is a range: nominal 96 GiB down to NVML's 97887 MiB (95.6 GiB)
    assert rows and all("(assumed 95.6-96 GiB/GPU)" in ln for ln in rows)
    assert any("TP8 " in ln and "max concurrency 33-34 " in ln for ln in rows)
    kv = [ln for ln in out.splitlines() if "KV room for" in ln]
    assert kv and all("assumed: card glm5-nvfp4's gpu_memory_gib (96 GiB nominal, 95.6 GiB as "
                      "NVML reports it (97887 MiB): range 95.6-96 GiB)" in ln for ln in kv)
    assert "fit uncertain" not in out  # 8K tokens: the verdict holds at both ends


def test_fit_inside_the_assumed_range_is_uncertain(tmp_path: Path) -> None:
    # the same box at 280,000 tokens of context: TP8's one request fits the card's nominal
    # 96 GiB and not the 95.6 GiB NVML reports on that GPU: neither "fits" nor "does not fit"
    out = _recommend([DATA / "importers" / "all_reduce_perf_16x_2node_nccl_tests_2.18.3.txt"],
                     tmp_path, "--context", "280000")
    tp8 = next(ln for ln in out.splitlines() if ln.strip().startswith("TP8 "))
    assert "fit uncertain, max concurrency 0-1 (assumed 95.6-96 GiB/GPU)" in tp8
    # the layout change it ranks first is priced on the card's memory, and says so
    assert "within the assumed GPU memory (95.6-96 GiB/GPU) at 280000 tokens" in out
    doc = (tmp_path / "b" / "recommendations.json").read_text()
    assert "TP8: fit uncertain: needs 81.5 GiB per GPU for the weights and one request's KV; " \
           "fits at 96.0 GiB (KV room for 1 request(s) per GPU), not at 95.6 GiB" in doc


def test_card_default_layout_inside_the_range_is_uncertain(tmp_path: Path) -> None:
    # topo -m of 8 unnamed GPUs, no layouts ranked: the launch line's own fit says it
    out = _recommend([DATA / "host_logs" / "topo_m_8xV100_pcie_2nic_same_box_as_dash_i.txt"],
                     tmp_path, "--context", "280000")
    assert _tp(out) == [8]
    assert "TP8: fit uncertain: needs 81.5 GiB per GPU" in out


def test_h100_box_knows_its_memory_from_the_product_name(tmp_path: Path) -> None:
    # sglang.check_env of 8x "NVIDIA H100 80GB HBM3": was "memory unknown each" (no gpus.toml
    # row for it); NVML prints 81559 MiB for that product (NVIDIA/nccl#1264), not 80 GiB
    out = _recommend([DATA / "importers" / "sglang_check_env_8xH100_nv18_8nic_sglang30401.txt"],
                     tmp_path)
    assert "8x NVIDIA H100 80GB HBM3 (sm90, 79.6 GiB each)" in out
    assert "81559 MiB, the total NVML reported for it in a real nvidia-smi paste; nominal 80 GB" \
        in out
    assert "TP8: fits: 55.3 GiB of weights per GPU, has 67.7 = 79.6 GiB x " \
           "--mem-fraction-static 0.85, KV room for 16 request(s) per GPU" in out
    assert "assumed" not in out.split("evidence: the box:")[1].splitlines()[0]
    assert _tp(out) == [8]


@pytest.mark.parametrize("name,box", [
    ("sglang_check_env_1xH100pcie_kvm_sglang24413.txt", "1x NVIDIA H100 PCIe (sm90, 79.6 GiB"),
    ("alltoall_perf_1x5090_command_line_nccltests287.txt",
     "1x NVIDIA GeForce RTX 5090 (sm120, 31.8 GiB"),
    ("sendrecv_perf_2node_a40_inplace_na_nccltests214.txt", "1x NVIDIA A40 (sm86, 45.0 GiB"),
])
def test_one_gpu_boxes_get_their_memory_and_no_launch_line(name: str, box: str,
                                                           tmp_path: Path) -> None:
    # GLM-5 NVFP4 needs ~416 GiB at TP1: "does not fit" against the product's NVML total
    out = _recommend([DATA / "importers" / name], tmp_path)
    assert box in out and not _tp(out)
    assert "glm5-nvfp4 at TP1: does not fit this box" in out and "assumed" not in out


def test_check_env_names_its_gpus_so_nvfp4_on_hopper_says_marlin(tmp_path: Path) -> None:
    # sglang.check_env of 8x H100 NV18: the product line above the matrix was dropped, so the
    # box was 'architecture unknown'; sm90 loads NVFP4 only through Marlin (SGLang 0.5.23)
    out = _recommend([DATA / "importers" / "sglang_check_env_8xH100_nv18_8nic_sglang30401.txt"],
                     tmp_path)
    assert "8x NVIDIA H100 80GB HBM3 (sm90" in out
    assert "RISK: --quantization modelopt_fp4 on sm90" in out and "runs through marlin" in out


def test_nothing_fits_names_the_widest_tp_the_box_holds(tmp_path: Path) -> None:
    # 2x RTX 4090: gpt-oss-120b fits neither TP1 nor TP2; the verdict was TP1's
    out = _recommend([DATA / "importers" / "p2pbwlat_2x4090_overflowing_columns.txt"], tmp_path,
                     "--model", str(CARD))
    assert "gpt-oss-120b at TP2: does not fit this box" in out and not _tp(out)


def test_report_of_unknown_memory_says_fit_not_checked(tmp_path: Path) -> None:
    # the report's layout table printed "yes", a concurrency of 64 and "0.0 GiB x 0.85 per GPU"
    _recommend([DATA / "importers" / "all_reduce_perf_rows_only_tinygrad_pr22.txt"], tmp_path,
               "--model", str(CARD))
    page = tmp_path / "r.html"
    r = cli("report", str(tmp_path / "b"), "-o", str(page), "-q")
    assert r.returncode == 0, r.stderr
    text = page.read_text()
    assert "GPU memory unknown: fit not checked" in text and "0.0 GiB x" not in text
    assert "<td>not checked</td>" in text


def test_launch_line_fitted_on_assumed_memory_says_so(tmp_path: Path) -> None:
    # topo -m of 8 unnamed GPUs: GLM-5 TP8 fits only the card's assumed 96 GiB
    _recommend([DATA / "host_logs" / "topo_m_8xV100_pcie_2nic_same_box_as_dash_i.txt"], tmp_path)
    doc = (tmp_path / "b" / "recommendations.json").read_text()
    assert "TP8: fits: " in doc and "(assumed: card glm5-nvfp4's gpu_memory_gib" in doc


#: The card's settings for its source box (8x RTX PRO 6000, SM120, PCIe, no NVLink).
SM120_ENV = ("SGLANG_ENABLE_JIT_DEEPGEMM=0", "SGLANG_ENABLE_DEEP_GEMM=0", "NCCL_MIN_NCHANNELS=8")
PCIE_ONLY = ("--disable-custom-all-reduce", "NCCL_P2P_LEVEL=SYS", "NCCL_IB_DISABLE=1")


def _launch_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if "sglang.launch_server" in ln]


def test_nvlink_hopper_box_gets_none_of_the_sm120_pcie_settings(tmp_path: Path) -> None:
    # sglang.check_env of 8x H100 NV18: the card's --disable-custom-all-reduce (custom AR is
    # SGLang's NVLink fast path), its DeepGEMM-off env (DeepGEMM is SGLang's FP8 GEMM on SM90)
    # and its PCIe NCCL settings were printed for this box too
    out = _recommend([DATA / "importers" / "sglang_check_env_8xH100_nv18_8nic_sglang30401.txt"],
                     tmp_path)
    lines = _launch_lines(out)
    sh = (tmp_path / "b" / "tune" / "sglang_command.sh").read_text()
    assert lines and "launch_server" in sh
    for word in SM120_ENV + PCIE_ONLY:
        assert all(word not in ln for ln in lines) and word not in sh, word
    # said once, with the reason, as the launch card's evidence (not a caveat: the box is known)
    doc = (tmp_path / "b" / "recommendations.json").read_text()
    assert "not set: --disable-custom-all-reduce (for PCIe-only boxes, S6, S7): this box has " \
           "NVLink (NVLink between every GPU pair" in doc
    assert "not set: SGLANG_ENABLE_JIT_DEEPGEMM=0 SGLANG_ENABLE_DEEP_GEMM=0 (for sm120 boxes" in doc
    assert "caveat: not set" not in out


def test_sm120_pcie_demo_box_keeps_every_setting_of_its_card(sim_vm_variants_bundle: Path,
                                                             tmp_path: Path) -> None:
    # the VM's all-reduce ran with NCCL_P2P_LEVEL=SYS too: the bundle priced it
    r = cli("recommend", str(sim_vm_variants_bundle), "--out", str(tmp_path / "b"), "-q")
    assert r.returncode == 0, r.stderr
    lines = _launch_lines(r.stdout)
    assert lines
    for word in SM120_ENV + PCIE_ONLY:
        assert all(word in ln for ln in lines), word
    assert "not set:" not in r.stdout


def test_a_box_that_did_not_price_the_cards_p2p_level_goes_without_it(
        sim_vm_bundle: Path, tmp_path: Path) -> None:
    """The quick plan runs NCCL's defaults only: the card's NCCL_P2P_LEVEL=SYS (the setting
    that can hang NCCL behind the VM's translating IOMMU) stays out of every line, said so."""
    r = cli("recommend", str(sim_vm_bundle), "--out", str(tmp_path / "b"), "-q")
    assert r.returncode == 0, r.stderr
    lines = _launch_lines(r.stdout)
    assert lines and all("NCCL_P2P_LEVEL" not in ln for ln in lines)
    for word in SM120_ENV + PCIE_ONLY:
        if word != "NCCL_P2P_LEVEL=SYS":
            assert all(word in ln for ln in lines), word
    assert "caveat: not set: NCCL_P2P_LEVEL=SYS, the card's, not checked on this box" in r.stdout


def test_box_whose_architecture_is_unknown_says_what_it_left_out(tmp_path: Path) -> None:
    # topo -m of 8 unnamed GPUs over PCIe: the fabric is known (no NV#), the architecture not
    out = _recommend([DATA / "host_logs" / "topo_m_8xV100_pcie_2nic_same_box_as_dash_i.txt"],
                     tmp_path)
    line = _launch_lines(out)[0]
    # NCCL_P2P_LEVEL=SYS needs an all-reduce of the box that priced it: topo -m has none
    assert all(word in line for word in PCIE_ONLY if word != "NCCL_P2P_LEVEL=SYS")
    assert "NCCL_P2P_LEVEL" not in line
    assert "caveat: not set: NCCL_P2P_LEVEL=SYS, the card's, not checked on this box" in out
    assert not any(word in line for word in SM120_ENV)
    assert "caveat: not set: SGLANG_ENABLE_JIT_DEEPGEMM=0 SGLANG_ENABLE_DEEP_GEMM=0 (for sm120 " \
           "boxes, S6, S13, S7): the box's architecture is unknown (no GPU named in the bundle)" \
           in out


def test_peak_that_moves_inside_the_assumed_range_is_said(tmp_path: Path) -> None:
    # 8,740 tokens of context: TP8 holds 32 requests at 96 GiB, 31 at 95.6 GiB, so its peak at
    # c=32 rests on the high end; the why says the low end's
    out = _recommend([DATA / "importers" / "all_reduce_perf_16x_2node_nccl_tests_2.18.3.txt"],
                     tmp_path, "--context", "8740")
    assert "max concurrency 31-32 (assumed 95.6-96 GiB/GPU)" in out
    assert "range of the assumed GPU memory (95.6-96 GiB/GPU): at 95.6 GiB, TP8 holds up to " \
           "c=31: 333 tok/s at c=16 (not 499 tok/s at c=32)" in out


def test_uncertain_fit_ranks_below_a_certain_one(tmp_path: Path) -> None:
    # 60,000 tokens: DP-attention8 has the highest peak but fits only the nominal 96 GiB
    out = _recommend([DATA / "importers" / "all_reduce_perf_16x_2node_nccl_tests_2.18.3.txt"],
                     tmp_path, "--context", "60000")
    rows = [ln.strip() for ln in out.split("parallel layouts (best first):")[1].splitlines()
            if ln.startswith("  ") and "weights" in ln]
    assert rows[0].startswith("PP2xTP4 ")
    dpa = next(ln for ln in rows if ln.startswith("TP8 DP-attention8"))
    assert "fit uncertain, max concurrency 0-8" in dpa

"""`pcieprof import FILE --out DIR`, `pcieprof recommend DIR --out COPY` and `pcieprof report COPY` on
every file of ../shared/samples (and on the files of one box imported together): what recommend
states for each, and no pair without P2P shown as 0 GB/s in its output, recommendations.json or
the report. The traces of ../shared/samples/traces are `pcieprof attribute` inputs (tested in
tests/analysis).

Each case names the findings the file's data call for (rule names, and words of the principal
bottleneck); the numbers inside them are checked against the files in test_tune_findings.py.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from builders.cli import cli


MORE = "tool-outputs-more"
TOOLS = "tool-outputs"
ASUS = "rtxpro6000-8x-asus-baremetal"
FINDINGS = {"p2p_data_errors", "p2p_asymmetry", "p2p_below_staged", "p2p_support_mismatch",
            "p2p_levels"}

NOT_ENOUGH = "not enough in this bundle to name a bottleneck"
#: case -> (files, {finding rule: kind}, words the principal bottleneck starts with)
CASES: dict[str, tuple[list[str], dict[str, str], str]] = {
    # tool-outputs
    "all_reduce_perf_6x4090": ([f"{TOOLS}/all_reduce_perf_6x4090_tinybox_p2p_patched_driver.txt"],
                               {}, "not named at decode sizes: the all-reduce was measured only "
                                   "from 32768 KiB up (6 ranks"),
    "nccl_debug_4x5060ti": ([f"{TOOLS}/nccl_debug_info_4x5060ti_p2p_cumem.log"], {}, NOT_ENOUGH),
    "nccl_graph_azure": ([f"{TOOLS}/nccl_graph_azure_ncv4_4xA100pcie_vm.xml"], {}, NOT_ENOUGH),
    "nccl_topo_azure": ([f"{TOOLS}/nccl_topo_azure_ncv4_4xA100pcie_vm.xml"], {}, NOT_ENOUGH),
    "p2pbwlat_5gpu": ([f"{TOOLS}/p2pbwlat_5gpu_5060ti_5070_gen3x4_p2p_patched.txt"],
                      {"p2p_levels": "warn"},
                      "GPU 0 has no working P2P with the other GPUs (peer access not supported)"),
    "topo_m_5gpu": ([f"{TOOLS}/topo_m_5gpu_5060ti_5070_proxmox_host.txt"],
                    {"p2p_levels": "info"}, NOT_ENOUGH),
    "topo_m_8x": ([f"{TOOLS}/topo_m_8x_rtxpro6000_server_baremetal_broadcom.txt"],
                  {"p2p_levels": "info"}, NOT_ENOUGH),
    "topo_p2p_rw_5gpu": ([f"{TOOLS}/topo_p2p_rw_5gpu_5060ti_5070_proxmox_host.txt"], {},
                         NOT_ENOUGH),
    # tool-outputs-more
    "topo_m_4x_ada": ([f"{MORE}/topo_m_4x_rtx6000ada_asus_esc8000a_e12_4nic.txt"],
                      {"p2p_levels": "info"}, NOT_ENOUGH),
    "p2pbwlat_2x4090": ([f"{MORE}/p2pbwlat_2x4090_trpro5995wx_driver525_p2p_reported_but_broken.txt"],
                        {"p2p_asymmetry": "warn", "p2p_below_staged": "warn"},
                        "P2P 0->1 moves 27.1 GB/s but 1->0 only 11.5 GB/s (2.4x)"),
    "simpleP2P_2x4090": ([f"{MORE}/simpleP2P_2x4090_trpro5995wx_driver525_nan_verification.txt"],
                         {"p2p_data_errors": "env"}, "P2P between GPUs is broken"),
    "p2pbwlat_4xA100_vm": ([f"{MORE}/p2pbwlat_4xA100pcie_vm_pci_domains_nvlink_pairs.txt"],
                           {"p2p_levels": "warn"},
                           "4 of 6 GPU pairs have no P2P (0-2, 0-3, 1-2, 1-3): their traffic "
                           "goes through host memory, 21.5 GB/s; P2P only within 0,1 | 2,3 "
                           "(NVLink 275 GB/s)"),
    "p2pbwlat_4x_ada": ([f"{MORE}/p2pbwlat_4x_rtx6000ada_asus_esc8000a_e12.txt"],
                        {"p2p_levels": "info"}, "slowest ring link 26.3 GB/s"),
    # the ASUS server's logs
    **{f"asus_{n}": ([f"{ASUS}/{n}.log"], {}, NOT_ENOUGH)
       for n in ("cmdline", "dmesg", "lscpu", "numa", "nvidia_smi_full")},
    "asus_lspci_full": ([f"{ASUS}/lspci_full.log"], {"p2p_levels": "info"}, NOT_ENOUGH),
    "asus_nvidia_topo": ([f"{ASUS}/nvidia_topo.log"], {"p2p_levels": "info"}, NOT_ENOUGH),
    # the files of one box, imported together
    "box_2x4090": ([f"{MORE}/p2pbwlat_2x4090_trpro5995wx_driver525_p2p_reported_but_broken.txt",
                    f"{MORE}/simpleP2P_2x4090_trpro5995wx_driver525_nan_verification.txt"],
                   {"p2p_data_errors": "env", "p2p_asymmetry": "warn", "p2p_below_staged": "warn"},
                   "P2P between GPUs is broken"),
    "box_5gpu": ([f"{TOOLS}/p2pbwlat_5gpu_5060ti_5070_gen3x4_p2p_patched.txt",
                  f"{TOOLS}/topo_m_5gpu_5060ti_5070_proxmox_host.txt",
                  f"{TOOLS}/topo_p2p_rw_5gpu_5060ti_5070_proxmox_host.txt"],
                 {"p2p_support_mismatch": "warn", "p2p_levels": "warn"},
                 "GPU 0 has no working P2P with the other GPUs (peer access not supported)"),
    "box_4x_ada": ([f"{MORE}/p2pbwlat_4x_rtx6000ada_asus_esc8000a_e12.txt",
                    f"{MORE}/topo_m_4x_rtx6000ada_asus_esc8000a_e12_4nic.txt"],
                   {"p2p_levels": "info"}, "slowest ring link 26.3 GB/s"),
    "box_asus_logs": ([f"{ASUS}/{n}" for n in ("lspci_full.log", "nvidia_smi_full.log",
                                               "nvidia_topo.log", "numa.log", "cmdline.log",
                                               "lscpu.log", "dmesg.log")],
                      {"p2p_levels": "info"}, NOT_ENOUGH),
}

#: A pair's bandwidth printed as zero: what a pair without P2P must never be shown as.
ZERO_GBPS = re.compile(r"(?<![\d.])0(?:\.0+)? ?GB/s")


def test_every_shared_tool_output_has_a_case(samples: Path) -> None:
    named = {f for files, _, _ in CASES.values() for f in files}
    on_disk = {f"{d}/{p.name}" for d in (TOOLS, MORE, ASUS) for p in (samples / d).iterdir()
               if p.is_file() and p.name != "SOURCES.md"}
    assert on_disk <= named, f"shared files without a recommend case: {sorted(on_disk - named)}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_recommend_states_what_the_data_shows(samples: Path, tmp_path: Path, case: str) -> None:
    files, findings, bottleneck = CASES[case]
    r = cli("import", *(str(samples / f) for f in files), "--out", str(tmp_path / "b"), "-q")
    assert r.returncode == 0, r.stderr
    r = cli("recommend", str(tmp_path / "b"), "--out", str(tmp_path / "rec"), "-q")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert not (tmp_path / "b" / "recommendations.json").exists()  # --out left it untouched
    doc = json.loads((tmp_path / "rec" / "recommendations.json").read_text())
    assert doc["bottleneck"].startswith(bottleneck), doc["bottleneck"]
    found = {r["rule"]: r["kind"] for r in doc["recommendations"] if r["rule"] in FINDINGS}
    assert found == findings
    for r in doc["recommendations"]:
        if r["rule"] in FINDINGS:
            assert r["evidence"], r["rule"]
            assert r["kind"] == "env" or r["action"] or r["rule"] == "p2p_levels", r["rule"]
    assert f"principal bottleneck: {doc['bottleneck']}" in out
    assert cli("report", str(tmp_path / "rec"), "-q").returncode == 0
    html = (tmp_path / "rec" / "report.html").read_text()
    for where, text in (("recommend output", out),
                        ("recommendations.json", json.dumps(doc)), ("report", html)):
        hit = ZERO_GBPS.search(text)
        assert hit is None, f"{where}: {text[max(0, hit.start() - 120):hit.end()]}"
    _launch_fits_the_box(tmp_path / "rec", doc)
    if doc["ring"] is not None:
        assert doc["ring"]["bottleneck_gbps"] > 0
    for lv in (doc["inferred"] or {}).get("levels", []):
        assert lv["value"] is None or lv["value"] > 0


#: The word that makes a line an SGLang launch (pcieprof.serve.sglang_cmd's module).
LAUNCH = "sglang.launch_server"
GIB = 1 << 30


def _launch_lines(bundle: Path, doc: dict) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    """(where, line) of every SGLang launch recommend wrote: each recommendation's action, each
    layout's command and tune/sglang_command.sh."""
    out = [(f"recommendation {r['rule']}", ln) for r in doc["recommendations"]
           for ln in (r["action"] or "").splitlines() if LAUNCH in ln and not ln.startswith("#")]
    out += [(f"layout {lay['label']}", lay["command"]) for lay in doc["layouts"] or []
            if lay.get("command")]
    script = bundle / "tune" / "sglang_command.sh"
    if script.is_file():
        out += [("tune/sglang_command.sh", ln) for ln in script.read_text().splitlines()
                if LAUNCH in ln and not ln.startswith("#")]
    return out


def _launch_fits_the_box(bundle: Path, doc: dict) -> int:  # type: ignore[type-arg]
    """No SGLang launch line (each recommendation's action, the MTP card's included, each
    layout's command, tune/sglang_command.sh) names more GPUs than the box has, runs a layout
    that does not fit its GPU memory (with the MTP layer's weights where the line turns MTP on),
    or backends of an architecture the card has no evidence for (issue 22 pt 2). Returns how
    many lines were checked."""
    from pcieprof.analysis.box import box_of
    from pcieprof.bundle import Bundle
    from pcieprof.cards import load_card
    from pcieprof.tune import speculative
    box = box_of(Bundle.open(bundle))
    card = load_card(doc["model"])
    lines = _launch_lines(bundle, doc)
    for where, line in lines:
        flags = shlex.split(line)

        def value(flag: str, default: str = "1") -> str:
            return flags[flags.index(flag) + 1] if flag in flags else default

        tp, pp, ep = int(value("--tp-size")), int(value("--pp-size")), int(value("--ep-size"))
        attn_dp, replicas = "--attn-dp-size" in flags, int(value("--dp-size"))
        # --dp-size without attention DP: one TP x PP group per replica (SGLang's DP controller)
        assert tp * pp * replicas <= max(box.gpus, 1), f"{where}: {line}"
        if box.arch not in ("sm120", "sm100"):
            assert "--attention-backend" not in flags and "--dsa-decode-backend" not in flags, \
                f"{where}: {line}"
        lay = next((lay for lay in doc["layouts"] or [] if (lay["tp"], lay["pp"], lay["ep"],
                    lay["dp_attention"], lay["replicas"]) == (tp, pp, ep, attn_dp, replicas)),
                   None)
        if lay is None:  # no layouts ranked (--no-layouts): the GPU count is what is known
            assert not doc["layouts"], f"{where}: no layout runs {line}"
            continue
        assert lay["fits"], f"{where}: {lay['label']} does not fit: {line}"
        if box.memory_bytes is not None and lay["gpu_memory_gib_low"] is None:
            assert lay["gpu_memory_gib"] == pytest.approx(box.memory_bytes / GIB, abs=0.05)
        fraction = float(value("--mem-fraction-static", str(lay["mem_fraction"])))
        assert fraction == pytest.approx(lay["mem_fraction"]), f"{where}: {line}"
        weights, kv = lay["weights_gib"], lay["kv_gib_per_request"]
        if "--speculative-algorithm" in flags:  # the MTP layer's weights and KV on top
            f = speculative.facts(card)
            assert f is not None, f"{where}: MTP for {card.name}, which has no MTP layer"
            weights += speculative.mtp_bytes(card, float(f["mtp_dtype_bytes"])) / (tp * pp) / GIB
            kv *= 1 + card.mtp_layers / max(card.num_layers, 1)
        # an assumed memory's high end (its low end only makes the fit uncertain, and says so)
        room = lay["gpu_memory_gib"] * fraction
        assert weights + kv <= room, (f"{where}: needs {weights + kv:.1f} GiB per GPU for the "
                                      f"weights and one request's KV, has {room:.1f}")
    for rec in doc["recommendations"]:
        if rec["action"] and LAUNCH in rec["action"]:
            assert "does not fit" not in rec["title"], rec["title"]
    return len(lines)


@pytest.mark.parametrize("profile", ["rtxpro6000-8x-vm", "rtxpro6000-8x-switch"])
def test_the_demo_boxes_launch_lines_fit(demo_bundles: dict[str, Path], tmp_path: Path,
                                         profile: str) -> None:
    """The demo's boxes: every launch line (the MTP card's +2.3 GiB included) fits the box; a
    box with less memory than the MTP line needs makes the check fail."""
    r = cli("recommend", str(demo_bundles[profile]), "--out", str(tmp_path / "rec"), "-q")
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "rec" / "recommendations.json").read_text())
    mtp = next(rec for rec in doc["recommendations"] if rec["rule"] == "speculative_mtp")
    assert "--speculative-algorithm" in mtp["action"]
    checked = _launch_fits_the_box(tmp_path / "rec", doc)
    # the launch card's and the MTP card's lines, every layout that fits, and the script's
    assert checked >= 3 + sum(1 for lay in doc["layouts"] if lay["fits"])
    # the check is not vacuous: the top layout's memory just above its own fit, below MTP's
    top = doc["layouts"][0]
    kv = top["kv_gib_per_request"]
    tight = dict(top, gpu_memory_gib=(top["weights_gib"] + kv + 0.5) / top["mem_fraction"],
                 gpu_memory_gib_low=0.0)  # a "range": the box's measured memory not compared
    with pytest.raises(AssertionError, match="speculative_mtp: needs"):
        _launch_fits_the_box(tmp_path / "rec", dict(doc, layouts=[tight, *doc["layouts"][1:]]))

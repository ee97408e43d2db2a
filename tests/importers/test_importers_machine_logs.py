"""`pcieprof import` of one real server's logs (lspci -vvv, nvidia-smi -q, topo -m, cmdline): one
topology with 8 GPUs, four switch uplinks to four root ports, Gen5 x16, ACS of every bridge, IOMMU
off. The discovery parsers live in pcieprof.discover; this checks the import puts them together."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from builders.cli import cli

from pcieprof.bundle import Bundle

BOX = "rtxpro6000-8x-asus-baremetal"
LOGS = ("lspci_full.log", "nvidia_smi_full.log", "nvidia_topo.log", "cmdline.log")


@pytest.fixture(scope="module")
def bundle(samples: Path, tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    pytest.importorskip("pcieprof.discover.from_logs")
    out = tmp_path_factory.mktemp("asus") / "bundle"
    r = cli("import", *[str(samples / BOX / f) for f in LOGS], "--out", str(out), "-q")
    assert r.returncode == 0, r.stderr
    return Bundle.open(out)


def acs_ctl_in_lspci(text: str) -> dict[str, dict[str, bool]]:
    """ACSCtl bits per device, read straight from the lspci text (independent of the parser)."""
    out: dict[str, dict[str, bool]] = {}
    bdf = None
    for line in text.splitlines():
        m = re.match(r"^([0-9a-f]{4}:)?([0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ", line)
        if m:
            bdf = (m.group(1) or "0000:") + m.group(2)
        elif bdf and line.strip().startswith("ACSCtl:"):
            out[bdf] = {k: v == "+" for k, v in re.findall(r"(\w+)([+-])", line.split(":", 1)[1])}
    return out


def test_one_bundle_from_the_four_logs(bundle: Bundle, samples: Path) -> None:
    m = bundle.manifest
    assert (m.source, m.backend, m.status) == ("imported", "imported", "ok")
    assert [f["format"] for f in bundle.part("import").extra["files"]] == [
        "lspci", "nvidia-smi-q", "nvidia-smi-topo-m", "cmdline"]
    for f in LOGS:
        assert (bundle.path / "imported" / f).read_bytes() == (samples / BOX / f).read_bytes()
    assert m.versions["driver"] == "595.58.03"


def test_eight_gpus_gen5_x16(bundle: Bundle) -> None:
    topo = bundle.read_json("topology.json")
    assert topo["source"] == "imported"
    gpus = topo["gpus"]
    assert [g["index"] for g in gpus] == list(range(8))
    assert {g["name"] for g in gpus} == {"NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    for g in gpus:
        assert (g["pcie"]["gen_max"], g["pcie"]["width_max"], g["pcie"]["width_current"]) == (5, 16, 16)
    nodes = {n["bdf"]: n for n in topo["pcie_tree"]["nodes"]}
    for g in gpus:
        link = nodes[g["bus_id"]]["link"]
        assert (link["cap_gen"], link["cap_width"]) == (5, 16)


def test_four_switch_uplinks_and_root_ports(bundle: Bundle) -> None:
    topo = bundle.read_json("topology.json")
    nodes = {n["bdf"]: n for n in topo["pcie_tree"]["nodes"]}
    paths = topo["pcie_tree"]["gpu_paths"]
    assert len(paths) == 8
    uplinks = {p[-2] for p in paths.values()}
    roots = {p[-1] for p in paths.values()}
    assert uplinks == {"0000:01:00.0", "0000:71:00.0", "0000:81:00.0", "0000:f1:00.0"}
    assert roots == {"0000:00:01.1", "0000:70:01.1", "0000:80:01.1", "0000:f0:01.1"}
    for u in uplinks:
        assert nodes[u]["kind"] == "switch_upstream" and "PEX890xx" in nodes[u]["description"]
        assert (nodes[u]["link"]["gen"], nodes[u]["link"]["width"]) == (5, 16)
        assert nodes[nodes[u]["parent"]]["kind"] == "root_port"
    # two GPUs behind each uplink, as topo -m's PIX pairs say
    level = {(p["a"], p["b"]): p["level"] for p in topo["pairs"]}
    for a, b in ((0, 1), (2, 3), (4, 5), (6, 7)):
        assert paths[str(a)][-2] == paths[str(b)][-2] and level[(a, b)] == "PIX"
    assert level[(0, 4)] == "SYS" and level[(1, 3)] == "NODE"


def test_acs_bits_of_every_bridge(bundle: Bundle, samples: Path) -> None:
    expected = acs_ctl_in_lspci((samples / BOX / "lspci_full.log").read_text())
    nodes = {n["bdf"]: n for n in bundle.read_json("topology.json")["pcie_tree"]["nodes"]}
    bridges = [b for b, n in nodes.items()
               if n["kind"] in ("root_port", "switch_upstream", "switch_downstream", "bridge")]
    checked = 0
    for bdf in bridges:
        if bdf in expected:
            assert nodes[bdf]["acs"]["ctl"] == expected[bdf], bdf
            checked += 1
        else:
            assert nodes[bdf]["acs"] is None, bdf  # no ACS capability printed for it
    assert checked >= 24  # every downstream port of the four virtual switches, and the root ports
    gpu_parent = nodes["0000:06:00.0"]["parent"]
    assert nodes[gpu_parent]["acs"]["ctl"]["ReqRedir"] is expected[gpu_parent]["ReqRedir"]


def test_iommu_off(bundle: Bundle) -> None:
    iommu = bundle.read_json("topology.json")["iommu"]
    assert (iommu["enabled"], iommu["mode"]) == (False, "off")
    assert "iommu=off" in iommu["cmdline"]


def test_two_lspci_logs_refused(samples: Path, tmp_path: Path) -> None:
    f = samples / BOX / "lspci_full.log"
    copy = tmp_path / "other.log"
    copy.write_bytes(f.read_bytes())
    r = cli("import", str(f), str(copy), "--out", str(tmp_path / "b"))
    assert r.returncode != 0
    assert "a second lspci -vvv log" in r.stderr

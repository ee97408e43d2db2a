"""`lspci -t` tree views of other boxes (tests/data/host_logs, sources in its NOTE.md): the tree
read into the same PCIe tree `lspci -vvv` gives, or one line saying what to run instead. Each test
asserts what the source shows, read by eye."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcieprof.discover.from_logs import topology_from_logs
from pcieprof.discover.lspci_tree import parse_lspci_tree
from pcieprof.discover.pcie_tree import build_tree, derive_level
from pcieprof.errors import BadInput
from pcieprof.importers.formats import detect, parse_text

DATA = Path(__file__).resolve().parents[1] / "data" / "host_logs"
TITANX = "lspci_tv_4x_titanx_two_plx_pex8747_elided_rows_prompt.txt"
NO_NAMES = "lspci_t_no_names_2x5090_amd_switch_sudo_note.txt"
B300_VM = "lspci_tv_b300_vm_root_bus_per_gpu_comments_elided.txt"


def _text(name: str) -> str:
    return (DATA / name).read_text()


def test_tv_two_plx_switches_give_gpu_paths_and_pix_phb_levels() -> None:
    devices = parse_lspci_tree(_text(TITANX))
    by = {d.bdf: d for d in devices}
    # the blog's reading: 04:00 (a TITAN X) sits on 03:08.0, a port of the PEX 8747 at 02:00.0,
    # which hangs below root port 00:02.0 (bus range 02-05)
    assert by["0000:04:00.0"].parent == "0000:03:08.0"
    assert by["0000:03:08.0"].parent == "0000:02:00.0"
    assert by["0000:02:00.0"].parent == "0000:00:02.0"
    assert (by["0000:00:02.0"].secondary_bus, by["0000:00:02.0"].subordinate_bus) == (2, 5)
    assert by["0000:04:00.1"].device == "GP102 HDMI Audio Controller"
    assert not by["0000:04:00.1"].is_nvidia_gpu  # the audio function is no GPU
    tree = build_tree(devices)
    assert tree["gpu_paths"]["0"] == ["0000:04:00.0", "0000:03:08.0", "0000:02:00.0",
                                      "0000:00:02.0"]
    assert tree["summary"]["switch_upstream"] == ["0000:02:00.0", "0000:06:00.0"]
    assert all(n.get("kind_inferred") for n in tree["nodes"] if n["kind"] != "gpu"
               and n["kind"] != "endpoint")  # the tree view prints no port type
    # one PEX 8747 per pair: PIX inside a pair, PHB across (both root ports on bus 00)
    assert derive_level(tree, 0, 1, {}) == "PIX" and derive_level(tree, 2, 3, {}) == "PIX"
    assert derive_level(tree, 0, 2, {}) == "PHB"
    # the poster's `+-...` rows (devices left out) are skipped, not errors; bus ff is a root too
    assert "0000:ff:08.0" in by and len(devices) == 20


def test_tv_imported_as_machine_log_with_what_it_lacks() -> None:
    assert detect(_text(TITANX)) == "lspci-tree"
    parsed = parse_text(_text(TITANX), TITANX)
    assert parsed.facts["gpus_by_name"] == 4
    assert any("NUMA node" in w for w in parsed.facts["warnings"])
    topo = topology_from_logs(lspci_tree=_text(TITANX))
    assert topo["status"]["lspci"].startswith("ok: lspci -tv, the tree only")
    assert [g["bus_id"] for g in topo["gpus"]] == ["0000:04:00.0", "0000:05:00.0",
                                                   "0000:08:00.0", "0000:09:00.0"]


def test_t_without_names_is_one_line_saying_what_to_run() -> None:
    assert detect(_text(NO_NAMES)) == "lspci-tree"
    devices = parse_lspci_tree(_text(NO_NAMES))
    by = {d.bdf: d for d in devices}
    # the switch below 00:02.1: upstream 04:00.0, downstream ports 05:xx.0 with endpoints
    assert by["0000:06:00.0"].parent == "0000:05:00.0"
    assert by["0000:05:0d.0"].parent == "0000:04:00.0"
    assert (by["0000:00:02.1"].secondary_bus, by["0000:00:02.1"].subordinate_bus) == (4, 0x10)
    with pytest.raises(BadInput) as e:
        parse_text(_text(NO_NAMES), NO_NAMES)
    assert "without -v" in e.value.message and "lspci -tv" in (e.value.hint or "")


@pytest.mark.parametrize("text", [
    "-[0000:00]-+-00.0  Intel\n           +-zz.q  broken\n",
    "-[0000:00]-+-00.0  Intel\nsome prose in the middle\n",
])
def test_broken_tree_line_is_one_line_with_its_number(text: str) -> None:
    with pytest.raises(BadInput) as e:
        parse_lspci_tree(text, source="t.txt")
    assert e.value.message.startswith("t.txt:2:")


def test_tv_vm_root_bus_per_gpu_with_the_posters_notes_and_elisions() -> None:
    devices = parse_lspci_tree(_text(B300_VM))
    by = {d.bdf: d for d in devices}
    # the author's reading: GPU0 (85:00.0) and mlx5_0/mlx5_1 (86:00.0/.1) share root bus 80,
    # one branch through bridges to the GPU, the other straight to the two VFs
    assert by["0000:85:00.0"].is_nvidia_gpu and by["0000:85:00.0"].device == "GB110 [B300 SXM6 AC]"
    assert by["0000:86:00.0"].parent == by["0000:86:00.1"].parent == "0000:82:01.0"
    assert by["0000:82:01.0"].parent == by["0000:82:00.0"].parent == "0000:81:00.0"
    assert by["0000:86:00.0"].class_code == 0x0200  # a NIC by its name: kept in the tree
    tree = build_tree(devices)
    assert tree["gpu_paths"]["0"][-1] == "0000:80:00.0" and tree["gpu_paths"]["1"][-1] == (
        "0000:88:00.0")  # GPU2-7 were left out by the poster (`... (GPU2~GPU7 ...)`)
    assert {n["bdf"] for n in tree["nodes"]} >= {"0000:86:00.0", "0000:c3:00.3"}
    assert derive_level(tree, 0, 1, {}) is None  # two root buses: NUMA decides, not in -tv

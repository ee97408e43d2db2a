"""The declarative fabric: shipped profiles, validation errors, topology.json, and the switch
profile checked against the real server's lspci and nvidia-smi topo logs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pcieprof.errors import BadInput
from pcieprof.sim.fabric import list_profiles, load_profile, pair_level, raw_link_gbps, topology

PROFILES = ["generic-8x-pcie4", "rtxpro6000-8x-direct", "rtxpro6000-8x-switch", "rtxpro6000-8x-vm"]


def test_shipped_profiles_load() -> None:
    assert list_profiles() == PROFILES
    for name in PROFILES:
        f = load_profile(name)
        assert [g.index for g in f.gpus] == list(range(8))


def test_gen5_x16_line_rate() -> None:
    assert raw_link_gbps(5, 16) == pytest.approx(63.0, abs=0.05)
    assert raw_link_gbps(4, 16) == pytest.approx(31.5, abs=0.05)


def _lspci_blocks(text: str) -> dict[str, str]:
    blocks = {}
    for block in text.split("\n\n"):
        m = re.match(r"([0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f])\s", block)
        if m:
            blocks[m.group(1)] = block
    return blocks


def test_switch_profile_matches_the_real_server_logs(samples: Path) -> None:
    box = samples / "rtxpro6000-8x-asus-baremetal"
    f = load_profile("rtxpro6000-8x-switch")
    blocks = _lspci_blocks((box / "lspci_full.log").read_text(encoding="utf-8", errors="replace"))
    gpus = sorted(bdf for bdf, b in blocks.items() if "3D controller: NVIDIA" in b)
    assert [g.bdf[5:] for g in f.gpus] == gpus  # NVML order is PCI bus order
    for g in f.gpus:  # each GPU's downstream port has the GPU's bus as its secondary bus
        port = blocks[g.port_bdf[5:]]
        assert f"secondary={g.bdf[5:7]}" in port and "PEX890xx" in port
    for sw in f.switches.values():
        up = blocks[sw.bdf[5:]]
        rp = blocks[f.root_ports[sw.upstream].bdf[5:]]
        assert f"secondary={sw.bdf[5:7]}" in rp and "LnkSta:\tSpeed 32GT/s, Width x16" in rp
        serial = re.search(r"Device Serial Number (\S+)", up).group(1)
        assert serial in f.chips[sw.chip].name  # chip grouping from the switch serial numbers
    # ACS redirect off everywhere in the log, as in the profile
    assert "ReqRedir+ CmpltRedir+" not in "".join(
        ln for ln in (box / "lspci_full.log").read_text(errors="replace").splitlines() if "ACSCtl" in ln)
    assert not any(sw.acs_redirect for sw in f.switches.values())
    # nvidia-smi topo -m levels, cell by cell
    rows = [ln.split("\t") for ln in (box / "nvidia_topo.log").read_text().splitlines()
            if ln.startswith("GPU")]
    for a, row in enumerate(rows):
        for b in range(8):
            assert row[1 + b].strip() == pair_level(f, a, b), (a, b)
    assert "iommu=off" in (box / "cmdline.log").read_text() and f.iommu_mode == "off"


def test_vm_profile_extends_the_switch_box() -> None:
    vm, bare = load_profile("rtxpro6000-8x-vm"), load_profile("rtxpro6000-8x-switch")
    assert [g.bdf for g in vm.gpus] == [g.bdf for g in bare.gpus]
    assert vm.iommu_mode == "translated" and vm.virtualization.guest_view == "flat"
    assert all(sw.acs_redirect for sw in vm.switches.values())
    assert {pair_level(vm, 0, b, guest=True) for b in range(1, 8)} == {"PHB"}
    assert pair_level(vm, 0, 1) == "PIX"  # the real tree is still there


def test_topology_json_flat_guest_and_real_tree_kept() -> None:
    topo = topology(load_profile("rtxpro6000-8x-vm"))
    assert topo["source"] == "simulated"
    assert topo["virtualization"]["flat_pcie_tree"] is True and topo["iommu"]["mode"] == "translated"
    kinds = {n["kind"] for n in topo["pcie_tree"]["nodes"]}
    assert "switch_upstream" not in kinds and len(topo["pcie_tree"]["gpu_paths"]) == 8
    real = topo["sim"]["real_pcie_tree"]
    assert sum(n["kind"] == "switch_upstream" for n in real["nodes"]) == 4
    assert real["gpu_paths"]["0"] == ["0000:06:00.0", "0000:02:03.0", "0000:01:00.0", "0000:00:01.1"]
    assert {p["level"] for p in topo["pairs"]} == {"PHB"}
    assert len(topo["pairs"]) == 56
    bare = topology(load_profile("rtxpro6000-8x-switch"))
    assert bare["gpus"][4]["numa_node"] == 1 and bare["gpus"][0]["bus_id"] == "0000:06:00.0"
    acs = [n["acs"]["ctl"]["ReqRedir"] for n in bare["pcie_tree"]["nodes"] if n["acs"]]
    assert acs and not any(acs)


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "box.toml"
    p.write_text(text, encoding="utf-8")
    return p


BASE = """
name = "mine"
[[socket]]
id = 0
[[root_port]]
id = "rp0"
socket = 0
[[gpu]]
index = 0
bdf = "0000:01:00.0"
parent = "rp0"
"""


def test_a_minimal_user_file_loads(tmp_path: Path) -> None:
    f = load_profile(_write(tmp_path, BASE))
    assert f.name == "mine" and f.gpus[0].gen == 5 and f.iommu_mode == "off"


@pytest.mark.parametrize("edit, key", [
    (BASE.replace('parent = "rp0"', 'parent = "nope"'), "gpu[0].parent"),
    (BASE.replace("[[socket]]", "colour = 1\n[[socket]]"), "colour"),
    (BASE + '[iommu]\nmode = "sometimes"\n', "iommu.mode"),
    (BASE.replace('id = "rp0"\nsocket = 0', 'id = "rp0"\nsocket = 0\ngen = 9'), "root_port[0].gen"),
    (BASE.replace("socket = 0", "socket = 3"), "root_port[0].socket"),
    (BASE + '[virtualization]\nguest_view = "flat"\n', "virtualization.guest_view"),
    (BASE.replace("index = 0", "index = 2"), "gpu"),
    (BASE + "[[socket]]\nid = 1\n", "inter_socket"),
    (BASE + '[virtualization]\nbare_metal_twin = "x"\n', "virtualization.bare_metal_twin"),
    (BASE + '[[mechanism]]\nid = "m"\ntitle = "t"\ntext = "x"\nsources = []\n', "mechanism[0].sources"),
    (BASE + '[[host_change]]\nid = "h"\ntitle = "t"\nhow = "x"\nrisk = "r"\nsources = ["s"]\n'
            'apply = { "iommu.mode" = "sometimes" }\n', "host_change[0].apply.iommu.mode"),
    (BASE + '[[host_change]]\nid = "h"\ntitle = "t"\nhow = "x"\nrisk = "r"\nsources = ["s"]\n'
            'apply = { "gpu.count" = 4 }\n', "host_change[0].apply.gpu.count"),
    (BASE + '[[known_issue]]\nid = "k"\nwhen = "always"\ntitle = "t"\ntext = "x"\nsources = ["s"]\n',
     "known_issue[0].when"),
])
def test_bad_fabric_files_name_file_and_key(tmp_path: Path, edit: str, key: str) -> None:
    path = _write(tmp_path, edit)
    with pytest.raises(BadInput) as err:
        load_profile(path)
    msg = err.value.one_line()
    assert msg.startswith(f"{path}: {key}:") and "\n" not in msg


def test_unknown_profile_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="unknown sim profile"):
        load_profile("no-such-box")
    with pytest.raises(BadInput, match="not valid TOML"):
        load_profile(_write(tmp_path, "name = \n"))


def test_extends_a_profile_or_a_sibling_file(tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text('extends = "rtxpro6000-8x-switch"\nname = "mine"\n[iommu]\nmode = "passthrough"\n')
    f = load_profile(mine)
    assert f.name == "mine" and f.iommu_mode == "passthrough" and len(f.switches) == 4
    child = tmp_path / "child.toml"
    child.write_text('extends = "mine.toml"\nname = "child"\n[acs]\nredirect = true\n')
    c = load_profile(child)
    assert c.iommu_mode == "passthrough" and all(sw.acs_redirect for sw in c.switches.values())
    loop = tmp_path / "loop.toml"
    loop.write_text('extends = "loop.toml"\nname = "loop"\n')
    with pytest.raises(BadInput, match="circular"):
        load_profile(loop)


def test_apply_changes_makes_the_host_side_change() -> None:
    from pcieprof.sim.fabric import apply_changes

    vm = load_profile("rtxpro6000-8x-vm")
    host = apply_changes(vm, {"virtualization.is_vm": False, "iommu.mode": "off", "acs.redirect": False})
    assert not host.virtualization.is_vm and host.virtualization.guest_view == "real"
    assert host.iommu_mode == "off" and not any(sw.acs_redirect for sw in host.switches.values())
    assert vm.iommu_mode == "translated" and all(sw.acs_redirect for sw in vm.switches.values())
    with pytest.raises(BadInput):
        apply_changes(vm, {"iommu.mode": "sometimes"})

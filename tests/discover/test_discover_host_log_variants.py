"""Machine logs of other boxes, as people paste them (tests/data/host_logs, sources in its NOTE.md):
nvidia-smi -q of vGPU guests and hosts, of `-i N` runs and of indented pastes with prompts; numactl
-H with --cpu-compress and CPU-less (HBM/GPU memory) nodes; lscpu of AMD NPS4 and GH200; dmesg
IOMMU lines. Each test asserts what the source shows, read by eye."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcieprof.discover.from_logs import topology_from_logs
from pcieprof.discover.lspci import parse_lspci
from pcieprof.discover.pcie_tree import build_tree
from pcieprof.discover.smi_query import parse_smi_query
from pcieprof.discover.system import hypervisor_state, iommu_state, numa_nodes
from pcieprof.errors import BadInput
from pcieprof.importers.formats import detect, parse_text

DATA = Path(__file__).resolve().parents[1] / "data" / "host_logs"


def _text(name: str) -> str:
    return (DATA / name).read_text()


def test_vgpu_guest_link_is_unknown_not_zero() -> None:
    # a prompt with a colon before the banner (user@host:~$) is the command, not the output
    q = parse_smi_query(_text("smi_q_vgpu_guest_rtxa6000_24q_535_link_na.txt"))
    assert (q["driver_version"], q["cuda_version"], q["attached_gpus"]) == ("535.183.06", "12.2", 1)
    (g,) = q["gpus"]
    assert (g["bus_id"], g["name"]) == ("0000:00:10.0", "NVIDIA RTXA6000-24Q")
    assert (g["virtualization_mode"], g["virtualization_mode_raw"]) == ("vgpu", "VGPU")
    assert set(g["pcie"].values()) == {None}  # every link field is N/A in the guest
    assert (g["memory_bytes"], g["bar1_bytes"]) == (24576 * 2**20, 256 * 2**20)


def test_host_vgpu_sriov_cuda_not_found_is_no_version() -> None:
    q = parse_smi_query(_text("smi_q_dash_i_0_of_4_A16_host_vgpu_sriov_470_cuda_not_found.txt"))
    assert (q["driver_version"], q["cuda_version"], q["attached_gpus"]) == ("470.129.04", None, 4)
    (g,) = q["gpus"]
    assert (g["bus_id"], g["virtualization_mode"]) == ("0000:13:00.0", "host_vgpu")
    # idle A16: Gen1 x4 now, Gen4 x16 possible
    assert (g["pcie"]["gen_current"], g["pcie"]["gen_max"]) == (1, 4)
    assert (g["pcie"]["width_current"], g["pcie"]["width_max"]) == (4, 16)


def test_indented_paste_with_prompts_around_it() -> None:
    text = _text("smi_q_head_T4_aws_g4dn_470_indented_prompts.txt")
    assert detect(text) == "nvidia-smi-q"
    q = parse_smi_query(text)
    assert (q["driver_version"], q["cuda_version"], q["attached_gpus"]) == ("470.82.01", "11.4", 1)
    assert [(g["bus_id"], g["name"]) for g in q["gpus"]] == [("0000:00:1e.0", "Tesla T4")]


def test_a_line_inside_a_gpu_section_must_still_be_key_value() -> None:
    # a shell prompt ends the output only back at the margin; inside a section it is an error
    with pytest.raises(BadInput, match=r"x:3: expected 'Key : Value'"):
        parse_smi_query("GPU 00000000:06:00.0\n    Product Name : A\n    user@h:~$ ls\n", source="x")


@pytest.mark.parametrize("name, shown, attached", [
    ("smi_q_dash_i_1_of_8_V100_pcie_470.txt", 1, 8),
    ("smi_q_dash_i_0_of_4_A16_host_vgpu_sriov_470_cuda_not_found.txt", 1, 4),
])
def test_dash_i_output_is_refused_naming_the_cause(name: str, shown: int, attached: int) -> None:
    # `nvidia-smi -q -i 1` holds GPU 1 of 8 but nothing in it says it is index 1
    q = parse_smi_query(_text(name))
    assert (len(q["gpus"]), q["attached_gpus"]) == (shown, attached)
    with pytest.raises(BadInput, match=rf"{attached} GPU sections .*found {shown}: .*-i/--id"):
        parse_text(_text(name), name)


def test_topo_m_of_the_dash_i_box_reads_eight_gpus_two_switches() -> None:
    p = parse_text(_text("topo_m_8xV100_pcie_2nic_same_box_as_dash_i.txt"), "topo.txt")
    assert p.facts["gpus"] == 8
    assert p.pair_levels[(0, 3)] == "PIX" and p.pair_levels[(3, 4)] == "NODE"
    assert p.facts["levels"] == {"PIX": 24, "NODE": 32}  # ordered pairs: 2 x (6 + 6), 2 x 16


def test_numactl_cpu_compress_ranges() -> None:
    n = numa_nodes(None, numa=_text("numactl_H_cpu_compress_2x_epyc9135.txt"))
    assert n == {"nodes": [{"id": 0, "cpus": "0-15"}, {"id": 1, "cpus": "16-31"}], "status": "ok"}


def test_numactl_nodes_without_cpus_are_kept() -> None:
    n = numa_nodes(None, numa=_text("numactl_H_16_nodes_spr_hbm_nodes_without_cpus.txt"))
    assert [x["id"] for x in n["nodes"]] == list(range(11))  # the excerpt stops inside node 10
    assert n["nodes"][0]["cpus"] == "0-11,96-107" and n["nodes"][7]["cpus"] == "84-95,180-191"
    assert {x["cpus"] for x in n["nodes"][8:]} == {""}


def test_lscpu_amd_siena_eight_nodes() -> None:
    text = _text("lscpu_epyc_8434p_siena_8_numa_nodes.txt")
    assert detect(text) == "lscpu"
    n = numa_nodes(None, lscpu=text)
    assert len(n["nodes"]) == 8
    assert n["nodes"][0]["cpus"] == "0-5,48-53" and n["nodes"][7]["cpus"] == "42-47,90-95"


def test_lscpu_gh200_one_cpu_node_and_eight_gpu_memory_nodes() -> None:
    n = numa_nodes(None, lscpu=_text("lscpu_numa_section_gh200_9_nodes_8_without_cpus.txt"))
    assert [x["id"] for x in n["nodes"]] == list(range(9))
    assert [x["cpus"] for x in n["nodes"]] == ["0-71"] + [""] * 8


def test_dmesg_iommu_groups_mean_enabled() -> None:
    s = iommu_state(None, dmesg=_text("dmesg_adding_to_iommu_group_amd_host.txt"))
    assert (s["enabled"], s["mode"]) == (True, "unknown")
    assert "Adding to iommu group 18" in s["evidence"][-1]


def test_dmesg_command_line_stands_in_for_proc_cmdline() -> None:
    s = iommu_state(None, dmesg=_text("dmesg_grep_dmar_and_command_line_intel_iommu_on.txt"))
    assert s["enabled"] is True and "intel_iommu=on" in s["cmdline"]
    assert "cmdline: intel_iommu=on" in s["evidence"]


def test_dmesg_interrupt_remapping_alone_is_not_an_enabled_iommu() -> None:
    s = iommu_state(None, dmesg=_text("dmesg_grep_dmar_no_iommu_on_cmdline_empty_grep.txt"))
    assert (s["enabled"], s["mode"]) == (None, "unknown")
    assert "interrupt remapping only" in s["evidence"][-1]


def test_lspci_v_of_a_qemu_guest_numa_and_iommu_groups_from_flags() -> None:
    # `lspci -v` prints "Flags: ..., NUMA node 1, IOMMU group 6" instead of own lines
    text = _text("lspci_v_qemu_q35_guest_pxb_pcie_2_numa_viommu_prompt.txt")
    assert detect(text) == "lspci"
    devs = {d.bdf: d for d in parse_lspci(text, source="x")}
    assert len(devs) == 23
    roots = sorted(b for b, d in devs.items() if d.port_type == "root_port")
    assert roots == ["0000:02:00.0", "0000:02:01.0", "0000:02:02.0",
                     "0000:80:00.0", "0000:80:01.0", "0000:80:02.0"]
    # expander bridges (pxb-pcie) put bus 02 on node 0 and bus 80 on node 1
    assert {devs[b].numa_node for b in roots[:3]} == {0} and {devs[b].numa_node for b in roots[3:]} == {1}
    assert (devs["0000:81:00.0"].parent, devs["0000:81:00.0"].numa_node) == ("0000:80:00.0", 1)
    assert devs["0000:81:00.0"].iommu_group == 9 and devs["0000:02:00.0"].iommu_group == 12
    assert devs["0000:00:1d.7"].iommu_group == 4 and devs["0000:00:00.0"].numa_node is None
    tree = build_tree(list(devs.values()), all_devices=True)
    kinds = {n["bdf"]: n["kind"] for n in tree["nodes"]}
    assert kinds["0000:80:02.0"] == "root_port" and kinds["0000:83:00.0"] == "endpoint"


def test_lspci_vv_pasted_with_spaces_prompt_and_ellipsis() -> None:
    text = _text("lspci_vv_aws_nitro_root_port_spaces_sudo_prompt_ellipsis.txt")
    assert detect(text) == "lspci"  # spaces where lspci prints tabs
    (d,) = parse_lspci(text, source="x")
    assert (d.bdf, d.port_type, d.numa_node, d.driver) == ("0000:01:00.0", "root_port", 0, "pcieport")
    assert (d.secondary_bus, d.subordinate_bus) == (0x02, 0x43)
    assert (d.speed_gts, d.width, d.cap_speed_gts, d.cap_width, d.downgraded) == (16.0, 16, 16.0, 16, False)


def test_lspci_prose_line_is_still_an_error() -> None:
    with pytest.raises(BadInput, match="expected an lspci device header"):
        parse_lspci("00:01.0 PCI bridge: X\n\tNUMA node: 0\nsee the output above\n", source="x")


def test_lspci_mail_wrapped_at_78_columns_keeps_the_acs_bits() -> None:
    # a mailer wrapped the header, the LnkCap line and both ACS lines onto column 0
    text = _text("lspci_vvvv_mail_wrapped_pericom_switch_downstream_acs.txt")
    assert detect(text) == "lspci"
    (d,) = parse_lspci(text, source="x")
    assert d.bdf == "0000:02:01.0" and d.port_type == "downstream"
    assert d.device == "Pericom Semiconductor PI7C9X2G404 EV/SV PCIe2 4-Port/4-Lane Packet Switch"
    assert (d.secondary_bus, d.speed_gts, d.width, d.cap_speed_gts, d.cap_width) == (3, 2.5, 1, 2.5, 1)
    assert d.acs_cap == dict.fromkeys(d.acs_cap, True)
    assert d.acs_ctl == {"SrcValid": True, "TransBlk": False, "ReqRedir": True, "CmpltRedir": True,
                         "UpstreamFwd": True, "EgressCtrl": False, "DirectTrans": False}


def test_lspci_terminal_wrapped_at_80_columns_mid_word() -> None:
    (d,) = parse_lspci(_text("lspci_vvv_terminal_wrapped_80_qemu_root_port_proxmox_guest.txt"),
                       source="x")
    assert (d.bdf, d.vendor, d.device) == ("0000:00:02.0", "Red Hat, Inc.", "QEMU PCIe Root port")
    assert (d.port_type, d.secondary_bus, d.subordinate_bus) == ("root_port", 1, 1)


def test_cmdline_acs_override_is_evidence() -> None:
    text = _text("cmdline_proxmox_zfs_amd_iommu_on_pt_acs_override.txt")
    assert detect(text) == "cmdline"
    s = iommu_state(None, cmdline=text)
    # the cmdline alone cannot say the IOMMU came up (amd_iommu=on is no proof); it says what
    # was asked and that the groups are the override's
    assert (s["enabled"], s["mode"]) == (None, "unknown")
    assert "cmdline: iommu=pt" in s["evidence"]
    (acs,) = [e for e in s["evidence"] if "pcie_acs_override" in e]
    assert acs.startswith("cmdline: pcie_acs_override=downstream,multifunction (")
    # with the groups of a dmesg the same cmdline reads as passthrough
    s = iommu_state(None, cmdline=text, dmesg=_text("dmesg_adding_to_iommu_group_amd_host.txt"))
    assert (s["enabled"], s["mode"]) == (True, "passthrough")


def test_guest_logs_make_a_vm_topology_with_two_numa_nodes() -> None:
    t = topology_from_logs(lspci=_text("lspci_v_qemu_q35_guest_pxb_pcie_2_numa_viommu_prompt.txt"),
                           numa=_text("numactl_hardware_qemu_q35_guest_2_nodes.txt"))
    assert (t["virtualization"]["is_vm"], t["virtualization"]["hypervisor"]) == (True, "QEMU/KVM")
    assert "QEMU PCIe Expander bridge" in t["virtualization"]["evidence"][0]
    assert t["numa"] == {"nodes": [{"id": 0, "cpus": "0-3"}, {"id": 1, "cpus": "4-7"}], "status": "ok"}
    # the guest's virtual IOMMU (-device intel-iommu) made the groups lspci prints
    assert t["iommu"]["enabled"] is True and "23 devices have IOMMU groups" in t["iommu"]["evidence"][-1]
    assert t["gpus"] == []  # virtio GPUs are no NVIDIA GPUs


def test_display_filtered_output_reads_gpus_and_warns_of_no_pci_section() -> None:
    p = parse_text(_text("smi_q_d_clock_2gpu_kepler_470.txt"), "clock.txt")
    assert [(g.index, g.bus_id, g.name) for g in p.gpus] == [(0, "0000:06:00.0", None),
                                                           (1, "0000:07:00.0", None)]
    (w,) = p.facts["warnings"]
    assert "0000:06:00.0, 0000:07:00.0 has no PCI section" in w
    # a vGPU guest has a PCI section whose link fields are all N/A: no such warning
    assert "warnings" not in parse_text(_text("smi_q_vgpu_guest_rtxa6000_24q_535_link_na.txt"),
                                        "g.txt").facts


def test_lspci_in_a_quoted_printable_mail_indented_with_a_pci_domain() -> None:
    # a raw linux-pci message: `=3D` for `=`, `=` ending a line that goes on; all indented by 2
    text = _text("lspci_vv_mail_quoted_printable_indented_amd_gpu_domain_000d_arm64.txt")
    assert detect(text) == "lspci"
    (d,) = parse_lspci(text, source="x")
    assert (d.bdf, d.vendor_id, d.port_type) == ("000d:03:00.0", "1002", "legacy_endpoint")
    assert d.device == "Navi 33 [Radeon RX 7600/7600 XT/7600M XT/7600S/7700S / PRO W7600]"
    assert (d.numa_node, d.iommu_group, d.driver) == (0, 21, "amdgpu")
    assert (d.speed_gts, d.width, d.cap_speed_gts, d.cap_width) == (16.0, 8, 16.0, 8)
    assert d.acs_ctl == dict.fromkeys(d.acs_ctl, False) and len(d.acs_ctl) == 7


def test_lscpu_flags_wrapped_by_the_terminal_still_show_the_hypervisor_flag() -> None:
    # "hypervisor" sits on the 6th line of a Flags value lscpu wrapped mid-word at 80 columns
    s = hypervisor_state(None, lscpu=_text(
        "lscpu_vm_icelake_flags_wrapped_hypervisor_on_a_continuation_line.txt"))
    assert (s["is_vm"], s["evidence"]) == (True, ["cpu flag: hypervisor"])


@pytest.mark.parametrize("name, evidence", [
    # dmesg -T (wall-clock stamps) and journalctl -k (syslog prefix): both kernel logs
    ("dmesg_T_wallclock_adding_to_iommu_group.txt", "pci 0000:00:1e.0: Adding to iommu group 13"),
    ("journalctl_k_dmar_force_enabled_platform_opt_in.txt",
     "DMAR: Intel-IOMMU force enabled due to platform opt in"),
])
def test_kernel_logs_with_other_timestamps(name: str, evidence: str) -> None:
    text = _text(name)
    assert detect(text) == "dmesg"  # was no format: only "[ 12.345]" stamps were known
    s = iommu_state(None, dmesg=text)
    assert (s["enabled"], s["mode"]) == (True, "unknown")
    assert s["evidence"][-1].endswith(evidence)


def test_lspci_paste_that_begins_inside_a_device() -> None:
    # the ACS lines at the top belong to a device whose header the poster left out
    text = _text("lspci_vvv_fragment_from_mid_device_plx_pex8725_acs_rk3588.txt")
    (d,) = parse_lspci(text, source="x")
    assert (d.bdf, d.vendor_id, d.secondary_bus, d.acs_ctl) == ("0000:02:08.0", "10b5", 0x82, None)
    assert d.device.startswith("PEX 8725 24-Lane, 10-Port PCI Express Gen 3")
    p = parse_text(text, "frag.txt")
    assert any("starts inside a device" in w for w in p.facts["warnings"])


def test_mig_mode_and_mig_devices_are_read_per_gpu() -> None:
    # a VM's H100 NVL right after `nvidia-smi -i 0 -mig 1`, the paste cut after `MIG Mode`
    q = parse_smi_query(_text("smi_q_h100nvl_vm_mig_enabled_vgpu_550_cut_after_mig_mode.txt"))
    (g,) = q["gpus"]
    assert (g["bus_id"], g["name"]) == ("0000:98:00.0", "NVIDIA H100 NVL")
    assert g["mig"] == {"current": "Enabled", "pending": "Enabled", "devices": 0}
    # a MIG device's own `FB Memory Usage` does not shadow the GPU's (97887 MiB, not 23680)
    q = parse_smi_query(_text("smi_q_gpu_section_rtxpro6000_server_mig_device_trimmed.txt"))
    (g,) = q["gpus"]
    assert g["mig"] == {"current": "Enabled", "pending": "Enabled", "devices": 1}
    assert g["memory_bytes"] == 97887 * 2**20
    q = parse_smi_query(_text("smi_q_dash_i_1_of_8_V100_pcie_470.txt"))
    assert q["gpus"][0]["mig"]["current"] is None  # a V100 has no MIG: N/A


def test_mig_enabled_import_says_p2p_and_nccl_differ() -> None:
    name = "smi_q_h100nvl_vm_mig_enabled_vgpu_550_cut_after_mig_mode.txt"
    parsed = parse_text(_text(name), name)
    assert parsed.facts["mig"] == {"0000:98:00.0": {"current": "Enabled", "pending": "Enabled",
                                                    "devices": 0}}
    (w,) = [w for w in parsed.facts["warnings"] if "MIG" in w]
    assert "no GPU-to-GPU P2P" in w and "0000:98:00.0" in w
    assert parsed.summary.endswith("MIG enabled on 1 of them")

"""NCCL_TOPO_FILE from the host's tree the user gives (issue 22 point 5: only from a tree
pcieprof has seen): `recommend --host-lspci FILE` reads the real `lspci -vvv` of the 8x RTX PRO
6000 box (../shared/samples, read in place) for a VM bundle of that box whose guest sees a flat
tree; the simulated VM stands in for the guest, its profile's own copy of the host tree removed,
as a measured guest has none."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from builders.cli import cli

from pcieprof.bundle import Bundle
from pcieprof.bundle.recommendations import Recommendations


def _guest(sim_vm_bundle: Path, dst: Path) -> Path:
    shutil.copytree(sim_vm_bundle, dst)
    topo = json.loads((dst / "topology.json").read_text())
    del topo["sim"]["real_pcie_tree"]  # what the guest itself could not see
    (dst / "topology.json").write_text(json.dumps(topo))
    return dst


def test_topo_file_from_the_hosts_lspci(samples: Path, sim_vm_bundle: Path,
                                        tmp_path: Path) -> None:
    lspci = samples / "rtxpro6000-8x-asus-baremetal" / "lspci_full.log"
    b = _guest(sim_vm_bundle, tmp_path / "vm")
    r = cli("recommend", str(b), "-q")
    assert r.returncode == 0, r.stderr
    assert not (b / "tune" / "nccl_topo.xml").exists()
    assert "--host-lspci FILE" in r.stdout  # what to give instead

    r = cli("recommend", str(b), "--host-lspci", str(lspci), "-q")
    assert r.returncode == 0, r.stderr
    xml = (b / "tune" / "nccl_topo.xml").read_text()
    # the real box: two sockets, each with two Broadcom switches of two GPUs (nvidia_topo.log:
    # PIX within a pair, NODE across pairs, SYS across sockets)
    cpus = re.findall(r'<cpu numaid="(\d+)">', xml)
    assert cpus == ["0", "1"]
    switches = re.findall(r'class="0x060400"', xml)
    assert len(switches) == 4
    doc = Bundle.open(b).read_doc(Recommendations)
    assert doc is not None
    rec = next(x for x in doc.recommendations if x.rule == "topo_file")
    assert "0,1 | 2,3 | 4,5 | 6,7" in rec.gain_text
    assert any("lspci_full.log" in e for e in rec.evidence)
    # this guest is the simulated VM, whose model prices the real tree (9.88 -> 12.19 ms with
    # NCCL's defaults): the file is written, to measure with, not offered
    assert rec.kind == "info" and not rec.env and str(b / "tune" / "nccl_topo.xml") in rec.action
    assert any(c.startswith("assumed: guest GPU i is the host's i-th GPU") for c in rec.caveats)
    assert (b / "tune" / "host_pcie_tree.json").is_file()  # kept: the report recomputes from it


def test_lspci_tree_view_and_other_files_are_one_line(sim_vm_bundle: Path,
                                                      tmp_path: Path) -> None:
    b = _guest(sim_vm_bundle, tmp_path / "vm")
    tree = tmp_path / "lspci_t.txt"
    tree.write_text("-[0000:00]-+-00.0  Advanced Micro Devices, Inc. [AMD] Root Complex\n"
                    "           +-01.1-[01-06]----00.0-[02-06]--+-03.0-[06]----00.0  NVIDIA "
                    "Corporation Device 2bb5\n")
    r = cli("recommend", str(b), "--host-lspci", str(tree))
    assert r.returncode == 2 and "`lspci -t` output" in r.stderr and "Traceback" not in r.stderr
    # a real `lspci -tv` paste (tests/data/host_logs): the tree without NUMA nodes, one line too
    real = Path(__file__).resolve().parents[1] / "data" / "host_logs" / (
        "lspci_tv_4x_titanx_two_plx_pex8747_elided_rows_prompt.txt")
    r = cli("recommend", str(b), "--host-lspci", str(real))
    assert r.returncode == 2 and "`lspci -t` output" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "lspci -vvv" in r.stderr
    other = tmp_path / "notes.txt"
    other.write_text("hello\n")
    r = cli("recommend", str(b), "--host-lspci", str(other))
    assert r.returncode == 2 and "not `lspci -vvv` output" in r.stderr



def test_a_topo_file_no_longer_recommended_is_removed(samples: Path, sim_vm_bundle: Path,
                                                       tmp_path: Path) -> None:
    """recommend's save removes the tune/ files an earlier run wrote that the new result does
    not name: here the host tree given before is taken away (it was the wrong box's), so the
    new run has no tree to describe, and a topo file left behind would read as this run's."""
    lspci = samples / "rtxpro6000-8x-asus-baremetal" / "lspci_full.log"
    b = _guest(sim_vm_bundle, tmp_path / "vm")
    assert cli("recommend", str(b), "--host-lspci", str(lspci), "-q").returncode == 0
    assert (b / "tune" / "nccl_topo.xml").is_file()
    Bundle.open(b).remove("tune/host_pcie_tree.json")
    r = cli("recommend", str(b), "-q")
    assert r.returncode == 0, r.stderr
    assert not (b / "tune" / "nccl_topo.xml").exists()
    assert "tune/nccl_topo.xml" not in json.loads((b / "manifest.json").read_text())["files"]
    named = "".join((b / f).read_text() for f in (Recommendations.FILE, "tune/recommended.env",
                                                  "tune/sglang_command.sh"))
    assert "nccl_topo.xml" not in named + r.stdout
    for name in ("nccl_graph.xml", "nccl_tuner.conf"):  # what is left is named
        assert not (b / "tune" / name).exists() or name in named

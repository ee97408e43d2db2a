"""The box a bundle describes: GPU count, architecture (NVML, else the product table), memory."""

from __future__ import annotations

import pytest

from pcieprof.analysis.box import GIB, arch_of, box_from, product
from pcieprof.bundle.topology import Gpu, Topology


def _topo(names: list[str], **extra: object) -> Topology:
    return Topology(gpus=[Gpu(index=i, name=n, extra=dict(extra)) for i, n in enumerate(names)])


MIB = 1 << 20


@pytest.mark.parametrize("name,arch,mib", [
    # NVML's total from a real paste where gpus.toml has one (its row cites it), in MiB
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "sm120", 97887),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "sm120", 97887),
    ("NVIDIA GeForce RTX 5090", "sm120", 32607),
    ("NVIDIA B200", "sm100", 183359),
    ("NVIDIA H200", "sm90", 143771),
    ("NVIDIA H200 NVL", "sm90", 143771),
    ("NVIDIA H20", "sm90", 97871),
    ("NVIDIA H100 80GB HBM3", "sm90", 81559),
    ("NVIDIA H100 PCIe", "sm90", 81559),
    ("NVIDIA H100 NVL", "sm90", 95830),
    ("NVIDIA L40S", "sm89", 46068),
    ("NVIDIA GeForce RTX 4090", "sm89", 24564),
    ("NVIDIA RTX 6000 Ada Generation", "sm89", 49140),
    ("NVIDIA A40", "sm86", 46068),
    ("NVIDIA RTX A4000", "sm86", 16376),
    ("NVIDIA A100 80GB PCIe", "sm80", 81920),       # the longer match wins over "A100"
    ("NVIDIA A100-SXM4-40GB", "sm80", 40960),
    ("NVIDIA A100-PCIE-40GB", "sm80", 40960),
])
def test_product_names_give_architecture_and_nvml_memory(name: str, arch: str, mib: int) -> None:
    box = box_from(_topo([name] * 4))
    assert (box.gpus, box.arch) == (4, arch)
    assert box.memory_bytes == mib * MIB
    assert "gpus.toml" in box.arch_source
    assert f"{mib} MiB, the total NVML reported" in box.memory_source
    assert box.memory_low_bytes is None  # a product's own number, not an assumed range


def test_nominal_size_is_said_to_be_nominal() -> None:
    # no NVML paste for the Max-Q edition: its nominal 96 GB, said so
    box = box_from(_topo(["NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"]))
    assert box.memory_bytes == 96 * GIB and "nominal size 96 GB" in box.memory_source


@pytest.mark.parametrize("name", ["NVIDIA GH200 480GB", "NVIDIA GB200", "NVIDIA H100", "NVIDIA RTX A400",
                                  "NVIDIA RTX PRO 6000D Blackwell Workstation Edition"])
def test_names_another_product_extends_do_not_borrow_its_memory(name: str) -> None:
    # "H200" inside "GH200 480GB" (96 GB), "B200" inside "GB200", "A40" inside "RTX A400": the
    # longest match, or an exact one, decides; a name that does not tell the size leaves it
    box = box_from(_topo([name]))
    assert box.memory_bytes is None


def test_mixed_products_take_the_smallest_memory() -> None:
    box = box_from(_topo(["NVIDIA H100 NVL", "NVIDIA H100 PCIe"]))
    assert box.memory_bytes == 81559 * MIB and "'NVIDIA H100 PCIe'" in box.memory_source


def test_a_name_that_does_not_tell_the_memory_leaves_it_unknown() -> None:
    box = box_from(_topo(["NVIDIA GeForce RTX 5060 Ti"]))
    assert box.arch == "sm120" and box.memory_bytes is None
    assert "does not tell" in box.memory_source


def test_unknown_products_have_no_architecture() -> None:
    box = box_from(_topo(["Some Future GPU"] * 2))
    assert box.arch == "" and "not in gpus.toml" in box.arch_source
    assert box_from(Topology(), p2p_gpus=3).gpus == 3  # counted from p2p.csv


def test_nvml_compute_capability_and_memory_win_over_the_name() -> None:
    topo = _topo(["NVIDIA GeForce RTX 4090"], compute_capability="12.0")
    topo.gpus[0].memory_bytes = 10 << 30
    box = box_from(topo)
    assert box.arch == "sm120" and "NVML" in box.arch_source
    assert box.memory_bytes == 10 << 30 and "NVML" in box.memory_source
    assert arch_of("8.9") == "sm89" and product(None) is None


def _pairs(n: int, level: str, source: str | None, **p2p: str) -> Topology:
    from pcieprof.bundle.topology import Pair
    return Topology(gpus=[Gpu(index=i) for i in range(n)],
                    pairs=[Pair(a=a, b=b, level=level, level_source=source, p2p=dict(p2p))
                           for a in range(n) for b in range(n) if a != b])


def test_fabric_is_read_only_from_views_that_show_nvlink() -> None:
    from pcieprof.analysis.box import fabric_of
    assert fabric_of(_pairs(4, "NV12", "topo -m"), 4)[0] == "nvlink"
    assert fabric_of(_pairs(4, "SYS", "topo -m"), 4)[0] == "pcie"
    # topo -mp hides NVLink; NVML's common-ancestor level is a PCIe path: neither tells
    assert fabric_of(_pairs(4, "SYS", "topo -mp"), 4) == (
        "", "the pair levels come from nvidia-smi topo -mp, which hides NVLink")
    assert fabric_of(_pairs(4, "SYS", "nvml"), 4)[0] == ""
    # ... unless NVML's NVLink P2P status answers for every pair
    assert fabric_of(_pairs(4, "SYS", "nvml", nvlink="NS"), 4)[0] == "pcie"
    assert fabric_of(_pairs(4, "SYS", "nvml", nvlink="OK"), 4)[0] == "nvlink"
    assert fabric_of(_pairs(1, "SYS", "topo -m"), 1)[0] == ""


def test_nvlink_between_some_pairs_is_neither_kind_of_box() -> None:
    # 4x RTX 3090 with two NVLink bridges (a real topo -m, tests/data/importers): pairs 0-1 and
    # 2-3 are NV4, the rest PCIe; SGLang counts a box as NVLink only when every pair is
    from pcieprof.analysis.box import fabric_of
    from pcieprof.bundle.topology import Pair
    topo = _pairs(4, "PHB", "topo -m")
    topo.pairs = [Pair(a=p.a, b=p.b, level="NV4" if {p.a, p.b} in ({0, 1}, {2, 3}) else "PHB",
                       level_source="topo -m", p2p={}) for p in topo.pairs]
    fabric, why = fabric_of(topo, 4)
    assert fabric == "" and why.startswith("NVLink between only 2 of 6 GPU pairs")

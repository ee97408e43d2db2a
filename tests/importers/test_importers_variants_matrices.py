"""p2pBandwidthLatencyTest and simpleP2P as pasted: each variant made from a real file gives the
rows the real file gives."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from pcieprof.importers.formats import detect
from pcieprof.importers.formats import parse_text

DATA = Path(__file__).resolve().parents[1] / "data" / "importers"
FILES = ["tool-outputs-more/p2pbwlat_4xA100pcie_vm_pci_domains_nvlink_pairs.txt",
         "tool-outputs-more/p2pbwlat_2x4090_trpro5995wx_driver525_p2p_reported_but_broken.txt",
         "tool-outputs/p2pbwlat_5gpu_5060ti_5070_gen3x4_p2p_patched.txt"]

VARIANTS: dict[str, Callable[[str], str]] = {
    "crlf": lambda t: t.replace("\n", "\r\n"),
    "prompt_and_fence": lambda t: ("```\nuser@box:~/cuda-samples/build$ ./p2pBandwidthLatencyTest\n"
                                   + t + "```\nThat was the run.\n"),
    "indented": lambda t: "".join("    " + l for l in t.splitlines(True)),
    "tabs_to_spaces": lambda t: t.expandtabs(8),
    "editor_line_numbers": lambda t: "".join(f"{k:3d} {l}" for k, l in
                                             enumerate(t.splitlines(True), start=1)),
}


def rows(parsed) -> list[tuple]:
    return [(r.src, r.dst, r.path, r.direction, r.bandwidth_gbps, r.latency_us, r.status)
            for r in parsed.p2p]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("rel", FILES)
def test_p2pbwlat_variants(samples: Path, rel: str, variant: str) -> None:
    text = (samples / rel).read_text()
    real = parse_text(text, "real.txt")
    v = VARIANTS[variant](text)
    assert detect(v) == "p2pBandwidthLatencyTest"
    got = parse_text(v, "v.txt")
    assert rows(got) == rows(real) and len(real.p2p) > 0
    assert [g.bus_id for g in got.gpus] == [g.bus_id for g in real.gpus]


def test_editor_line_numbers_of_a_real_paste() -> None:
    f = DATA / "p2pbwlat_4gpu_latency_editor_line_numbers.txt"
    p = parse_text(f.read_text(), f.name)
    lat = {(r.path, r.src, r.dst): r.latency_us for r in p.p2p}
    assert len(lat) == 24
    assert lat[("host_staged", 0, 1)] == 14.95 and lat[("p2p", 3, 2)] == 2.23
    assert p.facts["cpu_latency_us"]["P2P=Enabled Latency (P2P Writes) Matrix (us)"][3][0] == 1.84


@pytest.mark.parametrize("variant", ["crlf", "indented", "editor_line_numbers"])
def test_simplep2p_variants(samples: Path, variant: str) -> None:
    text = (samples / "tool-outputs-more/simpleP2P_2x4090_trpro5995wx_driver525_nan_verification.txt"
            ).read_text()
    p = parse_text(VARIANTS[variant](text), "v.txt")
    assert p.format == "simpleP2P"
    assert p.facts["verification"]["result"] == "failed" and p.p2p[0].status == "error"

"""`nvidia-smi topo -m` and `topo -p2p` as they exist in the wild, one test per variant.

Every variant is made from a real file (../shared/samples or tests/data/importers): the real text
with its tabs turned into spaces, with a prompt and prose around it, with CRLF, without its
legend, inside a Markdown fence, and so on. The expected cells are read from the real file by the
test itself (split on whitespace), never typed in.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

import pytest
from builders.cli import cli

from pcieprof.discover.topo_matrix import parse_topo_matrix
from pcieprof.errors import BadInput
from pcieprof.importers.formats import detect
from pcieprof.importers.formats import parse_text
from pcieprof.importers.topo_p2p import STATUS, parse_topo_p2p, status_of

DATA = Path(__file__).resolve().parents[1] / "data" / "importers"
ANSI = re.compile(r"\x1b\[[0-9;]*m")

#: Real topo -m outputs: (where, file).
TOPO_M = {
    "8x_tabs_ansi": ("samples", "tool-outputs/topo_m_8x_rtxpro6000_server_baremetal_broadcom.txt"),
    "5x_tabs_proxmox": ("samples", "tool-outputs/topo_m_5gpu_5060ti_5070_proxmox_host.txt"),
    "4x_spaces_4nic": ("samples", "tool-outputs-more/topo_m_4x_rtx6000ada_asus_esc8000a_e12_4nic.txt"),
    "4xH100_nv6_markdown": ("data", "topo_m_4xH100_nv6_4nic_markdown.txt"),
    "4x3090_nv4_prompt": ("data", "topo_m_4x3090_nvlink_pairs_prompt.txt"),
    "5x_session_with_p2p": ("data", "topo_m_and_p2p_p_5gpu_5060ti_epyc_prompts.txt"),
}


def real_text(samples: Path, key: str) -> str:
    where, rel = TOPO_M[key]
    return ((samples if where == "samples" else DATA) / rel).read_text()


def cells_of(text: str) -> dict[tuple[str, str], str]:
    """The matrix as the file prints it, read independently: the first line naming GPU0 and a
    device column after it is the header; rows are the lines that start with one of its names."""
    lines = [ANSI.sub("", l) for l in text.splitlines()]
    hdr = next(l.split() for l in lines if "GPU0" in l.split() and "GPU1" in l.split()
               and "-p2p" not in l and len(l.split()) > 2 and "OK" not in l)
    hdr = hdr[hdr.index("GPU0"):]
    devs = [h for h in hdr if re.fullmatch(r"GPU\d+|NIC\d+|mlx5_\d+", h)]
    out = {}
    for l in lines:
        t = l.split()
        if t and t[0] in devs and len(t) > len(devs) and t[1] != "OK" and "OK" not in t:
            for col, cell in zip(devs, t[1:1 + len(devs)]):
                out[(t[0], col)] = cell
    return out


VARIANTS: dict[str, Callable[[str], str]] = {
    "as_is": lambda t: t,
    "tabs_to_spaces": lambda t: t.expandtabs(8),
    "spaces_to_tabs": lambda t: re.sub(r"(?<=\S) {2,}(?=\S)", "\t", t),
    "crlf": lambda t: t.replace("\n", "\r\n"),
    "prompt_and_prose": lambda t: ("Here is what my box prints:\n\nuser@box:~$ nvidia-smi topo -m\n"
                                   + t + "\nuser@box:~$ uptime\n 10:00:01 up 3 days\n"),
    "no_legend": lambda t: t.split("Legend")[0] if "-p2p" not in t else t,
    "markdown_indented": lambda t: "```\n" + "".join("    " + l for l in t.splitlines(True)) + "```\n",
    "ansi_colour_everywhere": lambda t: "".join(f"\x1b[32m{l.rstrip(chr(10))}\x1b[0m\n"
                                                for l in t.splitlines(True)),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("key", sorted(TOPO_M))
def test_topo_m_variant_reads_the_cells_of_the_file(samples: Path, key: str, variant: str) -> None:
    text = real_text(samples, key)
    t = parse_topo_matrix(VARIANTS[variant](text), source="v.txt")
    expected = cells_of(text)
    got = {(r, c): v for r, row in t["matrix"].items() for c, v in row.items()}
    assert got == {k: ("SYS" if v == "SOC" else v) for k, v in expected.items()}
    assert t["gpus"] == len({r for r, _c in expected if r.startswith("GPU")})
    assert detect(VARIANTS[variant](text)) == "nvidia-smi-topo-m"


def test_spaces_file_once_refused_now_read(samples: Path) -> None:
    # The real space-separated paste (Markdown): every attribute column and the NIC legend.
    t = parse_topo_matrix(real_text(samples, "4x_spaces_4nic"), source="x")
    assert t["devices"] == ["GPU0", "GPU1", "GPU2", "GPU3", "NIC0", "NIC1", "NIC2", "NIC3"]
    assert t["cpu_affinity"] == {0: "0-31", 1: "0-31", 2: "32-63", 3: "32-63"}
    assert t["numa_affinity"] == {0: 0, 1: 0, 2: 1, 3: 1}
    assert t["gpu_numa_id"] == {i: None for i in range(4)}
    assert t["nics"] == {f"NIC{i}": f"mlx5_{i}" for i in range(4)}
    assert t["matrix"]["NIC0"]["NIC1"] == "PIX" and t["matrix"]["GPU2"]["NIC3"] == "NODE"
    assert t["legend"] is True


def test_nvlink_levels_are_nvlink(samples: Path) -> None:
    h100 = parse_topo_matrix(real_text(samples, "4xH100_nv6_markdown"), source="x")
    assert {(p["level"], p["nvlinks"]) for p in h100["pairs"]} == {("NV6", 6)}
    assert h100["cpu_affinity"][0] == "6,14,22,30" and h100["numa_affinity"] == {0: 3, 1: 1, 2: 7, 3: 5}
    assert h100["flat_evidence"] is None  # NVLink hides the PCIe level: no claim about the tree
    q = parse_topo_matrix(real_text(samples, "4x3090_nv4_prompt"), source="x")
    nv = {(p["a"], p["b"]) for p in q["pairs"] if p["level"] == "NV4"}
    assert nv == {(0, 2), (2, 0), (1, 3), (3, 1)}
    assert {p["nvlinks"] for p in q["pairs"] if p["level"] != "NV4"} == {None}


def test_header_on_the_prompt_line(samples: Path) -> None:
    # As pasted in aikitoria/open-gpu-kernel-modules issue #12: "nvidia-smi topo -m   GPU0 GPU1 ..."
    lines = real_text(samples, "4x3090_nv4_prompt").splitlines()
    k = next(i for i, l in enumerate(lines) if "GPU0" in l)
    lines[k - 1:k + 1] = ["nvidia-smi topo -m           " + lines[k].strip()]
    t = parse_topo_matrix("\n".join(lines), source="x")
    assert t["matrix"]["GPU0"]["GPU2"] == "NV4" and t["cpu_affinity"][3] == "0-23"


def test_a_session_with_topo_m_and_topo_p2p_p(tmp_path: Path) -> None:
    f = DATA / "topo_m_and_p2p_p_5gpu_5060ti_epyc_prompts.txt"
    parsed = parse_text(f.read_text(), f.name)
    assert parsed.format == "nvidia-smi-topo-m"
    assert parsed.pair_levels[(3, 4)] == "PHB" and parsed.pair_levels[(0, 4)] == "NODE"
    # the -p2p matrix after it: mode p (pcie) read from the command pasted above it
    assert parsed.facts["topo_p2p"]["capability"] == "p"
    assert parsed.facts["topo_p2p"]["capability_from"] == "command in the file"
    assert parsed.pair_p2p[(4, 0)] == {"pcie": "OK"} and len(parsed.pair_p2p) == 20


def test_errors_name_a_line_that_is_what_they_say(samples: Path) -> None:
    text = real_text(samples, "4x_spaces_4nic")
    lines = text.splitlines()
    # cut after GPU1's row, prose after it: the quoted line is the prose, and it is no GPU2 row
    cut = "\n".join(lines[:3] + ["that is all I could copy"]) + "\n"
    with pytest.raises(BadInput) as e:
        parse_topo_matrix(cut, source="t.txt")
    msg = e.value.one_line()
    assert msg.startswith("t.txt:4: rows missing for GPU2, GPU3: expected the row 'GPU2 <8 levels>' "
                          "here, got 'that is all I could copy'")
    # a garbled cell: named by row and column, on its own line
    bad = text.replace("GPU1    NODE     X      SYS", "GPU1    NODE     X      SYX", 1)
    with pytest.raises(BadInput) as e:
        parse_topo_matrix(bad, source="t.txt")
    assert e.value.one_line().startswith("t.txt:3: GPU1/GPU2 is 'SYX', expected one of X, PIX")
    assert "SYX" in bad.splitlines()[2]
    # the file ends with the matrix cut short: the last line is named, and it is GPU1's row
    with pytest.raises(BadInput) as e:
        parse_topo_matrix("\n".join(lines[:3]) + "\n", source="t.txt")
    assert e.value.one_line().startswith("t.txt:3: rows missing for GPU2, GPU3: expected the row "
                                         "'GPU2 <8 levels>' after this line, got the end of the file")
    assert lines[2].startswith("GPU1")


# --- topo -p2p ---------------------------------------------------------------------------------

P2P_RW = "tool-outputs/topo_p2p_rw_5gpu_5060ti_5070_proxmox_host.txt"
KEYS = {"r": ("read",), "w": ("write",), "rw": ("read", "write"), "n": ("nvlink",),
        "a": ("atomics",), "p": ("pcie",)}


@pytest.mark.parametrize("mode", sorted(KEYS))
def test_every_p2p_mode_from_the_command_in_the_file(samples: Path, mode: str) -> None:
    text = f"$ nvidia-smi topo -p2p {mode}\n" + (samples / P2P_RW).read_text()
    parsed = parse_topo_p2p(text, "matrix.txt")  # a name that says nothing
    assert parsed.facts["capability"] == mode
    assert parsed.pair_p2p[(0, 4)] == {k: "OK" for k in KEYS[mode]}


@pytest.mark.parametrize("mode", sorted(KEYS))
def test_every_p2p_mode_from_the_file_name(samples: Path, mode: str) -> None:
    parsed = parse_topo_p2p((samples / P2P_RW).read_text(), f"box_topo_p2p_{mode}.txt")
    assert parsed.facts["capability"] == mode and parsed.facts["capability_from"] == "file name"


def test_ns_is_not_supported_not_unknown(samples: Path, tmp_path: Path) -> None:
    # The real matrix with GPU0's pairs answered NS (as a GPU without P2P answers), mode p.
    lines = (samples / P2P_RW).read_text().splitlines()
    lines[1] = lines[1].replace("OK", "NS")
    lines = [l if not l.startswith(" GPU") or l.startswith(" GPU0") else
             l.replace("\tOK", "\tNS", 1) for l in lines]
    f = tmp_path / "topo_p2p_p.txt"
    f.write_text("\n".join(lines) + "\n")
    parsed = parse_topo_p2p(f.read_text(), f.name)
    assert parsed.facts["capability"] == "p"
    assert parsed.pair_p2p[(0, 3)] == {"pcie": "NS"} and parsed.pair_p2p[(3, 0)] == {"pcie": "NS"}
    assert status_of("NS") == "not_supported" and STATUS["GNS"] == "not_supported"
    assert parsed.facts["not_supported_pairs"] == sorted(
        [f"0->{b}" for b in range(1, 5)] + [f"{a}->0" for a in range(1, 5)])
    assert parsed.facts["status_counts"] == {"NS": 8, "OK": 12}
    # imported: the code lands in topology.json under the capability; no p2p.csv row is made
    r = cli("import", str(f), "--out", str(tmp_path / "b"), "-q")
    assert r.returncode == 0, r.stderr
    topo = json.loads((tmp_path / "b" / "topology.json").read_text())
    pair = next(p for p in topo["pairs"] if (p["a"], p["b"]) == (2, 0))
    assert pair["p2p"]["pcie"] == "NS"
    assert not (tmp_path / "b" / "p2p.csv").exists()


def test_unknown_mode_says_so(samples: Path) -> None:
    parsed = parse_topo_p2p((samples / P2P_RW).read_text(), "matrix.txt")
    assert parsed.facts["capability"] == "unknown"
    assert "which -p2p capability" in parsed.facts["warnings"][0]


@pytest.mark.parametrize("variant", ["tabs_to_spaces", "crlf", "prompt_and_prose", "no_legend",
                                     "markdown_indented", "ansi_colour_everywhere"])
def test_p2p_variants(samples: Path, variant: str) -> None:
    text = (samples / P2P_RW).read_text()
    parsed = parse_topo_p2p(VARIANTS[variant](text), "x_p2p_rw.txt")
    assert len(parsed.pair_p2p) == 20 and set(parsed.facts["status_counts"]) == {"OK"}
    assert detect(VARIANTS[variant](text)) == "nvidia-smi-topo-p2p"


def test_p2p_spaces_in_a_details_block() -> None:
    f = DATA / "topo_p2p_rw_2x5090_gns_spaces_details.txt"
    parsed = parse_text(f.read_text(), f.name)
    assert parsed.format == "nvidia-smi-topo-p2p"
    assert parsed.pair_p2p == {(0, 1): {"read": "GNS", "write": "GNS"},
                               (1, 0): {"read": "GNS", "write": "GNS"}}
    assert parsed.facts["not_supported_pairs"] == ["0->1", "1->0"]

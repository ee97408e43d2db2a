"""Bundles for the report tests (helpers; fixtures in conftest.py), from published real numbers.

Labelled `imported`.

The numbers are the calibration points of ../shared/calibration/README.md (voipmonitor/rtx6kpro
@29f3863): P2P within a switch 53.7-56.4 GB/s at 0.45-0.53 us, across sockets ~39 GB/s (Genoa),
host-staged latency ~14 us; the 8-GPU all-reduce of the WRX90 box (NCCL 2.27.5) and the dual-Turin
default vs graph-file small-message latencies. They come from different boxes: these bundles are
fixtures for drawing, not a description of one machine.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path


from pcieprof.bundle import Bundle

GROUPS = ([0, 1, 2, 3], [4, 5, 6, 7])
#: Real bundles copied into tests/report/data/ (each folder has a NOTE.md).
DATA_DIR = Path(__file__).parent / "data"

# WRX90 8-GPU ring, NCCL_P2P_LEVEL=SYS: size -> time_us (calibration README)
AR_DEFAULT = {4 << 10: 23.93, 16 << 10: 18.66, 64 << 10: 18.13, 256 << 10: 25.09,
              1 << 20: 81.08, 4 << 20: 182.49}
# dual Turin: default (Simple, 2 channels) vs graph file / LL, size -> time_us
AR_TURIN_DEFAULT = {32 << 10: 48.16, 64 << 10: 48.69, 128 << 10: 51.56, 256 << 10: 56.48}
AR_TURIN_LL = {32 << 10: 26.20, 64 << 10: 25.59, 128 << 10: 32.09, 256 << 10: 37.26}


def _topology(name: str, host_note: str) -> dict:
    gpus, nodes, paths = [], [], {}
    for sw, group in enumerate(GROUPS):
        root = f"0000:{0x00 + sw * 0x80:02x}:01.1"
        up = f"0000:{0x01 + sw * 0x80:02x}:00.0"
        nodes.append({"bdf": root, "parent": None, "kind": "root_port", "numa_node": sw,
                      "link": {"gen": 5, "width": 16}, "acs": None, "description": "root port"})
        nodes.append({"bdf": up, "parent": root, "kind": "switch_upstream", "numa_node": sw,
                      "link": {"gen": 5, "width": 16}, "description": "PCIe switch",
                      "acs": None})
        for k, g in enumerate(group):
            down = f"0000:{0x02 + sw * 0x80:02x}:{k:02x}.0"
            bdf = f"0000:{0x03 + sw * 0x80 + k:02x}:00.0"
            nodes.append({"bdf": down, "parent": up, "kind": "switch_downstream", "numa_node": sw,
                          "link": {"gen": 5, "width": 16}, "description": "",
                          "acs": {"cap": {"ReqRedir": True, "CmpltRedir": True},
                                  "ctl": {"ReqRedir": False, "CmpltRedir": False}}})
            nodes.append({"bdf": bdf, "parent": down, "kind": "gpu", "numa_node": sw,
                          "link": {"gen": 5, "width": 16}, "description": "", "acs": None})
            paths[str(g)] = [bdf, down, up, root]
            gpus.append({"index": g, "name": name, "uuid": f"GPU-{g}", "bus_id": bdf,
                         "pcie": {"gen_current": 5, "gen_max": 5, "width_current": 16,
                                  "width_max": 16}, "numa_node": sw,
                         "memory_bytes": 97887 << 20, "virtualization_mode": "bare_metal",
                         "status": {}})
    pairs = []
    for a in range(8):
        for b in range(a + 1, 8):
            level = "PXB" if (a < 4) == (b < 4) else "SYS"
            pairs.append({"a": a, "b": b, "level": level,
                          "p2p": {"read": "OK", "write": "OK", "atomics": "NS"}})
    return {"source": "imported", "driver": {"driver_version": "580.95.05",
                                             "cuda_driver_version": "13.0", "status": {}},
            "gpus": gpus, "pairs": pairs, "pcie_tree": {"nodes": nodes, "gpu_paths": paths},
            "iommu": {"enabled": False, "mode": "off", "cmdline": "amd_iommu=off iommu=off",
                      "groups": {}, "evidence": [host_note]},
            "virtualization": {"is_vm": False, "hypervisor": None, "flat_pcie_tree": False,
                               "evidence": []},
            "numa": {"nodes": [{"id": 0, "cpus": "0-63"}, {"id": 1, "cpus": "64-127"}]},
            "status": {}}


def make_bundle(path: Path, *, host: str = "calib-box", gpu_name: str = "NVIDIA RTX PRO 6000 "
                "Blackwell Server Edition", cross_gbps: float = 39.0, tuned: bool = False) -> Bundle:
    """An `imported` bundle of the calibration numbers (see the module docstring)."""
    b = Bundle.create(path, command="import", source="imported", backend="imported")
    b.manifest["host"] = host
    b.write_json("topology.json", _topology(gpu_name, "calibration fixture: published numbers"))
    b.set_part("discovery", "ok")
    rows = []
    for s in range(8):
        for d in range(8):
            if s == d:
                continue
            same = (s < 4) == (d < 4)
            bw = (54.0 + (s + d) % 3) if same else cross_gbps
            lat = 0.45 + 0.02 * ((s * d) % 4) if same else 0.53
            rows.append({"backend": "imported", "src": s, "dst": d, "path": "p2p",
                         "direction": "uni", "size_bytes": 256 << 20, "bandwidth_gbps": bw,
                         "iters": 10, "trials": 3, "detail": "calibration README"})
            rows.append({"backend": "imported", "src": s, "dst": d, "path": "p2p",
                         "direction": "uni", "size_bytes": 4, "latency_us": lat})
            rows.append({"backend": "imported", "src": s, "dst": d, "path": "host_staged",
                         "direction": "uni", "size_bytes": 256 << 20, "bandwidth_gbps": 27.0})
            rows.append({"backend": "imported", "src": s, "dst": d, "path": "host_staged",
                         "direction": "uni", "size_bytes": 4, "latency_us": 14.0})
    b.append_rows("p2p", rows)
    b.set_part("p2p", "ok")
    ar = []
    f = 2 * 7 / 8
    curves = {"default": AR_TURIN_LL if tuned else AR_TURIN_DEFAULT, "proto_ll": AR_TURIN_LL,
              "p2p_level_sys": AR_DEFAULT}
    for variant, curve in curves.items():
        env = {"proto_ll": {"NCCL_PROTO": "LL"}, "p2p_level_sys": {"NCCL_P2P_LEVEL": "SYS"}}.get(
            variant, {})
        for size, t in curve.items():
            alg = size / (t * 1e-6) / 1e9
            ar.append({"backend": "imported", "variant": variant, "env": json.dumps(env),
                       "nranks": 8, "ranks": "0,1,2,3,4,5,6,7", "size_bytes": size,
                       "dtype": "bf16", "time_us": t, "algbw_gbps": alg,
                       "busbw_gbps": alg * f, "iters": 20})
    b.append_rows("allreduce", ar)
    b.set_part("allreduce", "ok")
    b.finish()
    return b


#: Headless Chromium flags of the report's browser tests (no network, no first-run work).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
#: Appended to a copy of a report: once the page's loader is done, <body> gets the page's size
#: at this window width and the number of figure titles wider than their box.
_MEASURE = """<script>(function wait() {
  var b = document.body;
  if (!b.dataset.done) { setTimeout(wait, 50); return; }
  var wide = 0;
  document.querySelectorAll(".figure h4").forEach(function (h) { if (h.scrollWidth > h.clientWidth + 1) wide++; });
  b.setAttribute("data-page-height", String(document.documentElement.scrollHeight));
  b.setAttribute("data-page-width", String(document.documentElement.scrollWidth));
  b.setAttribute("data-titles-cut", String(wide));
})();</script></body>"""


def run_chromium(exe: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium with its own profile under `tmp`."""
    return subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'profile'}", *args],
                          capture_output=True, text=True, timeout=180)


def page_facts(exe: str, report: Path, tmp: Path, *, width: int = 1366) -> dict[str, int]:
    """Open `report` in headless Chromium at `width` px and read what the page says of itself.

    Returns:
        The data-* numbers of <body> once drawn: figures-expected, figures-rendered, main-svgs,
        errors, page-height and page-width (px, document scroll size), titles-cut; and
        console: the number of console messages.
    """
    probe = tmp / f"{report.stem}.measure.html"
    probe.write_text(report.read_text(encoding="utf-8").replace("</body>", _MEASURE),
                     encoding="utf-8")
    r = run_chromium(exe, tmp, "--enable-logging=stderr", "--v=0", f"--window-size={width},900",
                     "--virtual-time-budget=30000", "--dump-dom", probe.as_uri())
    body = re.search(r"<body([^>]*)>", r.stdout)
    assert body, r.stderr[-2000:]
    facts = {k: int(v) for k, v in re.findall(r'data-([a-z-]+)="(\d+)"', body.group(1))}
    facts["console"] = sum(":CONSOLE" in ln for ln in r.stderr.splitlines())
    return facts

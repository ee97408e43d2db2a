"""The console summary of a topology bundle."""

from __future__ import annotations

from pathlib import Path

from pcieprof.analysis.decode_band import band_for
from pcieprof.bundle import Bundle
from pcieprof.report.console import summarize


def test_summary_shows_the_matrix_statuses_and_decode_latency(tmp_path: Path) -> None:
    b = Bundle.create(tmp_path / "b", command="topology", source="measured", backend="cpu")
    mib = 1 << 20
    b.append_rows("p2p", [
        {"backend": "cpu", "src": 0, "dst": 1, "path": "p2p", "direction": "uni",
         "size_bytes": 16 * mib, "bandwidth_gbps": 12.34, "status": "ok"},
        {"backend": "cpu", "src": 1, "dst": 0, "path": "p2p", "direction": "uni",
         "size_bytes": 16 * mib, "status": "hang", "detail": "killed"},
        {"backend": "cpu", "src": 0, "dst": 1, "path": "p2p", "direction": "uni",
         "size_bytes": 8, "latency_us": 3.0, "status": "ok"},
    ])
    b.append_rows("allreduce", [
        {"backend": "cpu", "variant": v, "nranks": 2, "ranks": "0,1", "size_bytes": s,
         "dtype": "bf16", "time_us": t, "status": "ok", "detail": d}
        for v, t, d in (("default", 40.0, ""), ("proto_ll", 25.0, "gloo ignores NCCL_* settings"))
        for s in (16 * 1024, 32 * 1024)])
    text = summarize(b, band_for("glm5-nvfp4"))
    assert "measure this machine" in text
    assert "12.3" in text and "hang" in text
    assert "p2p latency: median 3.0 us" in text
    lines = text.splitlines()
    # GLM-5's decode sizes: 12 KiB is the latency floor of the 16 KiB point; 96 KiB and up lie
    # above the largest measured size (32 KiB): extrapolated linearly in size, and marked
    row = next(ln for ln in lines if ln.startswith("proto_ll"))
    assert row.split()[1:] == ["25.0", "75.0*", "300.0*", "600.0*"]
    assert "12 KiB" in text and "768 KiB" in text and "extrapolated" in text
    assert "gloo: same transport" in text

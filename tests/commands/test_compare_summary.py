"""`pcieprof compare A B` prints a summary of at most 40 lines; `--all` prints every row and the
whole VM verdict. Run on the demo's two simulated boxes (a VM and its bare-metal twin), whose full
comparison is ~250 lines."""

from __future__ import annotations

from pathlib import Path

from builders.cli import cli

from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.analysis.metrics import bundle_metrics
from pcieprof.bundle import Bundle
from pcieprof.cards import load_card
from pcieprof.commands.compare import SUMMARY_LINES

VM, BARE = "rtxpro6000-8x-vm", "rtxpro6000-8x-switch"


def rows(stdout: str) -> dict[str, str]:
    body = stdout.split("\nmetric ", 1)[1].splitlines()[1:]
    return {ln.split()[0]: ln for ln in body if ln and not ln.startswith("(")}


def test_summary_fits_and_all_prints_every_row(demo_bundles: dict[str, Path]) -> None:
    a, b = demo_bundles[VM], demo_bundles[BARE]
    short = cli("compare", str(a), str(b))
    full = cli("compare", str(a), str(b), "--all")
    assert short.returncode == 0 and full.returncode == 0, short.stderr + full.stderr
    lines = short.stdout.rstrip("\n").splitlines()
    assert len(lines) <= SUMMARY_LINES, len(lines)
    band = DecodeBand.of_card(load_card("glm5-nvfp4"))
    ma = bundle_metrics(Bundle.open(a), band)
    mb = bundle_metrics(Bundle.open(b), band)
    assert set(rows(full.stdout)) == set(ma) | set(mb)
    shown = rows(short.stdout)
    # the default all-reduce over the whole group and the P2P medians are always there
    for name in set(ma) & set(mb):
        if name.startswith("allreduce.default.n8.") or (name.startswith("p2p.")
                                                        and name.endswith(".median")):
            assert name in shown, name
    for name, line in shown.items():  # a summary row reads as the full one
        assert rows(full.stdout)[name] == line
    total = len(set(ma) | set(mb))
    assert f"({len(shown)} of {total} rows; --all prints the other {total - len(shown)}" \
        in lines[-1]
    # the VM part: the verdict's claim and the decode-step row; the rest under --all
    head, _ = short.stdout.split("\nmetric ", 1)
    assert "Virtualization costs time here" in head and "decode step" in head
    assert "What to do" not in head and "What to do" in full.stdout

"""`pcieprof recommend BUNDLE`: ring order, NCCL settings and parallel layout, each with its gain.

Writes into the bundle: recommendations.json, tune/recommended.env, tune/sglang_command.sh and the
NCCL graph/topology files (tune/nccl_graph.xml, tune/nccl_topo.xml). Prints the recommendations.
"""

from __future__ import annotations

from pathlib import Path

import click

from pcieprof import progress
from pcieprof.bundle import Bundle
from pcieprof.commands.options import verbosity
from pcieprof.errors import BadInput


def summary_lines(result) -> list[str]:
    """The fixed-width text printed on stdout."""
    lines = [f"principal bottleneck: {result.bottleneck}", ""]
    if not result.recommendations:
        lines.append("no change supported by the measurements")
    for i, r in enumerate(result.recommendations, 1):
        lines.append(f"{i}. [{r.confidence}] {r.title}")
        if r.gain_text:
            lines.append(f"   gain: {r.gain_text}")
        for a in (r.action or "").splitlines():
            lines.append(f"   {a}")
        for e in r.evidence[:2]:
            lines.append(f"   evidence: {e}")
    if result.layouts:
        lines += ["", "parallel layouts (best first):"]
        for lay in result.layouts:
            rows = {x["concurrency"]: x for x in lay["per_concurrency"]}
            c1, c64 = rows[min(rows)], rows[max(rows)]
            fit = "fits" if lay["fits"] else "does not fit"
            lines.append(f"  {lay['label']:<24} {fit:<13} weights {lay['weights_gb']:.1f} GB/GPU, "
                         f"max concurrency {lay['max_concurrency']}, "
                         f"c=1 {c1['step_ms']:.1f} ms/step, c={c64['concurrency']} "
                         f"{c64['tok_s']:.0f} tok/s{'' if c64['fits'] else ' (KV over)'}")
        if result.layouts[0].get("why"):
            lines.append(f"  why: {result.layouts[0]['why']}")
    if result.needs_measuring:
        lines += ["", "would need measuring:"] + [f"  - {m}" for m in result.needs_measuring]
    return lines


@click.command("recommend")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--model", default="glm5-nvfp4", show_default=True,
              help="Model card for decode message sizes and the layout advice.")
@click.option("--batch-max", default=64, show_default=True, type=click.IntRange(1, 4096),
              help="Largest decode batch (decode all-reduce = batch x hidden x 2 bytes).")
@click.option("--context", default=8192, show_default=True, type=click.IntRange(1),
              help="Tokens per request for the KV-cache fit of the layouts.")
@click.option("--no-layouts", is_flag=True, help="Skip the parallel layout advice.")
@click.option("--verify", is_flag=True, help="Re-run the all-reduce (decode sizes plus one large "
              "size) with each NCCL / ring-order recommendation and the bundle's backend, into a "
              "new bundle; store the measured (sim: simulated) gain next to the predicted one.")
@click.option("--verify-out", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Bundle of the verification (default BUNDLE/verify, replaced on each run).")
@click.option("--timeout", "timeout_s", type=float, default=60.0, show_default=True,
              help="--verify: deadline of each collective, seconds (past it: status=hang).")
@verbosity
def command(bundle: Path, model: str, batch_max: int, context: int, no_layouts: bool,
            verify: bool, verify_out: Path | None, timeout_s: float) -> None:
    """Recommend NCCL settings, the ring order and a parallel layout for BUNDLE.

    Every recommendation carries its evidence from the bundle and its gain at decode-sized
    messages; a setting the measurements do not support is never recommended (the output says
    what would need measuring instead).
    """
    from pcieprof.report.decode_band import band_for
    from pcieprof.serve.cards import load_card
    from pcieprof.tune.recommend import recommend, write_outputs

    b = Bundle.open(bundle)
    load_card(model)  # a wrong name is one line, before any work
    if verify:
        from pcieprof.tune.verify import check_verifiable

        check_verifiable(b)
        if verify_out is not None and not _ours(verify_out):
            raise BadInput(f"--verify-out {verify_out} exists and is not empty",
                           hint="choose another directory (an earlier verify bundle is replaced)")
    progress.info(f"tuning {b.path} ({b.source}, backend {b.backend})")
    result = recommend(b, model=model, batch_max=batch_max, layouts=not no_layouts,
                       context=context)
    try:
        paths = write_outputs(b, result)
    except OSError as exc:
        raise BadInput(f"cannot write the recommendations into {b.path}: {exc.strerror or exc}",
                       hint="copy the bundle somewhere writable") from None
    click.echo("\n".join(summary_lines(result)))
    click.echo("")
    if verify:
        paths["verify"] = _verify(b, result, band_for(model, 1, batch_max), verify_out, timeout_s)
    for what, p in paths.items():
        click.echo(f"{what}: {p}")
    click.echo(f"report: pcieprof report {b.path}")


def _verify(b: Bundle, result, band, out: Path | None, timeout_s: float) -> str:
    """Run tune.verify, store the blocks in recommendations.json, print the comparison."""
    from pcieprof.tune.verify import attach, verify, verify_lines

    if timeout_s <= 0:
        raise BadInput(f"--timeout {timeout_s:g}: must be positive")
    ring = (result.ring or {}).get("order")
    target = out if out is not None else b.path / "verify"
    vb, blocks = verify(b, result.recommendations, band, out=target, ring_order=ring,
                        force=_ours(target), timeout_s=timeout_s)
    b.write_json("recommendations.json", attach(result.as_dict(), blocks, vb))
    click.echo("\n".join(verify_lines(result.recommendations, blocks)))
    click.echo("")
    return str(vb.path)


def _ours(path: Path) -> bool:
    """True when `path` is absent or an earlier verify bundle (safe to replace)."""
    import json

    if not path.exists() or (path.is_dir() and not any(path.iterdir())):
        return True
    try:
        return json.loads((path / "manifest.json").read_text()).get("command") == "recommend-verify"
    except (OSError, ValueError):
        return False

"""Verify recommendations by re-running the all-reduce sweep with them (`recommend --verify`).

For each recommendation that carries an NCCL environment (and the ring order, as a GPU order),
the all-reduce is run again with the backend the bundle was measured with, next to a fresh
baseline (the default variant), at the decode-sized messages of the model card plus one large
size, into a new bundle. What it found goes into each recommendation's `verified` block:

- cuda: real GPUs and NCCL (`measured`);
- cpu: gloo between local processes, which reads no NCCL_* variable and has no GPU order: the
  times are measured, but no gain is claimed (`gain_us` is None and `note` says why);
- sim: the fabric model (`simulated`), the same model that wrote the bundle.

The plan comes from probes.plan.build_plan; cuda/cpu run through pcieprof.probe_runner.ProbeRunner,
sim through pcieprof.sim.backend.run_plan, so the verify bundle is an ordinary topology bundle
(command `recommend-verify`) that `pcieprof report` and `compare` read.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pcieprof import progress
from pcieprof.bundle import Bundle
from pcieprof.errors import BadInput
from pcieprof.report.decode_band import DecodeBand
from pcieprof.schema import source_of
from pcieprof.tune import curves as C
from pcieprof.tune.rules.base import MIN_GAIN, Recommendation
from probes import variants as V
from probes.plan import Plan, build_plan

#: The large message added to the decode band: NCCL's bandwidth regime (capped by what the
#: bundle measured, so the prediction it is compared with is not an extrapolation).
LARGE_BYTES = 64 * 1024 * 1024

#: Below this relative difference a verified change counts as "no change" (measurement spread).
NOISE = MIN_GAIN

CPU_NOTE = ("cpu backend: gloo reads no NCCL_* variable and local processes have no GPU order; "
            "the times are measured again with the setting, no gain is claimed")


def band_sizes(band: DecodeBand, large: int) -> list[int]:
    """Decode message sizes batch_min x 2^k .. batch_max (bytes), plus `large` (bytes)."""
    sizes, b = [], band.batch_min
    while b <= band.batch_max:
        sizes.append(band.message_bytes(b))
        b *= 2
    if band.message_bytes(band.batch_max) not in sizes:
        sizes.append(band.message_bytes(band.batch_max))
    if large > sizes[-1]:
        sizes.append(large)
    return sizes


def candidates(recs: list[Recommendation], ring_order: list[int] | None) -> list[Recommendation]:
    """The recommendations a re-run can check: those setting NCCL_* (or the ring order)."""
    out = []
    for r in recs:
        nccl = {k: v for k, v in r.env.items() if k.startswith("NCCL_")}
        if nccl or (r.rule == "ring_order" and ring_order):
            out.append(r)
    return out


def _abs_env(env: dict[str, str], bundle: Bundle) -> dict[str, str]:
    """NCCL_*_FILE values as absolute paths: the launches run with another working directory."""
    out = {}
    for k, v in env.items():
        if k.startswith("NCCL_") and k.endswith("_FILE") and v:
            p = Path(v)
            if not p.is_absolute():
                p = p if p.exists() else bundle.path / Path(v).name
                if not p.exists():
                    p = bundle.path / "tune" / Path(v).name
            v = str(p.resolve())
        out[k] = v
    return out


def build_verify_plan(bundle: Bundle, recs: list[Recommendation], sizes: list[int],
                      ring_order: list[int] | None, timeout_s: float) -> tuple[Plan, dict[str, str]]:
    """The all-reduce-only plan: the default variant and one case per recommendation.

    Returns:
        (plan, {rule: variant name in the verify bundle}).
    """
    base = C.find(C.curves(bundle.read_table("allreduce")), {})
    if base is None:
        raise BadInput(f"{bundle.path}: no all-reduce rows of the default variant to verify against",
                       hint="run pcieprof topology with the all-reduce probes first")
    devices = [int(x) for x in base.ranks.split(",")]
    if bundle.backend == "cpu":
        devices = list(range(len(devices)))
    wanted = [V.VARIANTS["default"]]
    names: dict[str, str] = {}
    for r in recs:
        name = f"rec_{r.rule}"
        names[r.rule] = name
        env = _abs_env({k: v for k, v in r.env.items() if k.startswith("NCCL_")}, bundle)
        wanted.append(V.Variant(name, env, f"verify: {r.title}"))
    plan = build_plan(bundle.backend, devices, quick=True, variants=wanted, group_kinds=[],
                      timeout_s=timeout_s, topology=bundle.read_json("topology.json", {}) or {})
    plan.p2p, plan.concurrent = [], []
    for case in plan.allreduce:
        case.sizes, case.dtypes = list(sizes), ["bf16"]
        if case.variant == names.get("ring_order") and ring_order and bundle.backend != "cpu":
            case.ranks = list(ring_order)
    return plan, names


def _run(vb: Bundle, plan: Plan, profile: str | None) -> None:
    """Run an all-reduce-only plan into `vb` with its backend."""
    if plan.backend == "sim":
        from pcieprof.sim.backend import run_plan

        run_plan(plan, profile or "rtxpro6000-8x-vm", vb)
        return
    from pcieprof.probe_runner import ProbeRunner

    runner = ProbeRunner(vb, plan)
    vb.set_part("allreduce", "running")
    try:
        ar = runner.run_allreduce()
    except BaseException:
        runner.kill()
        vb.interrupted("verification stopped")
        raise
    finally:
        runner.cleanup()
    vb.set_part("allreduce", ar["status"], why=ar["why"], cases=ar["cases"], hangs=ar["hangs"],
                errors=ar["errors"])


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 3)


def verified_block(rec: Recommendation, base_old: C.Curve, base: C.Curve, new: C.Curve | None,
                   band: DecodeBand, sizes: list[int], backend: str, provenance: str,
                   out: Path) -> dict[str, Any]:
    """One recommendation's `verified` entry (times in us, sizes in bytes).

    The predicted gain is the recommendation's own (from the original bundle) at batch
    `band.batch_min`; the measured (or simulated) one compares the fresh baseline with the
    run that applied the recommendation, at the same sizes in the same bundle.
    """
    s1 = band.message_bytes(band.batch_min)
    pred_gain = rec.gain_us_per_allreduce.get(band.batch_min)
    pred_base = base_old.at(s1)
    d: dict[str, Any] = {
        "backend": backend, "source": source_of(backend), "provenance": provenance,
        "bundle": str(out), "variant": new.variant if new else None,
        "ranks": new.ranks if new else None, "batch": band.batch_min, "size_bytes": s1,
        "predicted_baseline_us": _num(pred_base),
        "predicted_time_us": _num(pred_base - pred_gain) if pred_gain is not None else None,
        "predicted_gain_us": _num(pred_gain) if pred_gain is not None else None,
        "predicted_gain_fraction": _num(rec.gain_fraction) if rec.gain_fraction is not None else None,
        "baseline_time_us": _num(base.at(s1)), "time_us": None, "gain_us": None,
        "gain_fraction": None, "band_gain_fraction": None, "large_gain_fraction": None,
        "per_size": [], "status": "ok", "note": "",
    }
    if new is None:
        d.update(status="failed", note="no ok all-reduce rows with the recommendation (see the "
                                       "verify bundle's allreduce.csv: hang or error)")
        return d
    per: list[dict[str, Any]] = []
    for s in sizes:
        t0, t1 = base.at(s), new.at(s)
        per.append({"size_bytes": s, "baseline_us": _num(t0), "time_us": _num(t1),
                    "gain_fraction": _num((t0 - t1) / t0) if t0 > 0 and math.isfinite(t1)
                    and backend != "cpu" else None})
    d["per_size"] = per
    d["time_us"] = _num(new.at(s1))
    if backend == "cpu":
        d["note"] = CPU_NOTE
        d["text"] = verified_text(d)
        return d
    t0, t1 = base.at(s1), new.at(s1)
    d["gain_us"] = _num(t0 - t1)
    d["gain_fraction"] = _num((t0 - t1) / t0) if t0 > 0 else None
    band_rel = [p["gain_fraction"] for p in per
                if p["gain_fraction"] is not None and p["size_bytes"] <= band.hi_bytes]
    d["band_gain_fraction"] = _num(sum(band_rel) / len(band_rel)) if band_rel else None
    if sizes[-1] > band.hi_bytes:
        d["large_gain_fraction"] = per[-1]["gain_fraction"]
    rel = d["gain_fraction"] or 0.0
    same = "the fabric model predicts no change" if backend == "sim" else \
        "no change within measurement spread"
    d["note"] = ("faster" if rel >= NOISE else "slower" if rel <= -NOISE else same) + \
        f" at batch {band.batch_min}"
    if backend == "sim" and abs(rel) < NOISE and "NCCL_TOPO_FILE" in rec.env:
        d["note"] += " (the model reads no NCCL_TOPO_FILE: only hardware can verify this one)"
    d["text"] = verified_text(d)
    return d


def verified_text(v: dict[str, Any]) -> str:
    """One line for people: the verified time next to the predicted one (report, stdout)."""
    what = "simulated" if v["backend"] == "sim" else "measured"
    kib = f"{v['size_bytes'] / 1024:g} KiB"
    pred = (f"predicted {v['predicted_baseline_us']:.1f} -> {v['predicted_time_us']:.1f} us"
            if v.get("predicted_time_us") is not None else "no predicted time")
    if v.get("time_us") is None or v.get("baseline_time_us") is None:
        return f"verify ({what}, backend {v['backend']}): no result ({v.get('note', '')}); {pred}"
    got = f"{v['baseline_time_us']:.1f} -> {v['time_us']:.1f} us at {kib}"
    if v.get("gain_fraction") is None:
        return f"re-{what} ({v['provenance']}): {got}; no gain claimed: {v.get('note', '')}"
    return (f"verified ({v['provenance']}): {got} ({v['gain_fraction'] * 100:+.0f}%); {pred}"
            f"; {v.get('note', '')}")


def check_verifiable(bundle: Bundle) -> None:
    """Raise BadInput (one line) when no re-run of `bundle` is possible: checked before tuning.

    Raises:
        BadInput: an imported bundle (nothing to re-run) or no default-variant all-reduce rows.
    """
    if bundle.backend not in ("cuda", "cpu", "sim"):
        raise BadInput(f"{bundle.path}: backend {bundle.backend or 'unknown'} has no hardware or "
                       "model to re-run", hint="verify on the box itself (cuda), or a sim bundle")
    if C.find(C.curves(bundle.read_table("allreduce")), {}) is None:
        raise BadInput(f"{bundle.path}: no all-reduce rows of the default variant to verify against",
                       hint="run pcieprof topology with the all-reduce probes first")


def verify(bundle: Bundle, recs: list[Recommendation], band: DecodeBand, *, out: Path,
           ring_order: list[int] | None = None, force: bool = False, timeout_s: float = 60.0,
           large_bytes: int | None = None) -> tuple[Bundle, dict[str, dict[str, Any]]]:
    """Re-run the all-reduce with each verifiable recommendation; returns (verify bundle, blocks).

    Args:
        bundle: the measured (cuda/cpu) or simulated (sim) bundle the recommendations came from.
        recs: the recommendations (only those of `candidates` are run).
        band: decode band (message sizes batch x hidden x 2 bytes).
        out: directory of the new bundle.
        ring_order: the recommended GPU order (CUDA_VISIBLE_DEVICES) for the ring recommendation.
        force: reuse a non-empty `out`.
        timeout_s: deadline per collective, seconds.
        large_bytes: the one large size (default: 64 MiB, capped at the bundle's largest size).

    Returns:
        The verify bundle and {rule: verified block} (see `verified_block`).

    Raises:
        BadInput: an imported bundle (nothing to re-run), no all-reduce rows, nothing verifiable.
    """
    check_verifiable(bundle)
    todo = candidates(recs, ring_order)
    if not todo:
        raise BadInput(f"{bundle.path}: nothing to verify: no recommendation sets an NCCL "
                       "variable or a ring order",
                       hint="--verify re-runs the all-reduce with NCCL_* / ring recommendations")
    old = C.curves(bundle.read_table("allreduce"))
    base_old = C.find(old, {})
    if base_old is None:
        raise BadInput(f"{bundle.path}: no all-reduce rows of the default variant",
                       hint="run pcieprof topology with the all-reduce probes first")
    large = min(large_bytes or LARGE_BYTES, base_old.max_size)
    sizes = band_sizes(band, large)
    plan, names = build_verify_plan(bundle, todo, sizes, ring_order, timeout_s)
    vb = Bundle.create(out, command="recommend-verify", source=bundle.source if bundle.backend
                       != "sim" else source_of("sim"), backend=bundle.backend, force=force)
    vb.write_json("plan.json", plan.to_dict())
    if bundle.backend != "sim":  # sim's run_plan writes the fabric's own topology
        vb.write_json("topology.json", bundle.read_json("topology.json", {}) or {})
    vb.set_versions(verifies=str(bundle.path.resolve()))
    progress.info(f"verify: {len(todo)} recommendation(s) + baseline, {len(sizes)} sizes, "
                  f"backend {bundle.backend} -> {vb.path}")
    profile = (bundle.manifest.get("versions") or {}).get("sim_profile")
    _run(vb, plan, profile)
    vb.finish()
    cs = C.curves(vb.read_table("allreduce"))
    base = next((c for c in cs if c.variant == "default"), None)
    if base is None:
        raise BadInput(f"verify: the baseline all-reduce produced no rows (see {vb.path})",
                       hint="look at the verify bundle's manifest and logs")
    prov = {"sim": "simulated, backend sim (fabric model)", "cpu": "measured, backend cpu (gloo)",
            "cuda": "measured, backend cuda (NCCL)"}[bundle.backend]
    blocks = {}
    for r in todo:
        new = next((c for c in cs if c.variant == names[r.rule]), None)
        blocks[r.rule] = verified_block(r, base_old, base, new, band, sizes, bundle.backend,
                                        prov, vb.path)
    return vb, blocks


def verify_lines(recs: list[Recommendation], blocks: dict[str, dict[str, Any]]) -> list[str]:
    """`predicted X us -> measured Y us` per verified recommendation (stdout)."""
    lines = []
    for r in recs:
        v = blocks.get(r.rule)
        if v is None:
            continue
        what = "simulated" if v["backend"] == "sim" else "measured"
        kib = v["size_bytes"] / 1024
        pred = v["predicted_time_us"]
        ptxt = f"predicted {pred:.1f} us" if pred is not None else "no predicted time at batch 1"
        got = v["time_us"]
        gtxt = f"{what} {got:.1f} us" if got is not None else f"{what}: no result"
        base = v["baseline_time_us"]
        line = (f"verify {r.rule}: {ptxt} -> {gtxt} at {kib:g} KiB (baseline "
                f"{base:.1f} us)" if base is not None else f"verify {r.rule}: {ptxt} -> {gtxt}")
        if v["gain_us"] is not None:
            line += f", gain {v['gain_us']:+.1f} us ({(v['gain_fraction'] or 0) * 100:+.0f}%)"
        lines.append(line)
        big = v["per_size"][-1] if v["per_size"] else None
        if big and big["size_bytes"] > v["size_bytes"] and big["time_us"] is not None \
                and big["baseline_us"] is not None:
            lines.append(f"   large message {big['size_bytes'] >> 20} MiB: {big['baseline_us']:.0f} -> "
                         f"{big['time_us']:.0f} us"
                         + (f" ({big['gain_fraction'] * 100:+.0f}% time, busbw "
                            f"x{big['baseline_us'] / big['time_us']:.2f})"
                            if big["gain_fraction"] is not None and big["time_us"] > 0 else ""))
        if pred is None and r.gain_text:
            g = r.gain_text
            lines.append(f"   {g}" if g.startswith("predicted") else f"   predicted: {g}")
        if v["note"]:
            lines.append(f"   {v['note']}")
    return lines


def attach(doc: dict[str, Any], blocks: dict[str, dict[str, Any]], vb: Bundle) -> dict[str, Any]:
    """recommendations.json with each verified recommendation's `verified` block, and a
    top-level `verify` record (the verify bundle, its backend)."""
    for r in doc.get("recommendations", []):
        if r.get("rule") in blocks:
            r["verified"] = blocks[r["rule"]]
    doc["verify"] = {"bundle": str(vb.path), "backend": vb.backend, "source": vb.source,
                     "rules": sorted(blocks)}
    return doc

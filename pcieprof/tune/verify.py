"""Verify recommendations by re-running the all-reduce with them (`recommend --verify`): what to
re-run, and what the re-run found. The tuner decides; the measurement session measures.

For each recommendation that carries an NCCL environment (and the ring order, as a GPU order),
`plan_verify` says what to run again with the backend the bundle was measured with, next to a
fresh baseline (the default variant), at the decode-sized messages of the model card plus one
large size. pcieprof.measurement runs it into a new bundle (an ordinary topology bundle, command
`recommend-verify`, that `pcieprof report` and `compare` read), and `verify_results` turns that
bundle into each recommendation's `verified` block:

- cuda: real GPUs and NCCL (`measured`);
- cpu: gloo between local processes, which reads no NCCL_* variable and has no GPU order: the
  times are measured, but no gain is claimed (`gain_us` is None and `note` says why);
- sim: the fabric model (`simulated`), the same model that wrote the bundle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pcieprof.analysis.curves import Curve, Curves
from pcieprof.analysis.decode_band import DecodeBand
from pcieprof.analysis.provenance import obtained, part_provenance
from pcieprof.bundle import Bundle
from pcieprof.bundle.recommendations import Recommendation, Recommendations
from pcieprof.errors import BadInput
from pcieprof.schema import source_of
from pcieprof.tune.rules.base import MIN_GAIN

#: The large message added to the decode band: NCCL's bandwidth regime (capped by what the
#: bundle measured, so the prediction it is compared with is not an extrapolation).
LARGE_BYTES = 64 * 1024 * 1024

#: Below this relative difference a verified change counts as "no change" (measurement spread).
NOISE = MIN_GAIN

CPU_NOTE = ("cpu backend: gloo reads no NCCL_* variable and local processes have no GPU order; "
            "the times are measured again with the setting, no gain is claimed")


def band_sizes(band: DecodeBand, large: int) -> list[int]:
    """Decode message sizes batch_min x 2^k .. batch_max (bytes), plus `large` (bytes)."""
    sizes = list(band.sizes())
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


@dataclass(frozen=True)
class VerifyCase:
    """One all-reduce to re-run.

    Attributes:
        name: the variant name in the verify bundle (`default`, `rec_<rule>`).
        env: its NCCL_* environment (file paths absolute).
        ranks: the GPU order to run it over, or None for the plan's devices.
        title: what it checks.
    """

    name: str
    env: dict[str, str]
    ranks: tuple[int, ...] | None
    title: str


@dataclass(frozen=True)
class VerifyPlan:
    """What `recommend --verify` re-runs: cases over devices at sizes (bytes), one dtype (bf16).

    Attributes:
        backend: the bundle's backend (the re-run uses the same).
        devices: the devices of the default curve (cpu: process ranks).
        cases: the baseline first, then one per recommendation.
        sizes: message sizes, bytes.
        rules: rule -> case name.
        sim_profile: the fabric profile of a sim bundle, else None.
    """

    backend: str
    devices: tuple[int, ...]
    cases: tuple[VerifyCase, ...]
    sizes: tuple[int, ...]
    rules: dict[str, str]
    sim_profile: str | None = None


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


def plan_verify(bundle: Bundle, recs: list[Recommendation], band: DecodeBand, *,
                ring_order: list[int] | None = None, large_bytes: int | None = None) -> VerifyPlan:
    """The re-run for the verifiable recommendations of `recs` (see `candidates`).

    Args:
        bundle: the measured (cuda/cpu) or simulated (sim) bundle the recommendations came from.
        recs: the recommendations.
        band: decode band (message sizes batch x hidden x 2 bytes).
        ring_order: the recommended GPU order (CUDA_VISIBLE_DEVICES) for the ring recommendation.
        large_bytes: the one large size (default: 64 MiB, capped at the bundle's largest size).

    Raises:
        BadInput: an imported bundle (nothing to re-run), no default all-reduce rows, or nothing
            verifiable.
    """
    base = check_verifiable(bundle)
    todo = candidates(recs, ring_order)
    if not todo:
        raise BadInput(f"{bundle.path}: nothing to verify: no recommendation sets an NCCL "
                       "variable or a ring order",
                       hint="--verify re-runs the all-reduce with NCCL_* / ring recommendations")
    devices = base.ranks if bundle.backend != "cpu" else tuple(range(base.nranks))
    cases = [VerifyCase("default", {}, None, "baseline")]
    rules: dict[str, str] = {}
    for r in todo:
        name = f"rec_{r.rule}"
        rules[r.rule] = name
        env = _abs_env({k: v for k, v in r.env.items() if k.startswith("NCCL_")}, bundle)
        order = tuple(ring_order) if r.rule == "ring_order" and ring_order \
            and bundle.backend != "cpu" else None
        cases.append(VerifyCase(name, env, order, f"verify: {r.title}"))
    large = min(large_bytes or LARGE_BYTES, base.max_size)
    return VerifyPlan(backend=bundle.backend, devices=tuple(devices), cases=tuple(cases),
                      sizes=tuple(band_sizes(band, large)), rules=rules,
                      sim_profile=bundle.manifest.versions.get("sim_profile"))


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), 3)


def verified_block(rec: Recommendation, base_old: Curve, base: Curve, new: Curve | None,
                   band: DecodeBand, sizes: list[int], backend: str, provenance: str,
                   out: Path, failure: dict[str, Any] | None = None) -> dict[str, Any]:
    """One recommendation's `verified` entry (times in us, sizes in bytes).

    The predicted gain is the recommendation's own (from the original bundle) at batch
    `band.batch_min`; the measured (or simulated) one compares the fresh baseline with the
    run that applied the recommendation, at the same sizes in the same bundle. `failure` is the
    first hang or error row of the re-run with the recommendation (the watchdog's record).
    """
    s1 = band.message_bytes(band.batch_min)
    pred_gain = rec.gain_us_per_allreduce.get(band.batch_min)
    pred_base = base_old.at(s1)
    d: dict[str, Any] = {
        "backend": backend, "source": source_of(backend), "provenance": provenance,
        "bundle": str(out), "variant": new.variant if new else None,
        "ranks": list(new.ranks) if new else None, "batch": band.batch_min, "size_bytes": s1,
        "predicted_baseline_us": _num(pred_base),
        "predicted_time_us": _num(pred_base - pred_gain) if pred_gain is not None else None,
        "predicted_gain_us": _num(pred_gain) if pred_gain is not None else None,
        "predicted_gain_fraction": _num(rec.gain_fraction) if rec.gain_fraction is not None else None,
        "baseline_time_us": _num(base.at(s1)), "time_us": None, "gain_us": None,
        "gain_fraction": None, "band_gain_fraction": None, "large_gain_fraction": None,
        "per_size": [], "status": "ok", "note": "",
    }
    if failure is not None and failure.get("status") == "hang":
        d.update(status="hang", note=(
            f"HANG: the all-reduce with it made no progress at {failure['size_bytes']} B and the "
            f"watchdog killed it ({failure.get('detail') or 'status=hang'}): do not serve with it"))
    elif new is None:
        d.update(status="failed", note="no ok all-reduce rows with the recommendation (see the "
                                       "verify bundle's allreduce.csv: "
                                       + (f"{failure['status']}: {failure.get('detail', '')}"
                                          if failure else "hang or error") + ")")
    if new is None or d["status"] == "hang":
        d["text"] = verified_text(d)
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
    if backend == "sim" and rec.risks:
        d["note"] += ("; not checked for " + ", ".join(r.id for r in rec.risks)
                      + ": the fabric model does not model hangs, only a run on the box does")
    d["text"] = verified_text(d)
    return d


def verified_text(v: dict[str, Any]) -> str:
    """One line for people: the verified time next to the predicted one (report, stdout)."""
    what = obtained(v["backend"])
    kib = f"{v['size_bytes'] / 1024:g} KiB"
    if v.get("status") == "hang":
        return f"verify ({what}, backend {v['backend']}): {v.get('note', '')}"
    pred = (f"predicted {v['predicted_baseline_us']:.1f} -> {v['predicted_time_us']:.1f} us"
            if v.get("predicted_time_us") is not None else "no predicted time")
    if v.get("time_us") is None or v.get("baseline_time_us") is None:
        return f"verify ({what}, backend {v['backend']}): no result ({v.get('note', '')}); {pred}"
    got = f"{v['baseline_time_us']:.1f} -> {v['time_us']:.1f} us at {kib}"
    if v.get("gain_fraction") is None:
        return f"re-{what} ({v['provenance']}): {got}; no gain claimed: {v.get('note', '')}"
    return (f"verified ({v['provenance']}): {got} ({v['gain_fraction'] * 100:+.0f}%); {pred}"
            f"; {v.get('note', '')}")


def check_verifiable(bundle: Bundle) -> Curve:
    """The default curve a re-run of `bundle` is compared with; checked before tuning.

    Raises:
        BadInput: an imported bundle (nothing to re-run) or no default-variant all-reduce rows.
    """
    if bundle.backend not in ("cuda", "cpu", "sim"):
        raise BadInput(f"{bundle.path}: backend {bundle.backend or 'unknown'} has no hardware or "
                       "model to re-run", hint="verify on the box itself (cuda), or a sim bundle")
    base = Curves(bundle.read_table("allreduce")).default()
    if base is None:
        raise BadInput(f"{bundle.path}: no all-reduce rows of the default variant to verify against",
                       hint="run pcieprof topology with the all-reduce probes first")
    return base


def verify_results(bundle: Bundle, verify_bundle: Bundle, plan: VerifyPlan,
                   recs: list[Recommendation], band: DecodeBand) -> dict[str, dict[str, Any]]:
    """{rule: verified block} from the verify bundle's curves (see `verified_block`).

    Raises:
        BadInput: the baseline produced no rows.
    """
    base_old = check_verifiable(bundle)
    cs = Curves(verify_bundle.read_table("allreduce"))
    base = next((c for c in cs if c.variant == "default"), None)
    if base is None:
        raise BadInput(f"verify: the baseline all-reduce produced no rows (see {verify_bundle.path})",
                       hint="look at the verify bundle's manifest and logs")
    prov = part_provenance(verify_bundle.manifest, "allreduce")
    rows = verify_bundle.read_table("allreduce")
    bad = rows[rows["status"].isin(["hang", "error"])]
    blocks = {}
    for r in recs:
        if r.rule in plan.rules:
            name = plan.rules[r.rule]
            new = next((c for c in cs if c.variant == name), None)
            fail = bad[bad["variant"] == name]
            failure = None if fail.empty else {
                "status": str(fail.iloc[0]["status"]), "size_bytes": int(fail.iloc[0]["size_bytes"]),
                "detail": str(fail.iloc[0]["detail"] or "")}
            blocks[r.rule] = verified_block(r, base_old, base, new, band, list(plan.sizes),
                                            bundle.backend, prov, verify_bundle.path, failure)
    return blocks


def verify_lines(recs: list[Recommendation], blocks: dict[str, dict[str, Any]]) -> list[str]:
    """`predicted X us -> measured Y us` per verified recommendation (stdout)."""
    lines = []
    for r in recs:
        v = blocks.get(r.rule)
        if v is None:
            continue
        what = obtained(v["backend"])
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


def attach(doc: Recommendations, blocks: dict[str, dict[str, Any]],
           verify_bundle: Bundle) -> Recommendations:
    """`doc` with each verified recommendation's `verified` block and a top-level `verify`
    record (the verify bundle, its backend)."""
    for r in doc.recommendations:
        if r.rule in blocks:
            r.verified = blocks[r.rule]
    doc.verify = {"bundle": str(verify_bundle.path), "backend": verify_bundle.backend,
                  "source": verify_bundle.source, "rules": sorted(blocks)}
    return doc

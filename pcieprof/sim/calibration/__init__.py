"""Calibration of the fabric model against published measurements, stated honestly.

`reference_points.csv` holds every point with its source. Each point is used one way:
- `fit`: the free parameters (params.toml, kind "fitted") are fitted on these;
- `check`: held out, never fitted on; many are on boxes no fitted point comes from;
- `input`: the number is written into a profile (e.g. the inter-socket ceiling), so agreement is
  by construction; listed so the table shows it.
Every point has a class: the kind of route of its GPU pair (`model.pair_class`: same switch, same
chip, cross chip, same/cross socket direct) or of its measurement (host, concurrent, all-reduce).
`error_table()` computes the model's error on every point; the test (tests/sim/) fails when a
point's error passes its bound. `python -m pcieprof.sim.calibration` prints the markdown of
docs/fabric-model.md's validation section (points, held-out error by box and class, parameters);
`--fit` refits the fitted parameters and rewrites their values in params.toml.
"""

from __future__ import annotations

import copy
import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from pcieprof.sim import collectives, model
from pcieprof.sim.fabric import Fabric, load_profile

HERE = Path(__file__).resolve().parent
POINTS_FILE = HERE / "reference_points.csv"
PARAMS_FILE = HERE / "params.toml"

#: Fitted parameters, in stages: each stage is fitted on the points of its quantities only. Latency
#: comes first: the posted-write window is a rate over the round trip of the hops behind the
#: socket crossing, so the bandwidth stage needs the hop latencies.
STAGES: list[tuple[str, list[tuple[str, str]], tuple[str, ...]]] = [
    ("latency", [("latency", "gpu_base_us"), ("latency", "switch_hop_us"),
                 ("latency", "root_complex_us"), ("latency", "inter_socket_us"),
                 ("latency", "host_staged_us")], ("p2p_latency_us", "staged_latency_us")),
    ("p2p bandwidth", [("pcie", "dllp_efficiency"), ("inter_socket", "posted_window_kib")],
     ("p2p_uni_gbps", "p2p_bi_gbps")),
    ("nccl", [("nccl", "launch_us"), ("nccl", "smooth_k"), ("nccl", "ll_step_us"),
              ("nccl", "simple_step_us"), ("nccl", "inter_socket_step_us"),
              ("nccl", "simple_channel_gbps"), ("nccl", "simple_wire_efficiency"),
              ("nccl", "shm_step_us"), ("nccl", "shm_efficiency")],
     ("allreduce_time_us", "allreduce_busbw_gbps")),
]
#: Physical range of each fitted parameter: the fit stays inside it (a value pinned at a bound
#: shows up in params.toml and says the data pull it there).
BOUNDS: dict[tuple[str, str], tuple[float, float]] = {
    ("pcie", "dllp_efficiency"): (0.85, 1.0),
    ("inter_socket", "posted_window_kib"): (8.0, 256.0),
    ("latency", "gpu_base_us"): (0.1, 1.0), ("latency", "switch_hop_us"): (0.02, 0.6),
    ("latency", "root_complex_us"): (0.0, 0.5), ("latency", "inter_socket_us"): (0.0, 1.0),
    ("latency", "host_staged_us"): (2.0, 40.0),
    ("nccl", "launch_us"): (3.0, 15.0), ("nccl", "smooth_k"): (1.0, 8.0),
    ("nccl", "ll_step_us"): (0.3, 3.0), ("nccl", "simple_step_us"): (1.0, 8.0),
    ("nccl", "inter_socket_step_us"): (0.0, 3.0), ("nccl", "ll_channel_gbps"): (2.0, 30.0),
    ("nccl", "simple_channel_gbps"): (4.0, 30.0), ("nccl", "simple_wire_efficiency"): (0.6, 1.0),
    ("nccl", "shm_step_us"): (0.3, 10.0), ("nccl", "shm_efficiency"): (0.2, 1.0),
}
#: Where the fit starts a parameter when not at the middle of its range: the posted-write window
#: does not bind above ~60 KiB on the fit points, so the loss is flat there and a search started
#: at the middle (132 KiB) never moves; start where it binds.
START: dict[tuple[str, str], float] = {("inter_socket", "posted_window_kib"): 32.0}
#: Classes of points, in the order the validation table lists them.
CLASSES = ("same switch", "same chip", "cross chip", "same socket direct", "cross socket direct",
           "host", "concurrent", "all-reduce")


@dataclass(frozen=True)
class Point:
    """One published measurement and how the model is compared with it."""

    id: str
    use: str
    box: str
    quantity: str
    src: int | None
    dst: int | None
    ranks: str
    size_bytes: int
    env: dict[str, str]
    measured: float
    unit: str
    bound_pct: float | None
    source: str
    note: str


def load_points(path: Path = POINTS_FILE) -> list[Point]:
    """The reference points of reference_points.csv."""
    out = []
    with path.open(encoding="utf-8", newline="") as f:
        for r in csv.DictReader(f):
            if None in r:  # an unquoted comma in a note shifts every column after it
                raise ValueError(f"{path}: row {r.get('id')!r} has more fields than the header")
            env = dict(kv.split("=", 1) for kv in r["env"].split(";") if kv) if r["env"] else {}
            out.append(Point(
                id=r["id"], use=r["use"], box=r["box"], quantity=r["quantity"],
                src=int(r["src"]) if r["src"] else None, dst=int(r["dst"]) if r["dst"] else None,
                ranks=r["ranks"], size_bytes=int(r["size_bytes"]), env=env,
                measured=float(r["measured"]), unit=r["unit"],
                bound_pct=float(r["bound_pct"]) if r["bound_pct"] else None,
                source=r["source"], note=r["note"]))
    return out


_boxes: dict[str, Fabric] = {}


def box(name: str) -> Fabric:
    """A shipped profile by name, or `boxes/<name>` from this folder."""
    if name not in _boxes:
        _boxes[name] = load_profile(HERE / f"{name}.toml" if name.startswith("boxes/") else name)
    return _boxes[name]


def _flows(ranks: str) -> list[tuple[int, int]]:
    if ranks.startswith("ring+"):
        k = int(ranks[5:])
        return [(i, (i + k) % 8) for i in range(8)]
    return [tuple(int(x) for x in pair.split("-")) for pair in ranks.split("+")]  # type: ignore[misc]


def _group(ranks: str) -> list[int]:
    lo, hi = (int(x) for x in ranks.split("-"))
    return list(range(lo, hi + 1))


def predict(p: Point) -> float:
    """The model's value for a point, in the point's unit."""
    f = box(p.box)
    q = p.quantity
    if q in ("p2p_uni_gbps", "p2p_bi_gbps", "p2p_latency_us", "staged_latency_us", "h2d_gbps",
             "d2h_gbps") and (p.src is None or p.dst is None):
        raise ValueError(f"point {p.id}: {q} needs src and dst")
    src, dst = int(p.src or 0), int(p.dst or 0)  # set for these quantities (checked above)
    if q in ("p2p_uni_gbps", "p2p_bi_gbps", "p2p_latency_us"):
        bw, lat = model.predict_p2p(f, src, dst, "p2p", "bi" if q == "p2p_bi_gbps" else "uni",
                                    p.size_bytes)
        return lat if q == "p2p_latency_us" else bw
    if q == "staged_latency_us":
        return model.predict_p2p(f, src, dst, "host_staged", "uni", p.size_bytes)[1]
    if q in ("h2d_gbps", "d2h_gbps"):
        return model.predict_p2p(f, src, dst, q[:3], "uni", p.size_bytes)[0]
    if q.startswith("concurrent_"):
        op = "read" if "_read_" in q else "write"
        rates = model.predict_concurrent(f, _flows(p.ranks), op, p.size_bytes)
        return sum(rates) / len(rates) if q.endswith("avg_gbps") else sum(rates)
    if q in ("allreduce_time_us", "allreduce_busbw_gbps"):
        ranks = _group(p.ranks)
        t, _ = collectives.predict_allreduce(f, ranks, p.size_bytes, "bf16", p.env)
        return t if q == "allreduce_time_us" else collectives.busbw_gbps(p.size_bytes, t, len(ranks))
    raise ValueError(f"{p.id}: unknown quantity {q!r}")


def point_class(p: Point) -> str:
    """The class of a point: its GPU pair's route (`model.pair_class`) for P2P points, else the
    kind of measurement (host, concurrent, all-reduce)."""
    q = p.quantity
    if q in ("p2p_uni_gbps", "p2p_bi_gbps", "p2p_latency_us"):
        return model.pair_class(box(p.box), p.src, p.dst)  # type: ignore[arg-type]
    if q.startswith("concurrent_"):
        return "concurrent"
    if q.startswith("allreduce"):
        return "all-reduce"
    return "host"


def error_pct(p: Point) -> float:
    """Signed error of the model on a point: (predicted - measured) / measured, in percent."""
    return (predict(p) - p.measured) / p.measured * 100.0


def error_table(points: Sequence[Point] | None = None) -> list[dict[str, object]]:
    """One row per point: id, use, box, what, source, measured, predicted, error_pct, bound_pct."""
    rows = []
    for p in points if points is not None else load_points():
        pred = predict(p)
        rows.append({"id": p.id, "use": p.use, "box": p.box.removeprefix("boxes/"),
                     "class": point_class(p), "quantity": p.quantity, "source": p.source,
                     "note": p.note,
                     "measured": p.measured, "predicted": pred, "unit": p.unit,
                     "error_pct": (pred - p.measured) / p.measured * 100.0,
                     "bound_pct": p.bound_pct, "size_bytes": p.size_bytes, "env": p.env,
                     "ranks": p.ranks})
    return rows


def _what(r: dict[str, Any]) -> str:
    q = str(r["quantity"])
    size = int(r["size_bytes"])
    s = f"{size // (1 << 20)} MiB" if size >= 1 << 20 else (f"{size // 1024} KiB" if size >= 1024 else f"{size} B")
    env = ",".join(f"{k}={v}" for k, v in dict(r["env"]).items())
    if q.startswith("allreduce"):
        return f"all-reduce {s} ranks {r['ranks']}" + (f" [{env}]" if env else "")
    return {"p2p_uni_gbps": "P2P uni", "p2p_bi_gbps": "P2P bi", "p2p_latency_us": "P2P latency",
            "staged_latency_us": "staged latency", "h2d_gbps": "H2D", "d2h_gbps": "D2H"}.get(
        q, q.replace("_", " ") + f" {r['ranks']}")


def _median(v: list[float]) -> float:
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def class_summary(rows: list[dict[str, object]] | None = None,
                  use: str = "check") -> list[dict[str, object]]:
    """Error of the `use` points (held out by default) by box and class, then by class over all
    boxes (box "all"): n, median and max |error| in percent, and the worst point's id."""
    rows = rows if rows is not None else error_table()
    groups: dict[tuple[str, str], list[dict[str, object]]] = {}
    for r in rows:
        if r["use"] != use:
            continue
        groups.setdefault((str(r["box"]), str(r["class"])), []).append(r)
        groups.setdefault(("all", str(r["class"])), []).append(r)
    order = {c: i for i, c in enumerate(CLASSES)}
    out = []
    for (bx, cls), members in sorted(groups.items(),
                                     key=lambda kv: (kv[0][0] == "all", order[kv[0][1]], kv[0][0])):
        errs = [abs(float(m["error_pct"])) for m in members]  # type: ignore[arg-type]
        worst = max(members, key=lambda m: abs(float(m["error_pct"])))  # type: ignore[arg-type]
        out.append({"box": bx, "class": cls, "n": len(members), "median_abs_pct": _median(errs),
                    "max_abs_pct": max(errs), "worst": str(worst["id"]),
                    "worst_error_pct": float(worst["error_pct"])})  # type: ignore[arg-type]
    return out


def parameter_table() -> list[dict[str, str]]:
    """Every parameter of params.toml with its value, its kind (fitted, fixed, assumed) and the
    reason or source written beside it; fitted ones name the points they are fitted on."""
    fit_points: dict[str, list[str]] = {}
    for _name, keys, quantities in STAGES:
        ids = [p.id for p in load_points() if p.use == "fit" and p.quantity in quantities]
        for sec, key in keys:
            fit_points[f"{sec}.{key}"] = ids
    out = []
    section = ""
    for line in PARAMS_FILE.read_text(encoding="utf-8").splitlines():
        m = re.match(r"\[(\w+)\]", line)
        if m:
            section = m.group(1)
            continue
        m = re.match(r"(\w+)\s*=\s*([-+0-9.eE]+)\s*#\s*(fitted|fixed|assumed):\s*(.*)", line)
        if m:
            name = f"{section}.{m.group(1)}"
            why = m.group(4).strip()
            if m.group(3) == "fitted":
                why += f" (fitted on {', '.join(fit_points.get(name, [])) or 'no point'})"
            out.append({"parameter": name, "value": m.group(2), "kind": m.group(3), "why": why})
    return out


def markdown(rows: list[dict[str, object]] | None = None) -> str:
    """docs/fabric-model.md's validation section, as markdown: every point with its error and bound,
    the held-out error by box and class (worst points named), and the parameters by kind."""
    rows = rows if rows is not None else error_table()
    lines = [TABLE_HEAD, "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        bound = f"±{r['bound_pct']:.0f}%" if r["bound_pct"] is not None else "-"
        lines.append(f"| {r['id']} | {r['use']} | {r['box']} | {r['class']} | {_what(r)} | "
                     f"{r['measured']:.4g} {r['unit']} | {float(r['predicted']):.4g} | "  # type: ignore[arg-type]
                     f"{float(r['error_pct']):+.1f}% | {bound} | {r['source']} |")  # type: ignore[arg-type]
    lines += ["", "Held-out points (use = check) by box and class of route; `all` pools the boxes:", "",
              "| box | class | points | median abs error | max abs error | worst point |",
              "|---|---|---|---|---|---|"]
    for c in class_summary(rows):
        lines.append(f"| {c['box']} | {c['class']} | {c['n']} | {float(c['median_abs_pct']):.1f}% | "  # type: ignore[arg-type]
                     f"{float(c['max_abs_pct']):.1f}% | {c['worst']} ({float(c['worst_error_pct']):+.1f}%) |")  # type: ignore[arg-type]
    lines += ["", "Parameters (calibration/params.toml) by kind; profile inputs are the `input` points above:", "",
              "| parameter | value | kind | why / source |", "|---|---|---|---|"]
    for prm in parameter_table():
        lines.append(f"| {prm['parameter']} | {prm['value']} | {prm['kind']} | {prm['why']} |")
    by_use: dict[str, list[float]] = {}
    for r in rows:
        by_use.setdefault(str(r["use"]), []).append(abs(float(r["error_pct"])))  # type: ignore[arg-type]
    summary = "; ".join(f"{use}: {len(v)} points, median |error| {_median(v):.1f}%, "
                        f"max {max(v):.1f}%" for use, v in sorted(by_use.items()))
    return "\n".join(lines) + f"\n\nSummary: {summary}.\n"


# -- fitting ---------------------------------------------------------------------------------------

def _nelder_mead(f: Callable[[list[float]], float], x0: list[float], iters: int = 600,
                 step: float = 0.5) -> list[float]:
    """Minimise f from x0 (a plain Nelder-Mead; parameters are searched in log space)."""
    n = len(x0)
    simplex = [list(x0)] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = sorted(range(n + 1), key=lambda i: values[i])
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        centroid = [sum(x[j] for x in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]

        def at(t: float) -> list[float]:
            return [c + t * (c - w) for c, w in zip(centroid, worst)]

        xr = at(1.0)
        fr = f(xr)
        if fr < values[0]:
            xe = at(2.0)
            fe = f(xe)
            simplex[-1], values[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = xr, fr
        else:
            xc = at(-0.5)
            fc = f(xc)
            if fc < values[-1]:
                simplex[-1], values[-1] = xc, fc
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (x - b) for b, x in zip(best, s)] for s in simplex[1:]]
                values = [values[0]] + [f(s) for s in simplex[1:]]
    return simplex[min(range(n + 1), key=lambda i: values[i])]


def _from_free(v: float, bounds: tuple[float, float]) -> float:
    lo, hi = bounds
    return lo + (hi - lo) / (1.0 + math.exp(-v))


def _to_free(value: float, bounds: tuple[float, float]) -> float:
    lo, hi = bounds
    t = min(max((value - lo) / (hi - lo), 1e-6), 1 - 1e-6)
    return math.log(t / (1 - t))


def fit(points: Sequence[Point] | None = None) -> dict[str, dict[str, float]]:
    """Fit the `fitted` parameters on the `fit` points only; returns the full parameter set.

    Objective per stage: the sum of squared log ratios predicted/measured over that stage's
    fit points.
    """
    points = [p for p in (points or load_points()) if p.use == "fit"]
    params = copy.deepcopy(model.params())
    try:
        for _name, keys, quantities in STAGES:
            stage_points = [p for p in points if p.quantity in quantities]

            def loss(x: list[float]) -> float:
                trial = copy.deepcopy(params)
                for (sec, key), v in zip(keys, x):
                    trial[sec][key] = _from_free(v, BOUNDS[(sec, key)])
                model.use_params(trial)
                return sum(math.log(max(predict(p), 1e-9) / p.measured) ** 2 for p in stage_points)

            # Start from the middle of every range, not from the current values, so that a refit
            # gives the same parameters however often it is run.
            x = [_to_free(START[k], BOUNDS[k]) if k in START else 0.0 for k in keys]
            for _restart in range(4):  # restarts: Nelder-Mead stalls on a shrunken simplex
                x = _nelder_mead(loss, x)
            for (sec, key), v in zip(keys, x):
                params[sec][key] = _from_free(v, BOUNDS[(sec, key)])
    finally:
        model.use_params(None)
    return params


def write_fitted(params: dict[str, dict[str, float]], path: Path = PARAMS_FILE) -> None:
    """Rewrite the fitted values in params.toml in place, keeping its comments."""
    text = path.read_text(encoding="utf-8")
    section = None
    out = []
    fitted = {k for _n, keys, _q in STAGES for k in keys}
    for line in text.splitlines(keepends=True):
        m = re.match(r"\[(\w+)\]", line)
        if m:
            section = m.group(1)
        m = re.match(r"(\s*)(\w+)(\s*=\s*)([-+0-9.eE]+)(.*)", line, re.S)
        if m and section and (section, m.group(2)) in fitted:
            value = params[section][m.group(2)]
            value = 0.0 if abs(value) < 1e-6 else float(f"{value:.4g}")
            line = f"{m.group(1)}{m.group(2)}{m.group(3)}{value!r}{m.group(5)}"
        out.append(line)
    path.write_text("".join(out), encoding="utf-8")
    model._default_params.cache_clear()


TABLE_HEAD = "| point | use | box | class | what | measured | predicted | error | bound | source |"
BEGIN, END = "<!-- calibration table: generated by python -m pcieprof.sim.calibration -->", \
    "<!-- end of calibration table -->"


def update_readme(path: Path) -> bool:
    """Replace the generated validation section of a README (between the BEGIN and END markers)
    with the current one. Returns True when the file changed."""
    text = path.read_text(encoding="utf-8")
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{path}: no generated calibration section ({BEGIN} ... {END})")
    new = text[:start + len(BEGIN)] + "\n" + markdown().strip() + "\n" + text[end:]
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text

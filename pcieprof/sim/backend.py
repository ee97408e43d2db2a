"""The `sim` backend: run a measurement plan against the fabric model and write the bundle.

`pcieprof topology --backend sim --sim-profile NAME|FILE.toml` builds the same `probes.plan.Plan`
as the real backends and hands it here. Every row a real run would write is written, from the
model, with `backend=sim`; every part says `source=simulated`; topology.json is the fabric's
(for a VM profile: the flat tree the guest sees, the real one under `sim`); nccl_choices.json
holds what the model assumed NCCL chose, in the shape of the NCCL log parser's output, and says
that it is an assumption and not a log, with the profile's known issues that choice runs into. A
VM profile with a bare-metal twin also gets topology.json `sim.vm`: the like-for-like table
against its twin, the mechanisms behind it, the host-side changes priced, the known issues
(`pcieprof.sim.vm_cost`), so that a report can tell the VM story from the bundle alone.
"""

from __future__ import annotations

from typing import Any

from pcieprof import progress
from pcieprof.bundle import Bundle
from pcieprof.bundle.nccl_choices import NcclCase, NcclChoices, NcclParsed
from pcieprof.bundle.rows import AllReduceRow
from pcieprof.bundle.topology import Topology
from pcieprof.cards import DEFAULT_CARD, ModelCard, load_card
from pcieprof.sim import collectives, model, vm_cost
from pcieprof.sim.assumed import variant_times
from pcieprof.sim.fabric import Fabric, load_profile, topology

BACKEND = "sim"
SOURCE = "simulated"
NAN = float("nan")


def _detail(fabric: Fabric, extra: str = "") -> str:
    base = f"simulated by fabric model {fabric.name}; a prediction, not a measurement"
    return f"{base}; {extra}" if extra else base


def p2p_rows(fabric: Fabric, plan: Any) -> list[dict[str, Any]]:
    """p2p.csv rows for every P2PCase of the plan."""
    rows = []
    for case in plan.p2p:
        src, dst = case.row_ends()
        bw, lat = model.predict_p2p(fabric, src, dst, case.path, case.direction, case.size_bytes)
        row: dict[str, Any] = {
            "backend": BACKEND, "src": src, "dst": dst, "path": case.path,
            "direction": case.direction, "size_bytes": case.size_bytes, "iters": case.iters,
            "trials": case.trials, "status": "ok",
            "detail": _detail(fabric, "no spread: min/max left empty")}
        if case.kind == "bandwidth":
            row["bandwidth_gbps"] = bw
        else:
            # A small copy: the path latency plus the bytes at the path's peak rate.
            peak, _ = model.predict_p2p(fabric, src, dst, case.path, case.direction, 0)
            row["latency_us"] = lat + case.size_bytes / (peak * 1e3)
        rows.append(row)
    return rows


def concurrent_rows(fabric: Fabric, case: Any) -> list[dict[str, Any]]:
    """concurrent.csv rows of one ConcurrentCase: one per flow and the aggregate (flow=-1)."""
    flows = [tuple(f) for f in case.flows]
    rates = model.predict_concurrent(fabric, flows, case.op, case.size_bytes)
    hit = model.collapsed_flows(fabric, flows) if case.op == "write" else set()
    note = (f"posted-write collapse ({fabric.collapse.flow_gbps:g} GB/s per stream, see profile)"
            if hit and fabric.collapse else "")
    base = {"backend": BACKEND, "pattern": case.pattern, "op": case.op,
            "size_bytes": case.size_bytes, "iters": case.iters, "status": "ok"}
    extra = "; ".join(x for x in (case.detail, note) if x)
    rows = [{**base, "flow": i, "src": s, "dst": d, "bandwidth_gbps": r,
             "detail": _detail(fabric, "; ".join(x for x in (case.detail, note if i in hit else "")
                                                 if x))}
            for i, ((s, d), r) in enumerate(zip(flows, rates))]
    rows.append({**base, "flow": -1, "src": -1, "dst": -1, "bandwidth_gbps": sum(rates),
                 "detail": _detail(fabric, extra)})
    return rows


def allreduce_rows(fabric: Fabric, case: Any) -> tuple[list[AllReduceRow], list[dict[str, Any]]]:
    """allreduce.csv rows of one AllReduceCase, and the per-size choices the model made."""
    n = len(case.ranks)
    rows, tuner = [], []
    for size in case.sizes:
        t, choice = collectives.predict_allreduce(fabric, case.ranks, size, "bf16", case.env)
        for dtype in case.dtypes:
            algbw = size / (t * 1e3) if t > 0 else NAN
            rows.append(AllReduceRow(
                backend=BACKEND, variant=case.variant, env=dict(case.env), nranks=n,
                ranks=tuple(case.ranks), size_bytes=size, dtype=dtype, time_us=t,
                algbw_gbps=algbw, busbw_gbps=collectives.busbw_gbps(size, t, n) if n > 1 else NAN,
                iters=case.iters, status="ok",
                detail=_detail(fabric, f"assumed NCCL choice {choice['algo']}/{choice['proto']}, "
                                       f"{choice['channels']} channels")))
        tuner.append({"coll": "AllReduce", "bytes": size, "algo": choice["algo"],
                      "proto": choice["proto"], "channels": choice["channels"], "time_us": t})
    return rows, tuner


def choices_entry(fabric: Fabric, case: Any, tuner: list[dict[str, Any]]) -> NcclCase:
    """One nccl_choices.json entry, in the shape of the NCCL log parser's `parsed` output."""
    ranks = list(case.ranks)
    n = len(ranks)
    c: dict[str, Any] = {}
    if n > 1:
        c = collectives.choices(fabric, ranks, case.env)
        # The parser keys peers by rank; the model by GPU: rank i is ranks[i].
        by_rank = {f"{i}->{(i + 1) % n}": c["transport"][f"{ranks[i]}->{ranks[(i + 1) % n]}"]
                   for i in range(n)}
        nch, level, why = c["channels"], c["p2p_level"], [c["p2p_level_why"], c["channels_why"]]
    else:
        by_rank, nch, level, why = {}, 0, None, ["one rank: no communication"]
    vias = sorted(set(by_rank.values()))
    parsed = NcclParsed(
        source=f"fabric model {fabric.name}", nccl_version=fabric.nccl_version,
        nccl_versions=[fabric.nccl_version], cuda_driver_version=fabric.cuda_driver_version,
        env=dict(case.env), nranks=n, nchannels=nch,
        rings={str(ch): list(range(n)) for ch in range(nch)}, peer_transport=by_rank,
        transports=vias, transport_families=sorted({v.split("/")[0] for v in vias}),
        tuner=tuner)
    return NcclCase(variant=case.variant, ranks=tuple(ranks), env=dict(case.env), log=None,
                    parsed=parsed, source=SOURCE, backend=BACKEND,
                    model={"p2p_level": level, "why": why,
                           "gpu_transport": c.get("transport", {}),
                           "known_risks": [{"id": i.id, "title": i.title, "check": i.check,
                                            "sources": list(i.sources)}
                                           for i in vm_cost.known_risks(fabric, case.env, ranks)]},
                    note="simulated: the fabric model's assumption of what NCCL would choose, "
                         "not read from an NCCL log")


def run_plan(plan: Any, profile: str, bundle: Bundle, card: ModelCard | None = None) -> None:
    """Write every row the real backends would, from the fabric model.

    Args:
        plan: a `probes.plan.Plan` (devices are GPU indices of the fabric).
        profile: a profile name (`pcieprof.sim.fabric.list_profiles()`) or a path to a TOML file.
        bundle: the bundle to write into (created by the caller with source=simulated).
        card: the model whose decode a VM profile's like-for-like table prices (pcieprof.cards'
            DEFAULT_CARD when None).

    Writes topology.json, p2p.csv, concurrent.csv, allreduce.csv and nccl_choices.json, appending
    rows as each case is computed, and sets the parts discovery, p2p, concurrent and allreduce
    to `ok` with source=simulated, backend=sim.

    Raises:
        BadInput: unknown profile, bad fabric file, or plan devices the fabric does not have.
    """
    fabric = load_profile(profile)
    for d in plan.devices:
        fabric.gpu(d)
    part = {"source": SOURCE, "backend": BACKEND}
    bundle.set_versions(nccl=fabric.nccl_version, driver=fabric.driver_version,
                        cuda=fabric.cuda_driver_version, sim_profile=fabric.name)
    topo = topology(fabric)
    # the variants of the full group, at the card's decode sizes: what the tuner's gains rest on
    full = {c.variant: (c.variant, dict(c.env), list(c.ranks)) for c in plan.allreduce
            if list(c.ranks) == list(plan.devices)}
    if full:
        topo["sim"]["assumed"] = variant_times(
            fabric, list(full.values()),
            vm_cost.decode_sizes(card if card is not None else load_card(DEFAULT_CARD)))
    vm = vm_cost.bundle_section(fabric, card)
    if vm is not None:
        progress.info(f"sim: {fabric.name} is a VM: pricing it against its bare-metal twin "
                      f"{vm.bare_profile} (like for like, host-side changes)")
        topo["sim"]["vm"] = vm.to_json()
    bundle.write_doc(Topology.from_json(topo))
    bundle.set_part("discovery", "ok", profile=fabric.name, file=fabric.path,
                    gpus=len(fabric.gpus), **part)
    progress.info(f"sim: fabric model {fabric.name} ({len(fabric.gpus)} GPUs): predicting "
                  f"{len(plan.p2p)} copies, {len(plan.concurrent)} concurrent patterns, "
                  f"{len(plan.allreduce)} all-reduce cases")
    bundle.set_part("p2p", "running", **part)
    bundle.append_rows("p2p", p2p_rows(fabric, plan))
    bundle.set_part("p2p", "ok", cases=len(plan.p2p), **part)
    bundle.set_part("concurrent", "running", **part)
    for case in plan.concurrent:
        bundle.append_rows("concurrent", concurrent_rows(fabric, case))
    bundle.set_part("concurrent", "ok", cases=len(plan.concurrent), **part)
    bundle.set_part("allreduce", "running", **part)
    choices = NcclChoices()
    with progress.task("sim all-reduce", total=len(plan.allreduce)) as bar:
        for case in plan.allreduce:
            rows, tuner = allreduce_rows(fabric, case)
            bundle.append_rows("allreduce", rows)
            name = case.variant if list(case.ranks) == list(plan.devices) else case.label
            choices.cases[name] = choices_entry(fabric, case, tuner)
            bar.advance()
    bundle.write_doc(choices)
    bundle.set_part("allreduce", "ok", cases=len(plan.allreduce), **part)

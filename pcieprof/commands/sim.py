"""`pcieprof sim`: the fabric model's profiles. `list` names them, `describe` prints one as a tree,
`calibration` prints the model's error against the published reference points."""

from __future__ import annotations

from typing import Any

import click

from pcieprof.commands.options import verbosity


def render_tree(fabric: object) -> str:
    """The fabric as an indented tree: sockets, root ports, switches (by chip), GPUs, links.

    Args:
        fabric: a `pcieprof.sim.fabric.Fabric`.
    """
    from pcieprof.sim import model
    from pcieprof.sim.fabric import Fabric, pair_level, raw_link_gbps

    assert isinstance(fabric, Fabric)
    f = fabric

    def link(gen: int, width: int) -> str:
        return (f"Gen{gen} x{width} ({raw_link_gbps(gen, width):.1f} GB/s raw, "
                f"{model.link_gbps(gen, width):.1f} payload)")

    def acs(on: bool) -> str:
        return "ACS redirect ON" if on else "ACS redirect off"

    lines = [f"{f.name}: {f.description}", f"  file: {f.path}",
             f"  host: {f.cpu}; IOMMU {f.iommu_mode}; NCCL assumed {f.nccl_version}"]
    v = f.virtualization
    if v.is_vm:
        lines.append(f"  VM guest under {v.hypervisor or 'a hypervisor'}; guest sees the "
                     f"{'flat tree (every GPU on one root bus)' if v.guest_view == 'flat' else 'real tree'}")
    if f.inter_socket is not None:
        lat = f.inter_socket.latency_us
        lines.append(f"  inter-socket link: {f.inter_socket.kind}, {f.inter_socket.p2p_gbps:g} GB/s per "
                     f"P2P stream, {f.inter_socket.aggregate_gbps:g} GB/s all streams, per direction"
                     + (f", +{lat:g} us" if lat is not None else ""))
    if f.collapse is not None and f.collapse.enabled:
        masked = " (masked: the IOMMU translates)" if f.translated else ""
        lines.append(f"  posted-write collapse: {f.collapse.flow_gbps:g} GB/s per write stream when "
                     f"GPUs of one uplink write to 2+ root complexes{masked}")
    for sock in f.sockets:
        lines.append(f"  socket {sock.id} (NUMA {sock.numa_node}{', CPUs ' + sock.cpus if sock.cpus else ''})")
        ports = [rp for rp in f.root_ports.values() if rp.socket == sock.id]
        for i, rp in enumerate(ports):
            last_rp = i == len(ports) - 1
            pre = "    " + ("└─ " if last_rp else "├─ ")
            cont = "    " + ("   " if last_rp else "│  ")
            lines.append(f"{pre}root port {rp.bdf} [{rp.id}, {rp.root_complex}] {link(rp.gen, rp.width)}, "
                         f"{acs(rp.acs_redirect)}")
            children: list[tuple[str, object]] = []
            children += [("switch", sw) for sw in f.switches.values() if sw.upstream == rp.id]
            children += [("gpu", g) for g in f.gpus if g.parent == rp.id]
            for j, (kind, node) in enumerate(children):
                last = j == len(children) - 1
                p2 = cont + ("└─ " if last else "├─ ")
                c2 = cont + ("   " if last else "│  ")
                if kind == "switch":
                    sw = node
                    chip = f.chips.get(sw.chip) if sw.chip else None  # type: ignore[attr-defined]
                    chip_txt = (f" on chip {chip.id} ({chip.name}"
                                f"{', partitions share its fabric' if chip.internal_p2p else ''})"
                                if chip else "")
                    lines.append(f"{p2}switch {sw.id} {sw.bdf} {sw.vendor} {sw.device}{chip_txt}; "  # type: ignore[attr-defined]
                                 f"uplink {link(sw.gen, sw.width)}, {acs(sw.acs_redirect)}")  # type: ignore[attr-defined]
                    gpus = [g for g in f.gpus if g.parent == sw.id]  # type: ignore[attr-defined]
                    for k, g in enumerate(gpus):
                        lk = k == len(gpus) - 1
                        port = f" via port {g.port_bdf}" if g.port_bdf else ""
                        lines.append(f"{c2}{'└─ ' if lk else '├─ '}GPU{g.index} {g.bdf}{port} {g.name}, "
                                     f"{link(g.gen, g.width)}")
                else:
                    gpu: Any = node
                    lines.append(f"{p2}GPU{gpu.index} {gpu.bdf} {gpu.name}, {link(gpu.gen, gpu.width)}")
    n = len(f.gpus)
    header = "        " + "".join(f"GPU{b:<5d}" for b in range(n))
    lines += ["", "  pair levels (nvidia-smi topo -m), real tree:", "  " + header]
    for a in range(n):
        lines.append(f"  GPU{a:<4d}" + "".join(f"{pair_level(f, a, b):<8s}" for b in range(n)))
    if v.guest_view == "flat":
        lines.append("  (the guest sees PHB for every pair)")
    lines += ["", "  predicted P2P (uni, 256 MiB / small-copy latency):"]
    for a, b in [(0, x) for x in range(1, n)]:
        bw, lat = model.predict_p2p(f, a, b, "p2p", "uni", 256 << 20)
        lines.append(f"    GPU{a} -> GPU{b}: {bw:5.1f} GB/s, {lat:4.2f} us   "
                     f"[{' > '.join(model.describe_route(f, a, b))}]")
    return "\n".join(lines)


@click.group("sim")
def command() -> None:
    """The PCIe fabric model behind `pcieprof topology --backend sim`: its profiles and its
    calibration. A profile is a commented TOML file; copy one and edit it for your box."""


@command.command("list")
@verbosity
def list_cmd() -> None:
    """Name the shipped profiles with a one-line description each."""
    from pcieprof.sim.fabric import list_profiles, load_profile

    for name in list_profiles():
        click.echo(f"{name:24s} {load_profile(name).description}")


@command.command("describe")
@click.argument("profile")
@verbosity
def describe_cmd(profile: str) -> None:
    """Print PROFILE (a name from `pcieprof sim list` or a FILE.toml) as a tree, with the pair
    levels and the predicted P2P bandwidth and latency from GPU0."""
    from pcieprof.sim.fabric import load_profile

    click.echo(render_tree(load_profile(profile)))


@command.command("calibration")
@verbosity
def calibration_cmd() -> None:
    """Print the model's error on every published reference point (markdown table)."""
    from pcieprof.sim import calibration

    click.echo(calibration.markdown(), nl=False)

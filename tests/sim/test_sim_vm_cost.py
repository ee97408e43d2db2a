"""What virtualization costs, like for like: the VM profile against its bare-metal twin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcieprof.bundle.vm_cost import VmTable
from pcieprof.cards import load_card
from pcieprof.cards.step import ALL_REDUCE, Layout, count_collectives
from pcieprof.errors import BadInput
from pcieprof.sim import vm_cost
from pcieprof.sim.fabric import load_profile


LLAMA = Path(__file__).resolve().parents[1] / "data" / "cards" / "llama-3.1-70b" / "config.json"
GLM5_SIZES = vm_cost.decode_sizes(load_card("glm5-nvfp4"))


@pytest.fixture(scope="module")
def table() -> vm_cost.LikeForLike:
    return vm_cost.like_for_like("rtxpro6000-8x-vm")


def test_decode_sizes_and_step_count_are_the_cards() -> None:
    card = load_card("glm5-nvfp4")  # the default card
    table = vm_cost.like_for_like("rtxpro6000-8x-vm", sizes=GLM5_SIZES[:1])
    assert (table.model, table.hidden, table.step_allreduces) == (card.name, 6144, 157)
    for batch, size in zip(vm_cost.DECODE_BATCHES, GLM5_SIZES):
        coll = count_collectives(card, Layout(tp=8), batch)
        ars = [c for c in coll if c.op == ALL_REDUCE]
        assert sum(c.count for c in ars) == table.step_allreduces
        assert {c.size_bytes for c in ars} == {size}
    assert (GLM5_SIZES[0], GLM5_SIZES[-1]) == (12 << 10, 768 << 10)


def test_two_cards_two_vm_costs() -> None:
    """A dense 80-layer Llama (hidden 8192) is priced at its own sizes and step (161 all-reduces
    of 16 KiB at batch 1), not GLM-5's (157 of 12 KiB)."""
    glm = vm_cost.like_for_like("rtxpro6000-8x-vm", sizes=None, ranks=None)
    llama = vm_cost.like_for_like("rtxpro6000-8x-vm", card=load_card(LLAMA))
    assert sorted({c.size_bytes for c in llama.per_size}) == [b * 8192 * 2
                                                              for b in vm_cost.DECODE_BATCHES]
    assert llama.step_allreduces == 161 and glm.step_allreduces == 157
    step_g = next(c for c in glm.step if c.basis == "default" and c.batch == 1)
    step_l = next(c for c in llama.step if c.basis == "default" and c.batch == 1)
    assert (step_l.count, step_l.size_bytes) == (161, 16 << 10)
    assert step_l.vm.time_us != step_g.vm.time_us
    doc = vm_cost.bundle_section(load_profile("rtxpro6000-8x-vm"), load_card(LLAMA))
    assert doc is not None and doc.model == "llama-3.1-70b" and doc.step_allreduces == 161
    host = {h.id: h for h in doc.host_changes}["serve_on_host"]
    glm_host = next(h for h in vm_cost.host_changes("rtxpro6000-8x-vm")
                    if h.id == "serve_on_host")
    assert host.step_default_us[0] != glm_host.step_default_us[0]


def test_every_size_and_basis_once_and_the_step_is_157_of_them(table) -> None:
    keys = [(c.basis, c.size_bytes) for c in table.per_size]
    assert sorted(keys) == sorted((b, s) for b in vm_cost.BASES for s in GLM5_SIZES)
    assert (table.vm_profile, table.bare_profile) == ("rtxpro6000-8x-vm", "rtxpro6000-8x-switch")
    for one, step in zip(table.per_size, table.step):
        assert (one.basis, one.size_bytes) == (step.basis, step.size_bytes)
        assert step.count == 157 and step.vm.time_us == pytest.approx(157 * one.vm.time_us)
        assert step.bare.time_us == pytest.approx(157 * one.bare.time_us)


def test_the_vm_never_beats_its_twin_on_the_data_path(table) -> None:
    for c in table.per_size:
        if c.basis in ("best", "same_choices"):
            # same choices: only the path differs; best vs best: bare metal can do all the VM does
            assert c.bare.time_us < c.vm.time_us, (c.basis, c.size_bytes)
        if c.basis == "same_choices":
            assert (c.vm.proto, c.vm.channels, c.vm.p2p_edges) == \
                (c.bare.proto, c.bare.channels, c.bare.p2p_edges)
            assert "iommu_translation" in c.why


def test_a_faster_vm_default_is_explained_by_the_flat_tree(table) -> None:
    ahead = [c for c in table.per_size if c.vm.time_us < c.bare.time_us]
    assert ahead, "the default at decode sizes: the VM's NCCL keeps 4 channels and LL"
    for c in ahead:
        assert c.basis in ("default", "best_safe")
        assert c.why[0] == "flat_guest_tree"
        assert (c.vm.proto, c.vm.channels) != (c.bare.proto, c.bare.channels)
    default_12k = next(c for c in table.per_size if c.basis == "default" and c.size_bytes == 12 << 10)
    assert (default_12k.bare.proto, default_12k.bare.channels) == ("Simple", 2)
    assert (default_12k.vm.proto, default_12k.vm.shm_edges) == ("LL", 8)


def test_mechanisms_are_data_with_sources(table) -> None:
    assert set(table.mechanisms) == {"iommu_translation", "acs_redirect", "flat_guest_tree"}
    for m in table.mechanisms.values():
        assert m.text and m.sources and all(s.strip() for s in m.sources)
    used = {i for c in table.per_size + table.step for i in c.why}
    assert used <= set(table.mechanisms)


def test_vm_best_through_the_iommu_carries_the_hang_risk_and_best_safe_avoids_it(table) -> None:
    for c in table.per_size:
        risky = "nccl_p2p_hang_translated_iommu" in c.vm.risks
        assert risky == (c.vm.p2p_edges > 0)
        if c.basis == "best_safe":
            assert not c.vm.risks and not c.bare.risks
        assert not c.bare.risks  # no translation on bare metal


def test_known_risks_need_p2p_and_translation() -> None:
    vm, bare = load_profile("rtxpro6000-8x-vm"), load_profile("rtxpro6000-8x-switch")
    sys_ = {"NCCL_P2P_LEVEL": "SYS"}
    assert [i.id for i in vm_cost.known_risks(vm, sys_)] == ["nccl_p2p_hang_translated_iommu"]
    assert vm_cost.known_risks(vm, {}) == []  # SHM everywhere in the flat guest
    assert vm_cost.known_risks(bare, sys_) == []
    issue = vm.known_issues[0]
    assert "--verify" in issue.check and any("nccl" in s.lower() and "#" in s for s in issue.sources)


def test_rows_are_flat_and_the_document_reads_back_as_written(table) -> None:
    rows = table.rows()
    assert len(rows) == 2 * len(vm_cost.BASES) * len(GLM5_SIZES)
    assert {r.table for r in rows} == {"per_size", "step"}
    assert all(isinstance(r.vm_time_us, float) and r.vm_env for r in rows)
    doc = json.loads(json.dumps(table.document().to_json()))
    assert doc["source"] == "simulated" and doc["step_allreduces"] == 157
    assert doc["model"] == "glm5-nvfp4"
    assert VmTable.from_json(doc) == table.document()  # one shape, written and read back


def test_host_changes_priced_with_risk_and_feasibility() -> None:
    res = {h.id: h for h in vm_cost.host_changes("rtxpro6000-8x-vm")}
    assert set(res) == {"serve_on_host", "host_iommu_pt", "acs_off_switch_ports",
                        "ats_direct_translated_p2p", "guest_real_topology"}
    for h in res.values():
        assert h.risk and h.sources
    # iommu=pt on the host leaves VFIO's translation in place: no gain, and it says why
    pt = res["host_iommu_pt"]
    assert pt.gain_default_us == 0 and pt.gain_best_safe_us == 0 and "vfio" in pt.effect.lower()
    # serving on the host removes translation and redirect; with NCCL tuned the step halves
    host = res["serve_on_host"]
    assert host.feasible and host.gain_best_safe_us > 0.3 * host.step_best_safe_us[0]
    assert host.p2p_same_switch_gbps[1] > host.p2p_same_switch_gbps[0]
    # clearing ACS under VFIO needs ATS, which the GPUs of this box do not have
    for hid in ("acs_off_switch_ports", "ats_direct_translated_p2p"):
        assert not res[hid].feasible and "ATS" in str(res[hid].blocked_by)


def test_not_a_vm_is_refused() -> None:
    with pytest.raises(BadInput, match="bare-metal twin"):
        vm_cost.like_for_like("rtxpro6000-8x-switch")
    assert vm_cost.bundle_section(load_profile("rtxpro6000-8x-switch")) is None


def test_readme_vm_table_is_current(table) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "fabric-model.md").read_text(
        encoding="utf-8")
    assert vm_cost.markdown(table).strip() in doc, (
        "docs/fabric-model.md's VM table is stale: regenerate it with "
        "`python -m pcieprof.sim.vm_cost --readme docs/fabric-model.md`")

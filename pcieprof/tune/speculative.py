"""Multi-token prediction (MTP, SGLang's NEXTN) where the model card has the layer: the launch
line of the top layout with the speculative flags, its memory checked on the box, and the gain
as it was reported (the card's `[speculative]` table), never as measured here.

The draft runs the card's MTP layer(s) on the same GPUs: its weights (BF16, split over TP like a
decoder layer; SGLang's NextN shares the target's embedding and lm_head) and one more layer of KV
per token are added to the top layout's memory before the line is offered.
"""

from __future__ import annotations

from typing import Any

from pcieprof.analysis.box import GIB, gib
from pcieprof.bundle.recommendations import LayoutAdvice, Recommendation, Recommendations, ranked
from pcieprof.cards import ModelCard
from pcieprof.tune.launch import launch_line

RULE = "speculative_mtp"


def facts(card: ModelCard) -> dict[str, Any] | None:
    """The card's `[speculative]` table, when the card has an MTP layer and one."""
    if card.mtp_layers < 1 or not card.speculative:
        return None
    return card.speculative


def mtp_bytes(card: ModelCard, bytes_per_param: float) -> float:
    """Weight bytes of the card's MTP layer(s): one MoE decoder layer each (routed and shared
    experts, router, attention) plus the projection of [embedding; hidden] to hidden, stored at
    `bytes_per_param`."""
    per_layer = 0.0
    for name, n in (("routed_experts", card.num_moe_layers), ("shared_experts", card.num_moe_layers),
                    ("router", card.num_moe_layers), ("attention", card.num_layers)):
        g = card.weights.get(name)
        if g is not None and n:
            per_layer += g.params / n
    per_layer += 2 * card.hidden_size * card.hidden_size  # eh_proj
    return per_layer * bytes_per_param * card.mtp_layers


def recommendation(result: Recommendations, card: ModelCard) -> Recommendation | None:
    """The MTP launch of the top layout, or None (no MTP layer, no facts, no fitting layout)."""
    f = facts(card)
    top = result.layouts[0] if result.layouts and not result.layouts_unranked else None
    if f is None or top is None or not top.fits or not top.command:
        return None
    extra = mtp_bytes(card, float(f["mtp_dtype_bytes"])) / (top.tp * top.pp)
    need = top.weights_gib * GIB + extra
    kv = top.kv_gib_per_request * GIB * (1 + card.mtp_layers / max(card.num_layers, 1))

    def box_requests(memory_gib: float) -> tuple[int, float]:
        """(requests of the box whose KV fits, bytes for weights + KV per GPU)."""
        room = memory_gib * GIB * top.mem_fraction
        reqs = int((room - need) // kv) if room > need and kv > 0 else 0
        # each GPU of a DP-attention layout holds its own requests' KV
        return reqs * (top.tp if top.dp_attention else 1) * top.replicas, room

    fits_c, room = box_requests(top.gpu_memory_gib)
    # an assumed memory is a range: the KV room at its low end too
    low_c, low_room = (box_requests(top.gpu_memory_gib_low)
                       if top.gpu_memory_gib_low is not None else (fits_c, room))
    uncertain = fits_c >= 1 > low_c
    reqs = f"{low_c}-{fits_c}" if low_c != fits_c else str(fits_c)
    rooms = (f"{low_room / GIB:.1f}-{gib(room)}" if round(low_room / GIB, 1) != round(room / GIB, 1)
             else gib(room))
    mem = (f"{gib(need)} of weights per GPU with the MTP layer (+{gib(extra)}), KV room for "
           f"{reqs} request(s) at {top.context_tokens} tokens ({rooms} at "
           f"--mem-fraction-static {top.mem_fraction:g})"
           + ("; fit uncertain: it fits at the high end of the assumed memory only"
              if uncertain else "")
           # memory the bundle does not tell is the card's: the KV room rests on it, said so
           + (f"; {top.memory_source}" if top.memory_assumed() else ""))
    base, spec = (float(x) for x in f["reported_tok_s"])
    share = (f"reported ~{spec / base:.1f}x tokens per second at concurrency 1: the token time "
             f"~{1000 / base:.0f} -> ~{1000 / spec:.0f} ms")
    caveats = [str(f["checkpoint_note"]),
               "reported on another box, not yet run on this one: serve-bench with the line and "
               "compare", "the gain shrinks with concurrency and context (the source: 60-80 tok/s "
               "at 100K tokens)"]
    if fits_c < 1:
        return Recommendation(
            rule=RULE, kind="info", confidence="reported",
            title=f"Multi-token prediction ({f['algorithm']}) does not fit {top.label} on this box",
            gain_text=f"reported {f['reported']} on {f['reported_box']} [{f['source']}]",
            evidence=[mem], caveats=caveats[:1], priority=0.5,
            ranked_by="score 0.5, fixed: a reported gain of another box (unpriced: after every "
                      "priced card)")
    line = launch_line(result, top) + " " + " ".join(str(x) for x in f["flags"])
    return Recommendation(
        rule=RULE, kind="launch", confidence="reported",
        title=f"Multi-token prediction ({f['algorithm']}, the card's MTP layer) on {top.label}"
              + (" (fit uncertain on the assumed GPU memory)" if uncertain else ""),
        action=line,
        gain_text=f"reported: {f['reported_short']}, ~{spec / base:.1f}x [{f['source']}]",
        evidence=[mem, f"reported: {f['reported']} on {f['reported_box']} ({share})",
                  f"card {card.name}: mtp_layers = {card.mtp_layers}"],
        caveats=caveats, priority=0.8,
        ranked_by="score 0.8, fixed: a reported gain of another box (unpriced: after every "
                  "priced card)")


def add(result: Recommendations, card: ModelCard) -> Recommendations:
    """Add the MTP recommendation to `result` (in place) where it applies."""
    rec = recommendation(result, card)
    result.recommendations = [r for r in result.recommendations if r.rule != RULE]
    if rec is not None:
        result.recommendations.append(rec)
        result.recommendations = ranked(result.recommendations)
    return result

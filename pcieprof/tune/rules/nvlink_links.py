"""An NVLink pair with fewer links than its siblings: NV17 where every other pair shows NV18.

nvidia-smi topo -m prints `NV#` for "a bonded set of # NVLinks". On an NVSwitch or full-mesh box
every pair bonds the same count, so a pair with fewer is a link that did not come up (a cable, a
bridge, a GPU's link marked down) and every ring through that pair runs at its rate. A box built
with mixed counts (DGX-1's hybrid cube mesh: NV1 and NV2 side by side) is not flagged: the rule
speaks only when one count holds at least three quarters of the NVLink pairs and the others are
fewer. `nvidia-smi nvlink --status -i <gpu>` lists each link's state and speed.
"""

from __future__ import annotations

from collections import Counter

from pcieprof.bundle.recommendations import Recommendation
from pcieprof.tune.rules.base import RuleContext

#: Share of NVLink pairs the usual count must hold before the fewer ones count as deficient.
MAJORITY = 0.75


def short_pairs(levels: dict[tuple[int, int], str]) -> tuple[int, list[tuple[int, int, int]]]:
    """(the usual link count, [(a, b, count)] of pairs with fewer), or (0, []) when the counts
    are one, mixed by design, or there is no NVLink."""
    counts = {(a, b): int(lv[2:]) for (a, b), lv in levels.items()
              if a < b and lv.startswith("NV") and lv[2:].isdigit()}
    if len(set(counts.values())) < 2:
        return 0, []
    usual, n = Counter(counts.values()).most_common(1)[0]
    short = sorted((a, b, c) for (a, b), c in counts.items() if c < usual)
    if n / len(counts) < MAJORITY or not short:
        return 0, []
    return usual, short


def evaluate(ctx: RuleContext) -> list[Recommendation]:
    usual, short = short_pairs(ctx.topology.levels())
    if not short:
        return []
    pairs = ", ".join(f"{a}-{b} NV{c}" for a, b, c in short)
    gpus = sorted({g for a, b, _ in short for g in (a, b)})
    return [Recommendation(
        rule="nvlink_links", kind="warn", priority=50, confidence="advice",
        title=(f"GPU pair {pairs} bonds fewer NVLinks than the others (NV{usual}): "
               "a link is likely down"),
        gain_text=(f"every ring through {'that pair' if len(short) == 1 else 'those pairs'} runs "
                   f"at its rate; with all links up the pair carries NV{usual}"),
        action="\n".join(f"nvidia-smi nvlink --status -i {g}" for g in gpus),
        evidence=[f"topology.json levels: {pairs} where the other pairs show NV{usual} "
                  "(nvidia-smi topo -m: NV# = a bonded set of # NVLinks)"],
        caveats=["a reseat, a bridge or the GPU's service log decides; pcieprof only reads "
                 "the count"])]

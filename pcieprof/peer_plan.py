"""What a node other than node 0 takes from node 0's plan (pcieprof.node_group).

Node 0 decides which all-reduce cases every node runs and in which order; it may not decide
anything this node's own command line would not let it: a case is a known variant by name (its
environment is this node's copy of the variant's, never the one sent), over this node's own
devices, with sizes, dtypes and repeats within what this node's own plan holds. Deadlines,
kept variables and everything else stay this node's own.
"""

from __future__ import annotations

from dataclasses import replace

from pcieprof.errors import BadInput
from probes import variants as V
from pcieprof.bundle.plan import AllReduceCase, Plan
from probes.plan import DTYPES

#: Longest caveat text taken from node 0 per case (it lands in rows and the report).
MAX_DETAIL = 500


def accept_cases(own: Plan, theirs: list[AllReduceCase]) -> list[AllReduceCase]:
    """Node 0's all-reduce cases, checked against this node's own plan `own`.

    Raises:
        BadInput: a case this node could not have been asked for on its own command line
            (the text names it and why).
    """
    top = max((s for c in own.allreduce for s in c.sizes), default=0)
    warmup = max((c.warmup for c in own.allreduce), default=0)
    iters = max((c.iters for c in own.allreduce), default=0)
    out = []
    for k, case in enumerate(theirs):
        def refuse(why: str) -> BadInput:
            return BadInput(f"node 0's plan: all-reduce case {k + 1} ({str(case.variant)[:40]!r}) "
                            f"{why}", hint="start every node with the same pcieprof version "
                            "and options")
        if not isinstance(case.variant, str) or case.variant not in V.VARIANTS:
            raise refuse("is no known variant")
        if not isinstance(case.ranks, list) or not case.ranks or \
                any(type(r) is not int or r not in own.devices for r in case.ranks) or \
                len(set(case.ranks)) != len(case.ranks):
            raise refuse(f"runs over devices {case.ranks!r}, not this node's {own.devices}")
        if not isinstance(case.sizes, list) or not case.sizes or \
                any(type(s) is not int or not 1 <= s <= top for s in case.sizes):
            raise refuse(f"has sizes outside 1..{top} B, this node's own bound")
        if not isinstance(case.dtypes, list) or any(d not in DTYPES for d in case.dtypes):
            raise refuse(f"has dtypes {case.dtypes!r}, not within {list(DTYPES)}")
        if type(case.warmup) is not int or type(case.iters) is not int or \
                not 0 <= case.warmup <= warmup or not 1 <= case.iters <= iters:
            raise refuse(f"repeats {case.warmup!r} + {case.iters!r} times, this node's plan at "
                         f"most {warmup} + {iters}")
        sd = case.size_detail if isinstance(case.size_detail, dict) else {}
        out.append(replace(
            case, env=dict(V.VARIANTS[case.variant].env), ranks=list(case.ranks),
            sizes=list(case.sizes), dtypes=list(case.dtypes), detail=str(case.detail)[:MAX_DETAIL],
            node0_only=case.node0_only is True,
            size_detail={str(s): str(t)[:MAX_DETAIL] for s, t in list(sd.items())[:len(case.sizes)]}))
    return out

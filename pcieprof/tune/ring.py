"""Ring order search: maximise the bottleneck link bandwidth, then minimise the summed latency.

A ring all-reduce moves 2(n-1)/n of the message over every ring link, so its bandwidth term is set
by the slowest link; at decode sizes it is latency-bound, so among rings with (nearly) the best
bottleneck we take the one with the smallest summed link latency. Between those two, rings with
fewer links at the bottleneck level win: all ring links carry traffic at once, and slow links
(switch-to-switch, socket-to-socket) share uplinks that a pairwise matrix shows as free, so a ring
that crosses between two switches four times gets half the uplink bandwidth of one that crosses
twice.

NCCL runs its ring channels in both directions (the graph files it dumps list a ring and its
reverse), so each link is scored by the slower of its two directions: bandwidth min(B[i,j],
B[j,i]), latency max(L[i,j], L[j,i]).

Exhaustive (exact) up to `EXACT_MAX` GPUs: GPU 0 is fixed as the start and each ring is counted in
one direction only ((n-1)!/2 rings), with branch-and-bound pruning on both objectives. Beyond that
a heuristic (greedy construction + 2-opt) returns its result with an upper bound on how far from
optimal it can be.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

EXACT_MAX = 10
#: Bottlenecks within this fraction of the best count as equal (measurement spread is ~2-5%).
DEFAULT_TOLERANCE = 0.05


@dataclass
class Ring:
    """A ring order and its scores.

    Attributes:
        order: GPU indices in ring order (positions in the matrices' GPU list mapped to indices).
        bottleneck_gbps: slowest link of the ring, GB/s (both directions considered).
        latency_sum_us: sum of link latencies around the ring, us (NaN if no latency matrix).
        exact: True when the search was exhaustive.
        bottleneck_bound_gbps: upper bound on any ring's bottleneck (equal to the result when exact).
        latency_bound_us: lower bound on the summed latency at that bottleneck (heuristic only).
        links: (a, b, GB/s, us) per ring link.
    """

    order: list[int]
    bottleneck_gbps: float
    latency_sum_us: float
    exact: bool
    bottleneck_bound_gbps: float
    latency_bound_us: float
    links: list[tuple[int, int, float, float]] = field(default_factory=list)

    @property
    def gap(self) -> float:
        """Relative gap of the bottleneck to its bound (0 when exact or proven optimal)."""
        if self.bottleneck_gbps <= 0:
            return math.inf
        return max(0.0, self.bottleneck_bound_gbps / self.bottleneck_gbps - 1.0)

    def cuda_visible_devices(self) -> str:
        """The ring as a CUDA_VISIBLE_DEVICES value."""
        return ",".join(str(g) for g in self.order)


def symmetric_links(bw: np.ndarray, lat: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Per-link scores from directed matrices: slower direction of each pair; NaN -> 0 GB/s."""
    b = np.where(np.isnan(bw), 0.0, bw)
    b = np.minimum(b, b.T)
    np.fill_diagonal(b, 0.0)
    if lat is None or np.isnan(lat).all():
        l = np.zeros_like(b)
    else:
        l = np.where(np.isnan(lat), np.nanmax(lat) * 10, lat)
        l = np.maximum(l, l.T)
    np.fill_diagonal(l, 0.0)
    return b, l


def score(order: list[int], b: np.ndarray, l: np.ndarray) -> tuple[float, float]:
    """(bottleneck GB/s, summed latency us) of a ring given as positions into b/l."""
    n = len(order)
    if n < 2:
        return math.inf, 0.0
    edges = [(order[i], order[(i + 1) % n]) for i in range(n if n > 2 else 1)]
    return min(b[x, y] for x, y in edges), sum(l[x, y] for x, y in edges)


def bottleneck_upper_bound(b: np.ndarray) -> float:
    """No ring beats this: every node needs two ring links, and the ring spans all nodes."""
    n = len(b)
    if n <= 2:
        return float(b[0, 1]) if n == 2 else math.inf
    second = min(sorted(b[i][np.arange(n) != i], reverse=True)[1] for i in range(n))
    # widest spanning tree (Prim on max): its weakest edge also bounds every Hamiltonian cycle
    inside = {0}
    weakest = math.inf
    while len(inside) < n:
        best, node = -1.0, -1
        for i in inside:
            for j in range(n):
                if j not in inside and b[i, j] > best:
                    best, node = b[i, j], j
        inside.add(node)
        weakest = min(weakest, best)
    return float(min(second, weakest))


def _exact(b: np.ndarray, l: np.ndarray, tol: float) -> tuple[list[int], float, float]:
    n = len(b)
    nodes = list(range(1, n))
    # phase 1: the best bottleneck
    best_b = -1.0
    best_order: list[int] = []

    def dfs_b(path: list[int], used: set[int], cur: float) -> None:
        nonlocal best_b, best_order
        if cur <= best_b:
            return
        if len(path) == n:
            if path[1] < path[-1]:
                c = min(cur, b[path[-1], path[0]])
                if c > best_b:
                    best_b, best_order = c, list(path)
            return
        last = path[-1]
        for j in sorted(nodes, key=lambda j: -b[last, j]):
            if j not in used and b[last, j] > best_b:
                used.add(j)
                path.append(j)
                dfs_b(path, used, min(cur, b[last, j]))
                path.pop()
                used.discard(j)

    dfs_b([0], {0}, math.inf)
    threshold = best_b * (1.0 - tol)
    slow = b < best_b * (1.0 + tol)  # links at the bottleneck level: they share the uplinks
    # phase 2: fewest bottleneck-level links, then least latency, among rings above the threshold
    usable = [[l[i, j] for j in range(n) if j != i and b[i, j] >= threshold] for i in range(n)]
    floor_l = min((min(u) for u in usable if u), default=0.0)
    best_key: tuple[int, float] = (n + 1, math.inf)
    result = best_order
    # a lower bound on the key: once reached, nothing can beat it (flat matrices tie everywhere)
    need_slow = sum(max(0, 2 - sum(1 for j in range(n) if j != i and b[i, j] >= threshold
                                   and not slow[i, j])) for i in range(n))
    lb_lat = sum(sum(sorted(u)[:2]) for u in usable) / 2
    fast = (b >= threshold) & ~slow
    np.fill_diagonal(fast, False)
    k = _components(fast)
    lower = (max(math.ceil(need_slow / 2), k if k >= 2 else 0), lb_lat)

    class _Done(Exception):
        pass

    def dfs_l(path: list[int], used: set[int], lat: float, nslow: int) -> None:
        nonlocal best_key, result
        remaining = n - len(path) + 1
        if (nslow, lat + remaining * floor_l - 1e-12) > best_key:
            return
        if len(path) == n:
            last = path[-1]
            if path[1] < path[-1] and b[last, 0] >= threshold:
                key = (nslow + int(slow[last, 0]), lat + l[last, 0])
                if key < (best_key[0], best_key[1] - 1e-12):
                    best_key, result = key, list(path)
                    if key[0] <= lower[0] and key[1] <= lower[1] + 1e-12:
                        raise _Done
            return
        last = path[-1]
        for j in sorted(nodes, key=lambda j: (slow[last, j], l[last, j])):
            if j not in used and b[last, j] >= threshold:
                used.add(j)
                path.append(j)
                dfs_l(path, used, lat + l[last, j], nslow + int(slow[last, j]))
                path.pop()
                used.discard(j)

    try:
        dfs_l([0], {0}, 0.0, 0)
    except _Done:
        pass
    return result, best_b, best_key[1]


def _components(adj: np.ndarray) -> int:
    """Number of connected components of an undirected boolean adjacency matrix."""
    n, seen, count = len(adj), set(), 0
    for s in range(n):
        if s in seen:
            continue
        count += 1
        stack = [s]
        seen.add(s)
        while stack:
            i = stack.pop()
            for j in np.flatnonzero(adj[i]):
                if int(j) not in seen:
                    seen.add(int(j))
                    stack.append(int(j))
    return count


def _two_opt(order: list[int], cost: np.ndarray, allowed: np.ndarray) -> list[int]:
    n = len(order)
    improved = True
    while improved:
        improved = False
        for i in range(n - 1):
            for k in range(i + 2, n if i > 0 else n - 1):
                a, b_, c, d = order[i], order[i + 1], order[k], order[(k + 1) % n]
                if not (allowed[a, c] and allowed[b_, d]):
                    continue
                if cost[a, c] + cost[b_, d] < cost[a, b_] + cost[c, d] - 1e-12:
                    order[i + 1:k + 1] = reversed(order[i + 1:k + 1])
                    improved = True
    return order


def _hamiltonian_heuristic(allowed: np.ndarray, l: np.ndarray, tries: int = 64) -> list[int] | None:
    """A Hamiltonian cycle in the graph `allowed` (greedy nearest neighbour with restarts)."""
    n = len(allowed)
    rng = np.random.default_rng(0)
    for t in range(tries):
        start = 0 if t == 0 else int(rng.integers(n))
        path, used = [start], {start}
        while len(path) < n:
            last = path[-1]
            cands = [j for j in range(n) if j not in used and allowed[last, j]]
            if not cands:
                break
            # prefer the candidate with the fewest remaining options (Warnsdorff), then latency
            cands.sort(key=lambda j: (sum(1 for k in range(n) if k not in used and allowed[j, k]),
                                      l[last, j], rng.random()))
            nxt = cands[0]
            path.append(nxt)
            used.add(nxt)
        if len(path) == n and allowed[path[-1], path[0]]:
            i0 = path.index(0)
            return path[i0:] + path[:i0]
    return None


def _heuristic(b: np.ndarray, l: np.ndarray, tol: float) -> tuple[list[int], float, float, float]:
    n = len(b)
    bound = bottleneck_upper_bound(b)
    levels = sorted({float(x) for x in b[np.triu_indices(n, 1)] if x > 0 and x <= bound}, reverse=True)
    for level in levels:
        allowed = b >= level * (1.0 - tol)
        np.fill_diagonal(allowed, False)
        order = _hamiltonian_heuristic(allowed, l)
        if order is not None:
            slow_pen = (b < level * (1.0 + tol)) * (float(l.max()) * n + 1.0)
            order = _two_opt(order, l + slow_pen, allowed)
            bot, lat = score(order, b, l)
            # 2-matching bound on latency within the allowed links
            lb = 0.0
            for i in range(n):
                vals = sorted(l[i, j] for j in range(n) if j != i and allowed[i, j])
                lb += sum(vals[:2])
            return order, bot, lat, lb / 2
    order = list(range(n))
    bot, lat = score(order, b, l)
    return order, bot, lat, 0.0


def best_ring(bw: np.ndarray, lat: np.ndarray | None = None, gpus: list[int] | None = None, *,
              tolerance: float = DEFAULT_TOLERANCE, exact_max: int = EXACT_MAX) -> Ring:
    """The best ring over the GPUs of directed bandwidth (GB/s) and latency (us) matrices.

    Args:
        bw: n x n bandwidth, GB/s (row = source); NaN where unmeasured (treated as 0).
        lat: n x n latency, us; None when not measured (then only bandwidth counts).
        gpus: GPU index for each row (default 0..n-1).
        tolerance: bottlenecks within this fraction of the best are treated as equal, so that
            latency decides between them.
        exact_max: largest n searched exhaustively.
    """
    n = len(bw)
    gpus = list(range(n)) if gpus is None else list(gpus)
    b, l = symmetric_links(np.asarray(bw, dtype=float),
                           None if lat is None else np.asarray(lat, dtype=float))
    if n <= 3:
        order = list(range(n))
        bot, lsum = score(order, b, l)
        exact, bound, lb = True, bot, lsum
    elif n <= exact_max:
        order, _, _ = _exact(b, l, tolerance)
        bot, lsum = score(order, b, l)
        exact, bound, lb = True, bot, lsum
    else:
        order, bot, lsum, lb = _heuristic(b, l, tolerance)
        exact, bound = False, bottleneck_upper_bound(b)
    links = [(gpus[order[i]], gpus[order[(i + 1) % n]], float(b[order[i], order[(i + 1) % n]]),
              float(l[order[i], order[(i + 1) % n]])) for i in range(n)] if n > 1 else []
    no_lat = lat is None or np.isnan(np.asarray(lat, dtype=float)).all()
    return Ring(order=[gpus[i] for i in order], bottleneck_gbps=float(bot),
                latency_sum_us=math.nan if no_lat else float(lsum), exact=exact,
                bottleneck_bound_gbps=float(bound),
                latency_bound_us=math.nan if no_lat else float(lb), links=links)


def ring_of_order(order: list[int], bw: np.ndarray, lat: np.ndarray | None,
                  gpus: list[int] | None = None) -> Ring:
    """Score a given ring order (GPU indices), e.g. the identity order NCCL may use by default."""
    gpus = list(range(len(bw))) if gpus is None else list(gpus)
    pos = [gpus.index(g) for g in order]
    b, l = symmetric_links(np.asarray(bw, dtype=float),
                           None if lat is None else np.asarray(lat, dtype=float))
    bot, lsum = score(pos, b, l)
    n = len(pos)
    links = [(order[i], order[(i + 1) % n], float(b[pos[i], pos[(i + 1) % n]]),
              float(l[pos[i], pos[(i + 1) % n]])) for i in range(n)]
    no_lat = lat is None or np.isnan(np.asarray(lat, dtype=float)).all()
    return Ring(order=list(order), bottleneck_gbps=float(bot),
                latency_sum_us=math.nan if no_lat else float(lsum), exact=False,
                bottleneck_bound_gbps=math.nan, latency_bound_us=math.nan, links=links)


def brute_force(bw: np.ndarray, lat: np.ndarray | None = None, *,
                tolerance: float = DEFAULT_TOLERANCE) -> tuple[float, float, int]:
    """Reference for tests, over all orders: (best bottleneck, latency of the best ring, number of
    bottleneck-level links of the best ring), with the ordering `best_ring` uses."""
    b, l = symmetric_links(np.asarray(bw, dtype=float),
                           None if lat is None else np.asarray(lat, dtype=float))
    n = len(b)
    orders = [[0, *p] for p in itertools.permutations(range(1, n))]
    scores = [score(o, b, l) for o in orders]
    best_b = max(s[0] for s in scores)
    slow = b < best_b * (1 + tolerance)
    keys = [(sum(int(slow[o[i], o[(i + 1) % n]]) for i in range(n)), s[1])
            for o, s in zip(orders, scores) if s[0] >= best_b * (1 - tolerance)]
    return best_b, min(keys)[1], min(keys)[0]

"""The sweep in intervals.py against a brute-force count on a fine integer grid."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pcieprof.analysis.intervals import split


@pytest.mark.parametrize("seed", range(5))
def test_split_matches_grid_count(seed: int) -> None:
    rng = random.Random(seed)
    n = 60
    s = np.array([rng.randrange(0, 400) for _ in range(n)], dtype=float)
    e = s + np.array([rng.randrange(0, 40) for _ in range(n)], dtype=float)
    b = np.array([rng.choice([1, 2, 4, 0]) for _ in range(n)], dtype=np.int8)
    got = split(s, e, b)
    grid = np.zeros((3, 500), dtype=bool)
    for si, ei, bi in zip(s.astype(int), e.astype(int), b):
        for k, bit in enumerate((1, 2, 4)):
            if bi == bit:
                grid[k, si:ei] = True
    mask = grid[0] * 1 + grid[1] * 2 + grid[2] * 4
    for m in range(1, 8):
        assert got.exclusive[m] == pytest.approx(float((mask == m).sum()))
    counted = b > 0
    assert got.span_us == pytest.approx(e[counted].max() - s[counted].min())
    assert got.idle_us == pytest.approx(got.span_us - float((mask > 0).sum()))
    assert got.exposed_comm_us + got.comm_overlap_compute_us == pytest.approx(got.comm_us)

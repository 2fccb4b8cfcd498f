"""The meter's interval arithmetic (exposed all-to-all time) against brute force on a time grid."""

import numpy as np
import pytest

from tf_fusedrec.distributed.meter import merge_intervals, overlap_length


def grid_length(intervals, step=0.001, span=10.0):
    t = np.arange(0, span, step) + step / 2
    covered = np.zeros_like(t, bool)
    for s, e in intervals:
        covered |= (t >= s) & (t < e)
    return covered, step


@pytest.mark.parametrize("seed", range(5))
def test_union_and_overlap_match_a_grid(seed):
    rng = np.random.default_rng(seed)
    a = [(s, s + rng.uniform(0.05, 2)) for s in rng.uniform(0, 8, 6).round(3)]
    b = [(s, s + rng.uniform(0.05, 2)) for s in rng.uniform(0, 8, 5).round(3)]
    ma, mb = merge_intervals(a), merge_intervals(b)
    ca, step = grid_length(a)
    cb, _ = grid_length(b)
    assert sum(e - s for s, e in ma) == pytest.approx(ca.sum() * step, abs=0.02)
    assert overlap_length(ma, mb) == pytest.approx((ca & cb).sum() * step, abs=0.02)


def test_reversed_intervals_are_skipped():
    assert merge_intervals([(2.0, 1.0), (0.0, 1.0), (0.5, 1.5)]) == [[0.0, 1.5]]

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


class TwoRanks:
    """A comm whose allgather stacks this worker's tensor over a made-up second worker's."""

    def __init__(self, peer):
        self.peer = peer

    def allgather(self, tensor, name):  # noqa: ARG002
        import tensorflow as tf  # noqa: PLC0415

        return tf.concat([tensor, tf.constant(self.peer, tf.float64)[None]], 0)


def meter_with_sites(rows, kinds):
    import tensorflow as tf  # noqa: PLC0415

    from tf_fusedrec.distributed.meter import MAX_SITES, AlltoallMeter  # noqa: PLC0415

    meter = AlltoallMeter()
    for i, kind in enumerate(kinds):
        meter._sites[kind].append(i)
    stamps = np.zeros([MAX_SITES, 2])
    stamps[:len(rows)] = rows
    meter.site_stamps.assign(tf.constant(stamps))
    return meter, stamps


def test_arrival_split_against_a_hand_worked_case():
    # Sites 0 and 1 are all-to-alls run concurrently; site 2 an allreduce; site 3 an all-to-all of an earlier step.
    mine = [[10.0, 10.5], [10.1, 10.6], [10.7, 10.9], [1.0, 2.0]]
    peer_rows = [[10.2, 10.5], [10.3, 10.6], [10.6, 10.9], [1.5, 2.0]]
    meter, _ = meter_with_sites(mine, ["alltoall", "alltoall", "allreduce", "alltoall"])
    _, peer = meter_with_sites(peer_rows, ["alltoall"] * 4)
    split = meter.arrival_split(TwoRanks(peer), since=5.0)
    # Last arrivals 10.2 and 10.3. Worker 0: in flight 10.0-10.6, moving 10.2-10.6 -> waits 0.2; worker 1: in
    # flight 10.2-10.6, all of it moving. The allreduce: worker 0 arrives last (10.7), worker 1 waits 0.1.
    assert split["alltoall"]["calls"] == 2 and split["allreduce"]["calls"] == 1
    assert split["alltoall"]["wait"] == pytest.approx(0.1) and split["alltoall"]["transfer"] == pytest.approx(0.4)
    assert split["allreduce"]["wait"] == pytest.approx(0.05)
    assert split["allreduce"]["transfer"] == pytest.approx(0.2)


def test_arrival_split_skips_sites_not_run_since():
    meter, peer = meter_with_sites([[1.0, 2.0]], ["alltoall"])
    assert meter.arrival_split(TwoRanks(peer), since=5.0) == {}

"""Key-centric sample clustering (tf_fusedrec.train.clustering) against a plain-Python count of the pairs."""

import numpy as np
import pytest
import tensorflow as tf

from tf_fusedrec.train import clustering


def python_unique_sent(columns, order, k):
    """Unique (feature, id) pairs summed over k contiguous micro-batches of the samples taken in `order`."""
    n = len(order)
    total = 0
    for i in range(k):
        rows = order[(n * i) // k:(n * (i + 1)) // k]
        pairs = {(f, int(v)) for f, col in enumerate(columns) for r in rows for v in np.atleast_1d(col[r]) if v >= 0}
        total += len(pairs)
    return total


def test_sample_pairs_numbers_distinct_pairs_and_drops_padding():
    user = np.array([5, 7, 5])
    tags = np.array([[1, -1], [5, 5], [-1, -1]])
    samples, codes = clustering.sample_pairs([user, tags], ["user", "tags"])
    assert samples.tolist() == [0, 1, 2, 0, 1, 1]
    # user 5 and tag 5 are different pairs; the repeated tag 5 of sample 1 is one pair.
    assert codes.tolist() == [0, 1, 0, 2, 3, 3]


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_order_is_a_permutation_and_counts_match_python(k):
    rng = np.random.default_rng(k)
    columns = [rng.integers(0, 20, 37), rng.integers(-1, 6, (37, 3))]
    samples, codes = clustering.sample_pairs(columns, ["a", "b"])
    order = clustering.cluster_order_numpy(37, samples, codes, k)
    assert sorted(order.tolist()) == list(range(37))
    for o in (None, order):
        want = python_unique_sent(columns, np.arange(37) if o is None else o, k)
        assert clustering.unique_pairs_per_batch(37, samples, codes, k, o) == want


def test_clustering_groups_samples_that_share_keys():
    # Four users, each in two samples, interleaved: a naive split into 2 puts every user in both halves.
    user = np.array([0, 1, 2, 3, 0, 1, 2, 3])
    item = np.arange(8) + 100
    samples, codes = clustering.sample_pairs([user, item], ["user", "item"])
    naive = clustering.unique_pairs_per_batch(8, samples, codes, 2)
    order = clustering.cluster_order_numpy(8, samples, codes, 2)
    clustered = clustering.unique_pairs_per_batch(8, samples, codes, 2, order)
    assert naive == 8 + 8 and clustered == 4 + 8
    assert clustering.unique_pairs_per_batch(8, samples, codes, 1) == 4 + 8


def test_empty_and_no_ids():
    assert clustering.cluster_order_numpy(0, np.zeros(0, np.int64), np.zeros(0, np.int64), 2).tolist() == []
    samples, codes = clustering.sample_pairs([np.full(3, -1)], ["a"])
    assert clustering.cluster_order_numpy(3, samples, codes, 2).tolist() == [0, 1, 2]


def test_cluster_order_in_tf_data_with_ragged_features():
    features = {"user": tf.constant([0, 1, 0, 1], tf.int64),
                "tags": tf.ragged.constant([[3], [], [3, 4], [9]], tf.int64)}
    ds = tf.data.Dataset.from_tensors(features).map(
        lambda f: clustering.cluster_order(f, ["user", "tags"], 2))
    order = next(iter(ds)).numpy()
    assert sorted(order.tolist()) == [0, 1, 2, 3]
    assert set(order[:2].tolist()) in ({0, 2}, {1, 3})  # the two samples of a user end up together

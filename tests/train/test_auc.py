"""experiment.auc, the exact held-out AUC of the train CLI: equal to the pair-counting definition (a positive scored
above a negative counts 1, a tie 1/2), ties and degenerate inputs included."""

import numpy as np
import pytest

from tf_fusedrec.train.experiment import auc


def pair_count_auc(labels, scores):
    pos, neg = scores[labels > 0.5], scores[labels <= 0.5]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("n, distinct", [(1, 1), (7, 3), (500, 10), (2000, 2000)])
def test_equals_pair_counting(n, distinct):
    rng = np.random.default_rng(n)
    labels = (rng.random(n) < 0.3).astype(np.float32)
    labels[0], labels[-1] = 1.0, 0.0
    scores = rng.integers(0, distinct, n).astype(np.float32) / distinct  # many ties when distinct is small
    if n == 1:
        assert np.isnan(auc(labels, scores))
        return
    assert auc(labels, scores) == pytest.approx(pair_count_auc(labels, scores), rel=1e-12)


def test_one_class_is_nan_and_perfect_is_one():
    assert np.isnan(auc(np.ones(4), np.arange(4.0)))
    assert auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.2, 0.3, 0.4])) == 1.0
    assert auc(np.array([1, 1, 0, 0]), np.array([0.1, 0.2, 0.3, 0.4])) == 0.0
    assert auc(np.array([1, 0]), np.array([0.5, 0.5])) == 0.5

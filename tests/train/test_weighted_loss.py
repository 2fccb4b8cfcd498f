"""The train app's loss with sample weights (experiment.global_weighted_mean_loss): sum(w * l) / sum(w) over the
GLOBAL batch, against NumPy, alone and as two workers (each worker's loss x N / the global weight sum, averaged over
the workers as the grouped optimizer averages their gradients)."""

import numpy as np
import pytest

import tf_fusedrec  # noqa: F401
import tensorflow as tf

from tf_fusedrec.distributed.comm import SingleProcessComm
from tf_fusedrec.train import experiment


def _bce(y, z):
    """Binary cross-entropy on logits, in float64."""
    z = z.astype(np.float64)
    return np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))


class _OneOfTwo(SingleProcessComm):
    """Worker `rank` of two: an allreduce ("sum") adds the other worker's tensors, given up front."""

    size = 2

    def __init__(self, rank, others):
        self.rank, self.others = rank, others

    def allreduce(self, tensors, name, op="average"):
        assert op == "sum" and name == "FusedRec/loss/weight_sum"
        return [t + o for t, o in zip(tensors, self.others)]


def _data(seed, n=16):
    rng = np.random.default_rng(seed)
    labels = (rng.random(n) < 0.4).astype(np.float32)
    weights = rng.uniform(0, 4, n).astype(np.float32)
    weights[:3] = 0.0
    logits = rng.normal(0, 2, n).astype(np.float32)  # the models' logits: [B]
    return labels, weights, logits


@pytest.mark.parametrize("seed", [0, 1])
def test_weighted_mean_alone(seed):
    labels, weights, logits = _data(seed)
    loss_fn = experiment.global_weighted_mean_loss(SingleProcessComm())
    z = tf.Variable(logits)
    with tf.GradientTape() as tape:
        loss = loss_fn(tf.stack([labels, weights], 1), z)
    l = _bce(labels, logits)
    want = np.sum(weights * l) / np.sum(weights)
    np.testing.assert_allclose(loss.numpy(), want, rtol=1e-6)
    unweighted = np.mean(l)
    assert abs(want - unweighted) > 1e-3  # the weights matter: the test can tell them apart
    # d/dz_i = w_i (sigmoid(z_i) - y_i) / sum(w)
    grad = weights * (1 / (1 + np.exp(-logits.astype(np.float64))) - labels) / np.sum(weights)
    np.testing.assert_allclose(tape.gradient(loss, z).numpy(), grad, rtol=1e-5, atol=1e-7)


def test_all_ones_equal_the_keras_mean_bit_for_bit():
    labels, _, logits = _data(2)
    ones = np.ones_like(labels)
    weighted = experiment.global_weighted_mean_loss(SingleProcessComm())(tf.stack([labels, ones], 1), logits)
    plain = experiment.binary_cross_entropy()(labels, logits)
    assert weighted.numpy() == plain.numpy()


def test_two_workers_train_as_one_on_the_union():
    labels, weights, logits = _data(3, n=20)
    halves = [slice(0, 8), slice(8, 20)]  # workers holding different weight sums (and sizes)
    sums = [np.float32(weights[h].sum()) for h in halves]
    losses, grads = [], []
    for rank, h in enumerate(halves):
        loss_fn = experiment.global_weighted_mean_loss(_OneOfTwo(rank, [tf.constant(sums[1 - rank])]))
        z = tf.Variable(logits[h])
        with tf.GradientTape() as tape:
            loss = loss_fn(tf.stack([labels[h], weights[h]], 1), z)
        losses.append(loss.numpy())
        grads.append(tape.gradient(loss, z).numpy() / 2)  # the optimizer's average over the 2 workers
    l = _bce(labels, logits)
    np.testing.assert_allclose(np.mean(losses), np.sum(weights * l) / np.sum(weights), rtol=1e-6)
    one = experiment.global_weighted_mean_loss(SingleProcessComm())
    z = tf.Variable(logits)
    with tf.GradientTape() as tape:
        loss = one(tf.stack([labels, weights], 1), z)
    np.testing.assert_allclose(np.concatenate(grads), tape.gradient(loss, z).numpy(), rtol=1e-5, atol=1e-8)
    # The mean of the workers' own weighted means is another number: the global sum is what makes them one.
    local = [np.sum(weights[h] * l[h]) / np.sum(weights[h]) for h in halves]
    assert abs(np.mean(local) - np.mean(losses)) > 1e-3


def test_a_batch_of_zero_weights_has_loss_zero():
    labels, _, logits = _data(4)
    z = tf.Variable(logits)
    with tf.GradientTape() as tape:
        loss = experiment.global_weighted_mean_loss(SingleProcessComm())(
            tf.stack([labels, np.zeros_like(labels)], 1), z)
    assert loss.numpy() == 0.0 and not np.any(tape.gradient(loss, z).numpy())

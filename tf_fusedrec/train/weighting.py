"""Global-count loss weighting (MTGRBoost, shared/seeds/004 §5): exact training when workers' batches differ in size.

Each worker's loss is its *sum* of per-item losses times ``N / G``, where N is the number of workers and G the number
of items (samples or tokens) of all workers' batches of the step, one small allreduce (:func:`global_count`).
:class:`fr.train.GroupedOptimizer` averages dense gradients over workers (sum x 1/N) and scales the embedding rows'
gradients, which the embeddings all-to-all has summed over workers, by 1/N. The update is then
``(1/G) * sum over every item of every worker of grad l_i``: ONE worker's update on the union of the batches with the
global-mean loss, whatever the local batch sizes (:class:`GlobalMeanLoss`).

Weighting by samples counts each sample once (G = samples of the step); weighting by tokens counts each sequence
token once (G = tokens of the step), the mean of per-token losses. Both are exact in the sense above; the
distributed equality test (tests/distributed/test_balance.py) checks both.

:func:`worker_counts` (one allgather) collects every worker's per-step counts for the summary metrics of
train/balance_metrics.py.
"""

import collections

import tensorflow as tf

from tf_fusedrec.distributed import comm as comm_lib


def global_count(local_count, comm, name):
    """The sum over workers of a count: one small allreduce ("sum") named `name`.

    Args:
      local_count: int scalar or vector (e.g. [samples, tokens]) of this worker's batch.
      comm: a Comm (fr.distributed.comm); with one worker the count itself.
      name: the collective's name, equal on every worker (e.g. "FusedRec/balance/count").

    Returns:
      int64 tensor of local_count's shape.
    """
    return comm.allreduce([tf.cast(local_count, tf.int64)], name=name, op="sum")[0]


def global_mean_loss(loss_sum, count, world_size):
    """The loss each worker minimises: ``loss_sum * world_size / global_count``.

    With GroupedOptimizer's averaging over workers (dense: sum x 1/N; embedding rows: summed by the all-to-all, x
    1/N), the update is that of one worker minimising ``(sum over every worker's items of l_i) / global_count``: the
    global mean over the union of the batches.

    Args:
      loss_sum: float scalar, this worker's sum of per-item losses (items: samples or tokens).
      count: int or float scalar > 0, the items of every worker's batch (what global_count returns).
      world_size: N, the number of workers.

    Returns:
      float scalar of loss_sum's dtype.
    """
    loss_sum = tf.convert_to_tensor(loss_sum)
    count = tf.cast(count, loss_sum.dtype)
    check = tf.debugging.assert_positive(count, message="global_mean_loss: the global count is 0 (no worker's batch "
                                                        "holds an item to average over)")
    with tf.control_dependencies([check]):
        return loss_sum * tf.cast(world_size, loss_sum.dtype) / count


class SampleWeighting:
    """Every sample counts once: the global mean is over samples."""

    name = "samples"

    def local_count(self, lengths):
        """lengths: int [B], tokens per sample -> int64 scalar B."""
        return tf.size(lengths, out_type=tf.int64)


class TokenWeighting:
    """Every token counts once: the global mean is over tokens (per-token losses)."""

    name = "tokens"

    def local_count(self, lengths):
        """lengths: int [B], tokens per sample -> int64 scalar sum(lengths)."""
        return tf.reduce_sum(tf.cast(lengths, tf.int64))


WEIGHTINGS = {"samples": SampleWeighting(), "tokens": TokenWeighting()}


def get_weighting(by):
    """"samples" | "tokens" | a weighting object -> the weighting object."""
    if hasattr(by, "local_count"):
        return by
    if by not in WEIGHTINGS:
        raise ValueError(f"weighting 'by' must be one of {sorted(WEIGHTINGS)}, got {by!r}")
    return WEIGHTINGS[by]


WeightedLoss = collections.namedtuple("WeightedLoss", ["loss", "local_count", "global_count"])
WeightedLoss.__doc__ = """What GlobalMeanLoss returns: the loss to differentiate (float scalar), this worker's count
and every worker's (int64 scalars)."""


class GlobalMeanLoss:
    """The global-count weighted loss of one training step.

        weighted = GlobalMeanLoss(model.embedding.comm, by="tokens")
        with tf.GradientTape() as tape:
            per_token = ...                                    # per-token losses of this worker's batch
            result = weighted(per_token, batch["history"].row_lengths())
        optimizer.apply_gradients(zip(tape.gradient(result.loss, variables), variables))   # a GroupedOptimizer

    Args:
      comm: the workers' Comm (the embedding layer's).
      by: "samples" or "tokens" (or a weighting object with local_count(lengths)).
      name: the count allreduce's name (one per step), equal on every worker.
    """

    def __init__(self, comm, by="samples", name="FusedRec/balance/count"):
        self.comm = comm_lib.get_comm(comm)
        self.weighting = get_weighting(by)
        self.name = name

    def __call__(self, losses, lengths):
        """-> WeightedLoss.

        Args:
          losses: per-item losses of this worker's batch, a float tensor or tf.RaggedTensor of any shape: summed.
            By samples: one per sample (a sample's own loss may sum its tokens' losses). By tokens: per token (or
            anything whose sum is the sum of per-token losses).
          lengths: int [B], tokens per sample of this worker's batch.
        """
        if isinstance(losses, tf.RaggedTensor):
            losses = losses.flat_values
        loss_sum = tf.reduce_sum(losses)
        local = self.weighting.local_count(lengths)
        total = tf.stop_gradient(global_count(local, self.comm, self.name))
        return WeightedLoss(global_mean_loss(loss_sum, total, self.comm.size), local, total)


def worker_counts(local_counts, comm, name):
    """Every worker's counts, for the summary metrics: one allgather named `name`.

    Args:
      local_counts: int vector [C] of this worker's batch (e.g. [samples, tokens]).

    Returns:
      int64 [N, C], row r from rank r.
    """
    return comm.allgather(tf.reshape(tf.cast(local_counts, tf.int64), [1, -1]), name=name)

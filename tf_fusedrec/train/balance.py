"""Token-balanced training (MTGRBoost, shared/seeds/004 §5): the public names of its modules, as ``fr.train.balance``.

User sequences have long-tailed lengths: with a fixed number of samples per worker, every step waits for the worker
that drew the longest sequences. Three pieces fix that without changing what is learned, each in its own module:

* train/batching.py, token-balanced batches (§5.1, Algorithm 1): :class:`TokenBatcher`, :func:`closest_cut`, the
  baseline :func:`fixed_batches`, and :func:`batch_signature`, :func:`collate`, :func:`to_dataset` for tf.data.
* train/weighting.py, global-count loss weighting, exact whatever the workers' batch sizes: :class:`GlobalMeanLoss`,
  :func:`global_mean_loss`, :func:`global_count`, :func:`get_weighting` (:class:`SampleWeighting`,
  :class:`TokenWeighting`), and :func:`worker_counts` for the summary metrics.
* train/accumulation.py, gradient accumulation over micro-steps (§5.2): :class:`Accumulator`.

The summary metrics :func:`token_imbalance` and :func:`samples_per_worker` live in train/balance_metrics.py.
"""

from tf_fusedrec.train.accumulation import Accumulator
from tf_fusedrec.train.balance_metrics import samples_per_worker, token_imbalance
from tf_fusedrec.train.batching import (
    DEFAULT_BUFFER_SIZE,
    TokenBatcher,
    batch_signature,
    closest_cut,
    collate,
    fixed_batches,
    to_dataset,
)
from tf_fusedrec.train.weighting import (
    WEIGHTINGS,
    GlobalMeanLoss,
    SampleWeighting,
    TokenWeighting,
    WeightedLoss,
    get_weighting,
    global_count,
    global_mean_loss,
    worker_counts,
)

__all__ = [
    "DEFAULT_BUFFER_SIZE",
    "WEIGHTINGS",
    "Accumulator",
    "GlobalMeanLoss",
    "SampleWeighting",
    "TokenBatcher",
    "TokenWeighting",
    "WeightedLoss",
    "batch_signature",
    "closest_cut",
    "collate",
    "fixed_batches",
    "get_weighting",
    "global_count",
    "global_mean_loss",
    "samples_per_worker",
    "to_dataset",
    "token_imbalance",
    "worker_counts",
]

"""Training: the grouped optimizer, the experiment builders, the train step and the pipelines.

* ``fr.train.make_optimizer(model, default="adam")``: each table with its group's optimizer (train/optimizer.py).
* ``fr.train.TrainPipeline(model, optimizer, loss_fn, dataset, schedule="sync" | "dbp" | "fwp", ...)``: one training
  step per ``progress()``, with the embedding lookup split into stages and overlapped (train/pipeline.py).
* ``fr.train.choose_hot_set(layer, batches)`` / ``fr.train.repeek(layer, batches, optimizer)``: the hot rows of a
  FusedEmbedding built with ``replication=...`` (tf_fusedrec/distributed/replication.py).
* ``fr.train.balance``: token-balanced batches (MTGRBoost's dynamic sequence batching), the global-count loss
  weighting that makes them exact, gradient accumulation over micro-steps (train/balance.py).
* ``fr.train.Checkpointer(model_dir, model, optimizer, step, comm)``: checkpoints written by every worker and restored
  onto any worker count (train/checkpoint.py).
* ``fr.train.DynamicLossScale(comm)``: loss scaling for float16 dense layers, skipping overflowed steps on every
  worker (train/loss_scale.py).
* train/experiment.py builds embeddings, models and datasets from a configs/*.yaml; train/app.py is the CLI.
"""

from tf_fusedrec import _frameworks

# Before this package's modules import them (`python -m tf_fusedrec.train` imports this package first).
_frameworks.import_tensorflow()

from tf_fusedrec.distributed.replication import choose_hot_set, repeek  # noqa: E402
from tf_fusedrec.train import balance  # noqa: E402
from tf_fusedrec.train.checkpoint import Checkpointer  # noqa: E402
from tf_fusedrec.train.loss_scale import DynamicLossScale  # noqa: E402
from tf_fusedrec.train.optimizer import GroupedOptimizer, make_optimizer  # noqa: E402
from tf_fusedrec.train.pipeline import SCHEDULES, TrainPipeline  # noqa: E402

__all__ = ["Checkpointer", "DynamicLossScale", "GroupedOptimizer", "balance", "SCHEDULES", "TrainPipeline", "choose_hot_set", "make_optimizer", "repeek"]

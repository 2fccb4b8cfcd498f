"""Summary metrics of token-balanced training (MTGRBoost, shared/seeds/004 §5), in NumPy.

:func:`token_imbalance` and :func:`samples_per_worker` take per-step, per-worker counts, which train/weighting.py's
:func:`worker_counts` (one allgather) collects.
"""

import numpy as np


def _per_step_per_worker(values, what):
    array = np.asarray(values, np.float64)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"{what} must be a [steps, workers] array with at least one step and one worker, got "
                         f"shape {list(array.shape)}")
    if (array < 0).any():
        step, worker = np.argwhere(array < 0)[0]
        raise ValueError(f"{what}: negative count {array[step, worker]} at step {step}, worker {worker}")
    return array


def token_imbalance(tokens_per_worker_per_step):
    """The mean over steps of max/min tokens across workers (1.0: perfectly balanced).

    Args:
      tokens_per_worker_per_step: [steps, workers] token counts.

    Returns:
      float. A step where a worker had 0 tokens (a batch of empty sequences only) makes it inf.
    """
    tokens = _per_step_per_worker(tokens_per_worker_per_step, "token_imbalance: tokens_per_worker_per_step")
    largest, smallest = tokens.max(axis=1), tokens.min(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(smallest > 0, largest / np.where(smallest > 0, smallest, 1), np.inf)
    return float(ratios.mean())


def samples_per_worker(samples_per_worker_per_step):
    """Samples each worker trained on: {"total": [per worker], "mean_per_step": [per worker]} (JSON-ready).

    Args:
      samples_per_worker_per_step: [steps, workers] sample counts.
    """
    samples = _per_step_per_worker(samples_per_worker_per_step, "samples_per_worker: samples_per_worker_per_step")
    return {"total": [int(v) for v in samples.sum(axis=0)], "mean_per_step": [float(v) for v in samples.mean(axis=0)]}

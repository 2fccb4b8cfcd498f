"""Input pipelines: synthetic Zipf data (the default), Criteo Kaggle/Terabyte TSV, MovieLens-1M, and synthetic user
sequences for the GRM (sequences.py: ``grm_dataset`` and the per-sample ``grm_samples``).

Every dataset yields ``(features, label)`` batches for one worker: ``features`` maps each sparse feature to int64
ids ``>= 0``, ``[B]`` (one id per example) or ``tf.RaggedTensor [B, None]`` (multi-hot, rows may be empty), plus
``"dense"`` -> float32 ``[B, num_dense]`` when the source has dense features; ``label`` is float32 ``[B]`` in {0, 1}
(``[B, 2]``, click and conversion, for the GRM sequences).
``rank``/``num_ranks`` select this worker's share of the global stream (disjoint shares whose union is the
stream) and ``batch_size`` is the per-worker batch size.
"""

from tf_fusedrec import _frameworks

# The readers below import TensorFlow: first through the package's quiet import (its harmless CUDA plugin lines
# dropped), so that `python -m tf_fusedrec.data.convert` starts as quietly as the other commands.
_frameworks.import_tensorflow()

from tf_fusedrec.data.criteo import CRITEO_DENSE, CRITEO_SPARSE, criteo_dataset  # noqa: E402
from tf_fusedrec.data.movielens import (  # noqa: E402
    MOVIELENS_GENRES, MOVIELENS_SPARSE, movielens_dataset, movielens_is_test)
from tf_fusedrec.data.sequences import (  # noqa: E402
    SequenceSpec, grm_batch, grm_dataset, grm_hidden_logits, grm_samples)
from tf_fusedrec.data.synthetic import (  # noqa: E402
    SparseInput, calibrate_zipf, hidden_logits, synthetic_dataset, top_share)

__all__ = [
    "CRITEO_DENSE",
    "CRITEO_SPARSE",
    "MOVIELENS_GENRES",
    "MOVIELENS_SPARSE",
    "SequenceSpec",
    "SparseInput",
    "calibrate_zipf",
    "criteo_dataset",
    "grm_batch",
    "grm_dataset",
    "grm_hidden_logits",
    "grm_samples",
    "hidden_logits",
    "movielens_dataset",
    "movielens_is_test",
    "synthetic_dataset",
    "top_share",
]

"""tf_fusedrec: fused, lossless embedding communication for TFRA + Horovod recommendation training.

    import tf_fusedrec as fr
    emb = fr.FusedEmbedding([fr.Feature("user_id", dim=16), fr.Feature("tags", dim=8, combiner="mean")])
"""

import os as _os

# TFRA's Keras layers need Keras 2; the switch only works if it is set before TensorFlow is imported.
_os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

__version__ = "0.1.0"


def _import_tensorflow_quietly():
    """Imports TensorFlow with its C++ start-up lines about registering the cuFFT / cuDNN / cuBLAS factories twice
    dropped: they are logged at ERROR level (so TF_CPP_MIN_LOG_LEVEL=2 keeps them), come from XLA's CUDA plugins
    being registered by two of TensorFlow's own libraries, and are harmless. Everything else TensorFlow writes to
    stderr during the import is written back unchanged."""
    import re  # noqa: PLC0415
    import sys  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    if "tensorflow" in sys.modules:
        return
    # INFO and WARNING lines of TensorFlow's C++ start-up (TensorRT absent, CPU instructions) unless asked for.
    _os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    harmless = re.compile(r"Unable to register cu(FFT|DNN|BLAS) factory: Attempting to register factory for plugin")
    sys.stderr.flush()
    saved = _os.dup(2)
    with tempfile.TemporaryFile() as captured:
        _os.dup2(captured.fileno(), 2)
        try:
            import tensorflow  # noqa: F401,PLC0415
        finally:
            _os.dup2(saved, 2)
            _os.close(saved)
            captured.seek(0)
            text = captured.read().decode(errors="replace")
            rest = "".join(line for line in text.splitlines(keepends=True) if not harmless.search(line))
            if rest:
                sys.stderr.write(rest)
                sys.stderr.flush()


_import_tensorflow_quietly()


def _import_tfra_quietly():
    """Imports TFRA without its start-up chatter, which concerns APIs tf_fusedrec does not use: a print of
    " _SingleDeviceSaver removed after tf version 2.15" (TF 2.16 has no such saver; TFRA falls back) and a
    deprecation warning about dynamic_embedding.GraphKeys. Exactly those two are dropped; anything else TFRA
    prints or logs passes through."""
    import contextlib  # noqa: PLC0415
    import io  # noqa: PLC0415
    import logging  # noqa: PLC0415
    import sys  # noqa: PLC0415

    if "tensorflow_recommenders_addons.dynamic_embedding" in sys.modules:
        return

    def harmless(record):
        return not str(record.msg).startswith("dynamic_embedding.GraphKeys has already been deprecated")

    logger = logging.getLogger("tensorflow")
    logger.addFilter(harmless)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            import tensorflow_recommenders_addons.dynamic_embedding  # noqa: F401,PLC0415
    finally:
        logger.removeFilter(harmless)
        rest = [line for line in printed.getvalue().splitlines()
                if line.strip() != "_SingleDeviceSaver removed after tf version 2.15"]
        if rest:
            print("\n".join(rest))


_import_tfra_quietly()

from tf_fusedrec import initializers  # noqa: E402
from tf_fusedrec import ops  # noqa: E402
from tf_fusedrec.config import Feature, OptimizerSpec, Spec, SpecGroup  # noqa: E402
from tf_fusedrec.distributed.eviction import Eviction  # noqa: E402
from tf_fusedrec.distributed.replication import HotReplication  # noqa: E402
from tf_fusedrec.layers import FusedEmbedding, PerFeatureEmbedding  # noqa: E402
from tf_fusedrec import train  # noqa: E402
from tf_fusedrec import export  # noqa: E402

__all__ = [
    "Feature",
    "export",
    "FusedEmbedding",
    "Eviction",
    "HotReplication",
    "OptimizerSpec",
    "PerFeatureEmbedding",
    "Spec",
    "SpecGroup",
    "initializers",
    "ops",
    "train",
]

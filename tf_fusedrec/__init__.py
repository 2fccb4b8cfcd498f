"""tf_fusedrec: fused, lossless embedding communication for recommendation training on TensorFlow + Horovod.

    import tf_fusedrec as fr
    comm = fr.init_workers()  # Horovod under horovodrun/mpirun (rank, size); one worker otherwise
    emb = fr.FusedEmbedding([fr.Feature("user_id", dim=16), fr.Feature("tags", dim=8, combiner="mean")])

Importing the package loads nothing heavy, like horovod's root: each public name (below, `__all__`) loads TensorFlow
(quietly: tf_fusedrec/_frameworks.py) and its own module on first access (PEP 562), so tools that never touch them
(the serving load generator, embedding servers and client, the cluster launcher and its cost model) start without
TensorFlow. The package works with the Keras that `tf.keras` is in the caller's process (Keras 3, or Keras 2 where the
caller set TF_USE_LEGACY_KERAS=1) and never changes it; TFRA (the `[tfra]` extra) is imported only by what uses it.
"""

import importlib as _importlib
import importlib.util as _importlib_util

from tf_fusedrec import _frameworks

_frameworks.quiet_start()

__version__ = "0.1.0"

# Public name -> the module that defines it; each loads on first access, after TensorFlow.
_NAMES = {
    "Admission": "tf_fusedrec.distributed.admission",
    "Eviction": "tf_fusedrec.distributed.eviction",
    "Expiry": "tf_fusedrec.distributed.admission",
    "Feature": "tf_fusedrec.config",
    "FusedEmbedding": "tf_fusedrec.layers",
    "HotReplication": "tf_fusedrec.distributed.replication",
    "init_workers": "tf_fusedrec.distributed.comm",
    "OptimizerSpec": "tf_fusedrec.config",
    "PerFeatureEmbedding": "tf_fusedrec.layers",
    "Spec": "tf_fusedrec.config",
    "SpecGroup": "tf_fusedrec.config",
    "Tiered": "tf_fusedrec.distributed.tier",
}
# Public subpackages that need TensorFlow (fr.export is light: its TensorFlow half loads with fr.export.export_model).
_TF_SUBPACKAGES = ("distributed", "initializers", "ops", "train")

__all__ = sorted([*_NAMES, *_TF_SUBPACKAGES, "export"])


def __getattr__(name):  # PEP 562: called only for names the module does not hold (yet)
    if name in _NAMES:
        _frameworks.import_tensorflow()
        value = getattr(_importlib.import_module(_NAMES[name]), name)
    elif not name.startswith("_") and _importlib_util.find_spec(f"{__name__}.{name}") is not None:
        # Any submodule, as `from tf_fusedrec import config` would import it; never more than that module, since the
        # package's own modules reach their siblings this way while they are being imported.
        if name in _TF_SUBPACKAGES:
            _frameworks.import_tensorflow()
        value = _importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))

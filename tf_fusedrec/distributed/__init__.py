"""Communication backends and the stages of the distributed fused lookup.

``fr.distributed.init_workers()`` (also ``fr.init_workers()``) sets up a worker of a multi-worker job: comm.py.
"""

from tf_fusedrec import _frameworks

# Quietly, before comm.py imports TensorFlow (every module of this package needs it).
_frameworks.import_tensorflow()

from tf_fusedrec.distributed.comm import init_workers  # noqa: E402

__all__ = ["init_workers"]

"""Loads the FusedRec op library once, on first use."""

import functools
import os

import tensorflow as tf

_LIB_ENV = "TF_FUSEDREC_OPS_LIB"
_DEFAULT_LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fusedrec_ops.so")


def library_path():
    """Path of the op library: $TF_FUSEDREC_OPS_LIB if set (e.g. the Bazel build), else the one in this package."""
    return os.environ.get(_LIB_ENV) or _DEFAULT_LIB


@functools.lru_cache(maxsize=None)
def load_ops():
    """Returns the loaded op module; raises ImportError saying how to build it when it cannot be loaded."""
    path = library_path()
    hint = (
        f"Build it for this TensorFlow ({tf.__version__}) with `make build` in a checkout (or "
        "`pip install --no-build-isolation .`), or point ${env} at a library built with `bazel build //...`."
    ).format(env=_LIB_ENV)
    if not os.path.exists(path):
        raise ImportError(f"tf_fusedrec op library not found at {path}. {hint}")
    try:
        return tf.load_op_library(path)
    except tf.errors.NotFoundError as e:
        raise ImportError(
            f"tf_fusedrec op library {path} does not load in TensorFlow {tf.__version__}: it was probably built for "
            f"another TensorFlow ({e.message.strip()}). {hint}"
        ) from e

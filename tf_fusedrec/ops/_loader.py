"""Loads the FusedRec op library once, on first use.

The ops run on the CPU unless $TF_FUSEDREC_GPU=1. The library registers CUDA kernels beside the CPU ones when it is
built against a CUDA build of TensorFlow (setup.py, BUILD), and TensorFlow would then place the ops on a GPU whenever
it sees one; but while the kernels are verified on a GPU (through tests/cuda's standalone harness), the TensorFlow GPU
ops around them have not run on one yet (docs/design/cuda.md), so each op is created under
tf.device("/device:CPU:0") unless the variable, read at every op call, opts in.
"""

import functools
import mmap
import os

import tensorflow as tf

_LIB_ENV = "TF_FUSEDREC_OPS_LIB"
_DEFAULT_LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fusedrec_ops.so")
GPU_ENV = "TF_FUSEDREC_GPU"
# cc/kernels/build_info.cc: the TensorFlow version the library was compiled against, as bytes in the file.
_BUILD_MARKER = b"tf_fusedrec-built-against-tensorflow="


def library_path():
    """Path of the op library: $TF_FUSEDREC_OPS_LIB if set (e.g. the Bazel build), else the one in this package."""
    return os.environ.get(_LIB_ENV) or _DEFAULT_LIB


def gpu_enabled():
    """True when $TF_FUSEDREC_GPU is "1": the ops may then run on a GPU (where TensorFlow places them)."""
    return os.environ.get(GPU_ENV) == "1"


class _PlacedOps:
    """The op module, each op function wrapped to run on the CPU unless gpu_enabled() (see the module docstring)."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        op = getattr(self._module, name)
        if name.startswith("_") or not callable(op):
            return op

        @functools.wraps(op)
        def placed(*args, **kwargs):
            if gpu_enabled():
                return op(*args, **kwargs)
            with tf.device("/device:CPU:0"):
                return op(*args, **kwargs)

        setattr(self, name, placed)  # found in the instance from now on; the variable is still read at every call
        return placed


def built_against(path):
    """The TensorFlow version the op library at `path` was compiled against (cc/kernels/build_info.cc), read from the
    file without loading it; None when the file carries no marker."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        start = data.find(_BUILD_MARKER)
        if start < 0:
            return None
        start += len(_BUILD_MARKER)
        end = data.find(b";", start, start + 64)
        return data[start:end].decode("ascii", "replace") if end > 0 else None


@functools.lru_cache(maxsize=None)
def load_ops():
    """Returns the loaded op module (its ops placed on the CPU unless $TF_FUSEDREC_GPU=1); raises ImportError saying
    how to build it when it cannot be loaded."""
    path = library_path()
    hint = (
        f"Build it for this TensorFlow ({tf.__version__}) with `make build` in a checkout (or "
        "`pip install --no-build-isolation .`), or point ${env} at a library built with `bazel build //...`."
    ).format(env=_LIB_ENV)
    if not os.path.exists(path):
        raise ImportError(f"tf_fusedrec op library not found at {path}. {hint}")
    built_for = built_against(path)
    if built_for != tf.__version__:
        what = f"TensorFlow {built_for}" if built_for else "an unknown TensorFlow (no build marker: an older build)"
        raise ImportError(f"tf_fusedrec op library {path} was built against {what}, but this process runs "
                          f"TensorFlow {tf.__version__}; a custom-op library must be built against the TensorFlow "
                          f"that loads it. {hint}")
    try:
        return _PlacedOps(tf.load_op_library(path))
    except tf.errors.NotFoundError as e:
        raise ImportError(
            f"tf_fusedrec op library {path} does not load in TensorFlow {tf.__version__}: it was probably built for "
            f"another TensorFlow ({e.message.strip()}). {hint}"
        ) from e

"""TensorFlow and TFRA, imported the way tf_fusedrec imports them: Keras 2 selected first, their harmless start-up
chatter dropped.

The package root imports this module and nothing heavier (it uses only the standard library), so that tools which
never touch TensorFlow (the serving load generator and embedding servers, the cluster launcher and its cost model)
start without it. What needs TensorFlow calls `import_tensorflow()` before its first TensorFlow import: the root's
lazy names (`fr.FusedEmbedding`, `fr.train`, ...), and the packages behind the command lines that import TensorFlow
themselves (tf_fusedrec.train and tf_fusedrec.bench in their __init__, which `python -m` runs first; the export
CLI and fr.export.export_model). A submodule imported directly (`from tf_fusedrec.layers import ...`) imports
TensorFlow itself, with Keras 2 selected by the package root's import but without the dropping.
"""

import os
import sys


def select_keras2():
    """Sets TF_USE_LEGACY_KERAS=1 unless set: TFRA's Keras layers need Keras 2 (tf-keras). TensorFlow reads it when
    `tf.keras` is first resolved, so it must be set before that (and, to be safe, before TensorFlow is imported).
    Unless TensorFlow is already imported, also TF_CPP_MIN_LOG_LEVEL=2 unless set: no INFO or WARNING lines of
    TensorFlow's C++ start-up (TensorRT absent, CPU instructions)."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    if "tensorflow" not in sys.modules:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def import_tensorflow():
    """Imports TensorFlow and TFRA's dynamic_embedding (once; later calls return at once); returns `tensorflow`."""
    select_keras2()
    _import_tensorflow_quietly()
    _import_tfra_quietly()
    return sys.modules["tensorflow"]


def tfra():
    """TFRA's `dynamic_embedding` module, imported as import_tensorflow() imports it. The package's modules that use
    TFRA take it from here rather than importing it themselves, so that a process reaching them directly (a script
    doing `from tf_fusedrec.layers import ...`) also imports TFRA without Keras 3 (see _import_tfra_quietly)."""
    import_tensorflow()
    return sys.modules["tensorflow_recommenders_addons.dynamic_embedding"]


def _import_tensorflow_quietly():
    """Imports TensorFlow with its C++ start-up lines about registering the cuFFT / cuDNN / cuBLAS factories twice
    dropped: they are logged at ERROR level (so TF_CPP_MIN_LOG_LEVEL=2 keeps them), come from XLA's CUDA plugins
    being registered by two of TensorFlow's own libraries (in CUDA builds of TensorFlow), and are harmless.
    Everything else TensorFlow writes to stderr during the import is written back unchanged."""
    import re  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    if "tensorflow" in sys.modules:
        return
    harmless = re.compile(r"Unable to register cu(FFT|DNN|BLAS) factory: Attempting to register factory for plugin")
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow  # noqa: F401,PLC0415
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode(errors="replace")
            rest = "".join(line for line in text.splitlines(keepends=True) if not harmless.search(line))
            if rest:
                sys.stderr.write(rest)
                sys.stderr.flush()


def _import_tfra_quietly():
    """Imports TFRA without its start-up chatter, which concerns APIs tf_fusedrec does not use: a print of
    " _SingleDeviceSaver removed after tf version 2.15" (TF 2.16 has no such saver; TFRA falls back) and a
    deprecation warning about dynamic_embedding.GraphKeys. Exactly those two are dropped; anything else TFRA
    prints or logs passes through."""
    import contextlib  # noqa: PLC0415
    import io  # noqa: PLC0415
    import logging  # noqa: PLC0415

    if "tensorflow_recommenders_addons.dynamic_embedding" in sys.modules:
        return

    def harmless(record):
        return not str(record.msg).startswith("dynamic_embedding.GraphKeys has already been deprecated")

    logger = logging.getLogger("tensorflow")
    logger.addFilter(harmless)
    printed = io.StringIO()
    # TFRA tries `import keras` (Keras 3, which TensorFlow 2.16's wheel installs) for two things tf_fusedrec never
    # uses: patching Keras 3's VarianceScaling initializer and Keras 3's SavedModel save (whose import fails on
    # Keras 3 anyway). Importing Keras 3 pulls in matplotlib.pyplot and cost about 0.5 s of CPU in every process that
    # imports TFRA (2.6 s against 3.1 s, the means of three runs each, for TensorFlow + TFRA; docs/tests/tfra_import.txt). Unless the process has
    # already imported Keras 3 itself, `keras` is unimportable while TFRA's modules load (both imports sit in
    # try/except in TFRA), and importable again right after: a later `import keras` gets Keras 3 as usual.
    block_keras3 = "keras" not in sys.modules
    if block_keras3:
        sys.modules["keras"] = None
    try:
        with contextlib.redirect_stdout(printed):
            import tensorflow_recommenders_addons.dynamic_embedding  # noqa: F401,PLC0415
    finally:
        if block_keras3 and "keras" in sys.modules and sys.modules["keras"] is None:
            del sys.modules["keras"]
        logger.removeFilter(harmless)
        rest = [line for line in printed.getvalue().splitlines()
                if line.strip() != "_SingleDeviceSaver removed after tf version 2.15"]
        if rest:
            print("\n".join(rest))

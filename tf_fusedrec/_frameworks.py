"""TensorFlow, Keras and TFRA, imported the way tf_fusedrec imports them: quietly, and never choosing a Keras for the
user.

The package root imports this module and nothing heavier (it uses only the standard library), so that tools which
never touch TensorFlow (the serving load generator and embedding servers, the cluster launcher and its cost model)
start without it. What needs TensorFlow calls `import_tensorflow()` before its first TensorFlow import: the root's
lazy names (`fr.FusedEmbedding`, `fr.train`, ...), and the packages behind the command lines that import TensorFlow
themselves (tf_fusedrec.train and tf_fusedrec.bench in their __init__, which `python -m` runs first; the export
CLI and fr.export.export_model).

Which Keras: the one `tf.keras` resolves to in the user's process. TensorFlow >= 2.16 gives Keras 3 unless
TF_USE_LEGACY_KERAS=1 was set before TensorFlow was imported, which gives Keras 2 (the tf-keras package). tf_fusedrec
works under either and never sets that variable. TFRA (the `[tfra]` extra: the per-feature baseline and
`table_backend="tfra"`) needs Keras 2: `tfra()` says how to get both when either is missing.
"""

import os
import sys

TFRA_EXTRA_HINT = ("install the extra with `pip install 'tf_fusedrec[tfra]'` (TensorFlow 2.16.2, tf-keras 2.16, "
                   "tensorflow-recommenders-addons 0.8.1) and set TF_USE_LEGACY_KERAS=1 before TensorFlow is imported")


def quiet_start():
    """Unless TensorFlow is already imported, TF_CPP_MIN_LOG_LEVEL=2 unless set: no INFO or WARNING lines of
    TensorFlow's C++ start-up (TensorRT absent, CPU instructions). Nothing else about the process is changed."""
    if "tensorflow" not in sys.modules:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def import_tensorflow():
    """Imports TensorFlow (once; later calls return at once) without its harmless start-up chatter; returns
    `tensorflow`. Does not import TFRA: `tfra()` does, for the code that needs it."""
    quiet_start()
    _import_tensorflow_quietly()
    return sys.modules["tensorflow"]


def keras_is_legacy():
    """True when `tf.keras` is Keras 2 (tf-keras, TF_USE_LEGACY_KERAS=1), False when it is Keras 3."""
    return import_tensorflow().keras.layers.Layer.__module__.startswith("tf_keras")


def tfra():
    """TFRA's `dynamic_embedding` module, imported quietly. The package's modules that use TFRA (the tfra table
    backend, PerFeatureEmbedding, the TFRA comparisons of the bench) take it from here, at the point of use.

    Raises:
      ImportError: TFRA is not installed, or `tf.keras` is Keras 3 in this process; the message says what to do.
    """
    import_tensorflow()
    import importlib.util  # noqa: PLC0415

    if importlib.util.find_spec("tensorflow_recommenders_addons") is None:
        raise ImportError(f"this needs TensorFlow Recommenders Addons (TFRA), which is not installed: "
                          f"{TFRA_EXTRA_HINT}. The rest of tf_fusedrec (native tables, the default) needs no TFRA.")
    if not keras_is_legacy():
        raise ImportError(f"TFRA needs Keras 2, but tf.keras is Keras 3 in this process (TF_USE_LEGACY_KERAS is "
                          f"{os.environ.get('TF_USE_LEGACY_KERAS')!r}): {TFRA_EXTRA_HINT}")
    _import_tfra_quietly()
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
    # imports TFRA (2.6 s against 3.1 s, the means of three runs each, for TensorFlow + TFRA; benchmarks/results/tests/tfra_import.txt). Unless the process has
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


def tfra_loaded():
    """Whether TFRA's dynamic_embedding is already imported (by a TFRA table or layer): code that only needs to
    recognise TFRA's objects asks this first, and never imports TFRA for it."""
    return "tensorflow_recommenders_addons.dynamic_embedding" in sys.modules


class _LazyTFRA:
    """TFRA's dynamic_embedding, imported by tfra() on the first attribute read: modules that use TFRA in some of
    their code paths bind `de = _frameworks.de` at import, and a process that never takes those paths never imports
    (or needs) TFRA."""

    def __getattr__(self, name):
        return getattr(tfra(), name)


de = _LazyTFRA()

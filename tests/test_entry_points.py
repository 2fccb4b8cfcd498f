"""Entry points load only what they use (DESIGN.md), each checked in a fresh interpreter:

* importing the package root, the serving load generator, embedding server and client, and the cluster launcher
  (its __main__ too) and cost model imports neither TensorFlow nor TFRA nor Horovod, and their command lines answer
  --help without them;
* the package's public names still work: `fr.FusedEmbedding` and the others load TensorFlow on first access, in the
  Keras the process chose (the package never changes it), with TensorFlow's start-up lines dropped; the documented
  commands that import TensorFlow answer --help without those lines;
* the sequence sources (data/sequences.py, data/movielens_seq.py) import without the experiment schema (config.py),
  which imports them to check a config's sequence section: no import cycle.
"""

import json
import sys

import pytest

from tests.subprocess_runner import execute, tail

HEAVY = ("tensorflow", "tensorflow_recommenders_addons", "horovod", "keras", "tf_keras")
LIGHT_MODULES = ["tf_fusedrec", "tf_fusedrec.serve.loadtest", "tf_fusedrec.serve.embedding_server",
                 "tf_fusedrec.serve.client", "tf_fusedrec.cluster", "tf_fusedrec.cluster.__main__",
                 "tf_fusedrec.cluster.model"]
LIGHT_CLIS = ["tf_fusedrec.serve.loadtest", "tf_fusedrec.serve.embedding_server", "tf_fusedrec.cluster",
              "tf_fusedrec.cluster.model"]
TIMEOUT_S = 120  # a light start takes well under a second; the one TensorFlow import, seconds


def python(code):
    """Runs `code` in a fresh interpreter; -> (the JSON it prints last, everything else it wrote)."""
    rc, out, err = execute([sys.executable, "-c", code], TIMEOUT_S)
    assert rc == 0, f"exit status {rc}\n{code}\nstdout: {tail(out)}\nstderr: {tail(err)}"
    *rest, last = out.strip().splitlines()
    return json.loads(last), "\n".join(rest) + err


@pytest.mark.parametrize("module", LIGHT_MODULES)
def test_import_loads_no_framework(module):
    loaded, _ = python(f"import importlib, json, sys\nimportlib.import_module({module!r})\n"
                       f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    assert loaded == [], f"importing {module} imported {loaded}"


@pytest.mark.parametrize("module", LIGHT_CLIS)
def test_command_line_help_loads_no_framework(module):
    code = (f"import contextlib, io, json, runpy, sys\nsys.argv = [{module!r}, '--help']\n"
            f"with contextlib.redirect_stdout(io.StringIO()) as shown:\n"
            f"    try:\n        runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
            f"    except SystemExit as e:\n        code = e.code\n"
            f"print(json.dumps({{'code': code, 'usage': 'usage:' in shown.getvalue(), "
            f"'loaded': [m for m in {HEAVY!r} if m in sys.modules]}}))")
    result, _ = python(code)
    assert result == {"code": 0, "usage": True, "loaded": []}, f"python -m {module} --help: {result}"


def test_public_names_load_tensorflow_on_first_access():
    """Names load TensorFlow on first use, and the package never chooses the process's Keras: with
    TF_USE_LEGACY_KERAS unset, tf.keras is Keras 3 after the package built a layer, and the variable stays unset."""
    code = """
import json, os, sys
os.environ.pop("TF_USE_LEGACY_KERAS", None)
import tf_fusedrec as fr
before = "tensorflow" in sys.modules or "tf_fusedrec.layers" in sys.modules
layer = fr.FusedEmbedding([fr.Feature("a", dim=4), fr.Feature("b", dim=4)], name="sparse")
import tensorflow as tf
names = {n: getattr(fr, n) is not None for n in fr.__all__}
print(json.dumps({"before": before,
                  "keras": tf.keras.layers.Dense.__module__, "legacy": os.environ.get("TF_USE_LEGACY_KERAS"),
                  "tfra": "tensorflow_recommenders_addons" in sys.modules, "backend": layer.table_backend,
                  "groups": len(layer.groups), "names": names, "make_optimizer": callable(fr.train.make_optimizer),
                  "export_model": callable(fr.export.export_model)}))
"""
    result, output = python(code)
    assert not result["before"], "`import tf_fusedrec` imported TensorFlow or the layers before any name was used"
    assert result["legacy"] is None and result["keras"].startswith("keras"), result
    assert not result["tfra"] and result["backend"] == "native", result
    assert result["groups"] == 1 and result["make_optimizer"] and result["export_model"], result
    assert all(result["names"].values()) and len(result["names"]) >= 12, result["names"]
    # TensorFlow's start-up lines that the package drops.
    assert "Unable to register cuDNN factory" not in output, output


def test_without_tfra_its_names_say_how_to_get_it():
    """TFRA absent (hidden here, so the test runs in both lanes): the core works, and what needs TFRA raises an
    ImportError naming the [tfra] extra."""
    code = """
import json, sys
sys.modules["tensorflow_recommenders_addons"] = None  # as if not installed
import tf_fusedrec as fr
layer = fr.FusedEmbedding([fr.Feature("a", dim=4)], name="core")
errors = {}
for what, make in (("per_feature", lambda: fr.PerFeatureEmbedding([fr.Feature("a", dim=4)], name="pf")),
                   ("tfra_backend", lambda: fr.FusedEmbedding([fr.Feature("a", dim=4)], table_backend="tfra",
                                                              name="t"))):
    try:
        make()
        errors[what] = None
    except ImportError as e:
        errors[what] = str(e)
print(json.dumps({"backend": layer.table_backend, "errors": errors}))
"""
    result, _ = python(code)
    assert result["backend"] == "native", result
    for what, message in result["errors"].items():
        assert message is not None and "tf_fusedrec[tfra]" in message, (what, message)


def test_tfra_under_keras3_is_refused_naming_the_fix():
    code = """
import json, os
os.environ.pop("TF_USE_LEGACY_KERAS", None)
import tf_fusedrec as fr
try:
    fr.FusedEmbedding([fr.Feature("a", dim=4)], table_backend="tfra", name="t")
    print(json.dumps(None))
except ImportError as e:
    print(json.dumps(str(e)))
"""
    message, _ = python(code)
    assert message is not None and ("TF_USE_LEGACY_KERAS=1" in message or "not installed" in message), message


def test_sequence_sources_import_without_the_experiment_schema():
    loaded, _ = python("import json, sys\nimport tf_fusedrec.data.movielens_seq, tf_fusedrec.data.sequences\n"
                       "print(json.dumps('tf_fusedrec.config' in sys.modules))")
    assert loaded is False, "importing the sequence sources imported tf_fusedrec.config (which imports them)"


@pytest.mark.parametrize("module", ["tf_fusedrec.layers", "tf_fusedrec.train"])
def test_the_core_imports_no_tfra(module):
    loaded, _ = python(f"import importlib, json, sys\nimportlib.import_module({module!r})\n"
                       f"print(json.dumps('tensorflow_recommenders_addons' in sys.modules))")
    assert loaded is False, f"importing {module} imported TFRA"


@pytest.mark.tfra
def test_tfra_is_imported_without_keras3_and_keras3_stays_importable():
    """TFRA's optional `import keras` (Keras 3: its VarianceScaling and SavedModel patches, unused with Keras 2) is
    kept out while the package imports TFRA; afterwards `import keras` gets Keras 3 as usual."""
    code = """
import json, os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
from tf_fusedrec import _frameworks
_frameworks.tfra()
during = {m: m in sys.modules for m in ("tensorflow_recommenders_addons.dynamic_embedding", "keras", "matplotlib")}
import keras
print(json.dumps({"during": during, "keras": keras.__version__.split(".")[0]}))
"""
    result, _ = python(code)
    assert result == {"during": {"tensorflow_recommenders_addons.dynamic_embedding": True, "keras": False,
                                 "matplotlib": False}, "keras": "3"}, result


@pytest.mark.tfra
def test_keras3_imported_first_is_left_to_tfra():
    """A process that imported Keras 3 before the package keeps it, and TFRA sees it (its initializer patch)."""
    code = """
import json, os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import keras
from tf_fusedrec import _frameworks
_frameworks.tfra()
from tensorflow_recommenders_addons.dynamic_embedding.python.ops import tf_patch
print(json.dumps({"same": sys.modules["keras"] is keras, "tfra_saw_keras3": tf_patch.kinit_K is not None}))
"""
    result, _ = python(code)
    assert result == {"same": True, "tfra_saw_keras3": True}, result


def test_the_fast_exit_removes_this_processes_autograph_files(tmp_path):
    """comm.exit_after_success leaves by os._exit, which skips the atexit handlers that delete AutoGraph's generated
    files: it deletes this process's own. The child converts a function (a file appears in its temp directory) and
    exits that way; afterwards the directory holds only a file that was there before (another process's)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    other = temp / "__autograph_generated_fileother.py"
    other.write_text("# not this process's\n")
    script = tmp_path / "child.py"  # a file: AutoGraph converts functions whose source it can read
    script.write_text(f"""
import os, tempfile
tempfile.tempdir = {str(temp)!r}
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow as tf
from tf_fusedrec.distributed import comm


@tf.function(autograph=True)
def f(x):
    if x > 0:
        x = x * 2
    return x


f(tf.constant(3))
print(len([n for n in os.listdir(tempfile.tempdir) if n.startswith("__autograph_generated_file")]), flush=True)
comm.exit_after_success("unused")
""")
    rc, out, err = execute([sys.executable, str(script)], TIMEOUT_S)
    assert rc == 0, f"exit status {rc}\nstdout: {tail(out)}\nstderr: {tail(err)}"
    assert int(out.strip().splitlines()[-1]) >= 2, out  # the converted function's file and the other one
    assert sorted(p.name for p in temp.iterdir()) == [other.name]


# The documented commands that import TensorFlow before their --help: none may show TensorFlow's harmless ERROR lines
# about CUDA plugin factories registered twice (printed by CUDA builds of TensorFlow, the baseline lane's wheel), which
# the package's quiet import drops (tf_fusedrec/_frameworks.py).
TF_CLIS = ["tf_fusedrec.train", "tf_fusedrec.export", "tf_fusedrec.serve.ranker", "tf_fusedrec.serve.bench",
           "tf_fusedrec.data.convert", "tf_fusedrec.bench", "tf_fusedrec.bench.clustering"]


@pytest.mark.parametrize("module", TF_CLIS)
def test_command_line_help_shows_no_tensorflow_start_up_errors(module):
    rc, out, err = execute([sys.executable, "-m", module, "--help"], TIMEOUT_S)  # ERROR lines pass any log level
    assert rc == 0 and "usage:" in out, f"python -m {module} --help: exit status {rc}\n{tail(out)}\n{tail(err)}"
    assert "Unable to register" not in err and " E0000" not in err, f"python -m {module} --help wrote:\n{tail(err)}"

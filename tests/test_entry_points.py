"""Entry points load only what they use (DESIGN.md), each checked in a fresh interpreter:

* importing the package root, the serving load generator, embedding server and client, and the cluster launcher
  (its __main__ too) and cost model imports neither TensorFlow nor TFRA nor Horovod, and their command lines answer
  --help without them;
* the package's public names still work: `fr.FusedEmbedding` and the others load TensorFlow on first access, with
  Keras 2 selected by the package (TFRA needs it) and TensorFlow's start-up lines dropped;
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
    code = """
import json, os, sys
os.environ.pop("TF_USE_LEGACY_KERAS", None)  # the package selects Keras 2 itself
import tf_fusedrec as fr
before = "tensorflow" in sys.modules or "tf_fusedrec.layers" in sys.modules
layer = fr.FusedEmbedding([fr.Feature("a", dim=4), fr.Feature("b", dim=4)], name="sparse")
import tensorflow as tf
names = {n: getattr(fr, n) is not None for n in fr.__all__}
print(json.dumps({"before": before,
                  "keras": tf.keras.layers.Dense.__module__, "legacy": os.environ.get("TF_USE_LEGACY_KERAS"),
                  "groups": len(layer.groups), "names": names, "make_optimizer": callable(fr.train.make_optimizer),
                  "export_model": callable(fr.export.export_model)}))
"""
    result, output = python(code)
    assert not result["before"], "`import tf_fusedrec` imported TensorFlow or the layers before any name was used"
    assert result["legacy"] == "1" and result["keras"].startswith("tf_keras"), result
    assert result["groups"] == 1 and result["make_optimizer"] and result["export_model"], result
    assert all(result["names"].values()) and len(result["names"]) >= 12, result["names"]
    # TensorFlow's start-up lines that the package drops (TFRA's print included).
    for line in ("Unable to register cuDNN factory", "_SingleDeviceSaver removed"):
        assert line not in output, output


def test_sequence_sources_import_without_the_experiment_schema():
    loaded, _ = python("import json, sys\nimport tf_fusedrec.data.movielens_seq, tf_fusedrec.data.sequences\n"
                       "print(json.dumps('tf_fusedrec.config' in sys.modules))")
    assert loaded is False, "importing the sequence sources imported tf_fusedrec.config (which imports them)"


@pytest.mark.parametrize("module", ["tf_fusedrec.layers", "tf_fusedrec.train"])
def test_tfra_is_imported_without_keras3_and_keras3_stays_importable(module):
    """TFRA's optional `import keras` (Keras 3: its VarianceScaling and SavedModel patches, unused with Keras 2) is
    kept out while the package imports TFRA, by the package's modules reached directly too; afterwards `import keras`
    gets Keras 3 as usual."""
    code = f"""
import importlib, json, sys
importlib.import_module({module!r})
during = {{m: m in sys.modules for m in ("tensorflow_recommenders_addons.dynamic_embedding", "keras", "matplotlib")}}
import keras
print(json.dumps({{"during": during, "keras": keras.__version__.split(".")[0]}}))
"""
    result, _ = python(code)
    assert result == {"during": {"tensorflow_recommenders_addons.dynamic_embedding": True, "keras": False,
                                 "matplotlib": False}, "keras": "3"}, result


def test_keras3_imported_first_is_left_to_tfra():
    """A process that imported Keras 3 before the package keeps it, and TFRA sees it (its initializer patch)."""
    code = """
import json, sys
import keras
import tf_fusedrec as fr
fr.FusedEmbedding  # loads TensorFlow and TFRA
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

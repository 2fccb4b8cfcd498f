"""Shared helpers of the app tests (python -m tf_fusedrec.train / tf_fusedrec.bench, the models, the YAML configs).

* ``tiny_config(...)`` -- a fresh dict of the tiny experiment every app test trains: 4 sparse features (A1, A2 of
  dim 8; B1 of dim 4; B2 of dim 4, multi-hot with 0 to 3 ids), vocab 1000, 3 dense features, batch 64, DLRM with
  bottom MLP [8, 4] (interaction dim 4: the dim-8 features are projected) and top MLP [8]; DCN-v2 with 1 cross
  layer and deep MLP [8] when ``model_name="dcn"``. One optimizer, two dims: two spec groups.
* ``write_config(path, raw)`` -- writes such a dict as YAML.
* ``run_app(module, args, workers=1)`` -- runs ``python -m <module> args`` in a subprocess, alone or under
  ``horovodrun -np N -H localhost:N --gloo`` (the suite's launcher, tests/horovodrun.py), in its own process group
  with a timeout that ends the whole group, and returns an :class:`AppRun` whose ``describe()`` (command, exit status
  and the tail of stdout and stderr) goes into every failure message.
* ``summaries(run)`` -- the summaries the train app wrote, as (rank, dict): the JSON file each short summary on stdout
  names (``  summary JSON PATH``). ``run_app`` gives the train app a ``--summary-json`` in a temporary directory when
  the arguments have neither ``--summary-json`` nor ``--model-dir`` (the app writes none then).

The helpers are reached through the session fixture ``apps`` (a namespace), so the test modules need not import
this file.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import json
import re
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path

import pytest

from tests.subprocess_runner import ROOT, execute, horovodrun, tail

PYTHON = Path(sys.executable)
TRAIN_MODULE = "tf_fusedrec.train"
RUN_TIMEOUT_S = 300  # per subprocess; the machine is shared, so generous

TINY_FEATURES = ("A1", "A2", "B1", "B2")
TINY_DIMS = {"A1": 8, "A2": 8, "B1": 4, "B2": 4}
TINY_BATCH = 64

_TINY = {
    "name": "tiny",
    "data": {"source": "synthetic", "num_dense": 3, "seed": 0, "eval_batches": 2},
    "feature_defaults": {"vocab": 1000, "zipf": 1.1, "max_id_bits": 10,
                         "optimizer": {"name": "adagrad", "learning_rate": 0.05}},
    "features": [
        {"name": "A{i}", "repeat": 2, "dim": 8},
        {"name": "B1", "dim": 4},
        {"name": "B2", "dim": 4, "hotness": [0, 3]},
    ],
    "model": {"name": "dlrm", "bottom_mlp": [8, 4], "top_mlp": [8], "cross_layers": 1, "deep_mlp": [8]},
    "train": {"batch_size": TINY_BATCH, "steps": 6, "checkpoint_every": 2, "log_every": 1,
              "dense_optimizer": {"name": "adam", "learning_rate": 0.01}},
}


def tiny_config(model_name="dlrm", **sections):
    """A fresh raw (YAML-shaped) dict of the tiny experiment with model.name = model_name; ``sections`` update its
    top-level mappings, e.g. ``tiny_config(train={"steps": 4})`` (merged into "train") or ``features=[...]``
    (replaced)."""
    raw = copy.deepcopy(_TINY)
    raw["model"]["name"] = model_name
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key].update(copy.deepcopy(value))
        else:
            raw[key] = copy.deepcopy(value)
    return raw


def write_config(path, raw):
    import yaml  # noqa: PLC0415

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@dataclasses.dataclass
class AppRun:
    cmd: list
    rc: "int | None"  # None: timed out
    stdout: str
    stderr: str
    took: float

    def describe(self):
        status = f"timed out after {RUN_TIMEOUT_S} s" if self.rc is None else f"exit status {self.rc}"
        return (f"{' '.join(self.cmd)}\n{status} after {self.took:.0f} s\n--- stdout (tail) ---\n{tail(self.stdout)}"
                f"\n--- stderr (tail) ---\n{tail(self.stderr)}")

    def expect_ok(self):
        assert self.rc == 0, self.describe()
        return self

    def expect_error(self, *fragments, rc=2):
        """Exit status `rc`, an 'error: ...' line on stderr containing every fragment, no traceback."""
        assert self.rc == rc, f"expected exit status {rc}\n{self.describe()}"
        errors = [line for line in self.stderr.splitlines() if re.match(r"^(\[\d+\]<stderr>:)?error: ", line)]
        assert errors, f"no 'error: ...' line on stderr\n{self.describe()}"
        text = "\n".join(errors)
        for fragment in fragments:
            assert fragment in text, f"{fragment!r} is not in the error message {text!r}\n{self.describe()}"
        assert "Traceback" not in self.stderr, f"a traceback instead of a clean error\n{self.describe()}"
        return text


def run_app(module, args, workers=1, timeout=RUN_TIMEOUT_S):
    """``python -m module args`` alone (workers=1) or under horovodrun with `workers` Gloo workers on localhost."""
    args = [str(a) for a in args]
    if module == TRAIN_MODULE and "--summary-json" not in args and "--model-dir" not in args:
        args += ["--summary-json", str(Path(_summary_dir()) / f"summary-{time.monotonic_ns()}.json")]
    if workers == 1:
        cmd = [str(PYTHON), "-m", module] + args
    else:
        cmd = horovodrun(workers) + [str(PYTHON), "-m", module] + args
    start = time.monotonic()
    rc, out, err = execute(cmd, timeout)
    return AppRun(cmd, rc, out, err, time.monotonic() - start)


_SUMMARY_DIR = []


def _summary_dir():
    """A temporary directory for the summaries run_app asks for, removed when the session ends."""
    if not _SUMMARY_DIR:
        _SUMMARY_DIR.append(tempfile.mkdtemp(prefix="fusedrec-summaries-"))
        atexit.register(shutil.rmtree, _SUMMARY_DIR[0], ignore_errors=True)
    return _SUMMARY_DIR[0]


# The short summary's line naming the JSON file; a launcher's prefix where rank 0 could not write around it.
_SUMMARY = re.compile(r"^(?:\[(\d+)\]<stdout>:)?  summary JSON (.*)$")


def summaries(run):
    """[(rank, dict)] of the summary JSON files the short summaries on stdout name (rank 0 where no launcher prefix
    says otherwise)."""
    found = []
    for line in run.stdout.splitlines():
        m = _SUMMARY.match(line)
        if m:
            path = Path(m.group(2))
            assert path.is_file(), f"the summary names {str(path)!r}, which is not a file\n{run.describe()}"
            try:
                body = json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise AssertionError(f"{path} is not JSON ({e})\n{run.describe()}") from None
            assert isinstance(body, dict), f"{path} holds no JSON object\n{run.describe()}"
            found.append((int(m.group(1) or 0), body))
    return found


def the_summary(run):
    """The one summary of a run, printed by rank 0 only."""
    found = summaries(run)
    assert len(found) == 1, f"expected one summary, found {len(found)}\n{run.describe()}"
    assert found[0][0] == 0, f"the summary was printed by rank {found[0][0]}, not rank 0\n{run.describe()}"
    return found[0][1]


def require_horovod():
    """Skips the calling test when Horovod is not importable (as tests/distributed does)."""
    pytest.importorskip("horovod.tensorflow", reason="Horovod (horovod.tensorflow) is not importable")


@pytest.fixture(scope="session")
def apps():
    return types.SimpleNamespace(
        ROOT=ROOT, PYTHON=PYTHON, RUN_TIMEOUT_S=RUN_TIMEOUT_S,
        TINY_FEATURES=TINY_FEATURES, TINY_DIMS=TINY_DIMS, TINY_BATCH=TINY_BATCH,
        tiny_config=tiny_config, write_config=write_config, run_app=run_app,
        summaries=summaries, the_summary=the_summary, require_horovod=require_horovod,
    )


@pytest.fixture
def tiny_yaml(tmp_path):
    """tiny_yaml(model_name="dlrm", name="tiny.yaml", **sections) -> path of the tiny config in tmp_path."""

    def make(model_name="dlrm", name="tiny.yaml", **sections):
        return write_config(tmp_path / name, tiny_config(model_name, **sections))

    return make

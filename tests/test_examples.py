"""Every script of examples/ runs as its README says and prints its sign of success: the loss decreased, the dense
weights are equal on every worker and a restored checkpoint equals the saved one, the TFRA model and its FusedEmbedding
migration both train, curl's answer holds the model's predictions. Each in a fresh process (the multi-worker one under
horovodrun), without TensorFlow's start-up ERROR lines."""

import re
import sys
from pathlib import Path

import pytest

from tests.subprocess_runner import ROOT, execute, horovodrun, tail

pytestmark = pytest.mark.slow  # each starts processes

EXAMPLES = ROOT / "examples"
TIMEOUT_S = 600  # seconds alone; the suite shares two cores
STARTUP_ERRORS = re.compile(r"Unable to register cu(FFT|DNN|BLAS) factory")


def run(args, launcher=()):
    cmd = [*launcher, sys.executable, *[str(a) for a in args]]
    rc, out, err = execute(cmd, TIMEOUT_S)
    assert rc == 0, f"exit status {rc}: {' '.join(cmd)}\nstdout: {tail(out)}\nstderr: {tail(err)}"
    assert not STARTUP_ERRORS.search(out + err), f"TensorFlow's start-up ERROR lines:\n{tail(err)}"
    return out


def lines_with(out, prefix):
    found = [line for line in (re.sub(r"^\[\d+\]<stdout>:", "", x) for x in out.splitlines()) if line.startswith(prefix)]
    assert found, f"no line starting {prefix!r} in:\n{out}"
    return found


@pytest.mark.parametrize("script", ["custom_loop.py", "keras_fit.py"])
def test_one_worker_example_trains(script):
    (line,) = lines_with(run([EXAMPLES / script]), "loss: first")
    assert line.endswith("(decreased)"), line


@pytest.mark.multiworker
def test_multi_worker_example(tmp_path):
    out = run([EXAMPLES / "multi_worker.py", tmp_path / "model"], launcher=horovodrun(2))
    assert "2 workers; dense weights equal on every worker at the start: True" in out, out
    assert "dense weights equal on every worker after training: True" in out, out
    assert "checkpoint written: ckpt-30" in out, out
    assert "restored step 30 (written by 2 workers): weights and predictions equal the saved ones on every worker: " \
           "True" in out, out


@pytest.mark.tfra
def test_migrate_from_tfra_example():
    out = run([EXAMPLES / "migrate_from_tfra.py"])
    for name in ("per-feature TFRA", "FusedEmbedding"):
        (line,) = lines_with(out, name)
        assert line.endswith("(decreased)"), line
    assert "3 per-feature TFRA tables -> 1 fused group(s)" in out, out


@pytest.mark.serving
def test_export_and_serve_example(tmp_path):
    out = run([EXAMPLES / "export_and_serve.py", tmp_path / "export"])
    (answer,) = lines_with(out, "answer: ")
    assert re.fullmatch(r'answer: \{"predictions":\[-?[0-9.e-]+,-?[0-9.e-]+\].*\}', answer), answer
    assert "2 predictions, equal to the model's own (training=False) to 1e-5: True" in out, out


def test_the_readme_lists_every_example():
    listed = set(re.findall(r"\]\((\w+\.py)\)", (EXAMPLES / "README.md").read_text()))
    assert listed == {p.name for p in Path(EXAMPLES).glob("*.py")}

"""Dense weights start equal on every worker without the user broadcasting them (issue 55, item 4).

Each of two Horovod workers seeds its dense layers differently (tests/distributed/dense_start_scenario.py), so
without the GroupedOptimizer's equal start each would train its own dense model; with it both hold rank 0's weights
before their first update and equal weights after every step: in a custom tf.function loop and in model.fit, with the
model built before fr.train.make_optimizer (equal at once: the run equals one worker's from rank 0's seed) or by its
first step (equal before the first update). Native tables, so it runs on every stack.
"""

from pathlib import Path

import numpy as np
import pytest

from tests.subprocess_runner import execute, tail, worker_command

pytest.importorskip("horovod.tensorflow", reason="Horovod (horovod.tensorflow) is not importable")

SCRIPT = Path(__file__).with_name("dense_start_scenario.py")
MODES = ("built", "loop", "fit")
TIMEOUT_S = 600


def launch(workers, out):
    """Runs the scenario on `workers` workers -> {mode: [per rank {name: array}]}."""
    cmd = worker_command([SCRIPT, "--out", out], workers)
    rc, log, _ = execute(cmd, TIMEOUT_S, merge_stderr=True)
    assert rc == 0, f"exit status {rc}: {' '.join(map(str, cmd))}\n{tail(log)}"
    results = {}
    for mode in MODES:
        results[mode] = []
        for rank in range(workers):
            with np.load(Path(out) / mode / f"rank{rank}.npz") as z:
                results[mode].append({k: z[k] for k in z.files})
    return results


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dense_start")
    return {workers: launch(workers, root / str(workers)) for workers in (1, 2)}


def test_the_workers_initialise_different_dense_weights(runs):
    """The premise: each worker's own seed gives it other initial dense weights."""
    r0, r1 = runs[2]["built"]
    assert r0["start"].shape == r1["start"].shape and r0["start"].size > 0
    assert not np.allclose(r0["start"], r1["start"])


@pytest.mark.parametrize("mode", MODES)
def test_dense_weights_are_equal_on_every_worker_after_training(runs, mode):
    r0, r1 = runs[2][mode]
    np.testing.assert_array_equal(r0["dense"], r1["dense"], err_msg=f"{mode}: the workers' dense weights differ")
    assert float(r0["eval_loss"]) == float(r1["eval_loss"]), f"{mode}: the held-out losses differ"
    if mode == "built":
        assert not np.allclose(r0["dense"], r0["start"]), "nothing trained"


def test_a_model_built_before_make_optimizer_trains_as_one_worker(runs):
    """Equal before any gradient: two workers make exactly the updates one worker makes from rank 0's seed."""
    one, two = runs[1]["built"][0], runs[2]["built"]
    np.testing.assert_array_equal(two[0]["start"], one["start"])  # same seed as rank 0
    np.testing.assert_allclose(two[0]["dense"], one["dense"], rtol=1e-5, atol=1e-6)
    # Equal local batch sizes: the mean of the workers' local losses is the one worker's loss on the global batch.
    np.testing.assert_allclose((two[0]["losses"] + two[1]["losses"]) / 2, one["losses"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(two[0]["eval_loss"], one["eval_loss"], rtol=1e-5, atol=1e-6)

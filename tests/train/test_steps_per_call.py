"""TrainPipeline(steps_per_call=K) and the train app's --steps-per-call K: K steps in one call of the compiled step
are the same training as one step per call.

One worker, in process (the model and data of test_pipeline_api.py: 7 batches, not a multiple of K = 3): under sync,
dbp, fwp (micro-batches, sample clustering) every step's loss, the table rows and the dense weights equal K = 1's;
the calls run 3, 3 and 1 steps, then StopIteration; progress() runs one step, progress_many(max_steps) at most that
many; a loss scale skips the same steps; a bad batch in the middle of a call ends the call before it and the next call
raises the layer's error naming the feature, leaving the steps before it complete.
Two workers (tests/distributed/pipeline_scenario.py under horovodrun): sync, dbp and fwp with K = 3 equal sync with
K = 1 (rows, slots, dense weights, losses); a bad batch on rank 1 stops every schedule on both workers at its step
(both runs in one launch, pipeline_scenario.py --run, the bad one last).
The app: its default K = 4 with --steps 10 (calls shortened at the log and checkpoint steps) ends with the final loss
and AUC of --steps-per-call 1, logs and checkpoints where K = 1 does (--steps-per-call 0:
tests/apps/test_refusals.py); with 2 workers the summary counts all-to-alls per step, not per call.
"""

import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tests.apps.conftest import require_horovod, run_app, the_summary, tiny_config, write_config
from tests import subprocess_runner
from tests.train.test_loss_scale import Model as ScaledModel
from tests.train.test_loss_scale import dataset as scaled_dataset
from tests.train.test_pipeline_api import data, make, mse
from tf_fusedrec import config as cfg
from tf_fusedrec.distributed.comm import SingleProcessComm
from tf_fusedrec.train.app import call_length

K = 3
STEPS = 7  # not a multiple of K: the last call runs one step
RTOL, ATOL = 1e-6, 1e-7  # as tests/distributed/test_pipeline.py
# Inside a tf.function TensorFlow escapes the quotes of an assertion's message; the pipeline's own message has none.
BAD_USER = r"feature \\*'user\\*': ids must be >= 0"

SCHEDULES = {
    "sync": {"schedule": "sync"},
    "dbp": {"schedule": "dbp"},
    "fwp2": {"schedule": "fwp", "micro_batches": 2},
    "fwp3c": {"schedule": "fwp", "micro_batches": 3, "cluster_samples": True},
}


def state(model):
    """The model's table rows (sorted by key) and dense weights, as numpy."""
    out = []
    for table in model.embedding.tables:
        keys, rows = (x.numpy() for x in table.rows.export())
        order = np.argsort(keys)
        out += [keys[order], rows[order]]
    return out + [w.numpy() for w in model.dense.weights]


def train(steps_per_call, schedule, batches=STEPS, bad_step=None):
    """Trains a fresh model until the data ends or a batch is bad -> (losses, steps of each call, the error or None,
    pipe.steps, step counter, state)."""
    tf.keras.backend.clear_session()  # the next model reuses the layer's name
    model, opt = make()
    counter = tf.Variable(0, dtype=tf.int64)
    pipe = fr.train.TrainPipeline(model, opt, mse, data(batches, bad_step), step_counter=counter,
                                  steps_per_call=steps_per_call, **SCHEDULES[schedule])
    losses, calls, error = [], [], None
    try:
        while True:
            got = pipe.progress_many() if steps_per_call > 1 else tf.reshape(pipe.progress(), [1])
            losses += got.numpy().tolist()
            calls.append(len(got))
    except StopIteration:
        pass
    except tf.errors.InvalidArgumentError as e:
        error = e
    return losses, calls, error, pipe.steps, int(counter.numpy()), state(model)


def assert_same(got, want, what):
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=what)


@pytest.mark.parametrize("value", [0, -1, True, 2.0, "2", None])
def test_steps_per_call_must_be_an_int_of_at_least_one(value):
    model, opt = make()
    with pytest.raises(ValueError, match="steps_per_call must be an int >= 1"):
        fr.train.TrainPipeline(model, opt, mse, data(2), steps_per_call=value)


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_k_steps_per_call_equal_one(schedule):
    one, _, error_one, steps_one, counter_one, state_one = train(1, schedule)
    many, calls, error, steps, counter, state_many = train(K, schedule)
    assert error_one is None and error is None
    assert calls == [3, 3, 1], calls
    assert steps == steps_one == STEPS and counter == counter_one == STEPS
    np.testing.assert_allclose(many, one, rtol=RTOL, atol=ATOL)
    assert_same(state_many, state_one, f"{schedule}: K={K} vs K=1")


def test_progress_runs_one_step_and_max_steps_bounds_a_call():
    want = train(1, "dbp")[0]
    tf.keras.backend.clear_session()
    model, opt = make()
    pipe = fr.train.TrainPipeline(model, opt, mse, data(STEPS), schedule="dbp", steps_per_call=K)
    with pytest.raises(ValueError, match="max_steps must be an int >= 1"):
        pipe.progress_many(0)
    losses = [pipe.progress()]
    assert losses[0].shape == [] and pipe.steps == 1
    for max_steps, n in [(2, 2), (None, 3), (5, 1)]:  # 5 > K, but one batch is left
        got = pipe.progress_many(max_steps)
        assert got.shape == [n] and got.dtype == tf.float32, (max_steps, got)
        losses += list(got)
    for _ in range(2):
        with pytest.raises(StopIteration):
            pipe.progress_many()
    assert pipe.steps == STEPS
    np.testing.assert_allclose(np.array(losses), want, rtol=RTOL, atol=ATOL)


def test_progress_many_with_one_step_per_call():
    model, opt = make()
    pipe = fr.train.TrainPipeline(model, opt, mse, data(2), schedule="sync")
    assert pipe.progress_many().shape == [1] and pipe.progress_many(4).shape == [1]
    with pytest.raises(StopIteration):
        pipe.progress_many()


@pytest.mark.parametrize("schedule", ["sync", "dbp", "fwp2"])
@pytest.mark.parametrize("bad_step", [4, 3])  # in the middle of the second call; its first step
def test_bad_batch_in_a_call_fails_at_its_step(schedule, bad_step):
    _, _, error_one, _, _, state_one = train(1, schedule, bad_step=bad_step)
    losses, calls, error, steps, counter, state_many = train(K, schedule, bad_step=bad_step)
    assert error_one is not None and re.search(BAD_USER, str(error_one)), error_one
    assert error is not None and re.search(BAD_USER, str(error)), error
    # The call holding the bad batch runs the steps before it; the next call raises.
    assert calls == ([3, bad_step - 3] if bad_step > 3 else [3]), calls
    assert steps == counter == len(losses) == bad_step
    assert_same(state_many, state_one, f"{schedule}: stopped at bad batch {bad_step}, K={K} vs K=1")


def test_loss_scale_skips_the_same_steps():
    def run(steps_per_call):
        tf.keras.backend.clear_session()
        scale = fr.train.DynamicLossScale(SingleProcessComm(), initial=3e38, growth_interval=2)
        model = ScaledModel("scaled")
        ds = scaled_dataset(STEPS, scale=100.0)
        model(next(iter(ds))[0])
        optimizer = fr.train.make_optimizer(model, default="sgd")
        pipe = fr.train.TrainPipeline(model, optimizer, tf.keras.losses.MeanSquaredError(), ds, loss_scale=scale,
                                      steps_per_call=steps_per_call)
        losses = np.concatenate([pipe.progress_many().numpy() for _ in range(-(-STEPS // steps_per_call))])
        weights = [v.numpy() for v in model.dense.weights]
        return losses, int(scale.skipped.numpy()), float(scale.scale.numpy()), weights

    one, many = run(1), run(K)
    assert one[1] > 0, "the initial scale overflows: the first steps are skipped"
    assert many[1:3] == one[1:3]
    np.testing.assert_allclose(many[0], one[0], rtol=RTOL, atol=ATOL)
    assert_same(many[3], one[3], "loss scale: K=3 vs K=1")


@pytest.mark.parametrize("done, want", [
    (0, 3),  # the warm-up ends at step 3
    (3, 1),  # checkpoint at 4
    (4, 1),  # log at 5
    (5, 3),  # checkpoint at 8
    (8, 2),  # the end at 10
    (10, 0),
])
def test_call_length_ends_calls_at_the_steps_that_need_the_state(done, want):
    assert call_length(done, 4, 10, ends=[3], every=[5, 4]) == want


# --------------------------------------------------------------------------------------------------------------
# Two workers (horovodrun): the distributed pipeline scenario with K = 3
# --------------------------------------------------------------------------------------------------------------

SCENARIO = Path(__file__).resolve().parents[1] / "distributed" / "pipeline_scenario.py"
SCENARIO_RUNS = {
    "clean": ["--schedules", "sync,sync_k3,dbp_k3,fwp2c_k3"],
    "bad": ["--schedules", "sync,sync_k3,dbp_k3,fwp2_k3", "--bad-step", "4", "--bad-rank", "1"],
}
# The order of the one launch that trains them: the bad run's errors are caught and saved and the workers go on, but
# nothing trains after it.
SCENARIO_ORDER = ["clean", "bad"]
SCENARIO_LAUNCH_TIMEOUT_S = 300  # a launch, plus SCENARIO_PER_RUN_TIMEOUT_S for each run it trains
SCENARIO_PER_RUN_TIMEOUT_S = 300


def run_scenarios(root, names):
    """Trains the SCENARIO_RUNS `names` in one launch with 2 workers -> {name: [per-rank {key: array}]}."""
    flags = {name: ["--optimizer", "adagrad", "--encoding", "hashed", "--steps", STEPS] + SCENARIO_RUNS[name]
             for name in names}
    return subprocess_runner.run_scenarios(SCENARIO, flags, 2, root, SCENARIO_LAUNCH_TIMEOUT_S,
                                           SCENARIO_PER_RUN_TIMEOUT_S)


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """run(name) -> [per-rank {key: array}] of a SCENARIO_RUNS entry with 2 workers, run once per module: the first
    call trains all of SCENARIO_ORDER in one launch."""
    require_horovod()
    cache = {}

    def run(name):
        if name not in cache:
            todo = [n for n in SCENARIO_ORDER if n not in cache]
            try:
                cache.update(run_scenarios(tmp_path_factory.mktemp("two_workers"), todo))
            except AssertionError as e:  # remembered: a failed launch is not run again
                cache.update(dict.fromkeys(todo, e))
        if isinstance(cache[name], AssertionError):
            pytest.fail(str(cache[name]), pytrace=False)
        return cache[name]

    return run


def schedule_values(rank_data, schedule):
    prefix = f"{schedule}/"
    return {k[len(prefix):]: v for k, v in rank_data.items() if k.startswith(prefix)}


def assert_same_training(got, want, what):
    assert sorted(got) == sorted(want), f"{what}: held rows differ: {sorted(set(got) ^ set(want))[:10]}"
    for key in sorted(want):
        np.testing.assert_allclose(got[key], want[key], rtol=RTOL, atol=ATOL, err_msg=f"{what}: {key}")


@pytest.mark.parametrize("schedule", ["sync_k3", "dbp_k3", "fwp2c_k3"])
def test_two_workers_k_steps_per_call_equal_sync(two_workers, schedule):
    for r, rank_data in enumerate(two_workers("clean")):
        want = schedule_values(rank_data, "sync")
        assert "error" not in want and len(want["losses"]) == STEPS
        assert any(k.startswith("table/") for k in want), f"rank {r} holds no rows"
        got = schedule_values(rank_data, schedule)
        assert "error" not in got, f"rank {r} {schedule}: {got.get('error')}"
        assert_same_training(got, want, f"rank {r}: {schedule} vs sync")


@pytest.mark.parametrize("schedule", ["sync_k3", "dbp_k3", "fwp2_k3"])
def test_two_workers_bad_batch_stops_every_worker_at_its_step(two_workers, schedule):
    for r, rank_data in enumerate(two_workers("bad")):
        want = schedule_values(rank_data, "sync")  # one step per call, stopped at the bad batch (test_pipeline.py)
        got = schedule_values(rank_data, schedule)
        assert "error" in got and "error" in want, f"rank {r} {schedule}: no error raised"
        message = str(got.pop("error"))
        want.pop("error")
        assert re.search(r"feature \\*'user_id\\*': ids must be >= 0", message), message
        assert "in the batch of rank 1)" in message, message  # only rank 1's batch is bad: both raise, naming it
        assert len(got["losses"]) == 4, f"rank {r} {schedule}: stopped after {len(got['losses'])} steps, not 4"
        assert_same_training(got, want, f"rank {r}: {schedule} vs sync, stopped at the bad batch")


# --------------------------------------------------------------------------------------------------------------
# The train app
# --------------------------------------------------------------------------------------------------------------

APP = "tf_fusedrec.train"
APP_STEPS = 10


def app_run(tmp_path, *flags, workers=1):
    """10 steps of the tiny config, logging every 5 and checkpointing every 4 steps -> (run, summary, model dir)."""
    config = write_config(tmp_path / "tiny.yaml", tiny_config(train={"log_every": 5, "checkpoint_every": 4}))
    model_dir = tmp_path / "model"
    run = run_app(APP, ["--config", config, "--steps", APP_STEPS, "--no-progress", "--model-dir", model_dir, *flags],
                  workers=workers).expect_ok()
    return run, the_summary(run), model_dir


def checkpoints(model_dir):
    return sorted(int(p.parent.name[len("ckpt-"):]) for p in Path(model_dir).glob("ckpt-*/manifest.json"))


def test_app_steps_per_call_trains_like_one(tmp_path):
    one, one_summary, _ = app_run(tmp_path / "one", "--steps-per-call", "1")
    run, summary, model_dir = app_run(tmp_path / "four")  # the default, 4
    assert summary["steps"] == APP_STEPS and summary["steps_per_call"] == 4, run.describe()
    assert one_summary["steps_per_call"] == 1
    assert (summary["final_loss"], summary["auc"]) == (one_summary["final_loss"], one_summary["auc"]), (
        summary, one_summary)
    assert np.isfinite(summary["samples_per_s"]) and summary["samples_per_s"] > 0, run.describe()
    for step in (5, 10):  # the log lines, each with that step's loss
        line = re.search(rf"step {step}/{APP_STEPS}  loss (\S+)", run.stdout)
        assert line, run.describe()
        assert line.group(0) in one.stdout, (line.group(0), one.describe())
    assert checkpoints(model_dir) == [8, 10], run.describe()  # every 4 steps and at the end, the last two kept


def test_app_two_workers_count_alltoalls_per_step(tmp_path):
    require_horovod()
    run, summary, _ = app_run(tmp_path, "--steps-per-call", "4", "--pipeline", "dbp", workers=2)
    groups = len(fr.FusedEmbedding(cfg.load_config(tmp_path / "tiny.yaml").embedding_features()).groups)
    # Per step (not per call): the next batch's keys, this batch's embeddings and their gradients, per group.
    assert summary["alltoall_ops_in_step_graph"] == 3 * groups, summary
    assert summary["alltoall_calls_per_step"] == 3 * groups, summary
    busy, exposed = summary["alltoall_busy_seconds_per_step"], summary["exposed_alltoall_seconds_per_step"]
    assert 0 < exposed <= busy, summary

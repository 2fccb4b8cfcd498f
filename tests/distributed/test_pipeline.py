"""TrainPipeline schedules are the same training as sync: tests/distributed/pipeline_scenario.py trains one model per
schedule in one process (1 worker, and 2 Gloo workers under horovodrun), and every table row, optimizer slot, dense
weight and loss of dbp and fwp (k = 2, 4; sample clustering on and off) must equal sync's to 1e-6 relative, with SGD
and Adagrad, hashed and packed groups, multi-hot (dense with padding, ragged with empty rows) features.
Also: 2 workers == 1 worker under the pipelines, and a bad batch on one worker stops every worker, under every
schedule, at its own step with the layer's error naming the rank, leaving the tables as the previous step left them.

The runs of a worker count (RUNS) train in one launch, one after another (pipeline_scenario.py --run, each with a fresh
Keras session and its own layer name), the first time a test needs one of them; the bad-batch run trains last (its
errors are caught and saved, the processes go on, and nothing trains after it); a failed launch fails every test that
needs one of its runs, naming them all.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tests import subprocess_runner

pytest.importorskip("horovod.tensorflow", reason="Horovod (horovod.tensorflow) is not importable")

SCENARIO = Path(__file__).resolve().with_name("pipeline_scenario.py")
RTOL, ATOL = 1e-6, 1e-7
LAUNCH_TIMEOUT_S = 300  # a launch, plus PER_RUN_TIMEOUT_S for each run it trains
PER_RUN_TIMEOUT_S = 300
STEPS = 6

RUNS = {
    # name: (workers, optimizer, encoding, schedules, extra args)
    "adagrad_hashed_w2": (2, "adagrad", "hashed", "sync,dbp,fwp2,fwp4,fwp2c", []),
    "sgd_packed_w2": (2, "sgd", "packed", "sync,dbp,fwp4c", []),
    "adagrad_hashed_w1": (1, "adagrad", "hashed", "sync,dbp,fwp2c", []),
    "bad_w2": (2, "adagrad", "hashed", "sync,dbp,fwp2", ["--bad-step", "3", "--bad-rank", "1"]),
    "three_steps_w2": (2, "adagrad", "hashed", "sync", ["--steps", "3"]),
}
# Runs whose batches raise (caught and saved by the scenario): each trains after every other run of its launch, so
# whatever a stopped pipeline leaves behind reaches no other run.
LAST = {"bad_w2"}


def planned(workers):
    """The RUNS of `workers` workers, in the order one launch trains them."""
    return sorted((name for name, r in RUNS.items() if r[0] == workers), key=lambda name: name in LAST)


def run_scenarios(root, workers, names):
    """Trains the RUNS `names` in one launch with `workers` workers -> {name: [per-rank dict of arrays]}."""
    flags = {}
    for name in names:
        _, optimizer, encoding, schedules, extra = RUNS[name]
        flags[name] = ["--optimizer", optimizer, "--encoding", encoding, "--schedules", schedules,
                       "--steps", STEPS] + extra
    return subprocess_runner.run_scenarios(SCENARIO, flags, workers, root, LAUNCH_TIMEOUT_S, PER_RUN_TIMEOUT_S)


@pytest.fixture(scope="session")
def run(tmp_path_factory):
    """run(name) -> [per-rank dict of arrays], each configuration run once per session: the first call for a worker
    count trains all its RUNS in one launch."""
    cache = {}

    def get(name):
        if name not in cache:
            workers = RUNS[name][0]
            todo = [n for n in planned(workers) if n not in cache]
            try:
                cache.update(run_scenarios(tmp_path_factory.mktemp(f"w{workers}"), workers, todo))
            except AssertionError as e:  # remembered: a failed launch is not run again
                cache.update(dict.fromkeys(todo, e))
        if isinstance(cache[name], AssertionError):
            pytest.fail(str(cache[name]), pytrace=False)
        return cache[name]

    return get


def schedule_values(rank_data, schedule):
    prefix = f"{schedule}/"
    return {k[len(prefix):]: v for k, v in rank_data.items() if k.startswith(prefix)}


def assert_same_training(got, want, what):
    """Every row, slot, dense weight and loss of `got` equals `want`'s (same keys, 1e-6 relative)."""
    assert "error" not in got and "error" not in want, f"{what}: {got.get('error', want.get('error'))}"
    assert sorted(got) == sorted(want), f"{what}: held rows differ: {sorted(set(got) ^ set(want))[:10]}"
    for key in sorted(want):
        np.testing.assert_allclose(got[key], want[key], rtol=RTOL, atol=ATOL, err_msg=f"{what}: {key}")


CASES = [(name, schedule) for name in ("adagrad_hashed_w2", "sgd_packed_w2", "adagrad_hashed_w1")
         for schedule in RUNS[name][3].split(",") if schedule != "sync"]


@pytest.mark.parametrize("name,schedule", CASES, ids=[f"{n}-{s}" for n, s in CASES])
def test_schedule_equals_sync(run, name, schedule):
    ranks = run(name)
    for r, data in enumerate(ranks):
        sync = schedule_values(data, "sync")
        assert len(sync["losses"]) == STEPS
        assert any(k.startswith("table/") for k in sync), f"{name}: rank {r} holds no rows"
        assert_same_training(schedule_values(data, schedule), sync, f"{name} rank {r}: {schedule} vs sync")


def test_adagrad_slots_recorded(run):
    data = schedule_values(run("adagrad_hashed_w2")[0], "fwp2c")
    slots = [k for k in data if k.startswith("slot/")]
    tables = [k for k in data if k.startswith("table/")]
    assert slots and len(slots) == len(tables), "every row this worker holds has its accumulator"


@pytest.mark.parametrize("schedule", ["dbp", "fwp2c"])
def test_two_workers_equal_one(run, schedule):
    one = schedule_values(run("adagrad_hashed_w1")[0], schedule)
    two = [schedule_values(d, schedule) for d in run("adagrad_hashed_w2")]
    union = {}
    for r, data in enumerate(two):
        for k, v in data.items():
            if k.startswith(("table/", "slot/")):
                assert k not in union, f"{k} held by two ranks"
                union[k] = v
    want = {k: v for k, v in one.items() if k.startswith(("table/", "slot/"))}
    assert sorted(union) == sorted(want)
    for k in want:
        np.testing.assert_allclose(union[k], want[k], rtol=RTOL, atol=ATOL, err_msg=k)
    for r in range(2):
        for name in ("kernel", "bias"):
            np.testing.assert_allclose(two[r][name], one[name], rtol=RTOL, atol=ATOL, err_msg=f"rank {r} {name}")


@pytest.mark.parametrize("schedule", ["sync", "dbp", "fwp2"])
def test_bad_batch_stops_at_its_step_with_tables_untouched(run, schedule):
    reference = run("three_steps_w2")
    for r, data in enumerate(run("bad_w2")):
        got = schedule_values(data, schedule)
        assert "error" in got, f"rank {r} {schedule}: no error raised"
        message = str(got.pop("error"))
        # Inside a tf.function TensorFlow escapes the quotes of an assertion's message.
        assert re.search(r"feature \\*'user_id\\*': ids must be >= 0", message), message
        # Only rank 1's batch is bad: both workers raise the same error, naming it.
        assert "in the batch of rank 1)" in message, message
        assert len(got["losses"]) == 3, f"{schedule}: stopped after {len(got['losses'])} steps, not at step 3"
        want = schedule_values(reference[r], "sync")
        assert_same_training(got, want, f"rank {r}: {schedule} stopped at the bad batch vs 3 clean steps")

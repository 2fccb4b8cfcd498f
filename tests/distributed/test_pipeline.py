"""TrainPipeline schedules are the same training as sync: tests/distributed/pipeline_scenario.py trains one model per
schedule in one process (1 worker, and 2 Gloo workers under horovodrun), and every table row, optimizer slot, dense
weight and loss of dbp and fwp (k = 2, 4; sample clustering on and off) must equal sync's to 1e-6 relative, with SGD
and Adagrad, hashed and packed groups, multi-hot (dense with padding, ragged with empty rows) features.
Also: 2 workers == 1 worker under the pipelines, and a bad batch on one worker stops every worker, under every
schedule, at its own step with the layer's error naming the rank, leaving the tables as the previous step left them.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tests.subprocess_runner import run_scenario

pytest.importorskip("horovod.tensorflow", reason="Horovod (horovod.tensorflow) is not importable")

SCENARIO = Path(__file__).resolve().with_name("pipeline_scenario.py")
RTOL, ATOL = 1e-6, 1e-7
RUN_TIMEOUT_S = 600
STEPS = 6

RUNS = {
    # name: (workers, optimizer, encoding, schedules, extra args)
    "adagrad_hashed_w2": (2, "adagrad", "hashed", "sync,dbp,fwp2,fwp4,fwp2c", []),
    "sgd_packed_w2": (2, "sgd", "packed", "sync,dbp,fwp4c", []),
    "adagrad_hashed_w1": (1, "adagrad", "hashed", "sync,dbp,fwp2c", []),
    "bad_w2": (2, "adagrad", "hashed", "sync,dbp,fwp2", ["--bad-step", "3", "--bad-rank", "1"]),
    "three_steps_w2": (2, "adagrad", "hashed", "sync", ["--steps", "3"]),
}


@pytest.fixture(scope="session")
def run(tmp_path_factory):
    """run(name) -> [per-rank dict of arrays], each configuration run once per session."""
    cache = {}

    def get(name):
        if name not in cache:
            workers, optimizer, encoding, schedules, extra = RUNS[name]
            out = tmp_path_factory.mktemp(name)
            args = [SCENARIO, "--optimizer", optimizer, "--encoding", encoding, "--schedules", schedules,
                    "--steps", str(STEPS), "--out", out] + extra
            try:
                cache[name] = run_scenario(name, args, workers, out, RUN_TIMEOUT_S)
            except AssertionError as e:  # remembered: a failed configuration is not run again
                cache[name] = e
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

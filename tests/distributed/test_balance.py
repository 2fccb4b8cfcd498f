"""Token-balanced training is the training of one worker on the union of the workers' batches
(tests/distributed/balance_scenario.py, issue 11 items 3 and 6).

Two Gloo workers cut their own streams with a TokenBatcher, so their batches hold different numbers of samples, and
train with the global-count weighted loss (by samples: SGD tables and dense weights; by tokens: Adagrad tables, Adam
dense weights); one process trains on the union of both workers' batches of each step, in rank order, with the
global-mean loss. Every table row (the union over the workers, each row held by one), Adagrad slot and dense weight
must be equal to 1e-6 relative. The naive loss (each worker's own mean) must not be. Gradient accumulation over K
micro-batches, each its own step, must equal one step on their union: in one process (K = 2, SGD and Adagrad) and
on two workers (K = 2 consecutive batches each, against one process on the union of the four).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.subprocess_runner import run_scenario
from tf_fusedrec.train import balance

SCENARIO = Path(__file__).resolve().with_name("balance_scenario.py")
RTOL, ATOL = 1e-6, 1e-7
RUN_TIMEOUT_S = 600
# The scenario's data (balance_scenario.py): the batcher's target and the longest history.
TARGET_TOKENS, MAX_LENGTH = 24, 12

PROCESSES = {
    # name: (workers, scenario arguments)
    "two_workers": (2, ["--runs", "sgd_samples,adagrad_tokens,local_sgd_samples,acc_sgd_samples_b2"]),
    "one_process_union": (1, ["--union-of", "2", "--runs",
                              "sgd_samples,adagrad_tokens,acc_sgd_samples,acc_adagrad_tokens,sgd_samples_b2"]),
}
WEIGHT_KEYS = ("token_kernel", "token_bias", "sample_kernel", "sample_bias")


@pytest.fixture(scope="session")
def process(tmp_path_factory):
    """process(name) -> [per-rank {run: {key: array}}], each process configuration run once per session."""
    cache = {}

    def get(name):
        workers, scenario_args = PROCESSES[name]
        if workers > 1:
            pytest.importorskip("horovod.tensorflow", reason="Horovod (horovod.tensorflow) is not importable")
        if name not in cache:
            out = tmp_path_factory.mktemp(name)
            try:
                flat = run_scenario(name, [SCENARIO, "--out", out] + scenario_args, workers, out, RUN_TIMEOUT_S)
            except AssertionError as e:  # remembered: a failed configuration is not run again
                cache[name] = e
            else:
                ranks = []
                for arrays in flat:
                    runs = {}
                    for key, value in arrays.items():
                        run, rest = key.split("/", 1)
                        runs.setdefault(run, {})[rest] = value
                    ranks.append(runs)
                cache[name] = ranks
        if isinstance(cache[name], AssertionError):
            pytest.fail(str(cache[name]), pytrace=False)
        return cache[name]

    return get


def trained_state(data):
    """The rows, slots and dense weights of one run on one worker."""
    return {k: v for k, v in data.items() if k.startswith(("table/", "slot/")) or k in WEIGHT_KEYS}


def union_over_workers(ranks, run):
    """Rows and slots of every worker (each held by exactly one), and the dense weights (equal on every worker)."""
    union = {}
    for r, runs in enumerate(ranks):
        for key, value in trained_state(runs[run]).items():
            if key in WEIGHT_KEYS:
                if key in union:
                    np.testing.assert_allclose(value, union[key], rtol=RTOL, atol=ATOL,
                                               err_msg=f"{run}: {key} differs between workers")
                union.setdefault(key, value)
            else:
                assert key not in union, f"{run}: {key} held by two workers"
                union[key] = value
    return union


def assert_same_training(got, want, what):
    assert any(k.startswith("table/") for k in want), f"{what}: no rows"
    assert sorted(got) == sorted(want), f"{what}: held rows differ: {sorted(set(got) ^ set(want))[:10]}"
    for key in sorted(want):
        np.testing.assert_allclose(got[key], want[key], rtol=RTOL, atol=ATOL, err_msg=f"{what}: {key}")


@pytest.mark.parametrize("run", ["sgd_samples", "adagrad_tokens"])
def test_balanced_workers_equal_one_worker_on_the_union(process, run):
    two, (one,) = process("two_workers"), process("one_process_union")
    samples = [ranks[run]["samples"][:, 0] for ranks in two]
    tokens = [ranks[run]["tokens"][:, 0] for ranks in two]
    # What makes the test meaningful: the workers' local batch sizes differ, their token counts do not by much.
    assert np.any(samples[0] != samples[1]), f"{run}: the workers' batches have equal sizes {samples}"
    for t in tokens:
        assert np.all(np.abs(t - TARGET_TOKENS) <= MAX_LENGTH / 2), tokens
    # The single process trained on exactly the union, in rank order.
    np.testing.assert_array_equal(one[run]["samples"], np.stack(samples, axis=1))
    assert not np.allclose(one[run]["token_kernel"], one[run]["initial_token_kernel"]), "nothing was trained"
    if run == "adagrad_tokens":
        assert any(k.startswith("slot/") for k in one[run]), "Adagrad's accumulators were not recorded"
    assert_same_training(union_over_workers(two, run), trained_state(one[run]),
                         f"{run}: 2 workers vs 1 process on the union")


def test_worker_counts_feed_the_summary_metrics(process):
    """balance.worker_counts (one allgather per step) gives every worker the same [samples, tokens] of each worker,
    and token_imbalance / samples_per_worker summarise them."""
    two = process("two_workers")
    own = np.stack([np.stack([ranks["sgd_samples"]["samples"][:, 0], ranks["sgd_samples"]["tokens"][:, 0]], axis=1)
                    for ranks in two], axis=1)  # [steps, workers, 2]
    for r, ranks in enumerate(two):
        np.testing.assert_array_equal(ranks["sgd_samples"]["worker_counts"], own, err_msg=f"rank {r}")
    tokens = own[:, :, 1]
    assert balance.token_imbalance(tokens) == pytest.approx(np.mean(tokens.max(axis=1) / tokens.min(axis=1)))
    # The batcher's bound: every batch within half the longest history of the target.
    assert balance.token_imbalance(tokens) <= (TARGET_TOKENS + MAX_LENGTH / 2) / (TARGET_TOKENS - MAX_LENGTH / 2)
    assert balance.samples_per_worker(own[:, :, 0])["total"] == [int(v) for v in own[:, :, 0].sum(axis=0)]


def test_local_mean_loss_is_not_the_union_training(process):
    """The negative control: with unequal local batches, each worker's own mean loss trains something else."""
    two, (one,) = process("two_workers"), process("one_process_union")
    got, want = union_over_workers(two, "local_sgd_samples"), trained_state(one["sgd_samples"])
    assert sorted(got) == sorted(want)
    differences = [float(np.max(np.abs(got[k] - want[k]) / (np.abs(want[k]) + 1e-3))) for k in want]
    assert max(differences) > 1e-2, "the local-mean loss should not reproduce the union's training"


@pytest.mark.parametrize("run", ["sgd_samples", "adagrad_tokens"])
def test_accumulation_equals_one_step_on_the_union(process, run):
    """One process: each step's two batches (rank 0's, rank 1's) as two accumulated micro-steps, applied once."""
    (one,) = process("one_process_union")
    accumulated = one[f"acc_{run}"]
    np.testing.assert_array_equal(accumulated["samples"], one[run]["samples"])
    assert_same_training(trained_state(accumulated), trained_state(one[run]),
                         f"acc_{run}: K=2 accumulated micro-batches vs one batch of their union")


def test_accumulation_on_two_workers_equals_one_step_on_the_union(process):
    """Two workers, each accumulating 2 consecutive balanced batches per update (the count allreduce at apply),
    against one process taking one step on the union of the four batches."""
    two, (one,) = process("two_workers"), process("one_process_union")
    np.testing.assert_array_equal(np.concatenate([ranks["acc_sgd_samples_b2"]["samples"] for ranks in two], axis=1),
                                  one["sgd_samples_b2"]["samples"])
    assert_same_training(union_over_workers(two, "acc_sgd_samples_b2"), trained_state(one["sgd_samples_b2"]),
                         "2 workers x K=2 accumulated batches vs 1 process on the union")

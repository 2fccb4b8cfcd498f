"""Two Horovod workers equal one on native tables, without TFRA: the multi-worker check every stack runs (the current
stack's lane included: TensorFlow 2.21, Keras 3, Horovod with scripts/horovod's patch), over Gloo and over Open MPI,
with the optimizers the native table gained (momentum SGD, FTRL, RMSprop, AdamW) beside Adagrad.

tests/distributed/scenario.py trains each configuration; test_horovod.py's helpers compare them (its own tests, most
of which compare against TFRA's tables, run where TFRA is installed).
"""

import pytest

from tests.distributed.test_horovod import assert_close, assert_same_tables, assert_two_workers_equal_one, \
    run_scenarios
from tests.subprocess_runner import horovodrun_mpi

# (layer, optimizer) of scenario.py: the native backend with each kind of update.
CONFIGS = [("fused", "adagrad"), ("fused", "momentum"), ("fused", "ftrl"),
           ("fused", "rmsprop"), ("fused", "adamw")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{(workers, transport): {config: Run}}: every configuration in one launch per worker count and transport."""
    root = tmp_path_factory.mktemp("native_workers")
    configs = [(layer, optimizer, 3, "function") for layer, optimizer in CONFIGS]
    return {(1, "single"): run_scenarios(root / "one", 1, configs),
            (2, "gloo"): run_scenarios(root / "gloo", 2, configs),
            (2, "mpi"): run_scenarios(root / "mpi", 2, configs[:1], launcher=horovodrun_mpi, where="mpi")}


@pytest.mark.parametrize("config", CONFIGS, ids=[o for _, o in CONFIGS])
def test_two_workers_equal_one_on_native_tables(runs, config):
    key = (*config, 3, "function")
    assert_two_workers_equal_one(runs[(2, "gloo")][key], runs[(1, "single")][key])


def test_mpi_equals_gloo(runs):
    key = ("fused", "adagrad", 3, "function")
    mpi, gloo = runs[(2, "mpi")][key], runs[(2, "gloo")][key]
    assert [str(r["transport"]) for r in mpi.ranks] == ["mpi", "mpi"], "the --mpi launch did not run over MPI"
    assert_same_tables(mpi, gloo)
    for r in range(2):
        assert_close(mpi.ranks[r]["losses"], gloo.ranks[r]["losses"], f"rank {r} losses: mpi vs gloo")

"""The distributed equality tests of tests/distributed/test_horovod.py, with the 2 workers on 2 namespaced hosts
joined by a 1 Gbit/s link instead of loopback: fused == per-feature, and 2 workers == 1 worker (Adagrad)."""

import sys

import pytest

from tests.distributed import test_horovod as th

OPTIMIZER = "adagrad"


def cluster_launcher(workers):
    return [sys.executable, "-m", "tf_fusedrec.cluster", "--hosts", str(workers), "--link-rate", "1gbit", "--"]


# The configurations the tests read, by worker count: each worker count's run in one launch.
LAYERS = {1: ["fused"], 2: ["fused", "per_feature"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{(workers, layer): Run}, each run at most once; a failed launch fails every test that needs one of its runs."""
    cache = {}

    def get(workers, layer):
        key = (workers, layer)
        if key not in cache:
            configs = [(name, OPTIMIZER, th.STEPS, "function") for name in LAYERS[workers]
                       if th.TFRA_INSTALLED or name not in th.sc.TFRA_LAYERS]  # the others' tests: marked tfra
            root = tmp_path_factory.mktemp(f"cluster-w{workers}")
            try:
                done = th.run_scenarios(root, workers, configs, launcher=cluster_launcher,
                                        where="2 namespaced hosts at 1gbit")
            except AssertionError as e:
                done = dict.fromkeys(configs, e)
            cache.update({(workers, config[0]): run for config, run in done.items()})
        if isinstance(cache[key], AssertionError):
            pytest.fail(str(cache[key]), pytrace=False)
        return cache[key]

    return get


def test_fused_equals_per_feature_across_hosts(cluster_ok, runs):  # noqa: ARG001
    th.assert_fused_equals_per_feature(runs(2, "fused"), runs(2, "per_feature"), 2)


def test_two_hosts_equal_one_worker(cluster_ok, runs):  # noqa: ARG001
    th.assert_two_workers_equal_one(runs(2, "fused"), runs(1, "fused"))

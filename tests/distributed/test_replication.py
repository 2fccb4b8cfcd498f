"""Hot-row replication on 2 Horovod workers (tests/distributed/hot_scenario.py) equals the same training without it.

For each configuration a run with --hot R and one without replication (R = 0: the plain layer) train the same 8
steps; then, to 1e-6:

* the losses, first-step outputs, dense weights and held-out predictions (training=False) are equal;
* the union of what the workers hold (sharded rows on their owners, replicated rows from rank 0) equals the plain
  run's union, rows and optimizer slot rows alike: nothing lost, nothing held twice;
* every worker's replicated copy is the same (digests), and hot pairs were really served locally (hot_hits > 0);
* configurations: Adam with packed keys and a re-peek at step 4 that moves rows both ways, Adagrad with hashed keys,
  SGD with packed keys and a re-peek, R chosen by the model (given costs) on both workers alike, all on the layer's
  default (native) tables, and the first on TFRA's tables (FusedEmbedding(table_backend="tfra"), where the [tfra]
  extra is installed: the `tfra` marker) against the plain native run;
* a replicated layer whose hot set is empty (the model chose R = 0) trains like the plain layer.

Every run the tests read (PLANNED: the plain runs, the replicated ones, the empty hot set) trains in one horovodrun
launch, one after another (hot_scenario.py --run, each with a fresh Keras session and its own layer name), the first
time a test needs one of them; a failed launch fails every test that needs one of its runs, naming them all.
"""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from tests import subprocess_runner

pytest.importorskip("horovod.tensorflow", reason="Horovod (horovod.tensorflow) is not importable")

SCENARIO = Path(__file__).resolve().with_name("hot_scenario.py")
WORKERS = 2
LAUNCH_TIMEOUT_S = 240  # a launch, plus PER_RUN_TIMEOUT_S for each run it trains
PER_RUN_TIMEOUT_S = 120
RTOL, ATOL = 1e-6, 1e-7
CONFIGS = {  # name: (layer, optimizer, extra flags)
    "adam_packed_repeek": ("fused_packed", "adam", ["--hot", "5", "--repeek-at", "4"]),
    "adagrad_hashed": ("fused", "adagrad", ["--hot", "5"]),
    "sgd_packed_repeek": ("fused_packed", "sgd", ["--hot", "4", "--repeek-at", "4"]),
    "adam_packed_auto": ("fused_packed", "adam", ["--hot", "auto", "--costs", "1e-7,1e-6"]),
    # TFRA's tables (sharded and replicated) against the plain native run
    "adam_packed_repeek_tfra": ("fused_packed", "adam", ["--hot", "5", "--repeek-at", "4", "--table-backend", "tfra"]),
}
TFRA_INSTALLED = importlib.util.find_spec("tensorflow_recommenders_addons") is not None
PLAIN = ["--hot", "0"]
EMPTY = ("fused_packed", "adam", ["--hot", "auto", "--costs", "1,1e-12"])  # the model chooses R = 0


def planned():
    """Every run (layer, optimizer, flags tuple) the tests of this module read, in the order they train."""
    runs = []
    for layer, optimizer, flags in list(CONFIGS.values()) + [EMPTY]:
        for run in [(layer, optimizer, tuple(PLAIN)), (layer, optimizer, tuple(flags))]:
            if run not in runs and (TFRA_INSTALLED or "tfra" not in run[2]):
                runs.append(run)
    return runs


PLANNED = planned()


def run_scenarios(root, runs):
    """Trains `runs` ((layer, optimizer, flags tuple)) in one launch on WORKERS workers -> {run: [per rank dict]}."""
    flags = {run: ["--layer", run[0], "--optimizer", run[1], *run[2]] for run in runs}
    return subprocess_runner.run_scenarios(SCENARIO, flags, WORKERS, root, LAUNCH_TIMEOUT_S, PER_RUN_TIMEOUT_S)


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """runs(layer, optimizer, flags) -> [per rank {key: array}], each run trained once per pytest process: the first
    call trains all of PLANNED in one launch (a plain run serves several tests; tests/conftest.py keeps the tests of
    a module with such a fixture on one xdist worker). A run missing from PLANNED still trains, alone."""
    cache = {}

    def get(layer, optimizer, flags):
        key = (layer, optimizer, tuple(flags))
        if key not in cache:
            todo = [run for run in (PLANNED if key in PLANNED else [key]) if run not in cache]
            try:
                cache.update(run_scenarios(tmp_path_factory.mktemp("hot"), todo))
            except AssertionError as e:  # remembered: a failed launch is not run again
                cache.update(dict.fromkeys(todo, e))
        if isinstance(cache[key], AssertionError):
            pytest.fail(str(cache[key]), pytrace=False)
        return cache[key]

    return get


def union(ranks):
    rows = {}
    for r, data in enumerate(ranks):
        for k, v in data.items():
            if k.startswith(("table/", "hot/")):
                name = k.split("/", 1)[1]
                assert name not in rows, f"{name} held by rank {rows[name][0]} and rank {r}"
                rows[name] = (r, v)
    return {k: v for k, (_, v) in rows.items()}


def assert_trains_alike(hot, plain, name):
    for r in range(2):
        np.testing.assert_allclose(hot[r]["losses"], plain[r]["losses"], rtol=RTOL, err_msg=f"{name}: losses {r}")
        np.testing.assert_allclose(hot[r]["eval_pred"], plain[r]["eval_pred"], rtol=RTOL, atol=ATOL,
                                   err_msg=f"{name}: held-out predictions of rank {r}")
        for k in ("kernel", "bias"):
            np.testing.assert_allclose(hot[r][k], plain[r][k], rtol=RTOL, atol=ATOL, err_msg=f"{name}: {k}")
        for k in plain[r]:
            if k.startswith("out/"):
                np.testing.assert_allclose(hot[r][k], plain[r][k], rtol=RTOL, atol=ATOL, err_msg=f"{name}: {k}")
    got, want = union(hot), union(plain)
    assert sorted(got) == sorted(want), f"{name}: rows differ: {sorted(set(got) ^ set(want))[:6]}"
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=RTOL, atol=ATOL, err_msg=f"{name}: {k}")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_replication_trains_like_no_replication(runs, name):
    layer, optimizer, flags = CONFIGS[name]
    plain = runs(layer, optimizer, PLAIN)
    hot = runs(layer, optimizer, flags)
    assert_trains_alike(hot, plain, name)
    assert any(k.startswith("hot/") for k in hot[0]), f"{name}: no row was replicated"
    assert str(hot[0]["hot_digest"]) == str(hot[1]["hot_digest"]), f"{name}: the replicas differ"
    hits = sum(int(v) for r in hot for k, v in r.items() if k.endswith("/hot_hits"))
    assert hits > 0, f"{name}: no id was served from the replicated rows"
    assert all(int(v) == 0 for r in plain for k, v in r.items() if k.endswith("/hot_hits"))
    reports = [json.loads(str(r["reports"])) for r in hot]
    assert reports[0] == reports[1], f"{name}: the workers chose differently"
    if "--repeek-at" in flags:
        moved = sum(g["left"] + g["entered"] for g in reports[0]["repeek"])
        assert moved > 0, f"{name}: the re-peek moved nothing: {reports[0]['repeek']}"
    if "auto" in flags:
        assert all(g["chosen_by"] == "model" and g["rows"] > 0 for g in reports[0]["chosen"]), reports[0]


def test_empty_hot_set_trains_like_no_replication(runs):
    """A replicated layer whose model chose R = 0 (a replicated row costs 1 s): its hot path is switched off by
    tf.cond (no flag allreduce, no search), on both workers alike, and it trains like the plain layer."""
    plain = runs("fused_packed", "adam", PLAIN)
    empty = runs(*EMPTY)
    assert_trains_alike(empty, plain, "empty hot set")
    reports = [json.loads(str(r["reports"])) for r in empty]
    assert reports[0] == reports[1] and all(g["rows"] == 0 for g in reports[0]["chosen"]), reports[0]
    assert not any(k.startswith("hot/") for r in empty for k in r)
    assert all(int(v) == 0 for r in empty for k, v in r.items() if k.endswith("/hot_hits"))

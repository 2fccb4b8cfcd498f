"""Distributed tests: tests/distributed/scenario.py trained alone (1 worker) and under horovodrun (2 Gloo workers).

Each configuration runs once per session (the ``scenario`` fixture caches its result directory; the configurations
of a worker count run in one launch, one after another); the tests then compare the per-rank npz files they write:

* lossless: FusedEmbedding == PerFeatureEmbedding (first-step outputs, losses, tables, dense weights, held-out
  predictions with training=False), SGD and Adagrad, with 1 and with 2 workers;
* worker-count independence: 2 workers == 1 worker (tables as the union over ranks, dense weights, outputs), also
  with admission and expiry;
* sharding: each (feature, id) row on exactly one rank, owner_of(id, 2), and exactly the rows the batches touched;
* one all-to-all pair per spec group (fused) vs per feature (per_feature), none with 1 worker;
* per-feature statistics survive fusion (ids, unique_sent, unique_looked_up checked against NumPy);
* eager training steps == tf.function steps;
* the fused ops (sender, output sums) == the op chains they replace (2 workers, bit for bit).

The fused layers train the layer's default (native) tables; fused_tfra runs TFRA's, and per_feature is TFRA's
per-feature layer: those runs, and the tests that read them (the `tfra` marker), need the [tfra] extra.

Most runs trace with ``--autograph off`` (about half the time of a run); the main configuration (2 workers, fused,
Adagrad, tf.function) keeps the default AutoGraph path, so comparisons against it also cover that path.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.subprocess_runner import execute, horovodrun, horovodrun_mpi, load_script, tail

pytest.importorskip("horovod.tensorflow", reason="Horovod (horovod.tensorflow) is not importable")

SCENARIO = Path(__file__).resolve().with_name("scenario.py")

STEPS = 20  # training steps of every run
RTOL, ATOL = 1e-6, 1e-7  # float tolerance of every comparison
RUN_TIMEOUT_S = 240  # a launch, plus PER_RUN_TIMEOUT_S for each configuration it trains
PER_RUN_TIMEOUT_S = 120
OPTIMIZERS = ["sgd", "adagrad"]
# Runs that keep AutoGraph on (scenario.py's default); every other run passes --autograph off.
AUTOGRAPH_ON = {(2, "fused", "adagrad", "function"), (2, "fused_chain", "adagrad", "function")}


sc = load_script(SCENARIO, "fusedrec_distributed_scenario")
FEATURES = [f.name for f in sc.make_features("sgd")]
NUM_GROUPS = len({f.dim for f in sc.make_features("sgd")})  # one optimizer and initializer: a spec per dim


# --------------------------------------------------------------------------------------------------------------
# Running the scenario
# --------------------------------------------------------------------------------------------------------------

class Run:
    """The npz files of one scenario run, one dict per rank."""

    def __init__(self, name, out_dir, workers, log):
        self.name, self.workers, self.log = name, workers, log
        self.ranks = []
        for r in range(workers):
            path = Path(out_dir) / f"rank{r}.npz"
            assert path.exists(), f"{name}: rank {r} wrote no {path.name}\n{tail(log)}"
            with np.load(path) as z:
                self.ranks.append({k: z[k] for k in z.files})

    def tables(self):
        """{(feature, id): (rank, row)} over all ranks; a row held by two ranks fails."""
        rows = {}
        for r, data in enumerate(self.ranks):
            for k, v in data.items():
                if k.startswith("table/"):
                    _, feature, i = k.split("/")
                    key = (feature, int(i))
                    assert key not in rows, f"{self.name}: row {key} is held by ranks {rows[key][0]} and {r}"
                    rows[key] = (r, v)
        return rows

    def outputs(self, rank):
        return {k[len("out/"):]: v for k, v in self.ranks[rank].items() if k.startswith("out/")}

    def stats(self, rank):
        """{feature: {stat: int}} recorded after the last step."""
        out = {}
        for k, v in self.ranks[rank].items():
            if k.startswith("stat/"):
                _, feature, stat = k.split("/")
                out.setdefault(feature, {})[stat] = int(v)
        return out


def run_scenarios(root, workers, configs, launcher=horovodrun, where="loopback"):
    """Runs scenario.py once with `workers` workers (alone when 1, else under launcher(workers)), training each of
    `configs` ((layer, optimizer, steps, mode) tuples) in turn, into its own directory under `root`
    -> {config: Run}. A failed launch raises AssertionError naming every configuration it held and the log's tail
    (whose "[scenario] ... run i/n" lines say which one was running)."""
    args, dirs, names = [str(SCENARIO)], {}, []
    for layer, optimizer, steps, mode in configs:
        autograph = "on" if (workers, layer, optimizer, mode) in AUTOGRAPH_ON else "off"
        dirs[(layer, optimizer, steps, mode)] = out = Path(root) / f"{layer}-{optimizer}-{steps}-{mode}"
        args += ["--run", f"{layer}:{optimizer}:{steps}:{mode}:{autograph}={out}"]
        names.append(f"{layer}/{optimizer}/{mode}/{steps} steps/autograph {autograph}")
    cmd = [sys.executable] + args if workers == 1 else launcher(workers) + [sys.executable] + args
    name = f"{workers} worker(s){f' ({where})' if workers > 1 else ''}: " + ", ".join(names)
    timeout = RUN_TIMEOUT_S + PER_RUN_TIMEOUT_S * len(configs)
    start = time.monotonic()
    rc, log, _ = execute(cmd, timeout, merge_stderr=True)
    took = time.monotonic() - start
    if rc is None:
        raise AssertionError(f"{name}: timed out after {timeout} s: {' '.join(cmd)}\n{tail(log)}")
    if rc != 0:
        raise AssertionError(f"{name}: exit status {rc} after {took:.0f} s: {' '.join(cmd)}\n{tail(log)}")
    return {config: Run(f"{config[0]}/{config[1]}/{workers} worker(s)/{config[3]}", out, workers, log)
            for config, out in dirs.items()}


def run_scenario(out_dir, workers, layer, optimizer, steps=STEPS, mode="function", launcher=horovodrun,
                 where="loopback"):
    """One configuration of run_scenarios -> Run."""
    config = (layer, optimizer, steps, mode)
    return run_scenarios(out_dir, workers, [config], launcher, where)[config]


# Every configuration the tests of this module read, by worker count: the first test that needs one of them runs all
# of its worker count in one launch (about 6 s of CPU saved per configuration: processes, TensorFlow's import,
# Horovod's start). A configuration missing here still runs, alone.
PLANNED = {
    1: [("fused", "sgd"), ("fused", "adagrad"), ("per_feature", "sgd"), ("per_feature", "adagrad"),
        ("fused_tfra", "adagrad"), ("fused_admission", "adagrad"), ("fused_fp16", "adagrad"),
        ("fused_fp16s", "adagrad"), ("fused_tfra_fp16s", "adagrad")],
    2: [("fused", "sgd"), ("fused", "adagrad"), ("per_feature", "sgd"), ("per_feature", "adagrad"),
        ("fused_packed", "adagrad"), ("fused_tfra", "adagrad"), ("fused_tfra", "adam"), ("fused", "adam"),
        ("fused_admission", "adagrad"), ("fused_fp16", "adagrad"), ("fused", "adagrad", STEPS, "eager"),
        ("fused_chain", "adagrad"), ("fused_fp16s", "adagrad"), ("fused_tfra_fp16s", "adagrad")],
}
# Where TFRA (the [tfra] extra) is not installed, the launches leave out the layers on its tables (sc.TFRA_LAYERS),
# whose tests carry the `tfra` marker (by name or parametrization: tests/conftest.py) and are skipped there.
TFRA_INSTALLED = importlib.util.find_spec("tensorflow_recommenders_addons") is not None


@pytest.fixture(scope="session")
def scenario(tmp_path_factory):
    """scenario(workers, layer, optimizer, steps=STEPS, mode="function") -> Run, each configuration run once (the
    PLANNED ones of a worker count together)."""
    cache = {}

    def get(workers, layer, optimizer, steps=STEPS, mode="function"):
        key = (workers, layer, optimizer, steps, mode)
        if key not in cache:
            planned = [(p + (STEPS, "function"))[:4] for p in PLANNED.get(workers, [])
                       if TFRA_INSTALLED or p[0] not in sc.TFRA_LAYERS]
            configs = planned if key[1:] in planned else [key[1:]]
            configs = [c for c in configs if (workers,) + c not in cache]
            root = tmp_path_factory.mktemp(f"w{workers}")
            try:
                runs = run_scenarios(root, workers, configs)
            except AssertionError as e:  # remembered: a failed launch is not run again
                runs = dict.fromkeys(configs, e)
            cache.update({(workers,) + c: run for c, run in runs.items()})
        if isinstance(cache[key], AssertionError):
            pytest.fail(str(cache[key]), pytrace=False)
        return cache[key]

    return get


# --------------------------------------------------------------------------------------------------------------
# Comparisons and the NumPy side of the scenario's data
# --------------------------------------------------------------------------------------------------------------

def assert_close(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=what)


def assert_same_tables(a, b):
    ta, tb = a.tables(), b.tables()
    only_a, only_b = sorted(set(ta) - set(tb)), sorted(set(tb) - set(ta))
    assert not only_a and not only_b, (f"rows differ: only in {a.name}: {only_a[:10]} ({len(only_a)}); "
                                       f"only in {b.name}: {only_b[:10]} ({len(only_b)})")
    for key in sorted(ta):
        assert_close(ta[key][1], tb[key][1], f"table row {key}: {a.name} vs {b.name}")


def assert_same_dense(a, ra, b, rb):
    for name in ("kernel", "bias"):
        assert_close(a.ranks[ra][name], b.ranks[rb][name], f"dense {name}: {a.name} rank {ra} vs {b.name} rank {rb}")


def valid_ids(batch, rank, size):
    """{feature: int64 ids of the rank's slice of a global batch, padding (-1) dropped}, as scenario.local_slice."""
    per = sc.GLOBAL_BATCH // size
    lo, hi = rank * per, (rank + 1) * per
    values, lengths = batch["tags"]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    ids = {
        "user_id": batch["user_id"][lo:hi],
        "item_id": batch["item_id"][lo:hi],
        "tags": values[starts[lo]:starts[hi]],
        "genres": batch["genres"][lo:hi].ravel(),
        "history": batch["history"][lo:hi].ravel(),
    }
    assert sorted(ids) == sorted(FEATURES)
    return {k: v[v >= 0] for k, v in ids.items()}


def owner_of(ids, num_ranks):
    from tf_fusedrec.ops import reference  # NumPy: owner = mix64(id) mod N

    return reference.owner_of(np.asarray(ids, np.int64), num_ranks)


def test_scenario_data_is_nontrivial():
    """The premises the other tests rely on: ids collide across categories, padding and empty rows occur."""
    batch = sc.make_batch(STEPS - 1)
    ids = valid_ids(batch, 0, 1)
    assert set(ids["user_id"]) & set(ids["item_id"]), "no id shared by two categories of one group"
    assert (batch["genres"] == -1).any() and (batch["tags"][1] == 0).any()
    assert NUM_GROUPS == 2 and len(FEATURES) == 5


# --------------------------------------------------------------------------------------------------------------
# 1. Lossless: fused == per-feature
# --------------------------------------------------------------------------------------------------------------

def assert_fused_equals_per_feature(fused, per_feature, workers):
    """First-step outputs, losses, dense weights and tables of two runs of the same configuration agree."""
    for r in range(workers):
        out_f, out_p = fused.outputs(r), per_feature.outputs(r)
        assert sorted(out_f) == sorted(out_p) == sorted(FEATURES)
        for name in FEATURES:
            assert_close(out_f[name], out_p[name], f"rank {r} first-step output {name}: fused vs per_feature")
        losses = fused.ranks[r]["losses"]
        assert losses.shape == (STEPS,) and np.isfinite(losses).all()
        assert_close(losses, per_feature.ranks[r]["losses"], f"rank {r} losses: fused vs per_feature")
        assert_same_dense(fused, r, per_feature, r)
    assert_same_tables(fused, per_feature)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("workers", [1, 2])
def test_fused_equals_per_feature(scenario, workers, optimizer):
    assert_fused_equals_per_feature(scenario(workers, "fused", optimizer), scenario(workers, "per_feature", optimizer),
                                    workers)


@pytest.mark.parametrize("workers", [1, 2])
def test_eval_predictions_fused_equal_per_feature(scenario, workers):
    """Inference (training=False) reads every id on its owner in both layers: PerFeatureEmbedding used to read only
    the local shard with several workers, giving other workers' ids their initial rows."""
    fused, per_feature = scenario(workers, "fused", "adagrad"), scenario(workers, "per_feature", "adagrad")
    for r in range(workers):
        assert_close(per_feature.ranks[r]["eval_pred"], fused.ranks[r]["eval_pred"], f"rank {r} eval predictions")


def test_packed_groups_lossless(scenario):
    # Packed groups send one reversible int64 per (category, id) pair instead of an (id, category) row: they train as
    # the hashed groups do (fused, itself checked against per_feature above), without TFRA.
    packed = scenario(2, "fused_packed", "adagrad")
    hashed = scenario(2, "fused", "adagrad")
    assert int(packed.ranks[0]["alltoalls"]) == 2 * NUM_GROUPS
    for r in range(2):
        out_f, out_h = packed.outputs(r), hashed.outputs(r)
        for name in FEATURES:
            assert_close(out_f[name], out_h[name], f"rank {r} first-step output {name}: packed vs hashed")
        assert_close(packed.ranks[r]["losses"], hashed.ranks[r]["losses"], f"rank {r} losses")
        assert_same_dense(packed, r, hashed, r)
    assert_same_tables(packed, hashed)


# --------------------------------------------------------------------------------------------------------------
# 2. Worker-count independence: 2 workers == 1 worker
# --------------------------------------------------------------------------------------------------------------

def assert_two_workers_equal_one(two, one):
    assert_same_tables(two, one)
    for r in range(2):
        assert_same_dense(two, r, one, 0)
    out_one = one.outputs(0)
    for name in FEATURES:
        joined = np.concatenate([two.outputs(r)[name] for r in range(2)], axis=0)
        assert_close(joined, out_one[name], f"first-step output {name}: ranks 0,1 concatenated vs 1 worker")
    # Each rank's loss is the mean over its half of the batch: their mean is the 1-worker loss of every step.
    mean_two = np.mean([two.ranks[r]["losses"] for r in range(2)], axis=0)
    np.testing.assert_allclose(mean_two, one.ranks[0]["losses"], rtol=1e-5, atol=1e-6,
                               err_msg="mean of the 2 workers' losses vs 1-worker loss, per step")


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_two_workers_equal_one_worker(scenario, optimizer):
    assert_two_workers_equal_one(scenario(2, "fused", optimizer), scenario(1, "fused", optimizer))


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])  # sgd: tests/layers/test_native_backend.py
def test_native_backend_equals_tfra_on_two_workers(scenario, optimizer):
    """FusedEmbedding's default (native) tables on 2 workers give the TFRA tables' training: rows, losses, dense."""
    native, tfra = scenario(2, "fused", optimizer), scenario(2, "fused_tfra", optimizer)
    assert_same_tables(native, tfra)
    for r in range(2):
        assert_close(native.ranks[r]["losses"], tfra.ranks[r]["losses"], f"rank {r} losses: native vs tfra")
        assert_same_dense(native, r, tfra, r)


def test_mpi_transport_two_workers_equal_one_worker(scenario, tmp_path):
    """Under horovodrun --mpi (Open MPI, what `make bench` and `make demo` launch) the native tables' training is the
    1-worker training, as it is under Gloo: the transport moves the same bytes."""
    mpi = run_scenario(tmp_path, 2, "fused", "adagrad", launcher=horovodrun_mpi, where="mpi")
    gloo = scenario(2, "fused", "adagrad")
    assert [str(r["transport"]) for r in mpi.ranks] == ["mpi", "mpi"], "the --mpi launch did not run over MPI"
    assert [str(r["transport"]) for r in gloo.ranks] == ["gloo", "gloo"], "the --gloo launch did not run over Gloo"
    assert_two_workers_equal_one(mpi, scenario(1, "fused", "adagrad"))
    assert_same_tables(mpi, gloo)
    for r in range(2):
        assert_close(mpi.ranks[r]["losses"], gloo.ranks[r]["losses"], f"rank {r} losses: mpi vs gloo")


def test_tfra_backend_two_workers_equal_one_worker(scenario):
    """As test_two_workers_equal_one_worker, on TFRA's tables (OPTIMIZERS: Adam's normalised update magnifies the
    last-bit differences of gradients summed in another order past 1e-6, on either backend)."""
    assert_two_workers_equal_one(scenario(2, "fused_tfra", "adagrad"), scenario(1, "fused_tfra", "adagrad"))


def test_admission_two_workers_equal_one_worker(scenario):
    """Admission (min_count 3) and expiry (2 steps) on 2 workers: each owner counts the (feature, id) keys it owns
    once per step, as one worker counts them over the whole batch, so the same rows are admitted, trained, expired
    and admitted again; the tables are not those of the training without them."""
    two, one = scenario(2, "fused_admission", "adagrad"), scenario(1, "fused_admission", "adagrad")
    assert_two_workers_equal_one(two, one)
    held, plain = one.tables(), scenario(1, "fused", "adagrad").tables()
    assert set(held) < set(plain), "expiry removed no row (ids 0..11) or a row held is not one plain training holds"


def test_float16_storage_two_workers_equal_one_worker(scenario):
    """float16 storage (FusedEmbedding(storage="float16")): rows stored by 2 workers equal 1 worker's up to one
    float16 rounding (the float32 sums of the two runs may differ in their last bit, which can move a rounding by
    one float16 step, 2**-11 relative); the rows are float16 values; the model stays close to float32 storage."""
    two, one, fp32 = scenario(2, "fused_fp16", "adagrad"), scenario(1, "fused_fp16", "adagrad"), \
        scenario(1, "fused", "adagrad")
    ta, tb, t32 = two.tables(), one.tables(), fp32.tables()
    assert set(ta) == set(tb) == set(t32), "float16 storage holds other rows than float32 storage"
    for key in sorted(ta):
        row = ta[key][1]
        np.testing.assert_array_equal(row.astype(np.float16).astype(np.float32), row,
                                      err_msg=f"{key}: a stored row that is not a float16 value")
        np.testing.assert_allclose(row, tb[key][1], rtol=2e-3, atol=2e-4, err_msg=f"{key}: 2 workers vs 1")
        np.testing.assert_allclose(row, t32[key][1], rtol=2e-2, atol=2e-3, err_msg=f"{key}: float16 vs float32")
    mean_two = np.mean([two.ranks[r]["losses"] for r in range(2)], axis=0)
    np.testing.assert_allclose(mean_two, one.ranks[0]["losses"], rtol=1e-3, err_msg="losses: 2 workers vs 1")


def float16_steps_apart(a, b):
    """How many float16 steps apart two arrays of float16 values are, per element (their float16 bit patterns read
    as a monotone integer scale)."""
    def ordinal(x):
        bits = np.asarray(x, np.float32).astype(np.float16).view(np.int16).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFF), bits)
    return np.abs(ordinal(a) - ordinal(b))


def stochastic_rows(scenario, layer):
    """{workers: every value of the rows of `layer`'s runs on 1 and 2 workers, flat}, the keys of round to nearest's
    run (fused_fp16), and its values."""
    nearest = scenario(2, "fused_fp16", "adagrad").tables()
    keys = sorted(nearest)

    def stack(t):  # every value of the rows, flat (the groups' dims differ)
        return np.concatenate([t[k][1] for k in keys])

    rows = {}
    for w in (1, 2):
        table = scenario(w, layer, "adagrad").tables()
        assert sorted(table) == keys, f"{layer} on {w} worker(s): stochastic rounding holds other rows"
        rows[w] = stack(table)
    return rows, stack(nearest)


@pytest.mark.parametrize("layer", ["fused_fp16s", "fused_tfra_fp16s"])
def test_float16_stochastic_two_workers_equal_one_worker(scenario, layer):
    """Stochastic rounding (FusedEmbedding(storage="float16", rounding="stochastic")), on either backend: its random
    bits are a function of (salt, key, update count, column), never of the worker, so 2 workers store 1 worker's
    rows: the float32 rows rounded may differ in their last bit (gradients summed in another order), and for given
    bits the rounding is monotone in the value, so a row element can move by one float16 step, which then follows
    it; almost every element must be equal bit for bit (all of them are, here). The rounding is not round to
    nearest's (82% of the values differ from it here)."""
    rows, nearest = stochastic_rows(scenario, layer)
    for w, r in rows.items():
        np.testing.assert_array_equal(r.astype(np.float16).astype(np.float32), r,
                                      err_msg=f"{layer} on {w} worker(s): a stored row that is not a float16 value")
    apart = float16_steps_apart(rows[2], rows[1])
    assert apart.max() <= 2 and (apart > 0).mean() < 0.01, (
        f"{layer}, 2 workers vs 1: {int((apart > 0).sum())} of {apart.size} values differ, by up to "
        f"{apart.max()} float16 steps")
    mean_two = np.mean([scenario(2, layer, "adagrad").ranks[r]["losses"] for r in range(2)], axis=0)
    np.testing.assert_allclose(mean_two, scenario(1, layer, "adagrad").ranks[0]["losses"], rtol=1e-3,
                               err_msg=f"{layer} losses: 2 workers vs 1")
    differ = (float16_steps_apart(rows[2], nearest) > 0).mean()
    assert differ > 0.05, f"stochastic rounding stored round to nearest's rows ({differ:.1%} of the values differ)"


def test_float16_stochastic_native_near_tfra(scenario):
    """The backends' stochastic rounding agrees to the tolerance of the other float16 comparisons (the native table
    rounds a new key's initial row to nearest when it inserts it, so the first update rounds another value and the
    rows part by a float16 step or so)."""
    native, tfra = stochastic_rows(scenario, "fused_fp16s")[0][2], stochastic_rows(scenario, "fused_tfra_fp16s")[0][2]
    np.testing.assert_allclose(native, tfra, rtol=2e-3, atol=2e-4, err_msg="2 workers: native vs tfra")


# --------------------------------------------------------------------------------------------------------------
# 3. Sharding
# --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layer", ["fused", "per_feature"])
def test_rows_sharded_by_owner(scenario, layer):
    run = scenario(2, layer, "adagrad")
    tables = run.tables()  # fails if a row is on two ranks
    seen = {name: set() for name in FEATURES}
    for s in range(STEPS):
        for name, ids in valid_ids(sc.make_batch(s), 0, 1).items():
            seen[name].update(int(i) for i in ids)
    expected = {(name, i) for name, ids in seen.items() for i in ids}
    assert set(tables) == expected, (f"rows not touched by any batch: {sorted(set(tables) - expected)}; "
                                     f"touched rows missing: {sorted(expected - set(tables))}")
    keys = sorted(tables)
    owners = owner_of([i for _, i in keys], 2)
    wrong = [(key, tables[key][0], int(o)) for key, o in zip(keys, owners) if tables[key][0] != o]
    assert not wrong, f"rows on a rank other than owner_of(id, 2), as ((feature, id), rank, owner): {wrong}"
    for r in range(2):
        assert any(rank == r for rank, _ in tables.values()), f"rank {r} holds no row"


# --------------------------------------------------------------------------------------------------------------
# 4. All-to-all count of the forward graph
# --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("workers,layer,expected", [
    (2, "fused", 2 * NUM_GROUPS),
    (2, "per_feature", 2 * len(FEATURES)),
    (1, "fused", 0),
    (1, "per_feature", 0),
])
def test_alltoall_count(scenario, workers, layer, expected):
    run = scenario(workers, layer, "adagrad")
    counts = [int(run.ranks[r]["alltoalls"]) for r in range(workers)]
    assert counts == [expected] * workers, f"{run.name}: HorovodAlltoall ops per rank {counts}, expected {expected}"


# --------------------------------------------------------------------------------------------------------------
# 5. Per-feature statistics survive fusion
# --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [1, 2])
def test_statistics(scenario, workers):
    run = scenario(workers, "fused", "adagrad")
    batch = sc.make_batch(STEPS - 1)  # statistics are those of the last call, the last training step
    global_ids = valid_ids(batch, 0, 1)
    stats = [run.stats(r) for r in range(workers)]
    for r in range(workers):
        assert sorted(stats[r]) == sorted(FEATURES), f"rank {r}: statistics of {sorted(stats[r])}"
        local = valid_ids(batch, r, workers)
        for name in FEATURES:
            got = stats[r][name]
            assert got["ids"] == local[name].size, f"rank {r} {name}: ids {got}, slice has {local[name].size}"
            want_sent = np.unique(local[name]).size
            assert got["unique_sent"] == want_sent, f"rank {r} {name}: unique_sent {got}, expected {want_sent}"
            distinct = np.unique(global_ids[name])
            owned = int((owner_of(distinct, workers) == r).sum())
            assert got["unique_looked_up"] == owned, (
                f"rank {r} {name}: unique_looked_up {got}, but rank {r} owns {owned} of the batch's distinct ids")
    for name in FEATURES:
        total = sum(stats[r][name]["unique_looked_up"] for r in range(workers))
        distinct = np.unique(global_ids[name]).size
        assert total == distinct, f"{name}: unique_looked_up sums to {total} over ranks, {distinct} distinct ids"


# --------------------------------------------------------------------------------------------------------------
# 6. Eager training steps == tf.function steps
# --------------------------------------------------------------------------------------------------------------

def test_fused_ops_equal_the_op_chains_on_two_workers(scenario):
    """The fused sender op (group_lookup.FusedSender, the default) and the output's gather_segment_sum op
    (GroupLookup.output_sums) against the op chains they replace (ChainSender; gather, split and a segment sum per
    feature) give the same training bit for bit: outputs, losses, tables, dense weights, held-out predictions,
    statistics."""
    fused, chain = scenario(2, "fused", "adagrad"), scenario(2, "fused_chain", "adagrad")
    for r in range(2):
        # The runs really differ: one fused op of each kind per group, or none (the chains).
        for ops in ("sender_ops", "output_ops"):
            counts = int(fused.ranks[r][ops]), int(chain.ranks[r][ops])
            assert counts == (NUM_GROUPS, 0), (r, ops, counts)
        assert sorted(fused.ranks[r]) == sorted(chain.ranks[r]), (r, set(fused.ranks[r]) ^ set(chain.ranks[r]))
        for key, value in chain.ranks[r].items():
            if key not in ("sender_ops", "output_ops"):
                np.testing.assert_array_equal(fused.ranks[r][key], value, err_msg=f"rank {r}: {key}")


def test_eager_equals_function(scenario):
    # Eager over all STEPS costs less than two short runs: it skips the training step's tracing.
    eager = scenario(2, "fused", "adagrad", mode="eager")
    function = scenario(2, "fused", "adagrad")
    assert_same_tables(eager, function)
    for r in range(2):
        assert_close(eager.ranks[r]["losses"], function.ranks[r]["losses"], f"rank {r} losses: eager vs function")
        assert_same_dense(eager, r, function, r)

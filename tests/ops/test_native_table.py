"""Tests of the native embedding table ops against the NumPy reference (tf_fusedrec.ops.reference), the Hashed
initializer and plain TF optimizers."""

import gc
import json
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf

from tests.subprocess_runner import execute, tail
from tf_fusedrec.initializers import Hashed, feature_salt, hashed_rows_numpy
from tf_fusedrec.ops import reference as ref_module
from tf_fusedrec.ops.native_table_ops import adam_bias_corrected_lr

SALTS = [feature_salt(7, "user"), feature_salt(7, "item"), feature_salt(7, "tags")]
# The table semantics below (new keys, repeated keys, float16 storage, rounding) with each optimizer and slot layout;
# tests/ops/test_native_optimizers.py checks each update formula against Keras.
OPTIMIZERS = {
    "sgd": ("sgd", {}),
    "adagrad": ("adagrad", {}),
    "adam": ("adam", {}),
    "momentum": ("sgd", {"momentum": 0.9}),
    "nesterov": ("sgd", {"momentum": 0.9, "nesterov": True}),
    "adamw": ("adamw", {"weight_decay": 0.05}),
    "ftrl": ("ftrl", {"l1_regularization_strength": 0.001, "l2_regularization_strength": 0.01,
                      "l2_shrinkage_regularization_strength": 0.01, "beta": 0.1}),
    "rmsprop": ("rmsprop", {}),
    "rmsprop_centered_momentum": ("rmsprop", {"momentum": 0.5, "centered": True}),
}


def optimizer_args(key):
    optimizer, hyperparameters = OPTIMIZERS[key]
    return {"optimizer": optimizer, "hyperparameters": hyperparameters}
INITS = ["hashed", "constant", "normal", "uniform", "truncated_normal"]
INIT_ARGS = dict(seed=11, mean=0.25, stddev=0.05, minval=-0.3, maxval=0.2, value=0.125)


def make_pair(fro, name, dim=8, **kwargs):
    """(op table, reference table) with the same settings."""
    kwargs.setdefault("salts", SALTS)
    table = fro.NativeTableResource(name, dim, **kwargs)
    return table, ref_module.NativeTableReference(dim, **kwargs)


def random_ids(rng, n, high=2**40):
    return rng.choice(high, size=n, replace=False).astype(np.int64) - 2**39


def feed(keys):
    """categories and ids of keys: ids are the keys, categories a function of the key."""
    return (np.abs(keys) % len(SALTS)).astype(np.int32), keys.copy()


def export_sorted(fro, table):
    keys, rows, slots = (t.numpy() for t in fro.native_table_export(table))
    order = np.argsort(keys)
    return keys[order], rows[order], slots[order]


def assert_table_equal(fro, table, want):
    got = export_sorted(fro, table)
    for g, w, what in zip(got, want.export(), ("keys", "rows", "slots")):
        np.testing.assert_array_equal(g, w, err_msg=what)
    assert int(fro.native_table_size(table)) == want.size()


class Modes:
    """Runs an op-calling function eagerly, or inside a tf.function with unknown-length inputs."""

    def __init__(self, mode):
        self.mode = mode

    def __call__(self, fn, *arrays):
        def call(*tensors):  # ops without outputs return an Operation in a graph, which a tf.function cannot return
            out = fn(*tensors)
            return None if isinstance(out, tf.Operation) else out

        tensors = [tf.constant(a) for a in arrays]
        if self.mode == "eager":
            out = call(*tensors)
        else:
            spec = [tf.TensorSpec([None] * np.ndim(a), tf.as_dtype(np.asarray(a).dtype)) for a in arrays]
            out = tf.function(call, autograph=False, input_signature=spec)(*tensors)
        return tf.nest.map_structure(lambda t: t.numpy(), out) if out is not None else None

    def __repr__(self):
        return self.mode


@pytest.fixture(params=["eager", "function"])
def mode(request):
    return Modes(request.param)


# ----------------------------------------------------------------------------------------------------------------
# The reference's initializers (no compiled library needed)
# ----------------------------------------------------------------------------------------------------------------

def test_reference_hashed_is_the_hashed_initializer():
    rng = np.random.default_rng(0)
    ids = random_ids(rng, 500)
    salts = np.array(SALTS, np.int64)[rng.integers(0, 3, 500)]
    got = ref_module.native_table_initial_rows("hashed", ids, salts, 16, stddev=0.05)
    np.testing.assert_array_equal(got, hashed_rows_numpy(ids, salts, 16, 0.05))


def test_reference_initializer_distributions():
    ids = np.arange(20_000, dtype=np.int64)
    salts = np.full(20_000, SALTS[0], np.int64)
    normal = ref_module.native_table_initial_rows("normal", ids, salts, 4, seed=1, mean=1.0, stddev=0.5)
    assert abs(normal.mean() - 1.0) < 0.01 and abs(normal.std() - 0.5) < 0.01
    trunc = ref_module.native_table_initial_rows("truncated_normal", ids, salts, 4, seed=1, mean=0.0, stddev=0.5)
    assert np.abs(trunc).max() <= 1.0 and abs(trunc.std() - 0.5 * 0.8796) < 0.01
    uniform = ref_module.native_table_initial_rows("uniform", ids, salts, 4, seed=1, minval=-1.0, maxval=3.0)
    assert uniform.min() >= -1.0 and uniform.max() <= 3.0 and abs(uniform.mean() - 1.0) < 0.03
    other_seed = ref_module.native_table_initial_rows("normal", ids, salts, 4, seed=2, mean=1.0, stddev=0.5)
    assert not np.array_equal(normal, other_seed)


# ----------------------------------------------------------------------------------------------------------------
# lookup_or_init
# ----------------------------------------------------------------------------------------------------------------

def test_hashed_rows_are_the_hashed_initializer(fro, mode):
    """Bit-exact: the kernel computes Hashed's float64 Box-Muller with the same bits. (libm and TF's Eigen may differ
    in the last bit of a float64 log/cos, which changes a float32 result with probability ~2^-29 per entry; over
    these 32k entries the test expects, and gets, no difference at all.)"""
    rng = np.random.default_rng(1)
    keys = random_ids(rng, 2000)
    categories, ids = feed(keys)
    table = fro.NativeTableResource("hashed", 16, salts=SALTS, init="hashed", seed=7, stddev=0.05)
    got = mode(lambda k, c, i: fro.native_table_lookup_or_init(table, k, c, i), keys, categories, ids)
    salts = np.array(SALTS, np.int64)[categories]
    want = Hashed(7, 0.05).rows(tf.constant(ids), tf.constant(salts), 16).numpy()
    assert got.dtype == np.float32 and got.shape == (2000, 16)
    assert np.abs(got - want).max() == 0
    np.testing.assert_array_equal(got, hashed_rows_numpy(ids, salts, 16, 0.05))


@pytest.mark.parametrize("init", INITS)
@pytest.mark.parametrize("storage", ["float32", "float16"])
def test_lookup_or_init_matches_reference(fro, mode, init, storage):
    rng = np.random.default_rng(len(init))
    table, want = make_pair(fro, f"init_{init}", dim=6, init=init, storage=storage, **INIT_ARGS)
    lookup = lambda k, c, i: fro.native_table_lookup_or_init(table, k, c, i)  # noqa: E731
    pool = random_ids(rng, 300)
    for step in range(4):
        keys = np.unique(rng.choice(pool, 120))
        rng.shuffle(keys)
        categories, ids = feed(keys)
        np.testing.assert_array_equal(mode(lookup, keys, categories, ids), want.lookup_or_init(keys, categories, ids),
                                      err_msg=f"step {step}")
    assert int(fro.native_table_size(table)) == want.size()
    assert_table_equal(fro, table, want)


def test_initial_row_depends_on_category_and_id_only(fro):
    table = fro.NativeTableResource("indep", 4, salts=SALTS, init="normal", seed=3)
    a = fro.native_table_lookup_or_init(table, [1, 2], [0, 1], [10, 10]).numpy()
    b = fro.native_table_lookup_or_init(table, [3, 4], [1, 0], [10, 10]).numpy()  # other keys, same (cat, id)
    np.testing.assert_array_equal(a, b[::-1])
    assert not np.array_equal(a[0], a[1])


def test_float16_lookup_without_insert_gives_the_float32_initial_row(fro, mode):
    """A missing key read without insert (inference) gets the unrounded initial row, as the TFRA backend and the
    embedding servers (hashed_rows_numpy) give it for an id never trained; inserted rows are stored as float16."""
    table = fro.NativeTableResource("h16_infer", 5, storage="float16", salts=SALTS, init="hashed", seed=4, stddev=0.3)
    keys = np.arange(30, dtype=np.int64)
    categories, ids = feed(keys)
    lookup = lambda insert: lambda k, c, i: fro.native_table_lookup_or_init(table, k, c, i, insert=insert)  # noqa
    want = Hashed(4, 0.3).rows(tf.constant(ids), tf.gather(tf.constant(SALTS, tf.int64), categories),
                                            5).numpy()
    np.testing.assert_array_equal(mode(lookup(False), keys, categories, ids), want)
    assert int(fro.native_table_size(table)) == 0
    inserted = mode(lookup(True), keys, categories, ids)
    np.testing.assert_array_equal(inserted, want.astype(np.float16).astype(np.float32))


def test_insert_false_leaves_the_table_unchanged(fro, mode):
    table, want = make_pair(fro, "no_insert", dim=4, optimizer="adagrad", track_access=True)
    rng = np.random.default_rng(2)
    keys = random_ids(rng, 50)
    categories, ids = feed(keys)
    lookup = lambda insert: lambda k, c, i: fro.native_table_lookup_or_init(table, k, c, i, insert=insert)  # noqa
    np.testing.assert_array_equal(mode(lookup(True), keys[:20], categories[:20], ids[:20]),
                                  want.lookup_or_init(keys[:20], categories[:20], ids[:20]))
    before = fro.native_table_access_status(table)
    got = mode(lookup(False), keys, categories, ids)
    np.testing.assert_array_equal(got, want.lookup_or_init(keys, categories, ids, insert=False))
    assert int(fro.native_table_size(table)) == 20 == want.size()
    after = fro.native_table_access_status(table)
    for b, a in zip(before, after):
        np.testing.assert_array_equal(b.numpy(), a.numpy())
    # Missing keys returned their initial rows, which a training lookup then inserts unchanged.
    np.testing.assert_array_equal(mode(lookup(True), keys, categories, ids), got)


# ----------------------------------------------------------------------------------------------------------------
# apply_sparse
# ----------------------------------------------------------------------------------------------------------------

HYPER = dict(lr=0.05, beta1=0.9, beta2=0.999, epsilon=1e-7)


def training_steps(rng, num_steps, pool_size=400, per_step=150):
    """Keys of each step: unique, drawn from a pool that grows, so new keys keep appearing."""
    pool = random_ids(rng, pool_size)
    for step in range(num_steps):
        live = pool[: min(pool_size, 100 + step * (pool_size - 100) // max(1, num_steps - 1))]
        keys = np.unique(rng.choice(live, per_step))
        rng.shuffle(keys)
        yield step, keys


def reference_adam_lr(table, lr, update_count):
    """What the reference takes for adam and adamw: the bias-corrected lr, as the op's wrapper computes it."""
    if table.optimizer not in ("adam", "adamw"):
        return None
    hyper = table.hyperparameters
    return adam_bias_corrected_lr(lr, hyper["beta_1"], hyper["beta_2"], update_count).numpy()


def apply_both(fro, mode, table, want, keys, grads, categories, ids, lr, update_count=1, distinct_keys=False):
    """One apply_sparse on the op table (in `mode`) and on the reference."""
    mode(lambda k, g, c, i, n: fro.native_table_apply_sparse(table, k, g, c, i, lr, update_count=n,
                                                             distinct_keys=distinct_keys),
         keys, grads, categories, ids, np.int64(update_count))
    want.apply_sparse(keys, grads, categories, ids, lr, reference_adam_lr(table, lr, update_count), update_count,
                      distinct_keys=distinct_keys)


STORAGES = {"float32": {"storage": "float32"}, "float16": {"storage": "float16"},
            "float16_stochastic": {"storage": "float16", "rounding": "stochastic"}}


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("storage", list(STORAGES))
def test_apply_sparse_matches_reference(fro, mode, optimizer, storage):
    """25 steps of lookup + update with new keys arriving: exactly the reference's float32 arithmetic (float16:
    rounded once per update, to nearest or stochastically with the bits of (salts[0], key, update count, column))."""
    rng = np.random.default_rng(list(OPTIMIZERS).index(optimizer))
    table, want = make_pair(fro, f"apply_{optimizer}", dim=8, **optimizer_args(optimizer), **STORAGES[storage])
    lr = np.float32(HYPER["lr"])

    def step_fn(keys, grads, categories, ids, update_count):
        rows = fro.native_table_lookup_or_init(table, keys, categories, ids)
        with tf.control_dependencies([rows]):
            fro.native_table_apply_sparse(table, keys, grads, categories, ids, lr, update_count=update_count)
        return rows

    for step, keys in training_steps(rng, 25):
        categories, ids = feed(keys)
        grads = rng.normal(0, 1, (keys.size, 8)).astype(np.float32)
        rows = mode(step_fn, keys, grads, categories, ids, np.int64(step + 1))
        np.testing.assert_array_equal(rows, want.lookup_or_init(keys, categories, ids), err_msg=f"step {step}")
        want.apply_sparse(keys, grads, categories, ids, lr, reference_adam_lr(table, lr, step + 1), step + 1)
    assert_table_equal(fro, table, want)
    if storage != "float32":
        rows = export_sorted(fro, table)[1]
        np.testing.assert_array_equal(rows, rows.astype(np.float16).astype(np.float32))


# float32 values that exercise every branch of stochastic rounding: zeros, float16 subnormals (|x| < 2^-14) and
# their boundary, float32 subnormals, values a float16 holds exactly, the largest float16 and just past it, beyond
# float16, infinities; each also negative.
ROUNDING_EDGES = np.array(
    [0.0, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 2.0**-14 - 2.0**-30, 2.0**-14, 2.0**-14 + 2.0**-30, 1e-7, 1e-10, 1e-40,
     2.0**-126, 2.0**-149, 0.1, 1 / 3, 1.0, 1.0 + 2.0**-11, 2047.9, 65504.0, 65504.5, 65519.0, 65520.0, 65535.99,
     65536.0, 1e30, np.inf], np.float32)


def rounding_values(rng):
    """float32 [n]: the edges with both signs, normals and values spread over float16's range and beyond."""
    spread = rng.normal(0, 1, 600) * 2.0 ** rng.integers(-40, 18, 600)
    return np.concatenate([ROUNDING_EDGES, -ROUNDING_EDGES, rng.normal(0, 1, 600), spread]).astype(np.float32)


def test_stochastic_rounding_of_every_kind_of_value(fro, mode):
    """The kernel's rounding of an update is the reference's bit for bit, on zeros, subnormals, values past 65504,
    infinities (each with both signs) and values spread over float16's range, at several update counts. The update
    is an SGD step with lr 1 from a stored -0, so the float32 row it rounds is exactly the value (-0 - -x = x, also
    for x = +0 and -0); NaN comes out NaN."""
    rng = np.random.default_rng(21)
    dim = 4
    values = rounding_values(rng)
    values = np.concatenate([values, [np.nan, -np.nan, 0.5]]).astype(np.float32)
    values = values[: values.size // dim * dim].reshape(-1, dim)
    keys = (np.arange(values.shape[0], dtype=np.int64) * 7919 - 4000) * 1_000_003
    table = fro.NativeTableResource("stochastic_edges", dim, storage="float16", rounding="stochastic", salts=SALTS)

    def update(keys, grads, update_count):
        # -(+0), not tf.fill(..., -0.0): eager TF caches scalar constants by value, and -0.0 == 0.0 finds a +0.0
        # that an earlier test (any Keras layer) made; a stored +0 rounds -0 and negative float32 subnormals to +0.
        zeros = fro.native_table_upsert(table, keys, tf.negative(tf.zeros_like(grads)))
        with tf.control_dependencies([zeros]):
            step = fro.native_table_apply_sparse(table, keys, grads, tf.zeros_like(keys, tf.int32), keys, 1.0,
                                                 update_count=update_count)
        with tf.control_dependencies([step]):
            return fro.native_table_find(table, keys).values

    for count in (1, 2, 1000, 2**40 + 3):
        got = mode(update, keys, -values, np.int64(count)).astype(np.float16)
        want = ref_module.stochastic_float16(values, ref_module.float16_rounding_bits(SALTS[0], keys, count, dim))
        nan = np.isnan(values)
        np.testing.assert_array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16),
                                      err_msg=f"update count {count}")
        assert np.isnan(got[nan]).all()


def test_stochastic_rounding_needs_float16_and_an_update_count(fro):
    with pytest.raises(ValueError, match="native table 'sr': rounding stochastic needs storage float16"):
        fro.NativeTableResource("sr", 2, rounding="stochastic")
    with pytest.raises(ValueError, match="native table 'sr': rounding must be one of"):
        fro.NativeTableResource("sr", 2, storage="float16", rounding="up")
    table = fro.NativeTableResource("sr", 2, storage="float16", rounding="stochastic")
    with pytest.raises(ValueError, match="native table 'sr': rounding stochastic needs the update_count"):
        fro.native_table_apply_sparse(table, [1], [[0.5, 0.5]], [0], [1], 0.1)
    with pytest.raises(ValueError, match="native table 'sr': update_count must have rank 0"):
        fro.native_table_apply_sparse(table, [1], [[0.5, 0.5]], [0], [1], 0.1, update_count=[1, 2])
    # The kernel checks too, for graphs built without the wrapper.
    with pytest.raises(tf.errors.InvalidArgumentError, match="native table 'sr': rounding stochastic needs storage"):
        fro.load_ops().fused_rec_native_table_create(table_name="sr", dim=2, optimizer="sgd", storage="float32",
                                                     rounding="stochastic", init="hashed", salts=[0])


LEGACY_OPTIMIZERS = ["sgd", "adagrad", "adam"]


def keras_optimizer(optimizer):
    legacy = tf.keras.optimizers.legacy
    if optimizer == "sgd":
        return legacy.SGD(HYPER["lr"])
    if optimizer == "adagrad":
        return legacy.Adagrad(HYPER["lr"], initial_accumulator_value=0.1, epsilon=HYPER["epsilon"])
    return legacy.Adam(HYPER["lr"], beta_1=HYPER["beta1"], beta_2=HYPER["beta2"], epsilon=HYPER["epsilon"])


@pytest.mark.tfra  # Keras 2's legacy optimizers (tf_keras), which the [tfra] extra brings
@pytest.mark.parametrize("optimizer", LEGACY_OPTIMIZERS)
def test_apply_sparse_matches_keras(fro, optimizer):
    """The table against Keras' legacy optimizers on a tf.Variable of the touched rows, step by step: each step the
    touched rows (new keys with their hashed rows) and their slots go into a fresh variable, the optimizer applies a
    dense gradient to it (as TFRA's shadow variable of a step's rows gets: TensorFlow's dense kernels act on the
    touched rows only, lazy Adam), and the results are kept per key. Bit-equal, on any CPU: both round every product
    and sum alike. (The other optimizers: tests/ops/test_native_optimizers.py.)"""
    rng = np.random.default_rng(10 + LEGACY_OPTIMIZERS.index(optimizer))
    dim = 8
    table = fro.NativeTableResource(f"keras_{optimizer}", dim, optimizer=optimizer, salts=SALTS)
    slot_names = table.slot_names
    slot_init = {"sgd": [], "adagrad": [0.1], "adam": [0.0, 0.0]}[optimizer]
    rows, slots = {}, {}
    for step, keys in training_steps(rng, 22, pool_size=300, per_step=100):
        categories, ids = feed(keys)
        salts = np.array(SALTS, np.int64)[categories]
        initial = hashed_rows_numpy(ids, salts, dim, 0.05)
        for k, row in zip(keys.tolist(), initial):
            if k not in rows:
                rows[k] = row
                slots[k] = [np.full(dim, v, np.float32) for v in slot_init]
        grads = rng.normal(0, 1, (keys.size, dim)).astype(np.float32)
        # Keras
        var = tf.Variable(np.stack([rows[k] for k in keys.tolist()]))
        opt = keras_optimizer(optimizer)
        opt._create_all_weights([var])  # noqa: SLF001  (slots exist before the first step, to load ours)
        for s, name in enumerate(slot_names):
            opt.get_slot(var, name).assign(np.stack([slots[k][s] for k in keys.tolist()]))
        opt.iterations.assign(step)
        opt.apply_gradients([(tf.constant(grads), var)])
        for j, k in enumerate(keys.tolist()):
            rows[k] = var.numpy()[j]
            slots[k] = [opt.get_slot(var, name).numpy()[j] for name in slot_names]
        # The table
        fro.native_table_lookup_or_init(table, keys, categories, ids)
        fro.native_table_apply_sparse(table, keys, grads, categories, ids, HYPER["lr"], update_count=step + 1)
        got = fro.native_table_find(table, keys).values.numpy()
        np.testing.assert_array_equal(got, var.numpy(), err_msg=f"step {step}")
        for s, name in enumerate(slot_names):
            got = fro.native_table_find(table, keys, part=name).values.numpy()
            np.testing.assert_array_equal(got, opt.get_slot(var, name).numpy(), err_msg=f"step {step} slot {name}")


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_apply_sparse_sums_repeated_keys(fro, mode, optimizer):
    table, want = make_pair(fro, f"dup_{optimizer}", dim=4, **optimizer_args(optimizer))
    keys = np.array([5, 9, 5, -3, 5, 9, 11], np.int64)  # 11 and -3 are new: inserted by apply_sparse itself
    categories, ids = feed(keys)
    grads = np.random.default_rng(3).normal(0, 1, (7, 4)).astype(np.float32)
    mode(lambda k, c, i: fro.native_table_lookup_or_init(table, k, c, i), keys[:2], categories[:2], ids[:2])
    want.lookup_or_init(keys[:2], categories[:2], ids[:2])
    lr = np.float32(0.1)
    apply_both(fro, mode, table, want, keys, grads, categories, ids, lr)
    assert_table_equal(fro, table, want)
    # The same as one update with the summed grads of the distinct keys.
    once, _ = make_pair(fro, f"dup_once_{optimizer}", dim=4, **optimizer_args(optimizer))
    fro.native_table_lookup_or_init(once, keys[:2], categories[:2], ids[:2])
    distinct = np.array([5, 9, -3, 11], np.int64)
    summed = np.stack([grads[keys == k].sum(axis=0, dtype=np.float32) for k in distinct])
    fro.native_table_apply_sparse(once, distinct, summed, *feed(distinct), lr, update_count=1)
    for a, b in zip(export_sorted(fro, once), export_sorted(fro, table)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_apply_sparse_distinct_keys(fro, mode, optimizer):
    """distinct_keys=True skips the deduplication: on distinct keys (new ones among them) the table ends bit for bit
    as without it; on repeated keys each occurrence is its own update, in order (the reference's documented
    behaviour), which for these optimizers is not the summed update."""
    rng = np.random.default_rng(7)
    keys = np.array([5, 9, -3, 11, 40, 2], np.int64)  # -3, 11, 40, 2 new: inserted by apply_sparse itself
    categories, ids = feed(keys)
    grads = rng.normal(0, 1, (keys.size, 4)).astype(np.float32)
    lr = np.float32(0.1)
    tables = {}
    for distinct in (False, True):
        table, want = make_pair(fro, f"distinct_{optimizer}_{distinct}", dim=4, **optimizer_args(optimizer))
        mode(lambda k, c, i, t=table: fro.native_table_lookup_or_init(t, k, c, i), keys[:2], categories[:2],
             ids[:2])
        want.lookup_or_init(keys[:2], categories[:2], ids[:2])
        apply_both(fro, mode, table, want, keys, grads, categories, ids, lr, distinct_keys=distinct)
        assert_table_equal(fro, table, want)
        tables[distinct] = export_sorted(fro, table)
    for a, b in zip(tables[False], tables[True]):
        np.testing.assert_array_equal(a, b)

    repeated = np.array([5, 9, 5, 5], np.int64)
    rep_categories, rep_ids = feed(repeated)
    rep_grads = rng.normal(0, 1, (4, 4)).astype(np.float32)
    results = []
    for distinct in (False, True):
        table, want = make_pair(fro, f"distinct_rep_{optimizer}_{distinct}", dim=4, **optimizer_args(optimizer))
        apply_both(fro, mode, table, want, repeated, rep_grads, rep_categories, rep_ids, lr, distinct_keys=distinct)
        assert_table_equal(fro, table, want)
        results.append(export_sorted(fro, table)[1])
    assert not np.array_equal(results[0], results[1]), "per-occurrence updates should differ from the summed one"


# ----------------------------------------------------------------------------------------------------------------
# find / upsert / remove / export / size / access status
# ----------------------------------------------------------------------------------------------------------------

def test_find_upsert_remove_export(fro, mode):
    table, want = make_pair(fro, "crud", dim=3, optimizer="adam", storage="float16")
    rng = np.random.default_rng(4)
    keys = random_ids(rng, 40)
    rows = rng.normal(0, 1, (40, 3)).astype(np.float32)
    upsert = lambda part: lambda k, v: fro.native_table_upsert(table, k, v, part=part)  # noqa: E731
    find = lambda part: lambda k: tuple(fro.native_table_find(table, k, part=part))  # noqa: E731
    mode(upsert(0), keys[:30], rows[:30])  # rows first: slots at slot_init
    want.upsert(keys[:30], rows[:30])
    mode(upsert("v"), keys[20:], rows[20:] ** 2)  # keys 30..39 new through a slot: zero rows
    want.upsert(keys[20:], rows[20:] ** 2, part=2)
    mode(upsert(1), keys[:5], -rows[:5])
    want.upsert(keys[:5], -rows[:5], part=1)
    probe = np.concatenate([keys, random_ids(np.random.default_rng(99), 5)])
    for part in (0, 1, 2):
        values, exists = mode(find(part), probe)
        w_values, w_exists = want.find(probe, part)
        np.testing.assert_array_equal(values, w_values, err_msg=f"part {part}")
        np.testing.assert_array_equal(exists, w_exists)
    assert not exists[40:].any() and not values[40:].any()
    assert_table_equal(fro, table, want)
    mode(lambda k: fro.native_table_remove(table, k), np.concatenate([keys[::3], probe[40:]]))
    want.remove(keys[::3])
    assert_table_equal(fro, table, want)
    assert mode(lambda k: fro.native_table_size(table), keys[:1]) == want.size()


def test_upsert_last_value_wins(fro):
    table = fro.NativeTableResource("last_wins", 2)
    fro.native_table_upsert(table, [4, 4, 4], [[1, 1], [2, 2], [3, 3]])
    np.testing.assert_array_equal(fro.native_table_find(table, [4]).values.numpy(), [[3, 3]])


def test_export_of_empty_table(fro):
    table = fro.NativeTableResource("empty", 5, optimizer="adam")
    keys, rows, slots = fro.native_table_export(table)
    assert keys.shape == (0,) and rows.shape == (0, 5) and slots.shape == (0, 2, 5)
    assert int(fro.native_table_size(table)) == 0
    values, exists = fro.native_table_find(table, [1, 2])
    assert not exists.numpy().any() and values.shape == (2, 5)


def test_access_status(fro, mode):
    table, want = make_pair(fro, "access", dim=2, optimizer="adagrad", track_access=True)
    lookup = lambda k, c, i: fro.native_table_lookup_or_init(table, k, c, i)  # noqa: E731
    rng = np.random.default_rng(5)
    pool = random_ids(rng, 60)
    for _ in range(6):
        keys = np.unique(rng.choice(pool, 25))
        mode(lookup, keys, *feed(keys))
        want.lookup_or_init(keys, *feed(keys))
    # Repeated keys in one call count once per occurrence; keys inserted by upsert or apply_sparse start at 0.
    keys = np.array([pool[0], pool[0], pool[1]], np.int64)
    mode(lookup, keys, *feed(keys))
    want.lookup_or_init(keys, *feed(keys))
    fro.native_table_upsert(table, [123456789], [[1.0, 2.0]])
    want.upsert([123456789], [[1.0, 2.0]])
    fro.native_table_apply_sparse(table, [987654321], [[0.5, 0.5]], [0], [987654321], 0.1)
    want.apply_sparse([987654321], [[0.5, 0.5]], [0], [987654321], 0.1)
    got = mode(lambda k: tuple(fro.native_table_access_status(table)), keys[:1])
    order = np.argsort(got[0])
    w_keys, w_counts, w_last, w_clock = want.access_status()
    np.testing.assert_array_equal(got[0][order], w_keys)
    np.testing.assert_array_equal(got[1][order], w_counts)
    np.testing.assert_array_equal(got[2][order], w_last)
    assert got[3] == w_clock == 7
    # Removal drops a key's stats with it.
    fro.native_table_remove(table, [pool[0]])
    assert pool[0] not in fro.native_table_access_status(table).keys.numpy()


def sorted_status(fro, table):
    """{key: (count, last)} and the clock of a table."""
    keys, counts, last, clock = (t.numpy() for t in fro.native_table_access_status(table))
    return {int(k): (int(c), int(t)) for k, c, t in zip(keys, counts, last)}, int(clock)


def setter_of(fro, table):
    return lambda k, c, t, clock: fro.native_table_set_access_status(table, k, c, t, clock)


def test_set_access_status(fro, mode):
    """What a checkpoint's restore sets: the given keys' stats and the clock; the next training lookup counts on."""
    table = fro.NativeTableResource("set_access", 2, salts=SALTS, track_access=True)
    keys = np.array([5, -7, 11, 2**40], np.int64)
    fro.native_table_upsert(table, keys, np.zeros((4, 2), np.float32))
    setter = setter_of(fro, table)
    mode(setter, keys[:3], np.array([3, 1, 9], np.int64), np.array([4, 0, 6], np.int64), np.int64(6))
    assert sorted_status(fro, table) == ({5: (3, 4), -7: (1, 0), 11: (9, 6), 2**40: (0, 0)}, 6)
    # A repeated key takes its last entry; keys not given keep theirs; an empty call sets the clock only.
    mode(setter, np.array([5, 5], np.int64), np.array([1, 2], np.int64), np.array([1, 2], np.int64), np.int64(6))
    mode(setter, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), np.int64(8))
    assert sorted_status(fro, table) == ({5: (2, 2), -7: (1, 0), 11: (9, 6), 2**40: (0, 0)}, 8)
    fro.native_table_lookup_or_init(table, [11, 3], *feed(np.array([11, 3], np.int64)))
    assert sorted_status(fro, table) == ({5: (2, 2), -7: (1, 0), 11: (10, 9), 2**40: (0, 0), 3: (1, 9)}, 9)


# ----------------------------------------------------------------------------------------------------------------
# Growth and backward-shift removal
# ----------------------------------------------------------------------------------------------------------------

def test_growth_past_several_doublings(fro):
    table = fro.NativeTableResource("grow", 4, optimizer="adagrad", salts=SALTS)
    rng = np.random.default_rng(6)
    keys = random_ids(rng, 200_000)
    categories, ids = feed(keys)
    for chunk in np.array_split(np.arange(200_000), 7):  # the table starts at 64 slots: 13 doublings
        fro.native_table_lookup_or_init(table, keys[chunk], categories[chunk], ids[chunk])
    assert int(fro.native_table_size(table)) == 200_000
    values, exists = fro.native_table_find(table, keys)
    assert exists.numpy().all()
    salts = np.array(SALTS, np.int64)[categories]
    np.testing.assert_array_equal(values.numpy(), hashed_rows_numpy(ids, salts, 4, 0.05))
    slots = fro.native_table_find(table, keys, part="accumulator").values.numpy()
    assert (slots == np.float32(0.1)).all()


def test_random_inserts_and_removes_match_a_dict(fro):
    """Keys from a small range at high load, so clusters are long and every removal shifts entries back."""
    table = fro.NativeTableResource("churn", 1)
    rng = np.random.default_rng(8)
    universe = np.arange(-3000, 3000, dtype=np.int64)
    model = {}
    for round_ in range(40):
        add = rng.choice(universe, rng.integers(50, 400))
        values = rng.normal(0, 1, (add.size, 1)).astype(np.float32)
        fro.native_table_upsert(table, add, values)
        model.update(zip(add.tolist(), values[:, 0].tolist()))
        drop = rng.choice(universe, rng.integers(50, 400))
        fro.native_table_remove(table, drop)
        for k in drop.tolist():
            model.pop(k, None)
        values, exists = fro.native_table_find(table, universe)
        exists = exists.numpy()
        assert exists.sum() == len(model) == int(fro.native_table_size(table)), f"round {round_}"
        np.testing.assert_array_equal(universe[exists], np.array(sorted(model), np.int64))
        np.testing.assert_array_equal(values.numpy()[exists, 0], np.array([model[k] for k in sorted(model)],
                                                                          np.float32))


def test_concurrent_calls_on_one_table(fro):
    """Threads training disjoint keys of one table at once end where running them one after the other would."""
    table, want = make_pair(fro, "threads", dim=4, optimizer="adagrad")
    rng = np.random.default_rng(9)
    parts = np.array_split(random_ids(rng, 8000), 4)
    grads = [rng.normal(0, 1, (p.size, 4)).astype(np.float32) for p in parts]

    @tf.function
    def train(keys, g):
        categories = tf.zeros_like(keys, tf.int32)
        rows = fro.native_table_lookup_or_init(table, keys, categories, keys)
        with tf.control_dependencies([rows]):
            fro.native_table_apply_sparse(table, keys, g, categories, keys, 0.1)

    def work(i):
        for _ in range(5):
            train(tf.constant(parts[i]), tf.constant(grads[i]))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p, g in zip(parts, grads):
        categories = np.zeros(p.size, np.int32)
        for _ in range(5):
            want.lookup_or_init(p, categories, p)
            want.apply_sparse(p, g, categories, p, 0.1)
    assert_table_equal(fro, table, want)


# ----------------------------------------------------------------------------------------------------------------
# Resource life, tf.function capture
# ----------------------------------------------------------------------------------------------------------------

def test_table_in_tf_function_and_release(fro):
    table = fro.NativeTableResource("life", 2, optimizer="sgd", init="constant", value=1.0)

    @tf.function
    def train(keys):
        categories = tf.zeros_like(keys, tf.int32)
        rows = fro.native_table_lookup_or_init(table, keys, categories, keys)
        fro.native_table_apply_sparse(table, keys, tf.ones_like(rows), categories, keys, 0.5)
        return rows

    for _ in range(3):
        rows = train(tf.constant([1, 2], tf.int64))
    np.testing.assert_array_equal(rows.numpy(), np.full((2, 2), 0.0, np.float32))
    assert train.experimental_get_tracing_count() == 1
    handle = table.resource_handle
    del table, train
    gc.collect()
    with pytest.raises(tf.errors.NotFoundError):
        fro.load_ops().fused_rec_native_table_size(handle)


def test_create_native_table_handle(fro):
    handle = fro.create_native_table("raw", 3, optimizer="adam", salts=SALTS, shared_name="native_table_test_raw")
    ops = fro.load_ops()
    ops.fused_rec_native_table_upsert(handle, [7, 8], np.ones((2, 3), np.float32))
    assert int(ops.fused_rec_native_table_size(handle)) == 2
    _, _, slots = ops.fused_rec_native_table_export(handle)
    assert slots.shape == (2, 2, 3) and not slots.numpy().any()
    tf.raw_ops.DestroyResourceOp(resource=handle)
    with pytest.raises(tf.errors.NotFoundError):
        ops.fused_rec_native_table_size(handle)


def test_shared_name_shares_the_table(fro):
    a = fro.NativeTableResource("shared", 2, shared_name="native_table_test_shared")
    b = fro.NativeTableResource("shared", 2, shared_name="native_table_test_shared")
    fro.native_table_upsert(a, [1], [[3.0, 4.0]])
    np.testing.assert_array_equal(fro.native_table_find(b, [1]).values.numpy(), [[3.0, 4.0]])
    with pytest.raises(tf.errors.InvalidArgumentError, match="shared.*another config"):
        fro.NativeTableResource("shared", 3, shared_name="native_table_test_shared")


# ----------------------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------------------

def test_error_bad_category(fro, mode, check):
    table = fro.NativeTableResource("bad_cat", 2, salts=SALTS)
    keys = np.array([1, 2, 3], np.int64)
    categories = np.array([0, 3, 1], np.int32)
    check.expect_error(lambda: mode(lambda k, c, i: fro.native_table_lookup_or_init(table, k, c, i), keys,
                                    categories, keys), r"native table 'bad_cat'.*category", 3, "position 1")
    check.expect_error(lambda: mode(lambda k, c, i: fro.native_table_apply_sparse(table, k, tf.ones([3, 2]), c, i, 0.1),
                                    keys, np.array([0, 1, -1], np.int32), keys),
                       r"native table 'bad_cat'.*category", -1, "position 2")
    assert int(fro.native_table_size(table)) == 0  # nothing inserted by a rejected call


def test_error_mismatched_shapes(fro, mode, check):
    table = fro.NativeTableResource("bad_shape", 2)
    keys = np.array([1, 2, 3], np.int64)
    check.expect_error(lambda: mode(lambda k, c, i: fro.native_table_lookup_or_init(table, k, c, i), keys,
                                    np.zeros(2, np.int32), keys), r"native table 'bad_shape'", 3, 2)
    check.expect_error(lambda: mode(lambda k, v: fro.native_table_upsert(table, k, v), keys,
                                    np.zeros((3, 5), np.float32)), r"native table 'bad_shape'.*\b2\b", 5)
    check.expect_error(lambda: mode(lambda k, g: fro.native_table_apply_sparse(table, k, g, tf.zeros_like(k, tf.int32),
                                                                               k, 0.1),
                                    keys, np.zeros((4, 2), np.float32)), r"native table 'bad_shape'", 3, 4)
    check.expect_error(lambda: mode(lambda k: fro.native_table_find(table, k), keys.reshape(3, 1)),
                       r"native table 'bad_shape'.*rank|vector")


def test_error_access_status_without_tracking(fro, mode):
    table = fro.NativeTableResource("untracked", 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="native table 'untracked'.*track_access"):
        mode(lambda k: tuple(fro.native_table_access_status(table)), np.array([1], np.int64))


def test_error_set_access_status(fro, mode, check):
    """Each bad input is an error naming the table and the value, and a rejected call sets nothing."""
    table = fro.NativeTableResource("set_bad", 2, salts=SALTS, track_access=True)
    fro.native_table_upsert(table, [1, 2, 3], np.zeros((3, 2), np.float32))
    fro.native_table_set_access_status(table, [1], [4], [2], 5)
    before = sorted_status(fro, table)
    keys, ones = np.array([1, 2, 3], np.int64), np.ones(3, np.int64)
    setter = setter_of(fro, table)
    check.expect_error(lambda: mode(setter, np.array([2, 99, 3], np.int64), ones, ones, np.int64(5)),
                       r"native table 'set_bad': key 99 at position 1 is not in the table", 99)
    check.expect_error(lambda: mode(setter, keys, np.array([1, -1, 1], np.int64), ones, np.int64(5)),
                       r"native table 'set_bad': counts must be >= 0", -1, "key 2", "position 1")
    check.expect_error(lambda: mode(setter, keys, ones, np.array([1, 1, 7], np.int64), np.int64(5)),
                       r"native table 'set_bad': last must be in \[0, clock\]", 7, "key 3", "position 2")
    check.expect_error(lambda: mode(setter, keys, ones, np.array([0, -2, 0], np.int64), np.int64(5)),
                       r"native table 'set_bad': last must be in \[0, clock\]", -2)
    check.expect_error(lambda: mode(setter, keys, ones, ones, np.int64(-1)),
                       r"native table 'set_bad': clock must be >= 0", -1)
    check.expect_error(lambda: mode(setter, keys, np.ones(2, np.int64), ones, np.int64(5)),
                       r"native table 'set_bad'.*counts", 3, 2)
    check.expect_error(lambda: mode(setter, keys, ones, np.ones(4, np.int64), np.int64(5)),
                       r"native table 'set_bad'.*last", 3, 4)
    check.expect_error(lambda: mode(setter, keys, ones, ones, np.array([5, 5], np.int64)),
                       r"native table 'set_bad': clock must have rank 0")
    # The kernel checks the shapes too, for graphs built without the wrapper.
    raw = fro.load_ops().fused_rec_native_table_set_access_status
    check.expect_error(lambda: raw(table.resource_handle, keys, ones, ones, [5, 5]),
                       r"native table 'set_bad': clock must be a scalar")
    check.expect_error(lambda: raw(table.resource_handle, keys, ones[:2], ones, 5),
                       r"native table 'set_bad': counts must have one entry per key", 3, 2)
    assert sorted_status(fro, table) == before  # nothing set by a rejected call
    untracked = fro.NativeTableResource("set_untracked", 2)
    fro.native_table_upsert(untracked, [1], np.zeros((1, 2), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="native table 'set_untracked'.*track_access"):
        mode(setter_of(fro, untracked), np.array([1], np.int64), np.array([1], np.int64), np.array([1], np.int64),
             np.int64(1))


def test_error_bad_config_and_part(fro):
    with pytest.raises(ValueError, match="native table 'cfg': optimizer"):
        fro.NativeTableResource("cfg", 2, optimizer="lamb")
    with pytest.raises(ValueError, match="native table 'cfg': .*slot_init"):
        fro.NativeTableResource("cfg", 2, optimizer="adam", slot_init=[0.0])
    with pytest.raises(ValueError, match=r"native table 'cfg': .*slot_init .*initial_accumulator_value.*disagree"):
        fro.NativeTableResource("cfg", 2, optimizer="adagrad", slot_init=[0.5],
                                hyperparameters={"initial_accumulator_value": 0.1})
    # Hyperparameters: Keras 3's names only, with the checks of Keras 3's constructors.
    for optimizer, hyperparameters, message in [
            ("sgd", {"rho": 0.9}, r"optimizer sgd takes the hyperparameters \['momentum', 'nesterov'\].*\['rho'\]"),
            ("adam", {"amsgrad": True}, r"optimizer adam takes .*\['amsgrad'\]"),
            ("sgd", {"momentum": 1.5}, r"sgd momentum must be in \[0, 1\]"),
            ("sgd", {"nesterov": 1}, "sgd nesterov must be a bool"),
            ("rmsprop", {"momentum": -0.1}, "rmsprop momentum must be >= 0"),
            ("rmsprop", {"rho": "0.9"}, "rmsprop rho must be a float"),
            ("adamw", {"epsilon": float("nan")}, "adamw epsilon must be finite"),
            ("ftrl", {"learning_rate_power": 0.5}, "ftrl learning_rate_power must be <= 0"),
            ("ftrl", {"l1_regularization_strength": -1.0}, "ftrl l1_regularization_strength must be >= 0"),
            ("ftrl", {"initial_accumulator_value": -0.1}, "ftrl initial_accumulator_value must be >= 0")]:
        with pytest.raises(ValueError, match=f"native table 'cfg': {message}"):
            fro.NativeTableResource("cfg", 2, optimizer=optimizer, hyperparameters=hyperparameters)
    # The kernel checks too, for graphs built without the wrapper.
    create = fro.load_ops().fused_rec_native_table_create
    for attrs, message in [
            ({"optimizer": "sgd", "momentum": "0.9"}, "has 1 slots.*slot_init must have 1 values"),
            ({"optimizer": "rmsprop", "centered": True, "slot_init": [0.0]}, "has 2 slots"),
            ({"optimizer": "sgd", "momentum": "2.0", "slot_init": [0.0]}, r"momentum must be in \[0, 1\]"),
            ({"optimizer": "ftrl", "slot_init": [-1.0, 0.0]}, "initial_accumulator_value"),
            ({"optimizer": "ftrl", "learning_rate_power": "0.5", "slot_init": [0.1, 0.0]},
             "learning_rate_power must be <= 0"),
            ({"optimizer": "adam", "epsilon": "inf", "slot_init": [0.0, 0.0]}, "epsilon must be finite")]:
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"native table 'cfg': .*{message}"):
            create(table_name="cfg", dim=2, init="hashed", salts=[0], **attrs)
    with pytest.raises(ValueError, match="native table 'cfg': dim"):
        fro.NativeTableResource("cfg", 0)
    with pytest.raises(ValueError, match="native table 'cfg': storage"):
        fro.NativeTableResource("cfg", 2, storage="bfloat16")
    table = fro.NativeTableResource("cfg", 2, optimizer="adagrad")
    with pytest.raises(ValueError, match="native table 'cfg': part"):
        fro.native_table_find(table, [1], part=2)
    with pytest.raises(ValueError, match="native table 'cfg': part"):
        fro.native_table_find(table, [1], part="m")
    # The kernel checks too, for graphs built without the wrapper.
    with pytest.raises(tf.errors.InvalidArgumentError, match="native table 'cfg': part"):
        fro.load_ops().fused_rec_native_table_find(table.resource_handle, [1], part=2)


# ----------------------------------------------------------------------------------------------------------------
# The benchmark harness (tiny sizes; asserts what it writes, never its speed)
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.tfra
def test_bench_harness_writes_three_entries(tmp_path):
    cmd = [sys.executable, "-m", "tf_fusedrec.bench.table", "--out", str(tmp_path), "--dim", "4", "--batches", "3",
           "--batch-size", "300", "--prefill", "2000", "--vocab", "3000", "--warmup", "1", "--repeats", "2"]
    rc, out, err = execute(cmd, timeout=600)
    assert rc == 0, f"{' '.join(cmd)}: exit status {rc}\n{tail(out)}\n{tail(err)}"
    results = json.loads((tmp_path / "table.json").read_text())
    for variant in ("native", "tfra", "floor"):
        assert results[variant]["keys_per_s"] > 0, variant
        assert results[variant]["table_size"] >= 2000, variant
        assert len(results[variant]["runs"]) == 2, variant
    assert results["native"]["table_size"] == results["tfra"]["table_size"] == results["floor"]["table_size"]
    assert results["settings"]["dim"] == 4 and results["settings"]["batches"] == 3
    assert results["settings"]["repeats"] == 2
    assert "| native |" in out


# ----------------------------------------------------------------------------------------------------------------
# Change tracking (what a publish to serving reads)
# ----------------------------------------------------------------------------------------------------------------

def _changes(fro, mode, table):
    """(keys, rows, slots, removed) of native_table_changes in the mode, keys (and their rows) sorted."""
    keys, rows, slots, removed = mode(lambda k: tuple(fro.native_table_changes(table)), np.zeros(1, np.int64))
    order = np.argsort(keys)
    return keys[order], rows[order], slots[order], removed


@pytest.mark.parametrize("storage", ["float32", "float16"])
def test_changes_are_the_keys_written_since_the_last_clear(fro, mode, storage):
    """Against sets kept beside the ops: every key a training lookup inserted, an update or an upsert (rows or a
    slot) wrote since the last clear, with its row and slots as the reference table has them; and the keys removed
    since then that are not held now. Over rounds that grow the table (rehash) and remove keys in clusters (entries
    shift back), so the marks must travel with their entries."""
    rng = np.random.default_rng(17 + len(storage))
    table, want = make_pair(fro, f"changes_{storage}", dim=4, optimizer="adagrad", storage=storage)
    lookup = lambda k, c, i: fro.native_table_lookup_or_init(table, k, c, i)  # noqa: E731
    pool = random_ids(rng, 3000)
    with pytest.raises(tf.errors.FailedPreconditionError, match="changes_.*no changes are tracked yet"):
        fro.native_table_changes(table)
    keys = pool[:200]
    mode(lookup, keys, *feed(keys))
    want.lookup_or_init(keys, *feed(keys))
    mode(lambda k: fro.native_table_clear_changes(table), keys)
    written, removed = set(), set()
    for round_ in range(6):
        # A training step: a lookup that inserts, then an update of most of the keys it read.
        keys = np.unique(rng.choice(pool[:400 + 450 * round_], 300))
        held = set(export_sorted(fro, table)[0].tolist())
        mode(lookup, keys, *feed(keys))
        want.lookup_or_init(keys, *feed(keys))
        written |= set(keys.tolist()) - held  # a lookup writes the keys it inserts only
        removed -= set(keys.tolist())  # held again
        updated = keys[rng.random(len(keys)) < 0.6]
        grads = rng.normal(size=(len(updated), 4)).astype(np.float32)
        fro.native_table_apply_sparse(table, updated, grads, *feed(updated), 0.1)
        want.apply_sparse(updated, grads, *feed(updated), 0.1)
        # An upsert of a slot of some held keys, a removal of others (some of them written this round).
        held = export_sorted(fro, table)[0]
        slot_keys = rng.choice(held, 20, replace=False)
        values = rng.random((20, 4)).astype(np.float32)
        fro.native_table_upsert(table, slot_keys, values, part=1)
        want.upsert(slot_keys, values, part=1)
        gone = np.concatenate([rng.choice(held, 60, replace=False), pool[-5:]])  # pool[-5:]: never held
        fro.native_table_remove(table, gone)
        want.remove(gone)
        written |= set(slot_keys.tolist())
        written |= set(updated.tolist())
        removed |= set(gone[:60].tolist())
        written -= set(gone.tolist())
        if round_ == 3:  # a removed key comes back: it is written, not removed
            back = gone[:3]
            mode(lookup, back, *feed(back))
            want.lookup_or_init(back, *feed(back))
            written |= set(back.tolist())
            removed -= set(back.tolist())
        got_keys, got_rows, got_slots, got_removed = _changes(fro, mode, table)
        np.testing.assert_array_equal(got_keys, sorted(written), err_msg=f"round {round_}")
        np.testing.assert_array_equal(got_removed, sorted(removed), err_msg=f"round {round_}")
        w_keys, w_rows, w_slots = want.export()
        at = np.searchsorted(w_keys, got_keys)
        np.testing.assert_array_equal(got_rows, w_rows[at])
        np.testing.assert_array_equal(got_slots, w_slots[at])
        if round_ % 2 == 1:  # every other round: cleared, the next round starts from nothing
            mode(lambda k: fro.native_table_clear_changes(table), keys)
            written, removed = set(), set()
            got = _changes(fro, mode, table)
            assert len(got[0]) == 0 and len(got[3]) == 0
    assert int(fro.native_table_size(table)) > 800  # the table grew from 64 slots through five rehashes


def test_changes_leave_out_reads_and_report_unchanged_writes(fro):
    """A lookup of held keys (training or not) and a find write nothing; an update with a zero gradient writes its
    key (a superset of the keys whose bits differ, never a subset)."""
    table = fro.NativeTableResource("changes_reads", 3, optimizer="sgd", salts=SALTS)
    keys = np.array([5, 6, 7], np.int64)
    fro.native_table_lookup_or_init(table, keys, *feed(keys))
    fro.native_table_clear_changes(table)
    fro.native_table_lookup_or_init(table, keys, *feed(keys))
    fro.native_table_lookup_or_init(table, np.array([5, 99], np.int64), *feed(np.array([5, 99])), insert=False)
    fro.native_table_find(table, keys)
    got = fro.native_table_changes(table)
    assert got.keys.numpy().size == 0 and got.removed.numpy().size == 0
    assert got.rows.shape == (0, 3) and got.slots.shape == (0, 0, 3)
    fro.native_table_apply_sparse(table, [6], np.zeros((1, 3), np.float32), [0], [6], 0.5)
    got = fro.native_table_changes(table)
    np.testing.assert_array_equal(got.keys.numpy(), [6])
    np.testing.assert_array_equal(got.rows.numpy(), fro.native_table_find(table, [6]).values.numpy())

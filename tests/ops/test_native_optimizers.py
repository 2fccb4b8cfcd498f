"""The native table's optimizers beside SGD, Adagrad and Adam (SGD with momentum and Nesterov, AdamW, FTRL, RMSprop,
plain and centered, with and without momentum) and its random initializers (normal, truncated normal, uniform).

Each optimizer against
* an oracle written here: Keras 3's update_step (keras/src/optimizers/*.py) in NumPy float32, lazy (the rows of the
  step's keys only) and per key, over steps with new keys, repeated keys, zero and large gradients and a learning
  rate that changes every step; bit for bit, eagerly and in a tf.function;
* Keras 3's own optimizer on a dense float32 keras.Variable whose every row is updated every step, run eagerly: bit
  for bit (the one exception, said where it is: FTRL's x^p);
* tf_keras' optimizers where they exist (legacy SGD, Ftrl, RMSprop; the new-style AdamW): bit for bit where the
  formula is Keras 3's, within a stated tolerance where it is not.
The table semantics (float16 storage, stochastic rounding, repeated and distinct keys) with every optimizer are in
tests/ops/test_native_table.py, against tf_fusedrec.ops.reference.
"""

import numpy as np
import pytest
import tensorflow as tf

from tf_fusedrec.initializers import feature_salt, hashed_rows_numpy
from tf_fusedrec.ops import reference as ref_module
from tf_fusedrec.ops.native_table_ops import adam_bias_corrected_lr

SALTS = [feature_salt(3, "user"), feature_salt(3, "item")]
f32 = np.float32

# name -> (optimizer, hyperparameters): the settings each comparison runs, Keras 3's names.
CASES = {
    "sgd_momentum_0": ("sgd", {"momentum": 0.0}),
    "momentum": ("sgd", {"momentum": 0.9}),
    "nesterov": ("sgd", {"momentum": 0.9, "nesterov": True}),
    "adamw": ("adamw", {}),
    "adamw_decay": ("adamw", {"weight_decay": 0.1, "beta_1": 0.8, "beta_2": 0.99, "epsilon": 1e-5}),
    "ftrl": ("ftrl", {}),
    "ftrl_regularized": ("ftrl", {"l1_regularization_strength": 0.01, "l2_regularization_strength": 0.1,
                                  "l2_shrinkage_regularization_strength": 0.05, "beta": 0.5,
                                  "initial_accumulator_value": 0.2}),
    "ftrl_power_0": ("ftrl", {"learning_rate_power": 0.0, "l1_regularization_strength": 0.001}),
    "ftrl_power": ("ftrl", {"learning_rate_power": -0.3, "l2_regularization_strength": 0.01}),
    "rmsprop": ("rmsprop", {}),
    "rmsprop_momentum": ("rmsprop", {"momentum": 0.9}),
    "rmsprop_centered": ("rmsprop", {"centered": True, "rho": 0.8}),
    "rmsprop_centered_momentum": ("rmsprop", {"centered": True, "momentum": 0.5, "epsilon": 1e-4}),
}

# Each native slot as Keras 3 names it (Keras 2's names are the native ones).
KERAS3_SLOT = {"momentum": "momentum", "m": "momentum", "v": "velocity", "accumulator": "accumulator",
               "linear": "linear", "rms": "velocity", "mg": "average_gradient"}


def inexact_power(case):
    """FTRL's x^p for p other than 0.5 and 0: the kernel's std::pow (powf), NumPy's float32 power and TensorFlow's
    vectorised pow are each within an ulp or so of x^p but not always the same float (x^0.5 is sqrt everywhere, x^0
    is 1). The linear slot takes the difference n'^p - n^p divided by lr, which turns an ulp of n'^p into about 1e-5
    of the slot where a large gradient made n' large: such cases compare to 1e-4 (relative)."""
    optimizer, hyper = CASES[case]
    return optimizer == "ftrl" and hyper.get("learning_rate_power", -0.5) not in (-0.5, 0.0)


def keras3():
    keras = pytest.importorskip("keras")
    if not keras.__version__.startswith("3."):
        pytest.skip(f"Keras 3 is not importable (keras {keras.__version__})")
    return keras


# ----------------------------------------------------------------------------------------------------------------
# The oracle: Keras 3's update_step in NumPy float32
# ----------------------------------------------------------------------------------------------------------------

def keras3_hyper(optimizer, hyper):
    """The hyperparameters with Keras 3's defaults (its constructors' signatures, keras/src/optimizers/*.py)."""
    defaults = {
        "sgd": {"momentum": 0.0, "nesterov": False},
        "adamw": {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7, "weight_decay": 0.004},
        "ftrl": {"learning_rate_power": -0.5, "initial_accumulator_value": 0.1, "l1_regularization_strength": 0.0,
                 "l2_regularization_strength": 0.0, "l2_shrinkage_regularization_strength": 0.0, "beta": 0.0},
        "rmsprop": {"rho": 0.9, "momentum": 0.0, "epsilon": 1e-7, "centered": False},
    }[optimizer]
    return {**defaults, **hyper}


def keras3_slots(optimizer, h, dim):
    """Keras 3's optimizer variables of one row, at their initial values: {Keras 3 slot name: float32 [dim]}."""
    zeros = lambda: np.zeros(dim, f32)  # noqa: E731
    if optimizer == "sgd":
        return {"momentum": zeros()} if h["momentum"] != 0 else {}
    if optimizer == "adamw":
        return {"momentum": zeros(), "velocity": zeros()}
    if optimizer == "ftrl":
        return {"accumulator": np.full(dim, h["initial_accumulator_value"], f32), "linear": zeros()}
    slots = {"velocity": zeros()}
    if h["momentum"] > 0:
        slots["momentum"] = zeros()
    if h["centered"]:
        slots["average_gradient"] = zeros()
    return slots


def keras3_step(optimizer, h, w, s, g, lr, adam_lr):
    """Keras 3's update of one row w with gradient g (float32 [dim]), slots s updated in place; -> the new row.

    Python floats become float32 where Keras' ops meet a float32 tensor, after any Python arithmetic on them (1 - rho
    in float64). adam_lr: Keras' alpha, lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) in TensorFlow's float32 (tf.pow:
    NumPy's float32 power rounds differently)."""
    if optimizer == "sgd":  # keras/src/optimizers/sgd.py
        if h["momentum"] == 0:
            return w - g * lr
        momentum = f32(h["momentum"])
        s["momentum"] = s["momentum"] * momentum - g * lr
        if h["nesterov"]:
            return w + (s["momentum"] * momentum - g * lr)
        return w + s["momentum"]
    if optimizer == "adamw":  # base_optimizer._apply_weight_decay (TF backend), then adam.py's update_step
        w = w - w * f32(h["weight_decay"]) * lr
        m, v = s["momentum"], s["velocity"]
        s["momentum"] = m + (g - m) * f32(1 - h["beta_1"])
        s["velocity"] = v + (np.square(g) - v) * f32(1 - h["beta_2"])
        return w - (s["momentum"] * adam_lr) / (np.sqrt(s["velocity"]) + f32(h["epsilon"]))
    if optimizer == "ftrl":  # keras/src/optimizers/ftrl.py
        power = -h["learning_rate_power"]
        pow_ = np.sqrt if power == 0.5 else (lambda x: np.power(x, f32(power)))
        l2_reg = f32(h["l2_regularization_strength"]) + f32(h["beta"]) / (f32(2.0) * lr)
        accum, linear = s["accumulator"], s["linear"]
        grad_to_use = g + f32(2 * h["l2_shrinkage_regularization_strength"]) * w
        new_accum = accum + np.square(g)
        linear = linear + (grad_to_use - ((pow_(new_accum) - pow_(accum)) / lr) * w)
        quadratic = pow_(new_accum) / lr + f32(2) * l2_reg
        l1 = f32(h["l1_regularization_strength"])
        linear_clipped = np.maximum(np.minimum(linear, l1), -l1)  # tf.clip_by_value
        s["linear"], s["accumulator"] = linear, new_accum
        return (linear_clipped - linear) / quadratic
    # keras/src/optimizers/rmsprop.py
    rho = h["rho"]
    s["velocity"] = f32(rho) * s["velocity"] + f32(1 - rho) * np.square(g)
    if h["centered"]:
        s["average_gradient"] = f32(rho) * s["average_gradient"] + f32(1 - rho) * g
        denominator = s["velocity"] - np.square(s["average_gradient"]) + f32(h["epsilon"])
    else:
        denominator = s["velocity"] + f32(h["epsilon"])
    increment = (lr * g) / np.sqrt(denominator)
    if h["momentum"] > 0:
        s["momentum"] = f32(h["momentum"]) * s["momentum"] + increment
        return w - s["momentum"]
    return w - increment


class Oracle:
    """Keras 3's optimizer applied lazily to the rows of each step's keys, one key at a time: a key's first row is its
    Hashed row (the table's default initializer), its slots Keras 3's initial values; repeated keys' gradients are
    summed in input order first."""

    def __init__(self, optimizer, hyper, dim):
        self.optimizer, self.h, self.dim = optimizer, keras3_hyper(optimizer, hyper), dim
        self.rows, self.slots = {}, {}

    def apply(self, keys, grads, categories, lr, update_count):
        adam_lr = None
        if self.optimizer == "adamw":
            adam_lr = adam_bias_corrected_lr(lr, self.h["beta_1"], self.h["beta_2"], update_count).numpy()
        summed = {}
        for i, k in enumerate(keys.tolist()):
            if k not in self.rows:
                salt = np.array([SALTS[categories[i]]], np.int64)
                self.rows[k] = hashed_rows_numpy(np.array([k], np.int64), salt, self.dim, 0.05)[0]
                self.slots[k] = keras3_slots(self.optimizer, self.h, self.dim)
            summed[k] = summed.get(k, np.zeros(self.dim, f32)) + grads[i]
        for k, g in summed.items():
            self.rows[k] = keras3_step(self.optimizer, self.h, self.rows[k], self.slots[k], g, f32(lr), adam_lr)


def steps_of(rng, num_steps, dim):
    """(keys, grads, lr) per step: keys from a pool that grows (new keys keep arriving) with repeats; a few zero and
    large gradients; a learning rate that decays each step."""
    pool = rng.choice(2**40, 60, replace=False).astype(np.int64) - 2**39
    for step in range(num_steps):
        keys = rng.choice(pool[:20 + 5 * step], 30)
        grads = rng.normal(0, 1, (keys.size, dim)).astype(f32)
        grads[rng.random(keys.size) < 0.15] = 0.0
        grads[rng.random(keys.size) < 0.1] *= f32(1e6)
        yield keys, grads, f32(0.05 * 0.9**step)


def categories_of(keys):
    return (np.abs(keys) % len(SALTS)).astype(np.int32)


def assert_rows_and_slots(fro, table, keys, rows, slots, what, exact=True):
    """The table's rows and slots of keys against rows {key: [dim]} and slots {key: {Keras 3 name: [dim]}}."""
    check = np.testing.assert_array_equal if exact else (
        lambda got, want, err_msg: np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=err_msg))
    check(fro.native_table_find(table, keys).values.numpy(), np.stack([rows[k] for k in keys.tolist()]),
          err_msg=f"{what}: rows")
    for name in table.slot_names:
        got = fro.native_table_find(table, keys, part=name).values.numpy()
        check(got, np.stack([slots[k][KERAS3_SLOT[name]] for k in keys.tolist()]), err_msg=f"{what}: slot {name}")


@pytest.mark.parametrize("case", list(CASES))
def test_matches_the_keras3_oracle(fro, run, case):
    """8 steps of apply_sparse (which inserts the keys it has not seen) on repeated keys, new keys, zero and large
    gradients and a changing learning rate: the table's rows and slots are the oracle's bit for bit, eagerly and in
    a tf.function; with an FTRL power other than 0.5 and 0, to 1e-4 (inexact_power)."""
    optimizer, hyper = CASES[case]
    dim = 6
    table = fro.NativeTableResource(f"oracle_{case}_{run.mode}", dim, optimizer=optimizer, hyperparameters=hyper,
                                    salts=SALTS)
    oracle = Oracle(optimizer, hyper, dim)
    assert [KERAS3_SLOT[n] for n in table.slot_names] == list(keras3_slots(optimizer, oracle.h, dim))
    rng = np.random.default_rng(len(case))
    for step, (keys, grads, lr) in enumerate(steps_of(rng, 8, dim)):
        categories = categories_of(keys)

        def update(k, g, c, n, lr=lr):
            op = fro.native_table_apply_sparse(table, k, g, c, k, lr, update_count=n)
            with tf.control_dependencies([] if op is None else [op]):
                return fro.native_table_size(table)

        run(update, keys, grads, categories, np.int64(step + 1))
        oracle.apply(keys, grads, categories, lr, step + 1)
        held = np.array(sorted(oracle.rows), np.int64)
        assert int(fro.native_table_size(table)) == held.size
        assert_rows_and_slots(fro, table, held, oracle.rows, oracle.slots, f"{case} step {step}",
                              exact=not inexact_power(case))


# ----------------------------------------------------------------------------------------------------------------
# Keras 3 and tf_keras on a dense variable
# ----------------------------------------------------------------------------------------------------------------

def keras3_optimizer(keras, optimizer, hyper, lr):
    classes = {"sgd": keras.optimizers.SGD, "adamw": keras.optimizers.AdamW, "ftrl": keras.optimizers.Ftrl,
               "rmsprop": keras.optimizers.RMSprop, "adam": keras.optimizers.Adam,
               "adagrad": keras.optimizers.Adagrad}
    return classes[optimizer](learning_rate=lr, **hyper)


def dense_steps(rng, num_steps, num_keys, dim):
    """Gradients of every key each step, among them a zero row and a large one."""
    for _ in range(num_steps):
        grads = rng.normal(0, 1, (num_keys, dim)).astype(f32)
        grads[0] = 0.0
        grads[1] *= f32(1e6)
        yield grads


def train_dense_and_table(fro, case, train_dense, num_steps=10, num_keys=12, dim=5, lr=0.05):
    """Trains `num_keys` keys of a native table with the optimizer (optimizer, hyperparameters) of `case` (a CASES
    name or the pair itself) and, with train_dense(initial rows) -> step(grads) -> (rows, {native slot name: values}),
    a dense model of them, every key updated every step; yields (step, table rows, table slots, dense rows, dense
    slots)."""
    optimizer, hyper = CASES[case] if isinstance(case, str) else case
    table = fro.NativeTableResource(f"dense_{optimizer}_{len(hyper)}", dim, optimizer=optimizer,
                                    hyperparameters=hyper, salts=SALTS)
    keys = np.arange(num_keys, dtype=np.int64) * 1_000_003 - 5
    categories = categories_of(keys)
    initial = fro.native_table_lookup_or_init(table, keys, categories, keys).numpy()
    step_dense = train_dense(initial)
    rng = np.random.default_rng(5)
    for step, grads in enumerate(dense_steps(rng, num_steps, num_keys, dim)):
        fro.native_table_apply_sparse(table, keys, grads, categories, keys, lr, update_count=step + 1)
        rows, slots = step_dense(grads)
        got_slots = {n: fro.native_table_find(table, keys, part=n).values.numpy() for n in table.slot_names}
        assert sorted(slots) == sorted(got_slots), (sorted(slots), sorted(got_slots))
        yield step, fro.native_table_find(table, keys).values.numpy(), got_slots, rows, slots


def keras3_dense(case, lr=0.05, in_function=False):
    """train_dense for train_dense_and_table: Keras 3's optimizer of the case (as there) on a keras.Variable, run
    eagerly (or its apply in a tf.function)."""
    keras = keras3()
    optimizer, hyper = CASES[case] if isinstance(case, str) else case

    def keras3_run(initial):
        var = keras.Variable(initial, name="w")
        opt = keras3_optimizer(keras, optimizer, hyper, lr)
        opt.build([var])
        by_name = {v.path.split("/")[-1]: v for v in opt.variables}
        apply = (lambda g: opt.apply([g], [var]))
        apply = tf.function(apply) if in_function else apply

        def step(grads):
            apply(tf.constant(grads))
            slots = {n: by_name[f"w_{KERAS3_SLOT[n]}"].numpy() for n in native_slot_names(optimizer, hyper)}
            return var.numpy(), slots
        return step
    return keras3_run


def native_slot_names(optimizer, hyper):
    from tf_fusedrec.ops.native_table_ops import slot_names  # noqa: PLC0415

    return slot_names(optimizer, hyper)


@pytest.mark.parametrize("case", [c for c in CASES if not inexact_power(c)])
def test_matches_keras3_on_a_dense_variable(fro, case):
    """Keras 3's optimizer on a dense variable of the keys' rows, eagerly, every row updated every step: rows and
    slots bit for bit. FTRL runs Keras 3 in a tf.function, where Grappler makes its pow(x, 0.5) the square root the
    table takes: eagerly TensorFlow's vectorised pow(x, 0.5) differs from sqrt(x) in the last bit for about one x in
    twenty (test_keras3_ftrl_eagerly_within_an_ulp)."""
    in_function = CASES[case][0] == "ftrl"
    for step, rows, slots, want_rows, want_slots in train_dense_and_table(fro, case, keras3_dense(
            case, in_function=in_function)):
        np.testing.assert_array_equal(rows, want_rows, err_msg=f"{case} step {step}: rows")
        for n in slots:
            np.testing.assert_array_equal(slots[n], want_slots[n], err_msg=f"{case} step {step}: slot {n}")


@pytest.mark.parametrize("case", ["ftrl", "ftrl_regularized", "ftrl_power"])
def test_keras3_ftrl_eagerly_within_an_ulp(fro, case):
    """Keras 3's Ftrl run eagerly takes x^p with TensorFlow's vectorised pow, which is within an ulp or so of the
    table's sqrt (p = 0.5) or powf; the rows and slots stay within 1e-4 (relative, inexact_power) over 10 steps."""
    for step, rows, slots, want_rows, want_slots in train_dense_and_table(fro, case, keras3_dense(case)):
        np.testing.assert_allclose(rows, want_rows, rtol=1e-4, atol=1e-7, err_msg=f"{case} step {step}: rows")
        for n in slots:
            np.testing.assert_allclose(slots[n], want_slots[n], rtol=1e-4, atol=1e-7, err_msg=f"{case} step {step}")


def tf_keras_dense(case, lr=0.05):
    """train_dense for train_dense_and_table: tf_keras' optimizer of the case (legacy SGD, Ftrl, RMSprop; the
    new-style AdamW, without XLA) on a tf.Variable, eagerly."""
    optimizer, hyper = CASES[case]
    legacy = tf.keras.optimizers.legacy  # tf.keras is tf_keras where TFRA is installed (tests/conftest.py)

    def tf_keras_run(initial):
        var = tf.Variable(initial)
        if optimizer == "adamw":
            opt = tf.keras.optimizers.AdamW(learning_rate=lr, jit_compile=False, **hyper)
        else:
            opt = {"sgd": legacy.SGD, "ftrl": legacy.Ftrl, "rmsprop": legacy.RMSprop}[optimizer](lr, **hyper)

        def step(grads):
            opt.apply_gradients([(tf.constant(grads), var)])
            if optimizer == "adamw":
                slots = {"m": opt._momentums[0].numpy(), "v": opt._velocities[0].numpy()}  # noqa: SLF001
            else:
                slots = {n: opt.get_slot(var, n).numpy() for n in native_slot_names(optimizer, hyper)}
            return var.numpy(), slots
        return step
    return tf_keras_run


# The cases whose tf_keras optimizer computes Keras 3's formula: SGD with momentum (ResourceApplyKerasMomentum), FTRL
# with power 0.5 or 0 (ResourceApplyFtrl(V2): sqrt, pow(x, 0) = 1), AdamW (tf_keras' new-style AdamW).
TF_KERAS_EXACT = ["sgd_momentum_0", "momentum", "nesterov", "ftrl", "ftrl_regularized", "ftrl_power_0", "adamw",
                  "adamw_decay"]


@pytest.mark.tfra  # tf_keras (Keras 2), which the [tfra] extra brings
@pytest.mark.parametrize("case", TF_KERAS_EXACT)
def test_matches_tf_keras_where_the_formula_is_keras3s(fro, case):
    """tf_keras' optimizer (what the TFRA backend runs) on a dense variable, eagerly: rows and slots bit for bit, so
    the native and the TFRA backend train alike with these optimizers."""
    for step, rows, slots, want_rows, want_slots in train_dense_and_table(fro, case, tf_keras_dense(case)):
        np.testing.assert_array_equal(rows, want_rows, err_msg=f"{case} step {step}: rows")
        for n in slots:
            np.testing.assert_array_equal(slots[n], want_slots[n], err_msg=f"{case} step {step}: slot {n}")


@pytest.mark.tfra  # tf_keras (Keras 2), which the [tfra] extra brings
@pytest.mark.parametrize("case", ["rmsprop", "rmsprop_momentum", "rmsprop_centered", "rmsprop_centered_momentum"])
def test_rmsprop_differs_from_tf_keras_legacy_by_little(fro, case):
    """tf_keras' legacy RMSprop (the TFRA backend's) is not Keras 3's: it takes 1 - rho in float32 (0.100000024 for
    0.9, against Keras 3's 0.1), runs TF's kernel order with momentum (v += (g * g - v) * (1 - rho)), and without
    momentum puts epsilon outside the root, lr * g / (sqrt(v) + epsilon) against Keras 3's lr * g / sqrt(v + epsilon):
    a step then differs by about epsilon / (2 v) relative, 0.5% for the smallest gradients of dense_steps (|g| ~ 0.01,
    v ~ 1e-5). Hence the tolerances: rows to 5e-4 (absolute, rows of size 0.1 to 1 after 10 steps of lr 0.05), slots
    to 1e-4 relative. With momentum the rows agree to 1e-6."""
    row_atol = 1e-6 if CASES[case][1].get("momentum", 0) > 0 else 5e-4
    for step, rows, slots, want_rows, want_slots in train_dense_and_table(fro, case, tf_keras_dense(case)):
        np.testing.assert_allclose(rows, want_rows, rtol=0, atol=row_atol, err_msg=f"{case} step {step}: rows")
        for n in slots:
            np.testing.assert_allclose(slots[n], want_slots[n], rtol=1e-4, atol=1e-6, err_msg=f"{case} step {step}")


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_adagrad_and_adam_are_tf_kernels_near_keras3(fro, optimizer):
    """The native Adagrad and Adam stay TF's kernels (Keras 2's, the TFRA backend's: tests/ops/test_native_table.py
    checks them bit for bit); Keras 3's differ by little: its Adagrad takes epsilon inside the root
    (lr * g / sqrt(acc + epsilon)), its Adam takes 1 - beta in float64 (1 - beta_2: 0.001 against TF's
    0.00099998713, 1.3e-5 relative in v). Over 10 steps: rows to 1e-5 relative, slots to 5e-5."""
    case = (optimizer, {})
    for step, rows, slots, want_rows, want_slots in train_dense_and_table(fro, case, keras3_dense(case)):
        np.testing.assert_allclose(rows, want_rows, rtol=1e-5, atol=1e-6, err_msg=f"{optimizer} step {step}: rows")
        for n in slots:
            np.testing.assert_allclose(slots[n], want_slots[n], rtol=5e-5, atol=1e-6, err_msg=f"step {step} {n}")


# ----------------------------------------------------------------------------------------------------------------
# Random initializers
# ----------------------------------------------------------------------------------------------------------------

RANDOM_INITS = {
    "normal": {"init": "normal", "seed": 7, "mean": 0.5, "stddev": 0.2},
    "truncated_normal": {"init": "truncated_normal", "seed": 7, "mean": -0.25, "stddev": 0.1},
    "uniform": {"init": "uniform", "seed": 7, "minval": -0.3, "maxval": 0.7},
}


@pytest.mark.parametrize("init", list(RANDOM_INITS))
def test_random_rows_are_a_function_of_seed_category_and_id(fro, run, init):
    """A key's first row does not depend on the order or the batching of the keys, nor on which of two workers (two
    tables, keys split by owner) inserts it: it is the reference's row of (seed, category salt, id). Another seed or
    category gives other rows."""
    args = RANDOM_INITS[init]
    rng = np.random.default_rng(2)
    ids = rng.choice(2**40, 600, replace=False).astype(np.int64)
    categories = rng.integers(0, len(SALTS), ids.size).astype(np.int32)
    keys = ids * 2 + categories  # distinct keys for (category, id)
    want = ref_module.native_table_initial_rows(ids=ids, salts=np.array(SALTS, np.int64)[categories], dim=8,
                                                **args)
    lookup = lambda t: lambda k, c, i: fro.native_table_lookup_or_init(t, k, c, i)  # noqa: E731

    one = fro.NativeTableResource(f"one_{init}_{run.mode}", 8, salts=SALTS, **args)
    for part in np.array_split(np.arange(ids.size), 7):  # batches in key order
        run(lookup(one), keys[part], categories[part], ids[part])
    workers = [fro.NativeTableResource(f"worker{r}_{init}_{run.mode}", 8, salts=SALTS, **args) for r in range(2)]
    order = rng.permutation(ids.size)  # another order and batching, split over two tables by owner
    owner = ref_module.owner_of(ids, 2)
    for r, table in enumerate(workers):
        mine = order[owner[order] == r]
        for part in np.array_split(mine, 3):
            run(lookup(table), keys[part], categories[part], ids[part])

    np.testing.assert_array_equal(fro.native_table_find(one, keys).values.numpy(), want)
    for r, table in enumerate(workers):
        values, exists = fro.native_table_find(table, keys)
        np.testing.assert_array_equal(exists.numpy(), owner == r)
        np.testing.assert_array_equal(values.numpy()[owner == r], want[owner == r])
    other_seed = ref_module.native_table_initial_rows(ids=ids, salts=np.array(SALTS, np.int64)[categories], dim=8,
                                                      **{**args, "seed": 8})
    other_category = ref_module.native_table_initial_rows(ids=ids, salts=np.array(SALTS, np.int64)[1 - categories],
                                                          dim=8, **args)
    assert not np.any(np.all(other_seed == want, axis=1)) and not np.any(np.all(other_category == want, axis=1))


def test_random_rows_have_keras_distributions(fro):
    """200 000 values each: normal has its mean and stddev (to 0.005 and 1%); truncated normal lies within 2 stddev
    of the mean (TF's and Keras' truncation) with the truncated stddev 0.8796 stddev; uniform lies in [minval,
    maxval) (float32 bounds) with the mean in the middle."""
    ids = np.arange(25_000, dtype=np.int64)
    categories = (ids % 2).astype(np.int32)
    rows = {}
    for init, args in RANDOM_INITS.items():
        table = fro.NativeTableResource(f"moments_{init}", 8, salts=SALTS, **args)
        rows[init] = fro.native_table_lookup_or_init(table, ids, categories, ids).numpy()
    normal, args = rows["normal"], RANDOM_INITS["normal"]
    assert abs(normal.mean() - args["mean"]) < 0.005 and abs(normal.std() / args["stddev"] - 1) < 0.01
    trunc, args = rows["truncated_normal"], RANDOM_INITS["truncated_normal"]
    deviation = np.abs(trunc.astype(np.float64) - args["mean"])
    assert deviation.max() <= 2 * args["stddev"] * (1 + 1e-6)
    assert abs(trunc.mean() - args["mean"]) < 0.005 and abs(trunc.std() / (args["stddev"] * 0.8796) - 1) < 0.01
    uniform, args = rows["uniform"], RANDOM_INITS["uniform"]
    assert uniform.min() >= f32(args["minval"]) and uniform.max() < f32(args["maxval"])
    assert abs(uniform.mean() - (args["minval"] + args["maxval"]) / 2) < 0.005


def test_uniform_rows_stay_below_maxval(fro):
    """A float64 draw that rounds up to float32(maxval) takes the float below it (Keras' [minval, maxval)): a range
    of one float32 step, [1, 1 + 2^-23), holds 1 only, so every draw above 1 + 2^-24 would round up to the bound."""
    table = fro.NativeTableResource("uniform_edge", 16, salts=SALTS, init="uniform", seed=1, minval=1.0,
                                    maxval=1.0 + 2.0**-23)
    ids = np.arange(2000, dtype=np.int64)
    rows = fro.native_table_lookup_or_init(table, ids, np.zeros(ids.size, np.int32), ids).numpy()
    np.testing.assert_array_equal(rows, np.ones_like(rows))
    want = ref_module.native_table_initial_rows("uniform", ids, np.full(ids.size, SALTS[0], np.int64), 16, seed=1,
                                                minval=1.0, maxval=1.0 + 2.0**-23)
    np.testing.assert_array_equal(rows, want)

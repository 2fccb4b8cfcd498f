"""native_table: an embedding table as one TF resource with C++ CPU kernels (cc/kernels/native_table_op.cc).

A training step costs one hash probe per key for the lookup (a missing key is initialised and inserted in the same
probe) and one for the optimizer update, applied in place to the row and the slots stored beside it. TFRA's cuckoo
table costs two finds and two upserts per key for the same step (rows and slots are separate tables).

    table = NativeTableResource("user_id", dim=16, optimizer="adagrad", salts=[feature_salt(0, "user_id")])
    rows = native_table_lookup_or_init(table, keys, categories, ids)
    ...
    native_table_apply_sparse(table, keys, grads, categories, ids, lr=0.05)

Semantics worth knowing:

* The optimizer (sgd, adagrad, adam, adamw, ftrl, rmsprop) and its hyperparameters other than the learning rate are
  fixed when the table is created (Keras 3's names and defaults: HYPERPARAMETERS); the learning rate, and for adam
  and adamw the update count, come with each update. native_table_apply_sparse has the update formulas.

* Initial rows are a function of (category salt, id) only: ``init="hashed"`` gives exactly
  ``tf_fusedrec.initializers.Hashed(seed, stddev).rows(ids, salts[categories], dim)``; "normal", "uniform" and
  "truncated_normal" draw from a per-(seed, salt, id) stream (TFRA's distributions, not TFRA's values);
  "constant" fills ``value``.
* ``storage="float16"`` keeps rows as float16 (slots stay float32): a read converts to float32, an update computes
  the new row in float32 and rounds it to float16 once: to the nearest, or with ``rounding="stochastic"`` up or
  down at random with the probabilities that make the rounding unbiased (tf_fusedrec.ops.reference.stochastic_float16
  defines the bits), the random bits a function of (salts[0], key, the update_count given to apply_sparse, column).
  Upserts and the initial rows of new keys are rounded to the nearest.
* ``track_access=True`` keeps per key an access count and the clock of its last training lookup; the table's clock
  advances once per ``native_table_lookup_or_init(..., insert=True)`` call, and every key of that call (every
  occurrence, if a key repeats) adds 1 to its count. Keys inserted by upsert or apply_sparse start at count 0,
  last 0.
* Every table tracks its changes: ``native_table_changes`` gives the keys a training lookup inserted or an update or
  upsert wrote since the last ``native_table_clear_changes`` (with their rows and slots), and the keys removed since
  then that are not held now. Removals are logged only once clear_changes was called (so a table nobody publishes
  keeps no log); a publish to serving reads these instead of the whole table.
* ``tier_path`` and ``tier_dram_bytes`` make a tiered table: at most tier_dram_bytes of entries (keys, rows, slots,
  access stats) in DRAM, the others in a RocksDB store in the directory tier_path (created empty, removed with the
  table; RocksDB's shared library is loaded then). Every op gives what the all-DRAM table gives: a training call
  first reads its keys held on disk into DRAM (one batched read), evicting the least recently used rows (one batched
  write), and updates in place. ``native_table_tier_stats`` reports the tiers' rows and traffic.
"""

import collections
import dataclasses
import uuid

import numpy as np
import tensorflow as tf

from tf_fusedrec.ops._loader import load_ops

# The hyperparameters of each optimizer other than the learning rate, with Keras 3's names and defaults
# (keras/src/optimizers/*.py): static per table. initial_accumulator_value is the accumulator slot's initial value.
HYPERPARAMETERS = {
    "sgd": {"momentum": 0.0, "nesterov": False},
    "adagrad": {"initial_accumulator_value": 0.1, "epsilon": 1e-7},
    "adam": {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7},
    "adamw": {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7, "weight_decay": 0.004},
    "ftrl": {"learning_rate_power": -0.5, "initial_accumulator_value": 0.1, "l1_regularization_strength": 0.0,
             "l2_regularization_strength": 0.0, "l2_shrinkage_regularization_strength": 0.0, "beta": 0.0},
    "rmsprop": {"rho": 0.9, "momentum": 0.0, "epsilon": 1e-7, "centered": False},
}
_BOOLEAN_HYPERPARAMETERS = ("nesterov", "centered")
# Every slot an optimizer may keep, in slot order; a table keeps those its hyperparameters ask for (slot_names: sgd's
# momentum with momentum > 0 only, rmsprop's momentum with momentum > 0 and mg when centered), and part p of
# find/upsert is the p-th of those. TFRA's and Keras 2's names, so checkpoints match slots by name.
SLOT_NAMES = {"sgd": ("momentum",), "adagrad": ("accumulator",), "adam": ("m", "v"), "adamw": ("m", "v"),
              "ftrl": ("accumulator", "linear"), "rmsprop": ("rms", "momentum", "mg")}
STORAGES = ("float32", "float16")
ROUNDINGS = ("nearest", "stochastic")
INITS = ("hashed", "constant", "normal", "uniform", "truncated_normal")
# Initial slot values (of SLOT_NAMES) when none are given: an accumulator starts at the initial_accumulator_value
# hyperparameter (Keras' default, 0.1, here), every other slot at zero.
DEFAULT_SLOT_INIT = {"sgd": (0.0,), "adagrad": (0.1,), "adam": (0.0, 0.0), "adamw": (0.0, 0.0), "ftrl": (0.1, 0.0),
                     "rmsprop": (0.0, 0.0, 0.0)}


def slot_names(optimizer, hyperparameters=None):
    """The slots a table of `optimizer` keeps with `hyperparameters` (a dict; missing ones at their defaults)."""
    hyper = {**HYPERPARAMETERS[optimizer], **(hyperparameters or {})}
    keep = {"momentum": hyper.get("momentum", 0.0) > 0, "mg": bool(hyper.get("centered", False))}
    return tuple(n for n in SLOT_NAMES[optimizer] if keep.get(n, True))


def check_hyperparameters(optimizer, given, fail):
    """`given` (a dict or (name, value) pairs) with the optimizer's defaults filled in, as a dict of floats and bools;
    fail(message) for an unknown name, a bad type, or a value Keras 3 refuses."""
    given = dict(given or {})
    known = HYPERPARAMETERS[optimizer]
    unknown = sorted(set(given) - set(known))
    if unknown:
        fail(f"optimizer {optimizer} takes the hyperparameters {sorted(known)} (the learning rate comes with each "
             f"update), got also {unknown}")
    out = {}
    for key, default in known.items():
        value = given.get(key, default)
        if key in _BOOLEAN_HYPERPARAMETERS:
            if not isinstance(value, (bool, np.bool_)):
                fail(f"{optimizer} {key} must be a bool, got {value!r}")
            out[key] = bool(value)
            continue
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            fail(f"{optimizer} {key} must be a float, got {value!r}")
        if not np.isfinite(value):
            fail(f"{optimizer} {key} must be finite, got {value!r}")
        out[key] = float(value)
    # The checks of Keras 3's constructors (Keras 2's for Adagrad's accumulator).
    if optimizer == "sgd" and not 0.0 <= out["momentum"] <= 1.0:
        fail(f"sgd momentum must be in [0, 1], got {out['momentum']}")
    if optimizer == "rmsprop" and out["momentum"] < 0:
        fail(f"rmsprop momentum must be >= 0, got {out['momentum']}")
    if out.get("initial_accumulator_value", 0.0) < 0:
        fail(f"{optimizer} initial_accumulator_value must be >= 0, got {out['initial_accumulator_value']}")
    if optimizer == "ftrl":
        if out["learning_rate_power"] > 0:
            fail(f"ftrl learning_rate_power must be <= 0, got {out['learning_rate_power']}")
        negative = sorted(k for k in out if k.endswith("_strength") and out[k] < 0)
        if negative:
            fail(f"ftrl {', '.join(negative)} must be >= 0, got {[out[k] for k in negative]}")
    return out

NativeTableFindResult = collections.namedtuple("NativeTableFindResult", ["values", "exists"])
NativeTableExportResult = collections.namedtuple("NativeTableExportResult", ["keys", "rows", "slots"])
NativeTableAccessStatus = collections.namedtuple("NativeTableAccessStatus", ["keys", "counts", "last", "clock"])
NativeTableExportChunk = collections.namedtuple("NativeTableExportChunk",
                                                ["keys", "rows", "slots", "counts", "last", "next", "clock"])
EXPORT_START, EXPORT_DONE = (0, 0), (3, 0)  # native_table_export_chunk's first cursor, and its next after the last


@dataclasses.dataclass(frozen=True)
class NativeTableConfig:
    """The settings of one native table, checked on construction (ValueError naming the table).

    Attributes:
      name: the table's name, in every error message.
      dim: row width, >= 1.
      optimizer: "sgd" | "adagrad" | "adam" | "adamw" | "ftrl" | "rmsprop"; with the hyperparameters decides the
        slots (slot_names).
      slot_init: initial value of each slot of a new key; None: DEFAULT_SLOT_INIT's, an accumulator's at the
        initial_accumulator_value hyperparameter.
      storage: "float32" | "float16" rows.
      init: "hashed" | "constant" | "normal" | "uniform" | "truncated_normal".
      seed: seed of the random initializers (the hashed one takes its seed through the salts).
      mean, stddev, minval, maxval, value: initializer parameters (float64).
      salts: int64 salt of each category, e.g. initializers.feature_salt(seed, feature).
      track_access: keep per key access counts and last access clock.
      rounding: "nearest" | "stochastic": how an update's row is rounded to float16 (float16 storage only).
      hyperparameters: the optimizer's hyperparameters other than the learning rate (a dict or (name, value) pairs,
        Keras 3's names: HYPERPARAMETERS); missing ones take Keras 3's defaults. Held as sorted (name, value) pairs of
        every one of the optimizer's hyperparameters.
      tier_path: "" (all rows in DRAM) or the directory of a tiered table's on-disk store (one per table).
      tier_dram_bytes: a tiered table's DRAM budget for its entries, > 0 (with tier_path only).
    """

    name: str
    dim: int
    optimizer: str = "sgd"
    slot_init: tuple = None
    storage: str = "float32"
    init: str = "hashed"
    seed: int = 0
    mean: float = 0.0
    stddev: float = 0.05
    minval: float = -0.05
    maxval: float = 0.05
    value: float = 0.0
    salts: tuple = (0,)
    track_access: bool = False
    rounding: str = "nearest"
    hyperparameters: tuple = ()
    tier_path: str = ""
    tier_dram_bytes: int = 0

    def __post_init__(self):
        def fail(what):
            raise ValueError(f"native table '{self.name}': {what}")

        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"native table name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.dim, (int, np.integer)) or self.dim < 1:
            fail(f"dim must be an int >= 1, got {self.dim!r}")
        if self.optimizer not in SLOT_NAMES:
            fail(f"optimizer must be one of {sorted(SLOT_NAMES)}, got {self.optimizer!r}")
        given = dict(self.hyperparameters or {})
        hyper = check_hyperparameters(self.optimizer, given, fail)
        names = slot_names(self.optimizer, hyper)
        if self.slot_init is None:
            defaults = dict(zip(SLOT_NAMES[self.optimizer], DEFAULT_SLOT_INIT[self.optimizer]))
            if "initial_accumulator_value" in hyper:
                defaults["accumulator"] = hyper["initial_accumulator_value"]
            slot_init = tuple(defaults[n] for n in names)
        else:
            slot_init = tuple(float(v) for v in self.slot_init)
            if len(slot_init) != len(names):
                fail(f"optimizer {self.optimizer} has slots {names}, so slot_init needs {len(names)} values, got "
                     f"{slot_init}")
            if "initial_accumulator_value" in given and slot_init[0] != hyper["initial_accumulator_value"]:
                fail(f"slot_init {slot_init} and initial_accumulator_value {hyper['initial_accumulator_value']} "
                     f"disagree: give one of them")
        if self.storage not in STORAGES:
            fail(f"storage must be one of {STORAGES}, got {self.storage!r}")
        if self.rounding not in ROUNDINGS:
            fail(f"rounding must be one of {ROUNDINGS}, got {self.rounding!r}")
        if self.rounding == "stochastic" and self.storage != "float16":
            fail(f"rounding stochastic needs storage float16 (float32 rows are not rounded), got {self.storage!r}")
        if self.init not in INITS:
            fail(f"init must be one of {INITS}, got {self.init!r}")
        if self.init in ("hashed", "normal", "truncated_normal") and not self.stddev > 0:
            fail(f"init {self.init} needs stddev > 0, got {self.stddev!r}")
        if self.init == "uniform" and not self.minval < self.maxval:
            fail(f"init uniform needs minval < maxval, got {self.minval!r} and {self.maxval!r}")
        if not isinstance(self.tier_path, str):
            fail(f"tier_path must be a string, got {self.tier_path!r}")
        if isinstance(self.tier_dram_bytes, (bool, np.bool_)) or not isinstance(self.tier_dram_bytes, (int, np.integer)):
            fail(f"tier_dram_bytes must be an int, got {self.tier_dram_bytes!r}")
        if self.tier_path and self.tier_dram_bytes <= 0:
            fail(f"a tiered table (tier_path {self.tier_path!r}) needs tier_dram_bytes > 0, got {self.tier_dram_bytes}")
        if not self.tier_path and self.tier_dram_bytes:
            fail(f"tier_dram_bytes ({self.tier_dram_bytes}) needs a tier_path")
        object.__setattr__(self, "tier_dram_bytes", int(self.tier_dram_bytes))
        salts = tuple(int(s) for s in np.atleast_1d(np.asarray(self.salts, np.int64)))
        if not salts:
            fail("salts must name at least one category")
        object.__setattr__(self, "dim", int(self.dim))
        object.__setattr__(self, "slot_init", slot_init)
        object.__setattr__(self, "hyperparameters", tuple(sorted(hyper.items())))
        object.__setattr__(self, "salts", salts)
        object.__setattr__(self, "seed", int(self.seed))
        object.__setattr__(self, "track_access", bool(self.track_access))
        for f in ("mean", "stddev", "minval", "maxval", "value"):
            object.__setattr__(self, f, float(getattr(self, f)))

    @property
    def hyper(self):
        """The hyperparameters as a dict."""
        return dict(self.hyperparameters)

    @property
    def slot_names(self):
        return slot_names(self.optimizer, self.hyper)

    @property
    def num_slots(self):
        return len(self.slot_names)


def _float64_attr(x):
    """A float64 as an op attr: its repr, which parses back to exactly the same float64 (a float attr is float32)."""
    return repr(float(x))


def create_native_table(name, dim, optimizer="sgd", slot_init=None, storage="float32", init="hashed", seed=0,
                        mean=0.0, stddev=0.05, minval=-0.05, maxval=0.05, value=0.0, salts=(0,),
                        track_access=False, rounding="nearest", hyperparameters=None, tier_path="", tier_dram_bytes=0,
                        shared_name="", container=""):
    """The resource handle of a native table, created on first run. Prefer NativeTableResource, which also frees it.

    Args: as NativeTableConfig, plus
      shared_name: tables are shared by (container, shared_name); "" means the op's node name.
      container: the resource container.

    Returns:
      resource scalar.

    Raises:
      ValueError: a bad setting (naming the table).
      InvalidArgumentError: shared_name already holds a table of another config.
    """
    config = NativeTableConfig(name, dim, optimizer, slot_init, storage, init, seed, mean, stddev, minval, maxval,
                               value, salts, track_access, rounding, hyperparameters, tier_path, tier_dram_bytes)
    return _create(config, shared_name, container)


def _hyperparameter_attrs(config):
    """The create op's attributes of the optimizer's hyperparameters (floats as float64 decimal strings: Keras takes
    constants such as 1 - rho in float64); the accumulator's initial value goes in slot_init."""
    return {k: (v if isinstance(v, bool) else _float64_attr(v)) for k, v in config.hyperparameters
            if k != "initial_accumulator_value"}


def _create(config, shared_name, container):
    with tf.name_scope("native_table_create"):
        return load_ops().fused_rec_native_table_create(
            **_hyperparameter_attrs(config),
            table_name=config.name, dim=config.dim, optimizer=config.optimizer, slot_init=list(config.slot_init),
            storage=config.storage, rounding=config.rounding, init=config.init, seed=config.seed,
            mean=_float64_attr(config.mean), stddev=_float64_attr(config.stddev), minval=_float64_attr(config.minval),
            maxval=_float64_attr(config.maxval), value=_float64_attr(config.value), salts=list(config.salts),
            track_access=config.track_access, tier_path=config.tier_path, tier_dram_bytes=config.tier_dram_bytes,
            shared_name=shared_name, container=container)


tf.no_gradient("FusedRec>NativeTableCreate")


class NativeTableResource(tf.saved_model.experimental.TrackableResource):
    """A native table as a Python object: ``resource_handle`` for the ops, captured by tf.functions that use it.

    The table is created when the object is (outside any tf.function, like a variable) and destroyed when the
    object dies, unless ``shared_name`` was given: a table shared by name may have other users.

    Args: as NativeTableConfig (``name``, ``dim``, ...), plus ``shared_name`` (None: a fresh unique name).
    """

    def __init__(self, name, dim, optimizer="sgd", slot_init=None, storage="float32", init="hashed", seed=0,
                 mean=0.0, stddev=0.05, minval=-0.05, maxval=0.05, value=0.0, salts=(0,), track_access=False,
                 rounding="nearest", hyperparameters=None, tier_path="", tier_dram_bytes=0, shared_name=None):
        self._config = NativeTableConfig(name, dim, optimizer, slot_init, storage, init, seed, mean, stddev, minval,
                                         maxval, value, salts, track_access, rounding, hyperparameters, tier_path,
                                         tier_dram_bytes)
        self._owns_table = shared_name is None
        self._shared_name = f"{name}_{uuid.uuid4().hex}" if shared_name is None else shared_name
        super().__init__()
        with tf.init_scope():
            self._resource_handle = self._create_resource()

    def _create_resource(self):
        return _create(self._config, self._shared_name, "")

    def _destroy_resource(self):
        if self._owns_table and tf.executing_eagerly():
            tf.raw_ops.DestroyResourceOp(resource=self.resource_handle, ignore_lookup_error=True)

    @property
    def config(self):
        return self._config

    @property
    def name(self):
        return self._config.name

    @property
    def dim(self):
        return self._config.dim

    @property
    def optimizer(self):
        return self._config.optimizer

    @property
    def hyperparameters(self):
        """The optimizer's hyperparameters other than the learning rate: a dict, every one of them."""
        return self._config.hyper

    @property
    def slot_names(self):
        return self._config.slot_names

    @property
    def num_slots(self):
        return self._config.num_slots

    @property
    def storage(self):
        return self._config.storage

    @property
    def track_access(self):
        return self._config.track_access

    @property
    def rounding(self):
        return self._config.rounding

    @property
    def tiered(self):
        return bool(self._config.tier_path)

    @property
    def shared_name(self):
        return self._shared_name

    def __repr__(self):
        return f"NativeTableResource({self._config})"


# ----------------------------------------------------------------------------------------------------------------
# Input checks: static shapes are checked here so a mismatch found at trace time names the table too; the kernels
# check the runtime shapes.
# ----------------------------------------------------------------------------------------------------------------

# The wrappers hold no tensor-dependent Python control flow. Left to AutoGraph inside a tf.function, it would recurse
# into the generated op functions, which have no source, and log a warning on every trace.
_not_autograph = tf.autograph.experimental.do_not_convert


def _check_table(table):
    if not isinstance(table, NativeTableResource):
        raise TypeError(f"table must be a NativeTableResource, got {type(table).__name__}")


def _int64(table, x, what):
    x = tf.convert_to_tensor(x, dtype_hint=tf.int64)
    if x.dtype == tf.int32:
        x = tf.cast(x, tf.int64)
    if x.dtype != tf.int64:
        raise TypeError(f"native table '{table.name}': {what} must be int64 (or int32), got {x.dtype.name}")
    return x


def _tensor(table, x, dtype, what):
    x = tf.convert_to_tensor(x, dtype_hint=dtype)
    if x.dtype != dtype:
        raise TypeError(f"native table '{table.name}': {what} must be {dtype.name}, got {x.dtype.name}")
    return x


def _hyper(table, x, what):
    """A float32 hyperparameter; float64 (a NumPy or Python number) is cast, as Keras casts its hyperparameters."""
    x = tf.convert_to_tensor(x, dtype_hint=tf.float32)
    if not x.dtype.is_floating:
        raise TypeError(f"native table '{table.name}': {what} must be a float, got {x.dtype.name}")
    return tf.cast(x, tf.float32)


def _check_static(table, rank_of, lengths):
    """rank_of: {what: (tensor, rank)}; lengths: names whose first dimensions must agree (when known)."""
    for what, (t, rank) in rank_of.items():
        if t.shape.rank is not None and t.shape.rank != rank:
            raise ValueError(f"native table '{table.name}': {what} must have rank {rank}, got shape {t.shape}")
    known = {w: rank_of[w][0].shape[0] for w in lengths if rank_of[w][0].shape.rank and rank_of[w][0].shape[0]
             is not None}
    if len(set(known.values())) > 1:
        got = ", ".join(f"{n} {w}" for w, n in known.items())
        raise ValueError(f"native table '{table.name}': {', '.join(lengths)} must have the same length, got {got}")


def _check_width(table, t, what):
    if t.shape.rank == 2 and t.shape[1] is not None and t.shape[1] != table.dim:
        raise ValueError(f"native table '{table.name}': {what} must have {table.dim} columns (dim), got shape "
                         f"{t.shape}")


def _part_index(table, part):
    """A part as its index: 0 or "rows" for the rows, p or slot_names[p - 1] for a slot."""
    if isinstance(part, str):
        names = ("rows",) + table.slot_names
        if part not in names:
            raise ValueError(f"native table '{table.name}': part must be one of {names}, got {part!r}")
        return names.index(part)
    part = int(part)
    if not 0 <= part <= table.num_slots:
        raise ValueError(f"native table '{table.name}': part must be in [0, {table.num_slots}] (0: rows, then "
                         f"slots {table.slot_names}), got {part}")
    return part


# ----------------------------------------------------------------------------------------------------------------
# Ops
# ----------------------------------------------------------------------------------------------------------------

@_not_autograph
def native_table_lookup_or_init(table, keys, categories, ids, insert=True, name=None):
    """Rows of keys; a missing key gets its initial row, computed from (category, id) in the same probe.

    Args:
      table: NativeTableResource.
      keys: int64 [U], the table keys (unique within a call for access counting; repeats are allowed).
      categories: int32 [U], in [0, len(salts)): picks the salt of the initializer.
      ids: int64 [U], the ids the initial rows are computed from.
      insert: True (training): missing keys are inserted with their slots at slot_init, and accesses counted.
        False (inference): missing keys return their initial row and the table is left unchanged.
      name: optional op name.

    Returns:
      float32 [U, dim].

    Raises:
      InvalidArgumentError / ValueError: a category out of range (naming position and value), inputs of different
        lengths or ranks; ResourceExhausted: the table cannot grow.
    """
    _check_table(table)
    with tf.name_scope(name or "native_table_lookup_or_init"):
        keys = _int64(table, keys, "keys")
        categories = _tensor(table, categories, tf.int32, "categories")
        ids = _int64(table, ids, "ids")
        _check_static(table, {"keys": (keys, 1), "categories": (categories, 1), "ids": (ids, 1)},
                      ("keys", "categories", "ids"))
        rows = load_ops().fused_rec_native_table_lookup_or_init(table.resource_handle, keys, categories, ids,
                                                                insert=bool(insert))
        rows.set_shape([None, table.dim])
        return rows


tf.no_gradient("FusedRec>NativeTableLookupOrInit")


@_not_autograph
def native_table_apply_sparse(table, keys, grads, categories, ids, lr, update_count=None, distinct_keys=False,
                              name=None):
    """One in-place optimizer update per distinct key, with TensorFlow's float32 arithmetic.

    Repeated keys have their grads summed first (in input order) and are updated once, as TF's sparse optimizers do
    after deduplicating. A key not in the table is first inserted with the row lookup_or_init would give it. The
    update is lazy, as TF's ResourceSparseApply* kernels: only the rows of these keys and their slots change (a dense
    optimizer also decays the momentum, moments and weights of rows without a gradient). float16 rows are computed
    in float32 and rounded once, as the table's `rounding` says.

    The formulas, per element, in float32 and in the order TensorFlow evaluates them (cc/kernels/impl/native_table.h),
    with g the summed gradient, w the row and the table's hyperparameters (Keras 3's names). A Python float constant
    such as 1 - rho is taken in float64 and rounded to float32 once, as Keras 3 does; the Keras 2 (tf_keras legacy)
    kernels take 1 - beta in float32 from float32(beta).

    * sgd (TF's ResourceApplyGradientDescent): w -= lr * g.
    * sgd with momentum > 0 (Keras 3's SGD = TF's ResourceApplyKerasMomentum, Keras 2's): m = m * momentum - g * lr,
      then w += m, or with nesterov w += m * momentum - g * lr. Slot: momentum.
    * adagrad (TF's ResourceSparseApplyAdagradV2, Keras 2's): acc += g * g; w -= lr * g / (sqrt(acc) + epsilon).
      Slot: accumulator (starting at initial_accumulator_value). (Keras 3's Adagrad puts epsilon inside the root:
      w -= (lr * g) / sqrt(acc + epsilon).)
    * adam (lazy Adam as in TFRA: the arithmetic of TF's ResourceApplyAdam kernel, which TFRA runs on a step's rows;
      1 - beta in float32): m += (g - m) * (1 - beta_1); v += (g * g - v) * (1 - beta_2);
      w -= (m * adam_lr) / (sqrt(v) + epsilon), adam_lr = adam_bias_corrected_lr(lr, beta_1, beta_2, update_count).
      Slots: m, v. (Keras 3's Adam takes 1 - beta in float64: adamw's arithmetic without the decay.)
    * adamw (Keras 3's AdamW): w -= (w * weight_decay) * lr, then adam's step with 1 - beta taken in float64 as
      Keras 3 does. Slots: m, v.
    * ftrl (Keras 3's Ftrl, in its order; with learning_rate_power -0.5 also TF's ResourceApplyFtrlV2 kernel, Keras
      2's): with p = -learning_rate_power, n the accumulator and z the linear slot: g' = g + (2 * l2_shrinkage) * w;
      n' = n + g * g; z += g' - ((n'^p - n^p) / lr) * w; w = (clip(z, -l1, l1) - z) / (n'^p / lr + 2 * l2'), with
      l2' = l2 + beta / (2 * lr); n = n'. x^0.5 is sqrt(x) (TF's kernel; Grappler's rewrite of Keras 3's pow in a
      tf.function); another p is std::pow, which TensorFlow's vectorised pow (Keras 3 run eagerly) may differ from in
      the last bit. Slots: accumulator (starting at initial_accumulator_value), linear.
    * rmsprop (Keras 3's RMSprop): v = rho * v + (1 - rho) * (g * g); centered: mg = rho * mg + (1 - rho) * g and
      d = (v - mg * mg) + epsilon, else d = v + epsilon; step = (lr * g) / sqrt(d); with momentum > 0:
      mom = momentum * mom + step and w -= mom, else w -= step. Slots: rms, momentum (momentum > 0), mg (centered):
      Keras 2's names. Keras 2's RMSprop differs: 1 - rho in float32, and without momentum epsilon outside the root,
      w -= lr * g / (sqrt(d) + epsilon); with momentum TF's kernel, v += (g * g - v) * (1 - rho).

    Args:
      table: NativeTableResource.
      keys: int64 [U].
      grads: float32 [U, dim].
      categories: int32 [U]; ids: int64 [U]: initialise keys that are missing, as in lookup_or_init.
      lr: float32 scalar, this step's learning rate (a schedule already evaluated).
      update_count: int64 scalar, the optimizer's 1-based update number (Keras: optimizer.iterations + 1): adam and
        adamw's bias correction, and the source of stochastic rounding's random bits; required by those, ignored
        otherwise.
      distinct_keys: the caller vouches that no key repeats (e.g. the keys of one lookup_or_init, which a layer's
        lookup passes unique), and the pass that deduplicates them is skipped; a repeated key is then updated once
        per occurrence, each with its own grad. Default False: deduplicated as above.
      name: optional op name.

    Returns:
      The op (None when executing eagerly).

    Raises:
      ValueError: no update_count for an adam, adamw or stochastic rounding table.
    """
    _check_table(table)
    needs_count = table.optimizer in ("adam", "adamw") or table.rounding == "stochastic"
    if update_count is None:
        if needs_count:
            why = "rounding stochastic" if table.rounding == "stochastic" else f"optimizer {table.optimizer}"
            raise ValueError(f"native table '{table.name}': {why} needs the update_count (the optimizer's 1-based "
                             f"update number) of every apply_sparse")
        update_count = 0
    with tf.name_scope(name or "native_table_apply_sparse"):
        keys = _int64(table, keys, "keys")
        grads = _tensor(table, grads, tf.float32, "grads")
        categories = _tensor(table, categories, tf.int32, "categories")
        ids = _int64(table, ids, "ids")
        lr = _hyper(table, lr, "lr")
        update_count = _int64(table, update_count, "update_count")
        _check_static(table, {"keys": (keys, 1), "grads": (grads, 2), "categories": (categories, 1), "ids": (ids, 1),
                              "lr": (lr, 0), "update_count": (update_count, 0)},
                      ("keys", "grads", "categories", "ids"))
        _check_width(table, grads, "grads")
        if table.optimizer in ("adam", "adamw"):
            hyper = table.hyperparameters
            adam_lr = adam_bias_corrected_lr(lr, hyper["beta_1"], hyper["beta_2"], update_count)
        else:
            adam_lr = lr
        return load_ops().fused_rec_native_table_apply_sparse(table.resource_handle, keys, grads, categories, ids,
                                                              lr, adam_lr, update_count,
                                                              distinct_keys=bool(distinct_keys))


tf.no_gradient("FusedRec>NativeTableApplySparse")


def adam_bias_corrected_lr(lr, beta1, beta2, step):
    """The lr Adam's update takes: (lr * sqrt(1 - beta2^step)) / (1 - beta1^step), in float32 as TensorFlow's
    ResourceApplyAdam kernel computes its alpha from Keras 2's beta powers (beta^step, tf.pow in float32), and as
    Keras 3's Adam and AdamW compute theirs (the same operations, in the same order). TensorFlow's pow, not C++'s:
    the two differ in the last bit for some arguments.

    Args:
      lr, beta1, beta2: float32 scalars.
      step: the 1-based step (Keras: optimizer.iterations + 1).

    Returns:
      float32 scalar.
    """
    with tf.name_scope("adam_bias_corrected_lr"):
        lr, beta1, beta2 = (tf.convert_to_tensor(x, tf.float32) for x in (lr, beta1, beta2))
        step = tf.cast(step, tf.float32)
        return (lr * tf.sqrt(1 - tf.pow(beta2, step))) / (1 - tf.pow(beta1, step))


@_not_autograph
def native_table_find(table, keys, part=0, name=None):
    """Rows or one slot of keys, inserting nothing and counting no access.

    Args:
      table: NativeTableResource.
      keys: int64 [K].
      part: 0 or "rows" for the rows, p in 1..S or the slot's name (SLOT_NAMES) for slot p - 1.
      name: optional op name.

    Returns:
      NativeTableFindResult(values float32 [K, dim] (zeros for a missing key), exists bool [K]).
    """
    _check_table(table)
    part = _part_index(table, part)
    with tf.name_scope(name or "native_table_find"):
        keys = _int64(table, keys, "keys")
        _check_static(table, {"keys": (keys, 1)}, ())
        values, exists = load_ops().fused_rec_native_table_find(table.resource_handle, keys, part=part)
        values.set_shape([None, table.dim])
        return NativeTableFindResult(values, exists)


tf.no_gradient("FusedRec>NativeTableFind")


@_not_autograph
def native_table_upsert(table, keys, values, part=0, name=None):
    """Sets the rows or one slot of keys, inserting missing keys (a repeated key: the last value wins).

    A key inserted by a rows upsert gets its slots at slot_init; one inserted by a slot upsert gets a zero row and its
    other slots at slot_init, so a restore writes the rows first. float16 storage rounds rows to the nearest float16.
    Inserted keys start with access count 0 and last access 0.

    Args:
      table: NativeTableResource.
      keys: int64 [K].
      values: float32 [K, dim].
      part: as in native_table_find.
      name: optional op name.

    Returns:
      The op (None when executing eagerly).
    """
    _check_table(table)
    part = _part_index(table, part)
    with tf.name_scope(name or "native_table_upsert"):
        keys = _int64(table, keys, "keys")
        values = _tensor(table, values, tf.float32, "values")
        _check_static(table, {"keys": (keys, 1), "values": (values, 2)}, ("keys", "values"))
        _check_width(table, values, "values")
        return load_ops().fused_rec_native_table_upsert(table.resource_handle, keys, values, part=part)


tf.no_gradient("FusedRec>NativeTableUpsert")


@_not_autograph
def native_table_remove(table, keys, name=None):
    """Removes keys with their slots and access stats; missing keys are ignored.

    Args:
      table: NativeTableResource.
      keys: int64 [K].
      name: optional op name.

    Returns:
      The op (None when executing eagerly).
    """
    _check_table(table)
    with tf.name_scope(name or "native_table_remove"):
        keys = _int64(table, keys, "keys")
        _check_static(table, {"keys": (keys, 1)}, ())
        return load_ops().fused_rec_native_table_remove(table.resource_handle, keys)


tf.no_gradient("FusedRec>NativeTableRemove")


@_not_autograph
def native_table_size(table, name=None):
    """Number of keys: int64 scalar."""
    _check_table(table)
    with tf.name_scope(name or "native_table_size"):
        return load_ops().fused_rec_native_table_size(table.resource_handle)


tf.no_gradient("FusedRec>NativeTableSize")

# The counters of native_table_tier_stats, in order.
TIER_STATS = ("dram_rows", "disk_rows", "dram_capacity_rows", "dram_bytes", "hits", "disk_hits", "new_keys",
              "evicted_rows", "bytes_read", "bytes_written", "evict_micros", "read_micros")


def native_table_tier_stats(table, name=None):
    """The tiers' counters as int64 [12], named by TIER_STATS: rows in DRAM, rows on disk, the most rows DRAM holds
    (-1: an all-DRAM table), bytes of the DRAM arrays; then, since the table was created, the training lookups' keys
    found in DRAM (hits), found on disk (read into DRAM), found in neither (new keys), the rows evicted to disk and
    the bytes read from and written to disk, and the microseconds training calls spent evicting (the batched write)
    and reading from disk (the batched read and the deletes of the rows read). An all-DRAM table gives (size, 0, -1,
    bytes, 0, ...)."""
    _check_table(table)
    with tf.name_scope(name or "native_table_tier_stats"):
        return load_ops().fused_rec_native_table_tier_stats(table.resource_handle)


tf.no_gradient("FusedRec>NativeTableTierStats")


@_not_autograph
def native_table_export(table, name=None):
    """Every key with its row and slots, in the table's (fixed, unspecified) order.

    Returns:
      NativeTableExportResult(keys int64 [K], rows float32 [K, dim], slots float32 [K, S, dim]).
    """
    _check_table(table)
    with tf.name_scope(name or "native_table_export"):
        keys, rows, slots = load_ops().fused_rec_native_table_export(table.resource_handle)
        rows.set_shape([None, table.dim])
        slots.set_shape([None, table.num_slots, table.dim])
        return NativeTableExportResult(keys, rows, slots)


tf.no_gradient("FusedRec>NativeTableExport")


@_not_autograph
def native_table_export_chunk(table, cursor, max_rows, name=None):
    """Up to max_rows keys of the table from `cursor` on, with their rows, slots and access stats: an export of a
    table larger than memory (a tiered one) in pieces. Start at EXPORT_START and pass each chunk's `next` to the next
    call; the export is over when `next` is EXPORT_DONE. Each key comes once over the chunks provided the table does
    not change between the calls (compare their total with native_table_size).

    Returns:
      NativeTableExportChunk(keys int64 [k], rows float32 [k, dim], slots float32 [k, S, dim], counts int64 [k] and
      last int64 [k] (the keys' access stats; zeros where the table keeps none), next int64 [2], clock int64 scalar
      (the table's training lookups so far, as native_table_access_status gives it)).
    """
    _check_table(table)
    with tf.name_scope(name or "native_table_export_chunk"):
        out = load_ops().fused_rec_native_table_export_chunk(
            table.resource_handle, tf.convert_to_tensor(cursor, tf.int64), tf.convert_to_tensor(max_rows, tf.int64))
        out[1].set_shape([None, table.dim])
        out[2].set_shape([None, table.num_slots, table.dim])
        return NativeTableExportChunk(*out)


tf.no_gradient("FusedRec>NativeTableExportChunk")

NativeTableChanges = collections.namedtuple("NativeTableChanges", ["keys", "rows", "slots", "removed"])


@_not_autograph
def native_table_changes(table, name=None):
    """What changed since the last native_table_clear_changes: the keys inserted (by a training lookup, an update or
    an upsert) or written (an update, an upsert of the row or a slot) with their rows and slots, and the keys removed
    (eviction, expiry, remove) that the table does not hold now. A key written without its value changing (a zero
    gradient) is reported too: a superset of the keys whose bits differ, never a subset.

    What a publish to serving reads instead of the whole table (tf_fusedrec/train/publishing.py).

    Returns:
      NativeTableChanges(keys int64 [C] (in the table's order), rows float32 [C, dim], slots float32 [C, S, dim],
      removed int64 [R] ascending).

    Raises:
      FailedPreconditionError: native_table_clear_changes was never called on the table (removals are logged only
        from then on, so the first reader must read the whole table: native_table_export).
    """
    _check_table(table)
    with tf.name_scope(name or "native_table_changes"):
        keys, rows, slots, removed = load_ops().fused_rec_native_table_changes(table.resource_handle)
        rows.set_shape([None, table.dim])
        slots.set_shape([None, table.num_slots, table.dim])
        return NativeTableChanges(keys, rows, slots, removed)


tf.no_gradient("FusedRec>NativeTableChanges")


@_not_autograph
def native_table_clear_changes(table, name=None):
    """Forgets the changes native_table_changes reports (the first call also starts logging removed keys).

    Returns:
      The op (None when executing eagerly).
    """
    _check_table(table)
    with tf.name_scope(name or "native_table_clear_changes"):
        return load_ops().fused_rec_native_table_clear_changes(table.resource_handle)


tf.no_gradient("FusedRec>NativeTableClearChanges")


@_not_autograph
def native_table_access_status(table, name=None):
    """Access stats of every key, for LFU / LRU eviction (the table must track access).

    Returns:
      NativeTableAccessStatus(keys int64 [K], counts int64 [K], last int64 [K] (the clock of the key's last training
      lookup, 0 if none), clock int64 scalar (training lookups so far)).

    Raises:
      InvalidArgumentError: the table was created with track_access=False.
    """
    _check_table(table)
    with tf.name_scope(name or "native_table_access_status"):
        return NativeTableAccessStatus(*load_ops().fused_rec_native_table_access_status(table.resource_handle))


tf.no_gradient("FusedRec>NativeTableAccessStatus")


@_not_autograph
def native_table_set_access_status(table, keys, counts, last, clock, name=None):
    """Sets the access stats of keys and the table's clock (a checkpoint's restore; the table must track access).

    Every key must be in the table already (restore its row first): a key not held is an error, and then nothing is
    set. A repeated key takes its last entry; keys not given keep their stats.

    Args:
      table: NativeTableResource.
      keys: int64 [K].
      counts: int64 [K], >= 0: the training lookups that read each key.
      last: int64 [K], in [0, clock]: the clock of each key's last training lookup (0: none).
      clock: int64 scalar, >= 0: the training lookups so far (the next one reads at clock + 1).
      name: optional op name.

    Returns:
      The op (None when executing eagerly).

    Raises:
      ValueError: static shapes that are not vectors of one length, or a clock that is not a scalar.
      InvalidArgumentError: the same at run time, a table created with track_access=False, a key not in the table, a
        negative count or clock, or a last outside [0, clock] (naming the table, the key and its position).
    """
    _check_table(table)
    with tf.name_scope(name or "native_table_set_access_status"):
        keys = _int64(table, keys, "keys")
        counts = _int64(table, counts, "counts")
        last = _int64(table, last, "last")
        clock = _int64(table, clock, "clock")
        _check_static(table, {"keys": (keys, 1), "counts": (counts, 1), "last": (last, 1), "clock": (clock, 0)},
                      ("keys", "counts", "last"))
        return load_ops().fused_rec_native_table_set_access_status(table.resource_handle, keys, counts, last, clock)


tf.no_gradient("FusedRec>NativeTableSetAccessStatus")

"""Typed configs: features, embedding specs and spec groups (FusedRec eq. 1), and their deterministic grouping.

A feature's spec is ``(dim, optimizer, initializer)``. Features with equal specs are fused into one group; groups
and the features inside them are ordered by feature name, so every worker derives the same groups, tables and
collective names from the same config.
"""

import dataclasses
import json
import math
from typing import Any, Optional, Tuple

import tensorflow as tf

from tf_fusedrec.sequence_config import SequenceConfig  # data.sequences (its own module: the data modules use it)

COMBINERS = (None, "sum", "mean", "sqrtn")
KEY_DTYPES = (tf.int32, tf.int64)
OPTIMIZER_NAMES = ("sgd", "adagrad", "adam", "adamw", "ftrl", "rmsprop")


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """A sparse optimizer by name and hyperparameters, e.g. ``OptimizerSpec("adagrad", (("learning_rate", 0.1),))``.

    Feature and layer arguments accept a name (``"adagrad"``) or a dict (``{"name": "adagrad",
    "learning_rate": 0.1}``); :func:`optimizer_spec` turns either into this canonical, comparable form.
    """

    name: str
    config: Tuple[Tuple[str, Any], ...] = ()

    def build(self, for_tfra=False):
        """A fresh Keras optimizer of this spec (one per group: optimizer state is per table), of the Keras the
        process runs: Keras 3's class, or under Keras 2 (tf_keras) the legacy (OptimizerV2) one, which TFRA's tables
        need (tf_fusedrec/_keras.py). for_tfra: refuse an optimizer TFRA cannot wrap (AdamW)."""
        from tf_fusedrec import _keras  # noqa: PLC0415

        return _keras.build_optimizer(self.name, dict(self.config), for_tfra=for_tfra)

    def __str__(self):
        if not self.config:
            return self.name
        return self.name + "(" + ", ".join(f"{k}={v}" for k, v in self.config) + ")"


def optimizer_spec(optimizer, what="optimizer"):
    """Canonical OptimizerSpec from a name, a dict with "name", or an OptimizerSpec; ValueError naming `what`."""
    if isinstance(optimizer, OptimizerSpec):
        return optimizer
    if _is_keras_optimizer(optimizer):
        return _spec_of_keras_optimizer(optimizer, what)
    if isinstance(optimizer, str):
        name, config = optimizer, {}
    elif isinstance(optimizer, dict) and "name" in optimizer:
        config = dict(optimizer)
        name = config.pop("name")
    else:
        raise ValueError(
            f"{what}: expected an optimizer name {OPTIMIZER_NAMES} or a dict with 'name' and hyperparameters, got "
            f"{optimizer!r} (optimizer objects carry state and cannot be shared between tables)"
        )
    name = name.lower()
    if name not in OPTIMIZER_NAMES:
        raise ValueError(f"{what}: unknown optimizer {name!r}; expected one of {OPTIMIZER_NAMES}")
    return OptimizerSpec(name, tuple(sorted(config.items())))


def _is_keras_optimizer(obj):
    from tf_fusedrec import _keras  # noqa: PLC0415

    return _keras.is_optimizer(obj)


def _spec_of_keras_optimizer(optimizer, what):
    """The OptimizerSpec of a Keras optimizer instance (FusedEmbedding(optimizer=keras.optimizers.Adagrad(0.05))): its
    class and the hyperparameters its class takes; each table gets a fresh optimizer of that spec (the instance's
    state is not shared). ValueError naming `what` for settings a table's update does not implement (gradient
    clipping, EMA, ...) or a learning-rate schedule."""

    names = {cls.lower(): name for name, cls in _optimizer_classes().items()}
    name = names.get(type(optimizer).__name__.lower())
    if name is None:
        raise ValueError(f"{what}: Keras optimizer {type(optimizer).__name__} has no tf_fusedrec table update; "
                         f"expected one of {sorted(names.values())}")
    from tf_fusedrec.ops.native_table_ops import HYPERPARAMETERS  # noqa: PLC0415  (the op wrappers import config)

    config = optimizer.get_config()
    own = {"learning_rate", *HYPERPARAMETERS[name]}
    for key in sorted(_REFUSED_OPTIMIZER_SETTINGS - own):
        if config.get(key) not in (None, False, 0, 0.0):
            raise ValueError(f"{what}: {type(optimizer).__name__}({key}={config[key]!r}) is not implemented for "
                             f"embedding tables; leave {key} unset")
    spec = {key: config[key] for key in sorted(own) if key in config}
    spec = {k: v.item() if hasattr(v, "item") and not isinstance(v, dict) else v for k, v in spec.items()}
    if not isinstance(spec.get("learning_rate", 0.0), (int, float)):
        raise ValueError(f"{what}: a learning-rate schedule in a Keras optimizer given for embedding tables is not "
                         f"supported; give a float learning_rate (the dense optimizer of make_optimizer may use one)")
    return OptimizerSpec(name, tuple(sorted(spec.items())))


# Settings of a Keras optimizer that a table's update does not implement: refused unless unset (None, False or 0).
# Other generic settings (jit_compile, the EMA's momentum and frequency without use_ema) change nothing for a table.
_REFUSED_OPTIMIZER_SETTINGS = {"clipnorm", "clipvalue", "global_clipnorm", "use_ema", "gradient_accumulation_steps",
                               "loss_scale_factor", "decay", "weight_decay", "amsgrad"}


def _optimizer_classes():
    from tf_fusedrec import _keras  # noqa: PLC0415

    return _keras.OPTIMIZER_CLASSES


def default_initializer():
    """The initializer of features and layers that name none: Hashed rows, reproducible and independent of worker
    count and batch order."""
    from tf_fusedrec import initializers  # noqa: PLC0415  (initializers imports config)

    return initializers.Hashed(seed=0, stddev=0.05)


def initializer_key(initializer):
    """A comparable description of an initializer: equal keys mean equal initial-row distributions."""
    if hasattr(initializer, "spec_key"):
        return initializer.spec_key()
    config = initializer.get_config() if hasattr(initializer, "get_config") else {}
    return (type(initializer).__name__, json.dumps(config, sort_keys=True, default=str))


@dataclasses.dataclass(frozen=True)
class Feature:
    """One sparse feature.

    Args:
      name: unique feature name, the key of the input dict.
      dim: embedding dimension, > 0.
      combiner: None (one row per id), "sum", "mean" or "sqrtn" (one row per example).
      initializer: initial rows of new ids; None takes the layer's default.
      optimizer: name or dict (see OptimizerSpec); None takes the layer's default.
      key_dtype: dtype of the ids fed for this feature, tf.int64 or tf.int32.
      max_id_bits: ids are known to lie in [0, 2**max_id_bits); when every feature of a group declares it and it
        fits next to the category bits, the group uses the lossless packed encoding.
      shares: None, or the name of another feature whose rows this one reads and trains (one category of one table
        for both, e.g. a candidate item and the item history). Declared, never implied: the two must have the same
        spec (dim, optimizer, initializer) and key_dtype, and the shared feature must not share another's rows. The
        feature keeps its own input and combiner.
    """

    name: str
    dim: int
    combiner: Optional[str] = None
    initializer: Any = None
    optimizer: Any = None
    key_dtype: tf.DType = tf.int64
    max_id_bits: Optional[int] = None
    shares: Optional[str] = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"feature name must be a non-empty string, got {self.name!r}")
        where = f"feature '{self.name}'"
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim <= 0:
            raise ValueError(f"{where}: dim must be a positive int, got {self.dim!r}")
        if self.combiner not in COMBINERS:
            raise ValueError(f"{where}: combiner must be one of {COMBINERS}, got {self.combiner!r}")
        key_dtype = tf.as_dtype(self.key_dtype)
        if key_dtype not in KEY_DTYPES:
            raise ValueError(f"{where}: key_dtype must be tf.int32 or tf.int64, got {key_dtype.name}")
        object.__setattr__(self, "key_dtype", key_dtype)
        if self.max_id_bits is not None and not (isinstance(self.max_id_bits, int) and 1 <= self.max_id_bits <= 63):
            raise ValueError(f"{where}: max_id_bits must be an int in [1, 63], got {self.max_id_bits!r}")
        if self.optimizer is not None:
            object.__setattr__(self, "optimizer", optimizer_spec(self.optimizer, where))
        if self.shares is not None:
            if not isinstance(self.shares, str) or not self.shares:
                raise ValueError(f"{where}: shares must be None or the name of another feature, got {self.shares!r}")
            if self.shares == self.name:
                raise ValueError(f"{where} shares the rows of feature '{self.shares}', itself: name another feature "
                                 f"(or leave shares None)")

    def get_config(self):
        from tf_fusedrec import initializers  # noqa: PLC0415  (initializers imports config)

        return {
            "name": self.name,
            "dim": self.dim,
            "combiner": self.combiner,
            "initializer": None if self.initializer is None else initializers.serialize(self.initializer),
            "optimizer": None if self.optimizer is None else {"name": self.optimizer.name, **dict(self.optimizer.config)},
            "key_dtype": self.key_dtype.name,
            "max_id_bits": self.max_id_bits,
            "shares": self.shares,
        }

    @classmethod
    def from_config(cls, config):
        from tf_fusedrec import initializers  # noqa: PLC0415

        config = dict(config)
        if config.get("initializer") is not None:
            config["initializer"] = initializers.deserialize(config["initializer"])
        return cls(**config)


@dataclasses.dataclass(frozen=True)
class Spec:
    """The embedding spec of FusedRec eq. 1. `initializer_key` compares initializers by class and config."""

    dim: int
    optimizer: OptimizerSpec
    initializer_key: Tuple[Any, ...]

    def __str__(self):
        return f"dim={self.dim}, optimizer={self.optimizer}, initializer={self.initializer_key[0]}"


@dataclasses.dataclass(frozen=True)
class SpecGroup:
    """Features of one spec, ordered by name. Each feature that owns rows is a category of the group's table, its
    category index its position among them (`categories`); a feature that shares another's rows (Feature.shares) is
    not a category of its own: its ids are pairs of the shared feature's category.

    Attributes:
      spec: the shared Spec.
      feature_names: tuple of names, sorted: every feature of the group (the inputs).
      index: position of the group in the layer's group list.
      encoding: "packed" (lossless, every feature declares max_id_bits and they fit) or "hashed".
      max_id_bits: the bound the packed encoding relies on (None for hashed).
      shares: ((feature, the feature whose rows it reads), ...), sorted; () when no feature of the group shares.
    """

    spec: Spec
    feature_names: Tuple[str, ...]
    index: int = 0
    encoding: str = "hashed"
    max_id_bits: Optional[int] = None
    shares: Tuple[Tuple[str, str], ...] = ()

    @property
    def name(self):
        """Deterministic name used for the group's table and collectives."""
        return f"group{self.index}_d{self.spec.dim}_{self.spec.optimizer.name}"

    @property
    def categories(self):
        """The features that own rows, sorted: category c of the table is categories[c] (with no sharing, every
        feature: feature_names)."""
        sharing = dict(self.shares)
        return tuple(n for n in self.feature_names if n not in sharing)

    @property
    def num_categories(self):
        return len(self.categories)

    def category_of(self, feature_name):
        """The category whose rows a feature of the group reads: its own, or the one of the feature it shares."""
        return self.categories.index(dict(self.shares).get(feature_name, feature_name))

    @property
    def feature_categories(self):
        """The category of each feature_names entry (what the fused ids are segmented by)."""
        return tuple(self.category_of(n) for n in self.feature_names)


def feature_spec(feature, default_optimizer, default_initializer):
    """(Spec, resolved initializer) of a feature; the defaults fill what it leaves None."""
    optimizer = feature.optimizer if feature.optimizer is not None else default_optimizer
    initializer = feature.initializer if feature.initializer is not None else default_initializer
    return Spec(feature.dim, optimizer, initializer_key(initializer)), initializer


def shared_rows(features, default_optimizer, default_initializer):
    """{feature: the feature whose rows it reads} of the features that declare `shares`, checked.

    Raises:
      ValueError naming both features when the shared feature does not exist, itself shares another's rows (chains
      are refused, not followed), or differs in anything that decides the table: dim, optimizer, initializer (after
      the defaults) or key_dtype.
    """
    by_name = {f.name: f for f in features}
    shares = {}
    for f in sorted(features, key=lambda f: f.name):
        if f.shares is None:
            continue
        where = f"feature '{f.name}' shares the rows of feature '{f.shares}'"
        owner = by_name.get(f.shares)
        if owner is None:
            raise ValueError(f"{where}, which does not exist (features: {sorted(by_name)})")
        if owner.shares is not None:
            raise ValueError(f"{where}, which itself shares the rows of feature '{owner.shares}': chains are not "
                             f"followed; let '{f.name}' share '{owner.shares}' directly")
        (spec, _), (owner_spec, _) = (feature_spec(x, default_optimizer, default_initializer) for x in (f, owner))
        differences = [(what, mine, theirs) for what, mine, theirs in (
            ("dim", spec.dim, owner_spec.dim),
            ("optimizer", spec.optimizer, owner_spec.optimizer),
            ("initializer", spec.initializer_key, owner_spec.initializer_key),
            ("key_dtype", f.key_dtype.name, owner.key_dtype.name)) if mine != theirs]
        if differences:
            what, mine, theirs = differences[0]
            raise ValueError(f"{where}, but their {what} differs ({mine} for '{f.name}', {theirs} for '{owner.name}'):"
                             f" features that share rows need the same dim, optimizer, initializer and key_dtype")
        shares[f.name] = owner.name
    return shares


def group_features(features, default_optimizer, default_initializer):
    """Fuses features with equal specs into SpecGroups, ordered by their first feature name.

    Args:
      features: Features with unique names.
      default_optimizer / default_initializer: used where a feature leaves them None.

    Returns:
      (list of SpecGroup, dict feature name -> resolved initializer).

    Raises:
      ValueError naming both features of a `shares` that cannot be honoured (shared_rows).
    """
    from tf_fusedrec.ops import packed_key_bits  # noqa: PLC0415  (keeps config importable without the op library)

    shares = shared_rows(features, default_optimizer, default_initializer)
    by_spec = {}
    resolved_initializers = {}
    for feature in sorted(features, key=lambda f: f.name):
        spec, resolved_initializers[feature.name] = feature_spec(feature, default_optimizer, default_initializer)
        by_spec.setdefault(spec, []).append(feature)
    groups = []
    for index, (spec, members) in enumerate(sorted(by_spec.items(), key=lambda item: item[1][0].name)):
        names = tuple(f.name for f in members)
        sharing = tuple((n, shares[n]) for n in names if n in shares)  # same spec: the shared feature is a member
        bits = [f.max_id_bits for f in members]
        encoding, max_bits = "hashed", None
        if all(b is not None for b in bits) and max(bits) <= packed_key_bits(len(names) - len(sharing)):
            encoding, max_bits = "packed", max(bits)
        groups.append(SpecGroup(spec, names, index, encoding, max_bits, sharing))
    return groups, resolved_initializers


# ---------------------------------------------------------------------------------------------------------------
# Experiment configs (configs/*.yaml), parsed in one place: load_config().
# ---------------------------------------------------------------------------------------------------------------

DATA_SOURCES = ("synthetic", "criteo", "movielens", "grm_synthetic", "movielens_seq", "tfrecord", "parquet", "csv")
FILE_SOURCES = ("tfrecord", "parquet", "csv")  # your data, read by data.schema (tf_fusedrec/data/files.py)
SEQUENCE_SOURCES = ("grm_synthetic", "movielens_seq")  # user sequences, two labels (click, conversion): the GRM's data
# The knobs of the synthetic lengths; a source of real sequences (movielens_seq) takes its lengths from the data.
SYNTHETIC_LENGTH_KEYS = ("median_length", "length_sigma", "longest_length", "empty_fraction")
MODELS = ("dlrm", "dcn", "grm")
PIPELINES = ("sync", "dbp", "fwp")


@dataclasses.dataclass
class FeatureConfig:
    """A sparse feature: its embedding (dim, combiner, optimizer, initializer, max_id_bits, shares: the feature whose
    rows it reads, see Feature) and, for synthetic data, its id distribution (vocab, zipf exponent, hotness: an int or
    [lo, hi] for variable length)."""

    # the key of its input, unique; an entry with repeat: N (and start: S, default 1) is N features, named
    # name.format(i=S), ..., name.format(i=S+N-1), e.g. {name: "C{i}", repeat: 13}: C1..C13
    name: str
    dim: int  # embedding dimension, > 0
    vocab: int = 100_000  # synthetic data: the ids are drawn below this
    # synthetic data: the exponent of the ids' Zipf law (data.calibrate_zipf(vocab): the one for which 2% of the ids
    # carry 90% of the accesses)
    zipf: float = 1.05
    hotness: Any = 1  # synthetic data: ids per example, an int or [lo, hi] (a variable number)
    # null: one row per id; sum, mean or sqrtn: one pooled row per example (null with a hotness other than 1: sum)
    combiner: Optional[str] = None
    optimizer: Any = None  # its table's optimizer: a name or {name: ..., hyperparameters}; null: train.sparse_optimizer
    # initial rows of new ids (tf_fusedrec.initializers.get: a name or a mapping); null: Hashed rows, reproducible on
    # any number of workers
    initializer: Any = None
    # ids lie in [0, 2**max_id_bits): when every feature of a group declares it and it fits, the group's keys use the
    # lossless packed encoding (else hashed)
    max_id_bits: Optional[int] = None
    # null, or the feature whose rows this one reads and trains (one category of one table for both, e.g. a candidate
    # item and the item history): the same dim, optimizer, initializer and key dtype
    shares: Optional[str] = None

    def to_feature(self):
        from tf_fusedrec import initializers  # noqa: PLC0415

        combiner = self.combiner
        if combiner is None and self.hotness != 1:
            combiner = "sum"
        return Feature(self.name, self.dim, combiner=combiner, optimizer=self.optimizer,
                       initializer=initializers.get(self.initializer), max_id_bits=self.max_id_bits,
                       shares=self.shares)


@dataclasses.dataclass
class DataConfig:
    # a generator (synthetic, grm_synthetic), a reader of a public data set's files (criteo, movielens, movielens_seq)
    # or your files (FILE_SOURCES, read by data.schema)
    source: str = "synthetic"
    path: Optional[str] = None  # the files of a reader: a file, a glob or a list of them; not for the generators
    num_dense: int = 13  # dense inputs; the file sources count data.schema.dense, the sequence sources have none (0)
    seed: int = 0  # of the generated data (a batch is a function of seed, rank and step) and of shuffled files
    eval_batches: int = 8  # batches per worker of the held-out stream the AUC is measured on
    drift: float = 0.0  # source synthetic: new popular ids per step, every id sinking as many ranks (data/synthetic.py)
    # source movielens: shuffle each worker's training ratings (ratings.dat is sorted by user); false: file order, the
    # order `python -m tf_fusedrec.data.convert movielens` writes them in (without --shuffle)
    shuffle: bool = True
    # a SequenceConfig (parsed from a mapping) for the SEQUENCE_SOURCES, and for a file source whose records are user
    # sequences (data.schema's history, target and labels: docs/guide/your-data.md); else null
    sequences: Any = None
    # FILE_SOURCES (docs/guide/your-data.md): the columns (a data.files.FileSchema parsed from a mapping), the held-out
    # files (else the first eval_batches x batch x workers records are held out), what a bad record does
    schema: Any = None  # required: the columns of the features, the label, the dense inputs and a weight, a mapping
    eval_path: Any = None  # the held-out files: a file, a glob or a list of them; null: the first records
    on_bad_record: str = "error"  # error | skip (counted; past max_bad_records, the error)
    max_bad_records: int = 1000  # bad records skipped at most (on_bad_record: skip)
    # data.follow (data/follow.py): keep reading the files that arrive under path (a directory or glob), polling
    # every poll_seconds, ending after idle_timeout_seconds without one (null: never); follow_marker: a directory's
    # files count once it holds this file (e.g. _SUCCESS), else once under their final (not hidden) name
    follow: bool = False  # keep reading the files that arrive under path
    poll_seconds: float = 5.0  # seconds between looks for new files
    idle_timeout_seconds: Optional[float] = None  # the stream ends after this long without a new file; null: never
    follow_marker: Optional[str] = None  # a directory's files count once it holds this file; null: no marker

    @property
    def sequential(self):
        """Whether the batches are user sequences, labels [B, 2] (the GRM's data): a SEQUENCE_SOURCES source, or a
        file source with data.sequences."""
        return self.source in SEQUENCE_SOURCES or (self.source in FILE_SOURCES and self.sequences is not None)


@dataclasses.dataclass
class ModelConfig:
    # dlrm (bottom MLP, dot interaction, top MLP), dcn (DCNv2: cross layers, then a deep MLP) or grm (the sequence
    # sources' generative recommender); tf_fusedrec/models/
    name: str = "dlrm"
    # dlrm: widths of the MLP over the dense inputs; the last is the interaction dim
    bottom_mlp: Tuple[int, ...] = (64, 16)
    top_mlp: Tuple[int, ...] = (64, 32)  # dlrm: widths of the MLP over the interactions, before the logit
    cross_layers: int = 2  # dcn: number of cross layers
    deep_mlp: Tuple[int, ...] = (64, 32)  # dcn: widths of the deep MLP, before the logit
    # grm (tf_fusedrec/models/grm.py): HSTU blocks over the sequence, an MMoE head with two tasks
    num_blocks: int = 2  # HSTU blocks
    hidden_dim: int = 32  # U, Q, K and V each have hidden_dim (num_heads heads of hidden_dim / num_heads)
    num_heads: int = 2  # attention heads; hidden_dim is a multiple of it
    position_buckets: int = 16  # log-spaced relative-position buckets of the attention bias; 0: no bias
    attention_norm: Any = "causal"  # "causal" (divide by the keys a query sees) or a fixed int normaliser
    pooling: str = "last"  # "last" (the last item's state) or "mean" over the sequence
    experts: int = 4  # expert MLPs of the MMoE head
    expert_units: Tuple[int, ...] = (64, 32)  # widths of each expert's MLP
    tower_units: Tuple[int, ...] = (16,)  # widths of each task's tower, before its logit


@dataclasses.dataclass
class TrainConfig:
    batch_size: int = 2048  # per worker
    steps: int = 200  # training steps (--steps overrides)
    sparse_optimizer: Any = "adagrad"  # default of features that name none
    # the dense weights' optimizer: a name or {name: ..., hyperparameters} (fr.train.make_optimizer)
    dense_optimizer: Any = dataclasses.field(default_factory=lambda: {"name": "adam", "learning_rate": 0.001})
    checkpoint_every: int = 100  # steps between checkpoints (with --model-dir; and at the end)
    # 0: every checkpoint full; else a multiple of checkpoint_every: the checkpoints between full ones are deltas
    # (the rows and slots changed since the previous checkpoint; docs/guide/checkpoints.md)
    checkpoint_full_every: int = 0
    log_every: int = 10  # steps between progress lines in a log, and between TensorBoard summaries
    pipeline: str = "sync"  # TrainPipeline schedule: sync | dbp | fwp
    micro_batches: int = 2  # k of the fwp schedule
    cluster_samples: bool = False  # key-centric sample clustering of the fwp micro-batches


TABLE_BACKENDS = ("native", "tfra")
TABLE_ROUNDINGS = ("nearest", "stochastic")


@dataclasses.dataclass
class EmbeddingConfig:
    # FusedEmbedding's tables: native (the default of the train app and the bench: the same training, measured faster,
    # docs/reference/layer.md, table_backend) | tfra. The per-feature baseline is always TFRA.
    table_backend: str = "native"
    # How float16 table storage (--table-storage float16) rounds an updated row: nearest | stochastic (unbiased; see
    # FusedEmbedding's rounding). float32 storage ignores it.
    table_rounding: str = "nearest"
    # FusedEmbedding's table policies (tf_fusedrec/distributed/admission.py; the per-feature baseline has none):
    admission_min_count: Any = None  # fr.Admission(min_count): an id gets a row once read this often; null: at once
    expiry_steps: Any = None  # fr.Expiry(steps, interval): rows not updated for this many steps go; null: they stay
    expiry_interval: int = 100  # updates between expiry checks
    # Tables larger than memory (fr.Tiered, tf_fusedrec/distributed/tier.py): a mapping {dram_bytes: bytes or a size
    # such as 2GiB, path: a local directory}: each table keeps at most dram_bytes per worker in DRAM, the rest in a
    # RocksDB store under path; null: every row in DRAM. Native tables only.
    tier: Any = None


@dataclasses.dataclass
class ExperimentConfig:
    name: str  # the experiment's name, in summaries and checkpoints (load_config: the file's path when it has none)
    # the sparse features, a list of mappings (FeatureConfig); a top-level feature_defaults mapping gives every entry
    # the keys it leaves out
    features: list
    data: DataConfig = dataclasses.field(default_factory=DataConfig)  # the data section
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)  # the model section
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)  # the train section
    embedding: EmbeddingConfig = dataclasses.field(default_factory=EmbeddingConfig)  # the embedding section

    def embedding_features(self):
        return [f.to_feature() for f in self.features]


def _fields(cls):
    return {f.name: f for f in dataclasses.fields(cls)}


def _build(cls, raw, where):
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping, got {raw!r}")
    known = _fields(cls)
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown key '{unknown[0]}' (known keys: {sorted(known)})")
    values = {}
    for k, v in raw.items():
        if isinstance(v, list) and k != "hotness":
            v = tuple(v)
        values[k] = v
    missing = [n for n, f in known.items() if n not in values and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"{where}: missing required key '{missing[0]}'")
    return cls(**values)


def _expand_features(raw_features, defaults, where):
    if not isinstance(raw_features, list) or not raw_features:
        raise ValueError(f"{where}.features: expected a non-empty list of features")
    expanded = []
    for i, entry in enumerate(raw_features):
        if not isinstance(entry, dict):
            raise ValueError(f"{where}.features[{i}]: expected a mapping, got {entry!r}")
        entry = {**defaults, **entry}
        repeat, start = entry.pop("repeat", None), entry.pop("start", 1)
        names = [entry.get("name")] if repeat is None else [str(entry["name"]).format(i=start + j) for j in range(repeat)]
        for name in names:
            expanded.append((f"{where}.features[{i}] ({name})", {**entry, "name": name}))
    features, seen = [], set()
    for field, entry in expanded:
        feature = _build(FeatureConfig, entry, field)
        if isinstance(feature.dim, bool) or not isinstance(feature.dim, int) or feature.dim <= 0:
            raise ValueError(f"{field}: dim must be a positive int, got {feature.dim!r}")
        if not isinstance(feature.vocab, int) or feature.vocab <= 0:
            raise ValueError(f"{field}: vocab must be a positive int, got {feature.vocab!r}")
        if feature.name in seen:
            raise ValueError(f"{field}: feature '{feature.name}' is defined twice")
        seen.add(feature.name)
        try:
            feature.to_feature()
        except ValueError as e:
            raise ValueError(f"{field}: {e}") from None
        features.append(feature)
    return features


def parse_config(raw, where="config"):
    """An ExperimentConfig from a parsed YAML mapping; ValueError naming the offending field."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping at the top level")
    known = {"name", "features", "feature_defaults", "data", "model", "train", "embedding"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key '{unknown[0]}' (known keys: {sorted(known)})")
    if "features" not in raw:
        raise ValueError(f"{where}: missing required key 'features'")
    data = _build(DataConfig, raw.get("data"), f"{where}.data")
    if data.source not in DATA_SOURCES:
        raise ValueError(f"{where}.data.source: must be one of {DATA_SOURCES}, got {data.source!r}")
    if (not isinstance(data.drift, (int, float)) or isinstance(data.drift, bool) or not math.isfinite(data.drift)
            or data.drift < 0):
        raise ValueError(f"{where}.data.drift: a finite number >= 0 (ids per step), got {data.drift!r}")
    if data.drift and data.source != "synthetic":
        raise ValueError(f"{where}.data.drift: only for source 'synthetic', not {data.source!r}")
    if not isinstance(data.shuffle, bool):
        raise ValueError(f"{where}.data.shuffle: must be true or false, got {data.shuffle!r}")
    if "shuffle" in (raw.get("data") or {}) and data.source != "movielens":
        raise ValueError(f"{where}.data.shuffle: only for source 'movielens', not {data.source!r}")
    if data.source not in ("synthetic", "grm_synthetic") and not data.path:
        raise ValueError(f"{where}.data.path: required for source {data.source!r}")
    if data.sequential:
        if data.source != "grm_synthetic" and isinstance(data.sequences, dict):
            knobs = [k for k in SYNTHETIC_LENGTH_KEYS if k in data.sequences]
            if knobs:
                raise ValueError(f"{where}.data.sequences.{knobs[0]}: a knob of the synthetic lengths; source "
                                 f"{data.source!r} takes its lengths from the data (remove it)")
        data.sequences = _build(SequenceConfig, data.sequences, f"{where}.data.sequences")
        if data.num_dense != 0 and data.source in SEQUENCE_SOURCES:  # a file source's follows its schema (none)
            raise ValueError(f"{where}.data.num_dense: source {data.source!r} has no dense features; set 0, got "
                             f"{data.num_dense!r}")
    elif data.sequences is not None:
        raise ValueError(f"{where}.data.sequences: only for the sequence sources {SEQUENCE_SOURCES} and the file "
                         f"sources {FILE_SOURCES}, not {data.source!r}")
    _check_file_source(data, raw, where)
    model = _build(ModelConfig, raw.get("model"), f"{where}.model")
    if model.name not in MODELS:
        raise ValueError(f"{where}.model.name: must be one of {MODELS}, got {model.name!r}")
    if (model.name == "grm" and not data.sequential) or (model.name == "dcn" and data.sequential):
        raise ValueError(f"{where}.model.name: {model.name!r} does not fit data.source {data.source!r} (the grm "
                         f"model takes the sequence sources {SEQUENCE_SOURCES}, or a file source with data.sequences, "
                         f"and their two labels, dcn the others, dlrm both: on sequences with one logit per label, "
                         f"the history a pooled bag)")
    if model.name == "grm":
        _check_grm_model(model, f"{where}.model")
    embedding = _build(EmbeddingConfig, raw.get("embedding"), f"{where}.embedding")
    if embedding.table_backend not in TABLE_BACKENDS:
        raise ValueError(f"{where}.embedding.table_backend: must be one of {TABLE_BACKENDS}, got "
                         f"{embedding.table_backend!r}")
    if embedding.table_rounding not in TABLE_ROUNDINGS:
        raise ValueError(f"{where}.embedding.table_rounding: must be one of {TABLE_ROUNDINGS}, got "
                         f"{embedding.table_rounding!r}")
    if embedding.tier is not None:
        from tf_fusedrec.distributed.tier import parse_tier  # noqa: PLC0415  (pure Python, no TensorFlow)

        parse_tier(embedding.tier, f"{where}.embedding")
        if embedding.table_backend != "native":
            raise ValueError(f"{where}.embedding.tier: needs table_backend native, got {embedding.table_backend!r}")
    for key, optional in (("admission_min_count", True), ("expiry_steps", True), ("expiry_interval", False)):
        value = getattr(embedding, key)
        if not (optional and value is None) and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{where}.embedding.{key}: must be a positive int{' or null' if optional else ''}, got "
                             f"{value!r}")
    train = _build(TrainConfig, raw.get("train"), f"{where}.train")
    if train.pipeline not in PIPELINES:
        raise ValueError(f"{where}.train.pipeline: must be one of {PIPELINES}, got {train.pipeline!r}")
    if not isinstance(train.cluster_samples, bool):
        raise ValueError(f"{where}.train.cluster_samples: must be true or false, got {train.cluster_samples!r}")
    for key in ("batch_size", "steps", "checkpoint_every", "log_every", "micro_batches"):
        value = getattr(train, key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{where}.train.{key}: must be a positive int, got {value!r}")
    full_every = train.checkpoint_full_every
    if isinstance(full_every, bool) or not isinstance(full_every, int) or full_every < 0 \
            or full_every % train.checkpoint_every:
        raise ValueError(f"{where}.train.checkpoint_full_every: must be 0 (every checkpoint full) or a positive "
                         f"multiple of train.checkpoint_every ({train.checkpoint_every}), got {full_every!r}")
    features = _expand_features(raw["features"], raw.get("feature_defaults") or {}, where)
    try:  # as the train app's layer will resolve them: train.sparse_optimizer and the default initializer
        shared_rows([f.to_feature() for f in features], optimizer_spec(train.sparse_optimizer,
                                                                       f"{where}.train.sparse_optimizer"),
                    default_initializer())
    except ValueError as e:
        raise ValueError(f"{where}.features: {e}") from None
    config = ExperimentConfig(name=raw.get("name", where), features=features, data=data, model=model, train=train,
                              embedding=embedding)
    sequence = _check_sequences(config, where) if data.sequential else None
    if data.source in FILE_SOURCES:
        from tf_fusedrec.data import files  # noqa: PLC0415  (config imports the data modules, never the reverse)

        data.schema = files.parse_schema(data.schema, data.source, [f.name for f in features], f"{where}.data.schema",
                                         sequence=sequence)
        if "num_dense" not in (raw.get("data") or {}):
            data.num_dense = len(data.schema.dense)
        elif data.num_dense != len(data.schema.dense):
            raise ValueError(f"{where}.data.num_dense: {data.num_dense}, but data.schema.dense names "
                             f"{len(data.schema.dense)} column(s); leave num_dense out (it follows the schema)")
    return config


def _check_file_source(data, raw, where):
    """data.schema, eval_path, on_bad_record and max_bad_records: for the FILE_SOURCES only, of the right kinds (the
    schema itself is parsed against the features, by data.files.parse_schema)."""
    if data.source not in FILE_SOURCES:
        given = [k for k in ("schema", "eval_path", "on_bad_record", "max_bad_records", "follow", "poll_seconds",
                             "idle_timeout_seconds", "follow_marker") if k in (raw.get("data") or {})]
        if given:
            raise ValueError(f"{where}.data.{given[0]}: only for the file sources {FILE_SOURCES}, not "
                             f"{data.source!r}")
        return
    if data.schema is None:
        raise ValueError(f"{where}.data.schema: required for source {data.source!r} (the columns of the features "
                         f"and the label; docs/guide/your-data.md)")
    if data.on_bad_record not in ("error", "skip"):
        raise ValueError(f"{where}.data.on_bad_record: must be 'error' or 'skip', got {data.on_bad_record!r}")
    value = data.max_bad_records
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}.data.max_bad_records: must be an int >= 0, got {value!r}")
    if data.eval_path is not None and not isinstance(data.eval_path, (str, tuple)):
        raise ValueError(f"{where}.data.eval_path: expected a file, a glob or a list of them, got {data.eval_path!r}")
    _check_follow(data, raw, where)


def _check_follow(data, raw, where):
    """data.follow and its settings (data.follow.FollowSettings checks their values)."""
    if not isinstance(data.follow, bool):
        raise ValueError(f"{where}.data.follow: must be true or false, got {data.follow!r}")
    if not data.follow:
        given = [k for k in ("poll_seconds", "idle_timeout_seconds", "follow_marker") if k in (raw.get("data") or {})]
        if given:
            raise ValueError(f"{where}.data.{given[0]}: only with data.follow: true")
        return
    if data.sequences is not None:
        raise ValueError(f"{where}.data.follow: not with data.sequences (a sequence run resumes by reading its stream "
                         f"again from the start, which a followed directory need not still hold)")
    if not isinstance(data.path, str):
        raise ValueError(f"{where}.data.path: data.follow takes one directory or one glob pattern, got {data.path!r}")
    from tf_fusedrec.data.follow import FollowSettings  # noqa: PLC0415

    try:
        FollowSettings(data.poll_seconds, data.idle_timeout_seconds, data.follow_marker)
    except ValueError as e:
        raise ValueError(f"{where}.{e}") from None


def _check_grm_model(model, where):
    for key in ("num_blocks", "hidden_dim", "num_heads", "experts"):
        value = getattr(model, key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{where}.{key}: must be a positive int, got {value!r}")
    if model.hidden_dim % model.num_heads:
        raise ValueError(f"{where}.hidden_dim: must be a multiple of num_heads ({model.num_heads}), got "
                         f"{model.hidden_dim}")
    if isinstance(model.position_buckets, bool) or not isinstance(model.position_buckets, int) \
            or model.position_buckets < 0:
        raise ValueError(f"{where}.position_buckets: must be an int >= 0, got {model.position_buckets!r}")
    norm = model.attention_norm
    if norm != "causal" and (isinstance(norm, bool) or not isinstance(norm, int) or norm <= 0):
        raise ValueError(f"{where}.attention_norm: must be 'causal' or a positive int, got {norm!r}")
    if model.pooling not in ("last", "mean"):
        raise ValueError(f"{where}.pooling: must be 'last' or 'mean', got {model.pooling!r}")
    for key in ("expert_units", "tower_units"):
        units = getattr(model, key)
        if not isinstance(units, tuple) or not units or any(
                isinstance(u, bool) or not isinstance(u, int) or u <= 0 for u in units):
            raise ValueError(f"{where}.{key}: must be a non-empty list of positive ints, got {units!r}")


def _check_sequences(config, where):
    """The sequence section against the features: a sequence feature with combiner null, valid length knobs. -> The
    source's spec (a file source's: the data.files.FileSequence its schema is parsed with)."""
    from tf_fusedrec.data.files import FileSequence  # noqa: PLC0415  (op-free data modules only)
    from tf_fusedrec.data.movielens_seq import MovieLensSeqSpec  # noqa: PLC0415
    from tf_fusedrec.data.sequences import SequenceSpec  # noqa: PLC0415

    seq = config.data.sequences
    for f in config.features:
        # The GRM embeds every item of the history; the DLRM baseline pools it (combiner sum or mean: a bag).
        if f.name == seq.feature and config.model.name == "dlrm" and f.combiner not in ("sum", "mean"):
            raise ValueError(f"{where}.features ({f.name}): the DLRM pools the sequence feature, give it combiner "
                             f"sum or mean, got {f.combiner!r}")
        if f.name == seq.feature and config.model.name == "grm" and f.combiner is not None:
            raise ValueError(f"{where}.features ({f.name}): the sequence feature needs combiner null (one "
                             f"embedding per item), got {f.combiner!r}")
    spec = {"movielens_seq": MovieLensSeqSpec, "grm_synthetic": SequenceSpec}.get(config.data.source, FileSequence)
    try:
        return spec.from_config(config)
    except ValueError as e:
        raise ValueError(f"{where}.data.sequences: {e}") from None


def load_config(path):
    """Reads configs/*.yaml into an ExperimentConfig."""
    import yaml  # noqa: PLC0415

    with open(path) as f:
        raw = yaml.safe_load(f)
    return parse_config(raw, where=str(path))

"""The schema of a data set in files (``data.source: tfrecord | parquet | csv``): which column feeds which input.

    data:
      source: parquet                     # tfrecord | parquet | csv
      path: /data/clicks/*.parquet        # a file, a glob, or a list of them; files are read in sorted order
      schema:
        label: clicked                    # or {column: clicked, range: [0, 1]} (the default range)
        weight: importance                # optional: a float column, each record's sample weight (>= 0, finite)
        dense: [price, age_days]          # float columns, in this order -> "dense" float32 [B, 2]
        features:
          user_id: {type: int64}                          # column defaults to the feature name; shape one
          city: {column: city_name, type: string}         # strings are hashed to int64 ids in [0, 2**62)
          genres: {type: int64, shape: list, separator: "|"}   # separator: CSV only
          last_items: {type: int64, shape: fixed, length: 5}
          history: {type: int64, shape: list, order: history_times}   # ids sorted by their times (a list column)

**The batch dict** is the one the built-in sources give (tf_fusedrec/data/__init__.py): a feature of shape ``one``
is int64 ``[B]``, ``fixed`` int64 ``[B, length]``, ``list`` a ``tf.RaggedTensor`` int64 ``[B, None]`` (a missing value,
a null or an empty field, is an empty row); ``"dense"`` float32 ``[B, len(dense)]`` when ``dense`` names columns; the
label float32 ``[B]``. With ``weight``, the readers give ``(features, label, weight)`` batches (the Keras
``sample_weight`` convention), the weight float32 ``[B]``; without it ``(features, label)``. A ``string`` id is
``tf.strings.to_hash_bucket_fast(value, 2**62)``, the hash of the built-in Criteo and MovieLens readers, so converted
data gives the same ids. A list feature with ``order`` names a column holding as many integers as it holds ids (their
times, say): each record's ids are sorted by them (stable: ties keep their order in the list).

**Sequences** (``data.sequences`` with a file source: the GRM's user sequences, ``FileSequence``): its ``feature`` is
the history, shape ``list`` (with ``order`` when the lists are not stored oldest first), every other feature (the
target, the contexts) shape ``one``; ``label`` names two columns, ``[click, conversion]`` (labels float32 ``[B, 2]``);
no dense columns, no weight. A history longer than ``data.sequences.max_length`` is a bad record, or with ``truncate``
keeps its last (after the order: most recent) ``max_length`` ids. The train app reads such files as sample dicts, the
sequence sources' (readers.FileBatches.samples), for token-balanced batches.

This module holds the schema and its parsing only (no file access; TensorFlow only where a sequence schema takes the
sequence sources' names): the readers (readers.py) check the files against it when they start and read them.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
from typing import Optional, Tuple

FILE_SOURCES = ("tfrecord", "parquet", "csv")
ID_TYPES = ("int64", "string")
SHAPES = ("one", "fixed", "list")
BAD_RECORD_POLICIES = ("error", "skip")
STRING_ID_BUCKETS = 2 ** 62  # the built-in readers' tf.strings.to_hash_bucket_fast(value, 2**62)

FilePosition = collections.namedtuple("FilePosition", ["epoch", "file", "record", "skipped", "name"],
                                      defaults=(0, 0))
FilePosition.__doc__ = """Where a file source's stream stands: the next record is record `record` (0-based) of file
`file` (the index in the sorted file list; following a directory, the count of files taken before it) in pass
`epoch`; `skipped` bad records were skipped before it. Following (data.follow), `name` is name_hash of that file's
name, which is how a resumed run finds it again (files before it may since have been deleted); else 0. The same
on every worker (each reads the whole stream and keeps its share), so it resumes the stream on any worker count."""


class BadRecordError(ValueError):
    """A record that does not fit the schema, naming the file and the record (or too many skipped ones)."""


@dataclasses.dataclass(frozen=True)
class FeatureColumn:
    """One feature's column: ``type`` int64 (ids >= 0) or string (hashed), ``shape`` one | fixed (``length`` ids) |
    list (any number, ``separator`` between them in a CSV field; none: the field is one id or empty; ``order``: the
    column of the ids' sort keys). The readers read an order column as a FeatureColumn of its own, named
    ``<feature>/order``, with ``orders`` naming its feature (FileSchema.id_columns)."""

    name: str
    column: str
    type: str = "int64"
    shape: str = "one"
    length: Optional[int] = None
    separator: Optional[str] = None
    order: Optional[str] = None
    orders: Optional[str] = None

    @property
    def owner(self):
        """What the column is read for, as error messages name it."""
        return f"feature '{self.name}'" if self.orders is None else f"the order of feature '{self.orders}'"


@dataclasses.dataclass(frozen=True)
class LabelColumn:
    """The label's column and its range: a record whose label is outside [low, high] (or missing) is bad."""

    column: str
    low: float = 0.0
    high: float = 1.0


@dataclasses.dataclass(frozen=True)
class FileSequence:
    """``data.sequences`` of a file source, as the readers apply it: the sequence feature (the history) and the cap on
    its lists (longer: a bad record, or with ``truncate`` its last ``max_length`` ids)."""

    feature: str
    max_length: int
    truncate: bool = False

    @classmethod
    def from_config(cls, config):
        """The sequence of an ExperimentConfig of a file source with ``data.sequences`` (tf_fusedrec.config): its
        feature and target among the features, none named as a sample dict's keys, the cap an int >= 1."""
        from tf_fusedrec.data.sequences import RESERVED_KEYS, sequence_section  # noqa: PLC0415  (TensorFlow)

        seq, by_name = sequence_section(config, config.data.source)
        if seq.target is not None and seq.target not in by_name:
            raise ValueError(f"target: {seq.target!r} is not among the features {sorted(by_name)}")
        reserved = [name for name in by_name if name in RESERVED_KEYS]
        if reserved:
            raise ValueError(f"feature '{reserved[0]}': the name is reserved for the sample dict ({RESERVED_KEYS})")
        if isinstance(seq.max_length, bool) or not isinstance(seq.max_length, int) or seq.max_length < 1:
            raise ValueError(f"max_length must be an int >= 1, got {seq.max_length!r}")
        if not isinstance(seq.truncate, bool):
            raise ValueError(f"truncate must be true or false, got {seq.truncate!r}")
        return cls(seq.feature, seq.max_length, seq.truncate)


@dataclasses.dataclass(frozen=True)
class FileSchema:
    """``data.schema``: the features' columns (in the order of config.features), the labels (one; two with a
    sequence), the dense columns and, for CSV, the field delimiter and the column names of header-less files."""

    features: Tuple[FeatureColumn, ...]
    labels: Tuple[LabelColumn, ...]
    dense: Tuple[str, ...] = ()
    delimiter: str = ","
    columns: Optional[Tuple[str, ...]] = None  # CSV: the names of the fields when the files have no header line
    weight: Optional[str] = None  # the sample weight's column (finite, >= 0; anything else is a bad record)
    sequence: Optional[FileSequence] = None  # with data.sequences: the history feature and its cap

    def feature(self, name):
        return next(f for f in self.features if f.name == name)

    def id_columns(self):
        """The columns of ids the readers parse: the features', then each order column, read like its feature."""
        return self.features + tuple(dataclasses.replace(f, name=f"{f.name}/order", column=f.order, type="int64",
                                                         order=None, orders=f.name)
                                     for f in self.features if f.order is not None)

    def used_columns(self):
        """Every column the schema reads, in a fixed order (ids, dense, labels, weight), without repeats."""
        return tuple(dict.fromkeys([f.column for f in self.id_columns()] + [c for _, c in self.number_columns()]))

    def number_columns(self):
        """(what, column) of the columns holding one number a record: ("dense", c) for each dense column, ("label",
        c) for each label and, with a sample weight, ("weight", its column)."""
        return [("dense", c) for c in self.dense] + [("label", label.column) for label in self.labels] + \
            ([("weight", self.weight)] if self.weight is not None else [])


SCHEMA_KEYS = ("features", "label", "weight", "dense", "delimiter", "columns")
_FEATURE_KEYS = ("column", "type", "shape", "length", "separator", "order")


def _name(value, where):
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}: expected a column name (a non-empty string), got {value!r}")
    return value


def parse_schema(raw, source, feature_names, where="data.schema", sequence=None):
    """A FileSchema from the mapping of a config's ``data.schema``.

    Args:
      raw: the mapping (see the module docstring).
      source: "tfrecord", "parquet" or "csv".
      feature_names: the config's feature names, in order: the schema must give each exactly one column.
      sequence: a FileSequence (FileSequence.from_config) when the config has data.sequences, else None.

    Raises:
      ValueError naming the key: unknown or missing keys, a type, shape, length, separator, order or range that is not
      allowed, a feature of the config without a column (or a column for a feature the config lacks), and with a
      sequence a shape, label, dense or weight that does not fit one (the module docstring).
    """
    if source not in FILE_SOURCES:
        raise ValueError(f"{where}: only for the file sources {FILE_SOURCES}, not {source!r}")
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping with 'features' and 'label', got {raw!r}")
    unknown = sorted(set(raw) - set(SCHEMA_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key '{unknown[0]}' (known keys: {sorted(SCHEMA_KEYS)})")
    for key in ("features", "label"):
        if key not in raw:
            raise ValueError(f"{where}: missing required key '{key}'")
    raw_features = raw["features"]
    if not isinstance(raw_features, dict) or not raw_features:
        raise ValueError(f"{where}.features: expected a mapping of feature name -> column spec, got {raw_features!r}")
    extra = sorted(set(raw_features) - set(feature_names))
    if extra:
        raise ValueError(f"{where}.features.{extra[0]}: not a feature of the config (features: {list(feature_names)})")
    missing = [n for n in feature_names if n not in raw_features]
    if missing:
        raise ValueError(f"{where}.features: feature '{missing[0]}' of the config has no column; add "
                         f"'{missing[0]}: {{column: ..., type: int64 | string}}'")
    features = tuple(_parse_feature(name, raw_features[name], source, f"{where}.features.{name}")
                     for name in feature_names)
    labels = _parse_labels(raw["label"], sequence, f"{where}.label")
    weight = _parse_weight(raw.get("weight"), f"{where}.weight")
    dense = raw.get("dense") or ()
    if not isinstance(dense, (list, tuple)):
        raise ValueError(f"{where}.dense: expected a list of column names, got {dense!r}")
    dense = tuple(_name(c, f"{where}.dense[{i}]") for i, c in enumerate(dense))
    if len(set(dense)) != len(dense):
        raise ValueError(f"{where}.dense: a column is named twice: {list(dense)}")
    delimiter = raw.get("delimiter", ",")
    columns = raw.get("columns")
    if source != "csv":
        for key in ("delimiter", "columns"):
            if key in raw:
                raise ValueError(f"{where}.{key}: only for source 'csv', not {source!r}")
    if not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in "\r\n\"":
        raise ValueError(f"{where}.delimiter: expected one character (not a quote or a line break), got {delimiter!r}")
    if columns is not None:
        if not isinstance(columns, (list, tuple)) or not columns:
            raise ValueError(f"{where}.columns: expected the list of the CSV fields' names, got {columns!r}")
        columns = tuple(_name(c, f"{where}.columns[{i}]") for i, c in enumerate(columns))
    if sequence is not None:
        _check_sequence(features, sequence, dense, weight, where)
    schema = FileSchema(features, labels, dense, delimiter, columns, weight, sequence)
    if columns is not None:
        absent = [c for c in schema.used_columns() if c not in columns]
        if absent:
            raise ValueError(f"{where}.columns: column '{absent[0]}' is read by the schema but not among the "
                             f"columns {list(columns)}")
    return schema


def _parse_feature(name, raw, source, where):
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping (column, type, shape, length, separator), got {raw!r}")
    unknown = sorted(set(raw) - set(_FEATURE_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key '{unknown[0]}' (known keys: {sorted(_FEATURE_KEYS)})")
    column = _name(raw.get("column", name), f"{where}.column")
    kind, shape = raw.get("type", "int64"), raw.get("shape", "one")
    if kind not in ID_TYPES:
        raise ValueError(f"{where}.type: must be one of {ID_TYPES} (int64 ids, or strings hashed to int64), got "
                         f"{kind!r}")
    if shape not in SHAPES:
        raise ValueError(f"{where}.shape: must be one of {SHAPES}, got {shape!r}")
    length = raw.get("length")
    if shape == "fixed":
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"{where}.length: shape 'fixed' needs a positive int length, got {length!r}")
    elif length is not None:
        raise ValueError(f"{where}.length: only for shape 'fixed', not {shape!r}")
    separator = raw.get("separator")
    if separator is not None:
        if source != "csv":
            raise ValueError(f"{where}.separator: only for source 'csv' (the other formats store lists as lists)")
        if shape == "one":
            raise ValueError(f"{where}.separator: a feature of shape 'one' holds one id; give shape list or fixed")
        if not isinstance(separator, str) or not separator:
            raise ValueError(f"{where}.separator: expected a non-empty string, got {separator!r}")
    elif source == "csv" and shape == "fixed":
        raise ValueError(f"{where}.separator: a CSV field of shape 'fixed' needs the separator between its ids")
    order = raw.get("order")
    if order is not None:
        if shape != "list":
            raise ValueError(f"{where}.order: only for shape 'list' (it sorts each record's ids), not {shape!r}")
        if _name(order, f"{where}.order") == column:
            raise ValueError(f"{where}.order: the column of the ids' sort keys, not the ids' own column {column!r}")
    return FeatureColumn(name, column, kind, shape, length, separator, order)


def _check_sequence(features, sequence, dense, weight, where):
    """A sequence schema: the history a list, every other feature one id per sample, no dense columns, no weight."""
    for f in features:
        if f.name == sequence.feature and f.shape != "list":
            raise ValueError(f"{where}.features.{f.name}.shape: the sequence feature (data.sequences.feature) is a "
                             f"history of any length: give shape list, got {f.shape!r}")
        if f.name != sequence.feature and f.shape != "one":
            raise ValueError(f"{where}.features.{f.name}.shape: with data.sequences every feature but the sequence "
                             f"'{sequence.feature}' holds one id a sample (the target, the contexts): give shape one, "
                             f"got {f.shape!r}")
    if dense:
        raise ValueError(f"{where}.dense: a sequence (data.sequences) has no dense features, got {list(dense)}")
    if weight is not None:
        raise ValueError(f"{where}.weight: sample weights are not taken with data.sequences (the sequence loss is the "
                         f"mean over every worker's samples)")


def _parse_labels(raw, sequence, where):
    """The label columns: one; with a sequence, a list of the tasks' (click, conversion)."""
    if sequence is None:
        if isinstance(raw, (list, tuple)):
            raise ValueError(f"{where}: a list of label columns is for sequences (data.sequences: click and "
                             f"conversion); give one column, got {raw!r}")
        return (_parse_label(raw, where),)
    from tf_fusedrec.data.sequences import TASKS  # noqa: PLC0415  (TensorFlow)

    if not isinstance(raw, (list, tuple)) or len(raw) != len(TASKS):
        raise ValueError(f"{where}: with data.sequences, the columns of the {len(TASKS)} tasks' labels "
                         f"{list(TASKS)}, a list such as [clicked, converted]; got {raw!r}")
    return tuple(_parse_label(r, f"{where}[{i}]") for i, r in enumerate(raw))


def _parse_label(raw, where):
    if isinstance(raw, str):
        raw = {"column": raw}
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a column name or {{column: ..., range: [low, high]}}, got {raw!r}")
    unknown = sorted(set(raw) - {"column", "range"})
    if unknown:
        raise ValueError(f"{where}: unknown key '{unknown[0]}' (known keys: ['column', 'range'])")
    if "column" not in raw:
        raise ValueError(f"{where}: missing required key 'column'")
    column = _name(raw["column"], f"{where}.column")
    bounds = raw.get("range", [0, 1])
    if (not isinstance(bounds, (list, tuple)) or len(bounds) != 2
            or any(isinstance(b, bool) or not isinstance(b, (int, float)) for b in bounds) or bounds[0] > bounds[1]):
        raise ValueError(f"{where}.range: expected [low, high] with low <= high, got {bounds!r}")
    return LabelColumn(column, float(bounds[0]), float(bounds[1]))


def _parse_weight(raw, where):
    if raw is None:
        return None
    if isinstance(raw, dict):
        unknown = sorted(set(raw) - {"column"})
        if unknown:
            raise ValueError(f"{where}: unknown key '{unknown[0]}' (known keys: ['column']; a weight is any finite "
                             f"number >= 0)")
        if "column" not in raw:
            raise ValueError(f"{where}: missing required key 'column'")
        raw = raw["column"]
    if not isinstance(raw, str) or not raw:
        raise ValueError(f"{where}: expected a column name or {{column: ...}}, got {raw!r}")
    return raw


def expand_paths(paths, what="data.path"):
    """The files of `paths` (a file, a glob pattern or a list of them), each pattern's matches sorted by name.

    Raises:
      FileNotFoundError naming a path or a pattern that matches no file; IsADirectoryError for a directory.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [os.fspath(p) for p in paths or ()]
    if not paths:
        raise ValueError(f"{what}: no files given")
    files = []
    for p in paths:
        if glob.has_magic(p):
            matched = sorted(m for m in glob.glob(p) if os.path.isfile(m))
            if not matched:
                raise FileNotFoundError(f"{what}: no file matches {p!r}")
            files.extend(matched)
        elif os.path.isdir(p):
            raise IsADirectoryError(f"{what}: {p!r} is a directory; give its files or a glob such as "
                                    f"{os.path.join(p, '*')!r}")
        elif not os.path.isfile(p):
            raise FileNotFoundError(f"{what}: file not found: {p!r}")
        else:
            files.append(p)
    return files

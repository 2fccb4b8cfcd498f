"""TFRecord, Parquet and CSV files read by a schema (files.py) into the built-in sources' batches.

    reader = FileBatches("parquet", "/data/clicks/*.parquet", schema, batch_size=2048, rank=r, num_ranks=n)
    ds = reader.dataset()              # endless (features, label) batches of this worker (+ weight: schema.weight)
    reader.position_after(steps)       # the FilePosition a checkpoint stores to resume after `steps` batches

**Formats.** TFRecord files of ``tf.train.Example`` (``tf.data.TFRecordDataset`` read in chunks, parsed with one
``tf.io.parse_example`` per chunk: ids in an ``int64_list`` or a ``bytes_list``, dense values and the label in a
``float_list``; a list feature may be absent from a record, an empty list). Parquet through pyarrow (the schema's
columns only, one record batch of a row group at a time: integer, string or binary columns for ids, lists of them for
shapes fixed and list, a null being a missing value; numeric columns for dense values and the label). CSV through
pyarrow's streaming CSV reader (a header line names the fields unless ``schema.columns`` does; every field read as a
string and converted per column; every line is a record, an empty line a record without values).

**Order and workers.** The stream is the records of the files in sorted order, pass after pass (``epochs``: how
many; None: endless). Every worker reads and checks the whole stream and cuts it into global batches of
``batch_size x num_ranks`` good records; worker ``rank`` keeps records ``rank, rank + num_ranks, ...`` of each (the
split of the built-in Criteo and MovieLens readers: on the same records their batches are equal). A FilePosition
after each global batch (file, record, pass, bad records skipped) is the same on every worker: a run resumed from
it, on any number of workers and any batch size, reads each record after it once and none before it again.

**Bad records.** A record that does not fit the schema (a TFRecord that is truncated or does not parse, a CSV line
with another number of fields or a value that is not a number, a null or missing value where one is needed, a list of
the wrong length, a negative id, a label outside its range, a sample weight that is negative or not finite, an order
column holding another number of values than its list holds ids, a history longer than the sequence's cap) raises
BadRecordError naming the file, the record and the problem, on every worker while it makes the global batch that
would hold the record (so at the same step everywhere; no batch holds a part of it). With ``on_bad_record="skip"``
the record is left out and counted (``skipped``) and the error comes once more than ``max_bad_records`` were skipped.
A truncated or corrupt TFRecord file cannot be read past the damage: skipping it skips the rest of that file (one bad
record).

**Following** (``follow``: a follow.FollowSettings; ``data.follow: true``): ``paths`` is one directory or glob whose
files keep arriving. The stream is one endless pass over the complete files in name order (follow.py: which files are
complete, how the workers agree on each next one through ``comm``), waiting for new ones, ended by the idle timeout
(the records after the last whole global batch are then left for a resumed run). Each file is checked when taken.
The FilePosition names the current file (``name``), so a resumed run continues in it even after older files were
deleted; ``skip_records`` (the held-out records) are the stream's first records.

**Sequences** (a schema with ``sequence``, files.py): each list with an ``order`` column is sorted by it and the
history capped as it is read; ``FileBatches.samples()`` gives this worker's records one at a time as the sequence
sources' sample dicts, labels float32 ``[2]``, for the token batcher (train/batching.py).

**At start** ``FileBatches`` checks every file against the schema (Parquet: the file's schema; TFRecord: its first
record; CSV: its header and first block): a missing column, a column of the wrong type (an id column holding
floats, say) is a ValueError naming the file, the column and what it holds.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tf_fusedrec.data.files import (BAD_RECORD_POLICIES, FILE_SOURCES, STRING_ID_BUCKETS, BadRecordError,
                                    FilePosition, expand_paths)
from tf_fusedrec.data.follow import Follower, Listing, name_hash

__all__ = ["FileBatches", "hash_string_ids"]

CHUNK_RECORDS = 8192  # records read and parsed at once (a TFRecord chunk, a Parquet record batch)


def hash_string_ids(values):
    """int64 ids of string ids: ``tf.strings.to_hash_bucket_fast(values, 2**62)``, what the built-in readers do."""
    return tf.strings.to_hash_bucket_fast(values, STRING_ID_BUCKETS)


def _hashed(values):
    """int64 NumPy ids of a NumPy array of string ids. Every reader hashes a chunk's string ids as it reads them, so
    the batches carry int64 arrays only (Python bytes objects carried to the batch were half of the TFRecord reader's
    time, a sixth in the garbage collector: benchmarks/results/data/profile_criteo_tfrecord.txt)."""
    if len(values) == 0:
        return np.zeros(0, np.int64)
    return hash_string_ids(tf.constant(values, tf.string)).numpy()


def _pyarrow():
    try:
        import pyarrow  # noqa: PLC0415
    except ImportError as e:  # pragma: no cover - pyarrow is a requirement
        raise ImportError("the parquet and csv sources read through pyarrow: pip install pyarrow") from e
    return pyarrow


# ---------------------------------------------------------------------------------------------------------------
# Chunks: consecutive records of one file, every column as (flat values, per-record lengths).
# ---------------------------------------------------------------------------------------------------------------


class _Chunk:
    """Records first .. first + n - 1 of file `file`: ids[name] = (flat values, lengths int64 [n]) per feature,
    (an order column's under "<feature>/order" until _check_values sorts by it), dense float32 [n, d], label float32
    [n, labels], weight float32 [n] (None without a weight column); bad: {row: what is wrong} (those rows' values are
    arbitrary)."""

    def __init__(self, file, first, n, ids, dense, label, bad, weight=None):
        self.file, self.first, self.n, self.ids, self.dense, self.label, self.bad, self.weight = \
            file, first, n, ids, dense, label, dict(bad), weight

    @classmethod
    def all_bad(cls, file, first, message, schema):
        ids = {f.name: (np.zeros(0, np.int64), np.zeros(1, np.int64)) for f in schema.id_columns()}
        return cls(file, first, 1, ids, np.zeros((1, len(schema.dense)), np.float32),
                   np.zeros((1, len(schema.labels)), np.float32),
                   {0: message}, np.zeros(1, np.float32) if schema.weight is not None else None)

    def mark(self, rows, message_of):
        for row in np.unique(rows).tolist():
            self.bad.setdefault(row, message_of(row))


def _offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])


def _take(values, lengths, rows):
    """(values, lengths) of rows `rows` (an int array) of a ragged column, vectorised."""
    lengths = np.asarray(lengths, np.int64)
    starts = _offsets(lengths)[:-1][rows]
    taken = lengths[rows]
    index = np.repeat(starts - _offsets(taken)[:-1], taken) + np.arange(int(taken.sum()), dtype=np.int64)
    return values[index], taken


def _check_values(chunk, schema):
    """Marks the records whose values break the schema: a count of ids its shape refuses, a negative id, a label
    outside its range, a sample weight that is negative or not finite; then sorts the lists that have an order column
    (_order) and caps a sequence's history (_cap)."""
    rows = np.arange(chunk.n)
    for f in schema.id_columns():
        values, lengths = chunk.ids[f.name]
        where = f"column '{f.column}' of {f.owner}"
        want = 1 if f.shape == "one" else f.length if f.shape == "fixed" else None
        if want is not None:
            wrong = rows[lengths != want]
            chunk.mark(wrong, lambda r, w=where, n=want: f"{w} has no value" if lengths[r] == 0 else
                       f"{w} holds {int(lengths[r])} ids, its shape {f.shape!r} takes {n}")
        if f.type == "int64" and f.orders is None and len(values):  # an order column holds sort keys, not ids
            negative = np.flatnonzero(values < 0)
            if len(negative):
                owner = np.repeat(rows, lengths)[negative]
                first = dict(zip(owner[::-1].tolist(), values[negative][::-1].tolist()))
                chunk.mark(owner, lambda r, w=where: f"{w} holds the negative id {first[r]} (int64 ids are >= 0)")
    for j, spec in enumerate(schema.labels):
        label = chunk.label[:, j]
        outside = rows[~((label >= spec.low) & (label <= spec.high))]
        chunk.mark(outside, lambda r, s=spec, y=label: f"the label (column '{s.column}') is {y[r]!r}, outside its "
                                                       f"range [{s.low:g}, {s.high:g}]")
    if schema.weight is not None:
        weight = chunk.weight
        wrong = rows[~(np.isfinite(weight) & (weight >= 0))]
        chunk.mark(wrong, lambda r: f"the sample weight (column '{schema.weight}') is {float(weight[r])!r}; a "
                                    f"weight is a finite number >= 0")
    for f in schema.features:
        if f.order is not None:
            _order(chunk, f)
    if schema.sequence is not None:
        _cap(chunk, schema.feature(schema.sequence.feature), schema.sequence)


def _order(chunk, f):
    """Sorts each record's ids of list feature `f` by its order column, stable (ties keep their order in the list); a
    record whose order column holds another number of values than it holds ids is bad."""
    values, lengths = chunk.ids[f.name]
    keys, counts = chunk.ids.pop(f.name + "/order")
    ok = counts == lengths
    chunk.mark(np.flatnonzero(~ok), lambda r: f"column '{f.order}' (the order of feature '{f.name}') holds "
                                              f"{int(counts[r])} values, column '{f.column}' {int(lengths[r])} ids")
    if not ok.all():  # a bad record's ids keep their order
        aligned = np.zeros(len(values), np.int64)
        aligned[np.repeat(ok, lengths)] = _take(keys, counts, np.flatnonzero(ok))[0]
        keys = aligned
    row = np.repeat(np.arange(chunk.n), lengths)
    if not np.all((np.diff(keys) >= 0) | (np.diff(row) != 0)):  # stored in order already: the usual case
        chunk.ids[f.name] = (values[np.lexsort((keys, row))], lengths)


def _cap(chunk, f, sequence):
    """A history longer than the sequence's max_length: a bad record, or with truncate its last max_length ids."""
    values, lengths = chunk.ids[f.name]
    cap = sequence.max_length
    if lengths.max(initial=0) <= cap:
        return
    if not sequence.truncate:
        chunk.mark(np.flatnonzero(lengths > cap),
                   lambda r: f"column '{f.column}' of feature '{f.name}' holds a history of {int(lengths[r])} ids, "
                             f"more than data.sequences.max_length = {cap}; raise it, or set truncate: true to keep "
                             f"the last {cap}")
        return
    row = np.repeat(np.arange(chunk.n), lengths)
    position = np.arange(len(values)) - _offsets(lengths)[:-1][row]
    chunk.ids[f.name] = (values[position >= (lengths - cap)[row]], np.minimum(lengths, cap))


# ---------------------------------------------------------------------------------------------------------------
# Parquet
# ---------------------------------------------------------------------------------------------------------------


def _arrow_kind(pa, t):
    """"int", "float", "string", "list:<kind>" or the type's name, of an Arrow type."""
    types = pa.types
    if types.is_list(t) or types.is_large_list(t) or types.is_fixed_size_list(t):
        return "list:" + _arrow_kind(pa, t.value_type)
    if types.is_integer(t):
        return "int"
    if types.is_floating(t) or types.is_decimal(t):
        return "float"
    if types.is_string(t) or types.is_large_string(t) or types.is_binary(t) or types.is_large_binary(t):
        return "string"
    return str(t)


_KIND_WORDS = {"int": "integers", "float": "floats", "string": "strings"}


def _type_error(feature_or_what, kind, path, column):
    """The complaint about a column of Arrow kind `kind` for a feature (a FeatureColumn) or a "dense", "label" or
    "weight" column, or None when it fits."""
    scalar = kind.removeprefix("list:")
    is_list = kind.startswith("list:")
    found = ("lists of " if is_list else "") + _KIND_WORDS.get(scalar, scalar)
    if isinstance(feature_or_what, str):  # dense or label: one number a record
        if is_list or scalar not in ("int", "float"):
            return f"file {path}: {feature_or_what} column '{column}' holds {found}, not numbers"
        return None
    f = feature_or_what
    where = f"file {path}: column '{column}' of {f.owner} (type {f.type}, shape {f.shape})"
    if f.orders is not None and scalar != "int":
        return f"{where} holds {found}, not integers"
    if f.type == "int64" and scalar != "int":
        hint = "; give it type: string to hash them to ids" if scalar == "string" else ""
        return f"{where} holds {found}, not integer ids{hint}"
    if f.type == "string" and scalar != "string":
        hint = "; give it type: int64" if scalar == "int" else ""
        return f"{where} holds {found}, not strings{hint}"
    if f.shape == "one" and is_list:
        return f"{where} holds lists; give it shape list or fixed"
    if f.shape == "fixed" and not is_list:
        return f"{where} holds one value per record, not lists; give it shape one or list"
    return None


class _ParquetFormat:
    def __init__(self, schema):
        self.pa = _pyarrow()
        import pyarrow.compute as pc  # noqa: PLC0415
        import pyarrow.parquet as pq  # noqa: PLC0415

        self.pc, self.pq, self.schema = pc, pq, schema

    def check(self, path):
        try:
            arrow_schema = self.pq.read_schema(path)
        except Exception as e:  # noqa: BLE001  (pyarrow's errors for a file that is not Parquet vary)
            raise ValueError(f"file {path}: not a readable Parquet file ({e})") from None
        names = arrow_schema.names
        s = self.schema
        for what, column in [(f, f.column) for f in s.id_columns()] + s.number_columns():
            if column not in names:
                owner = what.owner if not isinstance(what, str) else f"the {what} values"
                raise ValueError(f"file {path}: no column '{column}' (read for {owner}); the file has columns "
                                 f"{names}")
            error = _type_error(what, _arrow_kind(self.pa, arrow_schema.field(column).type), path, column)
            if error:
                raise ValueError(error)

    def count(self, path):
        return self.pq.ParquetFile(path).metadata.num_rows

    def chunks(self, index, path, start):
        parquet = self.pq.ParquetFile(path)
        meta = parquet.metadata
        first_group, group_start = 0, 0
        while first_group < meta.num_row_groups and group_start + meta.row_group(first_group).num_rows <= start:
            group_start += meta.row_group(first_group).num_rows
            first_group += 1
        if first_group == meta.num_row_groups:
            return
        position, drop = group_start, start - group_start
        batches = parquet.iter_batches(batch_size=CHUNK_RECORDS, columns=list(self.schema.used_columns()),
                                       row_groups=list(range(first_group, meta.num_row_groups)), use_threads=False)
        for batch in batches:
            if drop >= batch.num_rows:
                drop -= batch.num_rows
                position += batch.num_rows
                continue
            batch = batch.slice(drop)
            position += drop
            drop = 0
            yield self._chunk(index, path, position, batch)
            position += batch.num_rows

    def _chunk(self, index, path, first, batch):
        pa, pc, s = self.pa, self.pc, self.schema
        n, bad = batch.num_rows, {}
        ids = {}
        for f in s.id_columns():
            column = batch.column(f.column)
            if pa.types.is_list(column.type) or pa.types.is_large_list(column.type) or \
                    pa.types.is_fixed_size_list(column.type):
                lengths = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
                flat = column.flatten()
                if flat.null_count:
                    parents = pc.list_parent_indices(column).to_numpy(zero_copy_only=False)
                    for row in np.unique(parents[flat.is_null().to_numpy(zero_copy_only=False)]).tolist():
                        bad.setdefault(row, f"column '{f.column}' of {f.owner} holds a null in its list")
                    flat = flat.fill_null(0 if f.type == "int64" else "")
            else:
                valid = column.is_valid()
                lengths = valid.to_numpy(zero_copy_only=False).astype(np.int64)
                flat = column.filter(valid) if column.null_count else column
            values = flat.to_numpy(zero_copy_only=False)
            ids[f.name] = (values.astype(np.int64) if f.type == "int64" else _hashed(values), lengths)
        dense = np.zeros((n, len(s.dense)), np.float32)
        for j, name in enumerate(s.dense):
            column = batch.column(name)
            for row in np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False)).tolist():
                bad.setdefault(row, f"dense column '{name}' has no value")
            dense[:, j] = column.fill_null(0).to_numpy(zero_copy_only=False)
        numbers = {}
        for what, name in s.number_columns()[len(s.dense):]:  # the label and the weight: one number a record
            column = batch.column(name)
            for row in np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False)).tolist():
                bad.setdefault(row, f"the {'label' if what == 'label' else 'sample weight'} (column '{name}') has "
                                    f"no value")
            numbers[name] = column.fill_null(0).to_numpy(zero_copy_only=False).astype(np.float32)
        label = np.stack([numbers[c.column] for c in s.labels], axis=1)
        return _Chunk(index, first, n, ids, dense, label, bad, numbers.get(s.weight))

    def where(self, path, record):
        return f"Parquet file {path} row {record + 1}"


# ---------------------------------------------------------------------------------------------------------------
# TFRecord
# ---------------------------------------------------------------------------------------------------------------

_TF_KINDS = {"int64_list": "int", "float_list": "float", "bytes_list": "string"}

# The chunks' TFRecordDataset without tf.data's autotuning: nothing in it is tuned (no parallelism, no prefetch),
# yet the model timed each of its records, a sixth of the reading's CPU time (Criteo converted, 733 bytes a record).
_PLAIN_READ = tf.data.Options()
_PLAIN_READ.autotune.enabled = False


class _TFRecordFormat:
    def __init__(self, schema):
        self.schema = schema
        spec = {}
        for f in schema.id_columns():
            spec[f.column] = tf.io.RaggedFeature(tf.int64 if f.type == "int64" else tf.string,
                                                 row_splits_dtype=tf.int64)
        for _, column in schema.number_columns():
            spec[column] = tf.io.RaggedFeature(tf.float32, row_splits_dtype=tf.int64)
        self.spec = spec

    def check(self, path):
        first = None
        try:
            for record in tf.data.TFRecordDataset(path).take(1):
                first = record.numpy()
        except tf.errors.OpError as e:
            raise ValueError(f"file {path}: not a readable TFRecord file ({e.message})") from None
        if first is None:
            return  # an empty file: nothing to check, nothing to read
        try:
            example = tf.train.Example.FromString(first)
        except Exception as e:  # noqa: BLE001  (protobuf's DecodeError)
            raise ValueError(f"file {path}: its first record is not a tf.train.Example ({e})") from None
        features = example.features.feature
        s = self.schema
        for what, column in [(f, f.column) for f in s.id_columns()] + s.number_columns():
            if column not in features:
                if not isinstance(what, str) and what.shape == "list":
                    continue  # an absent list is an empty one
                owner = what.owner if not isinstance(what, str) else f"the {what} values"
                raise ValueError(f"file {path}: its first record has no feature '{column}' (read for {owner}); it "
                                 f"has {sorted(features)}")
            kind = _TF_KINDS.get(features[column].WhichOneof("kind"), "nothing")
            if isinstance(what, str):
                error = None if kind == "float" else \
                    f"file {path}: {what} feature '{column}' holds {_KIND_WORDS.get(kind, kind)} (not a float_list)"
            else:
                error = _type_error(what, "list:" + kind if what.shape != "one" else kind, path, column)
            if error:
                raise ValueError(error)

    def count(self, path):
        return int(tf.data.TFRecordDataset(path).reduce(np.int64(0), lambda n, _: n + 1).numpy())

    def chunks(self, index, path, start):
        first = start
        records = tf.data.TFRecordDataset(path)
        iterator = iter((records.skip(start) if start else records).batch(CHUNK_RECORDS).with_options(_PLAIN_READ))
        while True:
            try:
                serialized = next(iterator)  # a string tensor: parsed as it is, without a round trip through Python
            except StopIteration:
                return
            except tf.errors.DataLossError as e:  # the chunk holds a damaged record: read up to it, one by one
                readable = []
                try:
                    for record in tf.data.TFRecordDataset(path).skip(first):
                        readable.append(record.numpy())
                except tf.errors.DataLossError:
                    pass
                if readable:
                    yield self._chunk(index, first, np.array(readable, object))
                message = f"a truncated or corrupt TFRecord ({e.message.splitlines()[0]}); the rest of the file " \
                          f"cannot be read"
                yield _Chunk.all_bad(index, first + len(readable), message, self.schema)
                return
            yield self._chunk(index, first, serialized)
            first += int(serialized.shape[0])

    def _parse(self, serialized):
        parsed = tf.io.parse_example(tf.convert_to_tensor(serialized, tf.string), self.spec)
        # String ids hashed while still a tensor (_hashed: the batches carry int64 only).
        return {k: ((hash_string_ids(v.flat_values) if v.dtype == tf.string else v.flat_values).numpy(),
                    np.diff(v.row_splits.numpy())) for k, v in parsed.items()}

    def _chunk(self, index, first, serialized):
        n, bad = int(serialized.shape[0]), {}
        try:
            parsed = self._parse(serialized)
            good = np.arange(n)
        except tf.errors.InvalidArgumentError:  # find the records that do not parse, one by one
            for row in range(n):
                try:
                    self._parse(serialized[row:row + 1])
                except tf.errors.InvalidArgumentError as e:
                    bad[row] = f"not a tf.train.Example of the schema: {e.message.splitlines()[0]}"
            good = np.array([r for r in range(n) if r not in bad], np.int64)
            parsed = self._parse(tf.gather(serialized, good)) if len(good) else \
                {k: (np.zeros(0, np.int64 if v.dtype == tf.string else v.dtype.as_numpy_dtype), np.zeros(0, np.int64))
                 for k, v in self.spec.items()}

        def column(name):  # (values, lengths of every row): a bad row holds nothing
            values, lengths = parsed[name]
            full = np.zeros(n, np.int64)
            full[good] = lengths
            return values, full

        s = self.schema
        ids = {}
        for f in s.id_columns():
            values, lengths = column(f.column)
            ids[f.name] = (values, lengths)  # string ids hashed by _parse
        scalars = {}
        words = {"dense": "dense feature", "label": "the label", "weight": "the sample weight"}
        for kind, name in s.number_columns():
            values, lengths = column(name)
            for row in np.flatnonzero(lengths != 1).tolist():
                bad.setdefault(row, f"{words[kind]} '{name}' holds {int(lengths[row])} values, not 1")
            full = np.zeros(n, np.float32)
            ok = np.flatnonzero(lengths == 1)
            full[ok] = values[_offsets(lengths)[:-1][ok]]
            scalars[name] = full
        dense = np.stack([scalars[c] for c in s.dense], axis=1) if s.dense else np.zeros((n, 0), np.float32)
        weight = scalars[s.weight] if s.weight is not None else None
        label = np.stack([scalars[c.column] for c in s.labels], axis=1)
        return _Chunk(index, first, n, ids, dense, label, bad, weight)

    def where(self, path, record):
        return f"TFRecord file {path} record {record + 1}"


# ---------------------------------------------------------------------------------------------------------------
# CSV
# ---------------------------------------------------------------------------------------------------------------

_INT = r"^-?[0-9]{1,18}$|^[0-9]{19}$"  # negative ids parse, and are then bad records of their own
_FLOAT = r"^\s*[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?\s*$"
_INT64_MAX = str(2 ** 63 - 1)


class _CsvFormat:
    def __init__(self, schema):
        self.pa = _pyarrow()
        import pyarrow.compute as pc  # noqa: PLC0415
        import pyarrow.csv as pacsv  # noqa: PLC0415

        self.pc, self.csv, self.schema = pc, pacsv, schema
        self.header = 1 if schema.columns is None else 0

    def _open(self, path, start=0, invalid=None, columns=None):
        pa = self.pa

        def handler(row):
            invalid.append((row.number, row.actual_columns, row.text))
            return "skip"

        read = self.csv.ReadOptions(use_threads=False, block_size=1 << 20, column_names=self.schema.columns,
                                    skip_rows_after_names=start)
        parse = self.csv.ParseOptions(delimiter=self.schema.delimiter, ignore_empty_lines=False,
                                      invalid_row_handler=handler if invalid is not None else None)
        columns = list(self.schema.used_columns()) if columns is None else columns
        convert = self.csv.ConvertOptions(include_columns=columns, column_types={c: pa.string() for c in columns},
                                          strings_can_be_null=False, quoted_strings_can_be_null=False)
        return self.csv.open_csv(path, read_options=read, parse_options=parse, convert_options=convert)

    def check(self, path):
        try:
            reader = self._open(path, invalid=[], columns=[])
            names = reader.schema.names
        except Exception as e:  # noqa: BLE001  (pyarrow's ArrowInvalid and friends)
            raise ValueError(f"file {path}: not a readable CSV file ({e})") from None
        if self.schema.columns is None:
            names = self._header(path)
        s = self.schema
        for what, column in [(f, f.column) for f in s.id_columns()] + s.number_columns():
            if column not in names:
                owner = what.owner if not isinstance(what, str) else f"the {what} values"
                raise ValueError(f"file {path}: no column '{column}' (read for {owner}) in its header {names}")
        try:
            batch = next(iter(self._open(path, invalid=[])), None)
        except StopIteration:
            batch = None
        if batch is None:
            return
        pc = self.pc
        for what, column in [(f, f.column) for f in s.id_columns() if f.type == "int64"] + s.number_columns():
            values = batch.column(column)
            if not isinstance(what, str) and what.separator is not None:
                values = pc.list_flatten(pc.split_pattern(values, what.separator))
            values = values.filter(pc.not_equal(values, ""))
            if len(values) == 0:
                continue
            # The column's type, from its first lines: an id column with a float in them, or one (or a number
            # column) without one value of its type, is a wrong type; a stray wrong value later is a bad record.
            fits = pc.match_substring_regex(values, _INT if not isinstance(what, str) else _FLOAT)
            floats = pc.and_(pc.match_substring_regex(values, _FLOAT), pc.match_substring_regex(values, "[.eE]"))
            if isinstance(what, str):
                if not pc.any(fits).as_py():
                    raise ValueError(f"file {path}: {what} column '{column}' holds {values[0].as_py()!r}, not a "
                                     f"number, in its first lines")
            elif pc.any(floats).as_py():
                example = values.filter(floats)[0].as_py()
                raise ValueError(f"file {path}: column '{column}' of {what.owner} (type int64) holds floats, "
                                 f"not integer ids (e.g. {example!r} in its first lines)")
            elif not pc.any(fits).as_py():
                hint = "; give it type: string to hash them to ids" if what.orders is None else ", not integers"
                raise ValueError(f"file {path}: column '{column}' of {what.owner} (type int64) holds "
                                 f"strings ({values[0].as_py()!r} in its first lines){hint}")

    def _header(self, path):
        with open(path, "rb") as f:
            line = f.readline().decode("utf-8", "replace").rstrip("\r\n")
        return [name.strip('"') for name in line.split(self.schema.delimiter)]

    def count(self, path):
        invalid, rows = [], 0
        for batch in self._open(path, invalid=invalid, columns=[self.schema.labels[0].column]):
            rows += batch.num_rows
        return rows + len(invalid)

    def chunks(self, index, path, start):
        invalid = []
        first = start
        for batch in self._open(path, start=start, invalid=invalid):
            n = batch.num_rows + len(invalid)
            bad_rows = {number - 1 - self.header - first: (got, text) for number, got, text in invalid}
            invalid.clear()
            good = np.array([r for r in range(n) if r not in bad_rows], np.int64) if bad_rows else np.arange(n)
            chunk = self._chunk(index, first, n, good, batch)
            expected = len(self.schema.columns or self._header(path))
            for row, (got, text) in bad_rows.items():
                chunk.bad[row] = f"{got} fields, expected {expected}: {text[:200]!r}"
            yield chunk
            first += n

    def _ints(self, strings, where):
        """int64 values of decimal strings, and a mask of the ones that are not ids."""
        pc = self.pc
        try:  # the common case, all of them ids: Arrow's cast refuses what _INT does (but zero-padding past 19 digits)
            return pc.cast(strings, self.pa.int64()).to_numpy(zero_copy_only=False), np.zeros(len(strings), bool)
        except self.pa.ArrowInvalid:
            pass
        ok = pc.match_substring_regex(strings, _INT)
        long = pc.equal(pc.utf8_length(strings), 19)
        ok = pc.and_(ok, pc.or_(pc.invert(long), pc.less_equal(strings, _INT64_MAX)))
        values = pc.cast(pc.if_else(ok, strings, "0"), self.pa.int64()).to_numpy(zero_copy_only=False)
        return values, ~ok.to_numpy(zero_copy_only=False)

    def _chunk(self, index, first, n, good, batch):
        pc, s = self.pc, self.schema
        bad = {}

        def spread(values_of_good):  # a per-good-row array -> per-row, zeros in the bad rows
            full = np.zeros((n,) + values_of_good.shape[1:], values_of_good.dtype)
            full[good] = values_of_good
            return full

        def mark(rows, message):  # rows: indices among the good rows (the batch's); message(index)
            for i in np.unique(rows).tolist():
                bad.setdefault(int(good[i]), message(i))

        ids = {}
        for f in s.id_columns():
            strings = batch.column(f.column)
            where = f"column '{f.column}' of {f.owner}"
            if f.separator is not None:
                present = pc.not_equal(strings, "").to_numpy(zero_copy_only=False)
                parts = pc.split_pattern(strings, f.separator)
                lengths = np.where(present, pc.list_value_length(parts).to_numpy(zero_copy_only=False), 0)
                parents = pc.list_parent_indices(parts).to_numpy(zero_copy_only=False)
                keep = present[parents]
                flat = pc.list_flatten(parts).filter(self.pa.array(keep))
                parents = parents[keep]
            else:
                present = pc.not_equal(strings, "")
                flat = strings.filter(present)
                lengths = present.to_numpy(zero_copy_only=False).astype(np.int64)
                parents = np.flatnonzero(lengths)
            if f.type == "int64":
                values, wrong = self._ints(flat, where)
                texts = flat.to_pylist() if wrong.any() else None
                first_wrong = {}
                for i in np.flatnonzero(wrong)[::-1].tolist():
                    first_wrong[int(parents[i])] = texts[i]
                mark(parents[wrong], lambda i, w=where, fw=first_wrong: f"{w} holds {fw[i]!r}, not an int64 id")
            else:
                values = _hashed(flat.to_numpy(zero_copy_only=False))
                empty = np.flatnonzero(pc.equal(flat, "").to_numpy(zero_copy_only=False))
                mark(parents[empty], lambda i, w=where: f"{w} holds an empty id in its list")
            ids[f.name] = (values, spread(np.asarray(lengths, np.int64)))
        floats = {}
        words = {"dense": "dense", "label": "the label", "weight": "the sample weight"}
        for kind, column in s.number_columns():
            strings = batch.column(column)
            what = words[kind]
            try:  # the common case: every field a finite number (Arrow's cast also takes nan, inf: checked after)
                values = pc.cast(strings, self.pa.float64()).to_numpy(zero_copy_only=False)
                if np.isfinite(values).all():
                    floats[column] = spread(values.astype(np.float32))
                    continue
            except self.pa.ArrowInvalid:
                pass
            ok = pc.match_substring_regex(strings, _FLOAT).to_numpy(zero_copy_only=False)
            if not ok.all():
                texts = strings.to_pylist()
                mark(np.flatnonzero(~ok), lambda i, c=column, t=texts, w=what:
                     f"{w} column '{c}' holds {t[i]!r}, not a number" if t[i] else f"{w} column '{c}' has no value")
            cleaned = pc.if_else(self.pa.array(ok), pc.utf8_trim_whitespace(strings), "0")
            floats[column] = spread(pc.cast(cleaned, self.pa.float64()).to_numpy(zero_copy_only=False)
                                    .astype(np.float32))
        dense = np.stack([floats[c] for c in s.dense], axis=1) if s.dense else np.zeros((n, 0), np.float32)
        label = np.stack([floats[c.column] for c in s.labels], axis=1)
        return _Chunk(index, first, n, ids, dense, label, bad,
                      floats[s.weight] if s.weight is not None else None)

    def where(self, path, record):
        return f"CSV file {path} line {record + 1 + self.header}"


_FORMATS = {"tfrecord": _TFRecordFormat, "parquet": _ParquetFormat, "csv": _CsvFormat}


# ---------------------------------------------------------------------------------------------------------------
# The stream: chunks -> checked records -> global batches -> this worker's share
# ---------------------------------------------------------------------------------------------------------------


class FileBatches:
    """This worker's ``(features, label)`` batches of files by a schema; see the module docstring.

    Args:
      source: "tfrecord", "parquet" or "csv".
      paths: a file, a glob pattern, or a list of them.
      schema: a files.FileSchema (files.parse_schema).
      batch_size: records per worker and batch.
      rank, num_ranks: this worker's share.
      position: a FilePosition to start at (a checkpoint's); None: `start`'s records after the first `skip_records`.
      skip_records: without `position`, the stream starts after this many records of the first pass (the train
        app holds them out for evaluation); later passes start after them too.
      epochs: passes over the files; None: endless.
      limit: read only the first `limit` records of the first pass (the held-out records); None: no limit.
      on_bad_record: "error" or "skip"; max_bad_records: the skips allowed (counting those of `position`).
      follow: a follow.FollowSettings: follow `paths` (one directory or glob) as files arrive (the module docstring);
        None: the files there now, pass after pass.
      comm: following with several workers, the distributed.comm Comm they agree through (None: alone).
      on_wait: following, called with the seconds waited so far at each poll without a new file (follow.Follower).
    """

    def __init__(self, source, paths, schema, batch_size, rank=0, num_ranks=1, position=None, skip_records=0,
                 epochs=None, limit=None, on_bad_record="error", max_bad_records=0, follow=None, comm=None,
                 on_wait=None):
        if source not in FILE_SOURCES:
            raise ValueError(f"FileBatches: source must be one of {FILE_SOURCES}, got {source!r}")
        if on_bad_record not in BAD_RECORD_POLICIES:
            raise ValueError(f"FileBatches: on_bad_record must be one of {BAD_RECORD_POLICIES}, got "
                             f"{on_bad_record!r}")
        for name, value, low in (("batch_size", batch_size, 1), ("num_ranks", num_ranks, 1), ("rank", rank, 0),
                                 ("skip_records", skip_records, 0), ("max_bad_records", max_bad_records, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"FileBatches: {name} must be an int >= {low}, got {value!r}")
        if rank >= num_ranks:
            raise ValueError(f"FileBatches: rank {rank} is not below num_ranks {num_ranks}")
        self.source, self.schema = source, schema
        self.batch_size, self.rank, self.num_ranks = batch_size, rank, num_ranks
        self.epochs, self.limit = epochs, limit
        self.on_bad_record, self.max_bad_records = on_bad_record, max_bad_records
        self.format = _FORMATS[source](schema)
        self.follow, self.comm, self.on_wait = follow, comm, on_wait
        self._names = {}  # following: file index -> name_hash of the file's name
        self.follower = None
        if follow is not None:
            if epochs is not None or limit is not None:
                raise ValueError("FileBatches: a followed stream is one endless pass (no epochs, no limit)")
            self.listing = Listing(paths, follow.marker)
            self.files = {}  # file index -> path, of the files taken so far
            self.wrap = (0, 0)
            self._skip_first = skip_records if position is None else 0
            if position is not None and not FilePosition(*position).name and tuple(position)[1:3] != (0, 0):
                raise ValueError("data.follow: the checkpoint's stream position was written by a run that did not "
                                 "follow data.path (it counts files of a fixed list); start a new --model-dir")
        else:
            self.files = expand_paths(paths)
            for path in self.files:
                self.format.check(path)
            self.wrap = self._advance(skip_records) if skip_records else (0, 0)
        self.start = FilePosition(0, *self.wrap) if position is None else FilePosition(*position)
        self.skipped = self.start.skipped
        self._positions = []

    def _advance(self, records):
        """(file, record) after the first `records` records of a pass."""
        left = records
        for index, path in enumerate(self.files):
            count = self.format.count(path)
            if left < count:
                return index, left
            left -= count
        raise ValueError(f"data.path: {records} records are held out for evaluation, the files hold only "
                         f"{records - left}; give a smaller data.eval_batches or a data.eval_path")

    def _chunks(self):
        if self.follow is not None:
            yield from self._followed_chunks()
            return
        epoch, file, record = self.start[:3]
        remaining = self.limit
        while self.epochs is None or epoch < self.epochs:
            read = 0
            for index in range(file, len(self.files)):
                for chunk in self.format.chunks(index, self.files[index], record if index == file else 0):
                    if remaining is not None:
                        if remaining <= 0:
                            return
                        if chunk.n > remaining:
                            chunk = _records(chunk, 0, remaining)
                        remaining -= chunk.n
                    _check_values(chunk, self.schema)
                    read += chunk.n
                    yield epoch, chunk
            if read == 0 and self.epochs is None and (file, record) == self.wrap:
                raise ValueError(f"data.path: the {len(self.files)} file(s) hold no record to train on")
            epoch += 1
            file, record = self.wrap

    def _followed_chunks(self):
        """The chunks of the files as they arrive (one pass, epoch 0), from the start position on."""
        self.follower = follower = Follower(self.listing, self.follow, comm=self.comm, on_wait=self.on_wait)
        index, record = self.start.file, self.start.record
        taken = follower.find(self.start.name) if self.start.name else follower.next_after(None)
        skip = self._skip_first
        while taken is not None:
            name, path = taken
            self.files[index], self._names[index] = path, name_hash(name)
            self.format.check(path)
            for chunk in self.format.chunks(index, path, record):
                if skip >= chunk.n:
                    skip -= chunk.n
                    continue
                if skip:
                    chunk, skip = _records(chunk, skip, chunk.n), 0
                _check_values(chunk, self.schema)
                yield 0, chunk
            taken = follower.next_after(name)
            index, record = index + 1, 0

    def _global_batches(self, remainder=False):
        """(global batch pieces, FilePosition after the batch) of batch_size x num_ranks good records each; with
        `remainder`, a finite stream's good records after its last whole global batch make a last, smaller one."""
        size = self.batch_size * self.num_ranks
        pieces, have, skipped = [], 0, self.start.skipped
        good_in_pass, last_epoch = 0, self.start.epoch
        for epoch, chunk in self._chunks():
            if epoch != last_epoch:
                if good_in_pass == 0 and have == 0:
                    raise ValueError(f"data.path: a whole pass over {len(self.files)} file(s) found no good record")
                good_in_pass, last_epoch = 0, epoch
            bad_rows = sorted(chunk.bad)
            stop = None  # (row, error) where the stream must stop
            if bad_rows and self.on_bad_record == "error":
                stop = (bad_rows[0], self._bad(chunk, bad_rows[0]))
            elif bad_rows and skipped + len(bad_rows) > self.max_bad_records:
                row = bad_rows[self.max_bad_records - skipped]
                stop = (row, BadRecordError(f"more than data.max_bad_records = {self.max_bad_records} bad records "
                                            f"skipped; the last: {self._bad(chunk, row)}"))
            end = chunk.n if stop is None else stop[0]
            keep = np.ones(end, bool)
            keep[[r for r in bad_rows if r < end]] = False
            good = np.flatnonzero(keep)
            skipped_before = np.cumsum(~keep)  # bad rows up to and including each row
            pieces.append((epoch, chunk, good, skipped, skipped_before))
            have += len(good)
            good_in_pass += len(good)
            skipped += int(len(keep) - keep.sum())
            while have >= size:
                batch, pieces, position = self._cut(pieces, size)
                have -= size
                self.skipped = position.skipped
                yield batch, position
            if stop is not None:
                raise stop[1]
        if remainder and have:
            batch, _, position = self._cut(pieces, have)
            self.skipped = position.skipped
            yield batch, position

    def _bad(self, chunk, row):
        return BadRecordError(f"{self.format.where(self.files[chunk.file], chunk.first + row)}: {chunk.bad[row]}")

    def _cut(self, pieces, size):
        """The first `size` good records of `pieces`: this worker's rows of each piece, the rest, the position."""
        taken, offset = [], 0
        while offset < size:
            epoch, chunk, good, skipped, skipped_before = pieces[0]
            need = size - offset
            if len(good) > need:
                pieces[0] = (epoch, chunk, good[need:], skipped, skipped_before)
                good = good[:need]
            else:
                pieces = pieces[1:]
            mine = good[(self.rank - offset) % self.num_ranks::self.num_ranks]
            taken.append((chunk, mine))
            offset += len(good)
            if len(good):  # a piece of bad records only (a damaged TFRecord's rest, say) moves no position
                last = good[-1]
                position = FilePosition(epoch, chunk.file, chunk.first + int(last) + 1,
                                        skipped + int(skipped_before[last]), self._names.get(chunk.file, 0))
        return taken, pieces, position

    def _worker_batch(self, taken):
        """This worker's numpy batch of the pieces `_cut` took: per feature its values (+ "/lengths" for lists),
        "dense", "label" (+ "weight")."""
        out = {}
        for f in self.schema.features:
            parts = [_take(*chunk.ids[f.name], rows) for chunk, rows in taken]
            values = np.concatenate([p[0] for p in parts])
            if f.shape == "one":
                out[f.name] = values
            elif f.shape == "fixed":
                out[f.name] = values.reshape(-1, f.length)
            else:
                out[f.name] = values
                out[f.name + "/lengths"] = np.concatenate([p[1] for p in parts])
        out["dense"] = np.concatenate([chunk.dense[rows] for chunk, rows in taken])
        out["label"] = np.concatenate([chunk.label[rows] for chunk, rows in taken])
        if self.schema.weight is not None:
            out["weight"] = np.concatenate([chunk.weight[rows] for chunk, rows in taken])
        return out

    def _signature(self):
        """The spec of _generate's tuples."""
        lists = sum(f.shape == "list" for f in self.schema.features)
        spec = (tf.TensorSpec([None], tf.int64), tf.TensorSpec([len(self.schema.features)], tf.int64),
                tf.TensorSpec([lists, None], tf.int64), tf.TensorSpec([None, len(self.schema.dense)], tf.float32),
                tf.TensorSpec([None, len(self.schema.labels)], tf.float32))
        return spec + ((tf.TensorSpec([None], tf.float32),) if self.schema.weight is not None else ())

    def _generate(self):
        """This worker's batches packed in a few arrays, each of which costs from_generator its own conversion and
        checks (per batch of Criteo's 26 list features, 54 arrays took 0.8 ms, 5 take 0.3): ids (every feature's
        ids, flat, one feature after the other, int64), counts (how many ids each feature has, int64 [F]), splits
        (the row splits of the list features, int64 [lists, B + 1]: a RaggedTensor made of them costs no op, of row
        lengths five), dense, label (+ weight). dataset() unpacks them."""
        features = self.schema.features
        lists = [f for f in features if f.shape == "list"]
        weighted = self.schema.weight is not None
        self._positions = []
        for taken, position in self._global_batches():
            self._positions.append(position)
            batch = self._worker_batch(taken)
            ids = [batch[f.name].reshape(-1) for f in features]
            splits = [_offsets(batch[f.name + "/lengths"]) for f in lists]
            packed = (np.concatenate(ids) if ids else np.zeros(0, np.int64),
                      np.array([len(v) for v in ids], np.int64),
                      np.stack(splits) if splits else np.zeros((0, len(batch["label"]) + 1), np.int64),
                      batch["dense"], batch["label"])
            yield packed + ((batch["weight"],) if weighted else ())

    def dataset(self):
        """The batches from the start position on: ``(features, label)``, features as the module docstring says, or
        ``(features, label, weight)`` with a sample-weight column (weight float32 [B]). Iterate it once per
        FileBatches when checkpointing (position_after describes the latest pass)."""
        features = self.schema.features
        lists = sum(f.shape == "list" for f in features)
        has_dense = bool(self.schema.dense)
        one_label = len(self.schema.labels) == 1

        def finish(ids, counts, splits, dense, label, *weight):  # _generate's arrays -> the batch
            values = tf.split(ids, counts, num=len(features)) if features else []
            row_splits = iter(tf.unstack(splits, num=lists))
            out = {}
            for f, v in zip(features, values):
                if f.shape == "fixed":
                    v = tf.reshape(v, [-1, f.length])
                elif f.shape == "list":
                    v = tf.RaggedTensor.from_row_splits(v, next(row_splits), validate=False)
                out[f.name] = v
            if has_dense:
                out["dense"] = dense
            return (out, label[:, 0] if one_label else label) + weight

        ds = tf.data.Dataset.from_generator(self._generate, output_signature=self._signature())
        return ds.map(finish, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(tf.data.AUTOTUNE)

    def samples(self, start=0):
        """This worker's records one at a time, from the start position on, as the sequence sources' sample dicts
        (data/sequences.py) of a schema with a sequence: the sequence feature int64 [L] (ordered and capped), every
        other feature int64 [] (strings hashed), "labels" float32 [2] and "tokens" L. Its records are those
        dataset() gives it (records rank, rank + num_ranks, ... of each global batch; batch_size: how many it reads
        at once), and a finite stream's last records too. `start`: the stream from its start-th sample on (the
        records before it are read again, not made into samples)."""
        if self.schema.sequence is None:
            raise ValueError("FileBatches.samples: the schema has no sequence (data.sequences)")
        history = self.schema.sequence.feature
        skip = start
        for taken, _ in self._global_batches(remainder=self.epochs is not None):
            n = sum(len(rows) for _, rows in taken)
            if skip >= n:
                skip -= n
                continue
            batch = self._worker_batch(taken)
            ids = {f.name: batch[f.name] for f in self.schema.features}
            splits = _offsets(batch[history + "/lengths"])
            contexts = [(name, values) for name, values in ids.items() if name != history]
            for i in range(skip, n):
                sample = {"tokens": int(splits[i + 1] - splits[i]), history: ids[history][splits[i]:splits[i + 1]]}
                for name, values in contexts:
                    sample[name] = values[i]
                sample["labels"] = batch["label"][i]
                yield sample
            skip = 0

    def position_after(self, batches):
        """The FilePosition after the first `batches` batches of the dataset (whatever tf.data made ahead)."""
        if batches == 0:
            return self.start
        if not 0 < batches <= len(self._positions):
            raise ValueError(f"position_after({batches}): {len(self._positions)} batches were made")
        return self._positions[batches - 1]


def _records(chunk, start, stop):
    """Records start..stop-1 of a chunk, as a chunk."""
    ids = {}
    for name, (values, lengths) in chunk.ids.items():
        ids[name] = (values[int(lengths[:start].sum()):int(lengths[:stop].sum())], lengths[start:stop])
    return _Chunk(chunk.file, chunk.first + start, stop - start, ids, chunk.dense[start:stop], chunk.label[start:stop],
                  {r - start: m for r, m in chunk.bad.items() if start <= r < stop},
                  None if chunk.weight is None else chunk.weight[start:stop])

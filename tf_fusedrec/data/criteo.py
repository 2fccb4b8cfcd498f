"""Criteo Kaggle / Terabyte click logs (TSV) as a streaming tf.data pipeline.

    ds = criteo_dataset("/data/criteo/train.txt", batch_size=2048, rank=hvd.rank(), num_ranks=hvd.size())
    # or the Terabyte days in order: criteo_dataset([f"/data/day_{d}.gz" for d in range(23)], 2048, ...)

**Format.** One example per line: ``label \\t I1 ... I13 \\t C1 ... C26`` (``num_dense`` integer fields, ``num_sparse``
categorical fields of 8 hex digits), a missing value being an empty field. Lines may end in ``\\r\\n``. Files whose
name ends in ``.gz`` are read as gzip. ``paths`` may hold glob patterns (expanded in sorted order).

**Features.** ``"dense"``: float32 ``[B, num_dense]``, ``log(1 + max(x, 0))`` with a missing value read as 0 (the
usual DLRM preprocessing). ``"C1"`` .. ``"C26"``: ``tf.RaggedTensor`` int64 ``[B, None]`` with one id per row, or
no id (an empty row) where the value is missing; the id is ``tf.strings.to_hash_bucket_fast(value, 2**62)`` (a 64-bit
fingerprint of the string modulo 2**62: ids are in ``[0, 2**62)``, equal strings give equal ids, and two distinct
values of a feature collide with probability ~2**-62 per pair, i.e. never in practice). An embedding layer with a
``"sum"``/``"mean"`` combiner gives zeros for a missing value. ``label``: float32 ``[B]`` in {0, 1}.

**Order and workers.** The global stream is the lines of the files in the given order (``shuffle=True``: the file
order is shuffled once with ``seed``, the same on every worker, and consecutive files are interleaved line by line
``min(4, files)`` at a time). Worker ``rank`` keeps the lines ``rank, rank + num_ranks, ...`` of that stream (every
worker reads all of it: the split is exact and needs no line counts), shuffles them (``shuffle=True``: a buffer of
``shuffle_buffer`` lines, reshuffled each epoch) and batches ``batch_size`` lines with ``drop_remainder=True``: the
workers' shares are disjoint, their union is the stream less at most ``batch_size`` lines per worker, and every
worker does ``floor(lines_of_rank / batch_size)`` steps (equal across workers up to one when ``num_ranks`` does not
divide the line count; pass ``.take(steps)`` to be exact). One pass; ``.repeat()`` for more.

**Errors.** A missing file raises ``FileNotFoundError`` naming it (when the dataset is built). A line with the wrong
number of fields, a label other than 0/1, or a non-integer dense value raises ``tf.errors.InvalidArgumentError`` when
its batch is parsed; the field-count and label messages name the file, the line number (1-based) and the line.
"""

from __future__ import annotations

import glob
import os
from typing import Sequence, Union

import tensorflow as tf

__all__ = ["CRITEO_DENSE", "CRITEO_SPARSE", "criteo_dataset"]

CRITEO_DENSE = [f"I{i}" for i in range(1, 14)]     # the order of the columns of "dense"
CRITEO_SPARSE = [f"C{i}" for i in range(1, 27)]
HASH_BUCKETS = 2 ** 62
_LINES_PER_FILE = 2 ** 40


def _expand(paths: Union[str, Sequence[str]]) -> list[str]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ValueError("criteo_dataset: no paths given")
    files = []
    for p in paths:
        if glob.has_magic(p):
            matched = sorted(m for m in glob.glob(p) if os.path.isfile(m))
            if not matched:
                raise FileNotFoundError(f"Criteo data: no file matches {p!r}")
            files.extend(matched)
        elif os.path.isdir(p):
            raise IsADirectoryError(f"Criteo data: {p!r} is a directory; pass the TSV files (or a glob pattern)")
        elif not os.path.isfile(p):
            raise FileNotFoundError(f"Criteo data file not found: {p!r}")
        else:
            files.append(p)
    return files


def _check_int(name, value, low, high=None):
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        rng = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"criteo_dataset: {name} must be an int {rng}, got {value!r}")
    return value


def criteo_dataset(paths: Union[str, Sequence[str]], batch_size: int, rank: int = 0, num_ranks: int = 1,
                   num_dense: int = 13, num_sparse: int = 26, shuffle: bool = False, seed: int = 0,
                   shuffle_buffer: int = 100_000) -> tf.data.Dataset:
    """This worker's ``(features, label)`` batches of Criteo TSV files; see the module docstring."""
    files = _expand(paths)
    batch_size = _check_int("batch_size", batch_size, 1)
    num_ranks = _check_int("num_ranks", num_ranks, 1)
    rank = _check_int("rank", rank, 0, num_ranks - 1)
    num_dense = _check_int("num_dense", num_dense, 0)
    num_sparse = _check_int("num_sparse", num_sparse, 0)
    shuffle_buffer = _check_int("shuffle_buffer", shuffle_buffer, 1)
    seed = _check_int("seed", seed, 0)
    num_fields = 1 + num_dense + num_sparse
    sparse_names = [f"C{i}" for i in range(1, num_sparse + 1)]
    compression = ["GZIP" if f.endswith(".gz") else "" for f in files]

    def read(index, path, comp):
        # (file index << 40 | 0-based line number, line): a zip with a range, no per-line function call.
        start = index * _LINES_PER_FILE
        return tf.data.Dataset.zip((tf.data.Dataset.range(start, start + _LINES_PER_FILE),
                                    tf.data.TextLineDataset(path, compression_type=comp)))

    ds = tf.data.Dataset.from_tensor_slices((tf.range(len(files), dtype=tf.int64), files, compression))
    if shuffle and len(files) > 1:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=False)
    cycle = min(4, len(files)) if shuffle else 1
    ds = ds.interleave(read, cycle_length=cycle, block_length=1)
    ds = ds.shard(num_ranks, rank)
    if shuffle:
        ds = ds.shuffle(shuffle_buffer, seed=seed + rank, reshuffle_each_iteration=True)
    ds = ds.batch(batch_size, drop_remainder=True)
    file_names = tf.constant(files)

    def parse(code, line):
        def where(i):   # "file F line N" of row i of the batch (1-based line number)
            return ["file ", file_names[code[i] // _LINES_PER_FILE], " line ",
                    tf.strings.as_string(code[i] % _LINES_PER_FILE + 1)]

        # "\r\n" line endings: drop the "\r" (checked first: the usual files have none and skip the rewrite).
        last_char = tf.strings.substr(line, tf.maximum(tf.strings.length(line) - 1, 0), tf.ones_like(code, tf.int32))
        line = tf.cond(tf.reduce_any(tf.equal(last_char, "\r")),
                       lambda: tf.strings.regex_replace(line, "\r$", ""), lambda: line)
        fields = tf.strings.split(line, "\t")
        counts = fields.row_lengths()
        bad = tf.math.argmax(tf.cast(tf.not_equal(counts, num_fields), tf.int32), output_type=tf.int64)
        check = tf.debugging.Assert(tf.reduce_all(tf.equal(counts, num_fields)), [tf.strings.join([
            f"Criteo: expected {num_fields} tab-separated fields (label, {num_dense} integer, {num_sparse} "
            "categorical) per line; ", *where(bad), " has ", tf.strings.as_string(counts[bad]), " fields: ",
            tf.strings.substr(line[bad], 0, 300)])])
        with tf.control_dependencies([check]):
            cols = tf.reshape(fields.flat_values, [batch_size, num_fields])   # every row has num_fields

        label = tf.strings.to_number(cols[:, 0], tf.float32)
        bad_label = tf.math.argmax(tf.cast((label != 0.0) & (label != 1.0), tf.int32), output_type=tf.int64)
        check_label = tf.debugging.Assert(tf.reduce_all((label == 0.0) | (label == 1.0)), [tf.strings.join([
            "Criteo: the label (first field) must be 0 or 1; ", *where(bad_label), " has label ",
            cols[bad_label, 0]])])
        with tf.control_dependencies([check_label]):
            label = tf.identity(label)
        features = {}
        if num_dense:
            d = cols[:, 1:1 + num_dense]
            d = tf.strings.to_number(tf.where(tf.equal(d, ""), "0", d), tf.float64)
            features["dense"] = tf.cast(tf.math.log1p(tf.maximum(d, 0.0)), tf.float32)
        if num_sparse:
            c = cols[:, 1 + num_dense:]                                  # [B, num_sparse]
            present = tf.transpose(tf.not_equal(c, ""))                 # [num_sparse, B]
            ids = tf.boolean_mask(tf.transpose(tf.strings.to_hash_bucket_fast(c, HASH_BUCKETS)), present)
            lengths = tf.cast(present, tf.int64)                        # 0 or 1 id per row
            per_feature = tf.split(ids, tf.reduce_sum(lengths, axis=1), num=num_sparse)
            for j, name in enumerate(sparse_names):
                features[name] = tf.RaggedTensor.from_row_lengths(per_feature[j], lengths[j], validate=False)
        return features, label

    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(tf.data.AUTOTUNE)

"""Writes the built-in data sets (the Criteo TSV, MovieLens-1M, MovieLens-1M sequences) as TFRecord, Parquet or CSV
files with their schema, for the file sources.

    python -m tf_fusedrec.data.convert criteo train.txt --to parquet --out /data/criteo_parquet --files 8
    # -> /data/criteo_parquet/part-00000-of-00008.parquet ... and schema.yaml, the config's `data:` section
    python -m tf_fusedrec.data.convert movielens /data/ml-1m --to parquet --out /data/ml1m_parquet --shuffle 0
    # -> /data/ml1m_parquet/train/part-*.parquet, test/part-*.parquet (data.eval_path) and schema.yaml
    python -m tf_fusedrec.data.convert movielens_seq /data/ml-1m --to parquet --out /data/ml1m_seq --max-length 200

The records keep their order (file k holds the k-th run of them), and the values are those the built-in reader
(data/criteo.py) makes: the label (float32), the dense features already as ``log(1 + max(x, 0))`` (float32 columns
I1..I13, a missing value 0), the categorical values as the hex strings of the TSV (string columns C1..C26, null or
absent where missing; the schema gives them type string, shape list: hashed like the built-in reader, an empty row
where missing). The file sources then give the same batches as ``data.source: criteo`` on the same records.
TFRecord records are ``tf.train.Example``s (a missing value: no feature); CSV files have a header line.

**MovieLens** (data/movielens.py): one record a rating, the features the built-in reader joins from users.dat and
movies.dat: int64 columns user_id, movie_id, gender, age, occupation; zip as the string of users.dat (type string:
hashed like the built-in reader); genres a list of genre ids (in CSV joined by ``|``); label float32 (rating >= 4).
The ratings of the built-in test split (``movielens_is_test`` with ``--test-fraction`` and ``--seed``, as data.seed)
go to ``test/``, the schema's ``eval_path``, the others to ``train/``, in the order of ratings.dat: with
``data.shuffle: false`` the built-in source then gives the same batches. The built-in source shuffles each worker's
training ratings by default (ratings.dat is sorted by user) and the file sources read in file order, so
``--shuffle SEED`` writes the training ratings in a seeded random order instead.

**MovieLens sequences** (data/movielens_seq.py): one record a sample of the built-in ``movielens_seq`` source, the
histories whole or, with ``--max-length N``, their last N movies (its ``truncate``): ``items`` the history's MovieIDs
oldest first and ``items_time`` their Timestamps (a list each; in CSV joined by ``|``), ``target``, the user's
``user_id``, ``gender``, ``age``, ``occupation`` (int64) and ``zip`` (its string), ``click`` and ``conversion``
(float32, rating >= 4 and rating == 5). The schema reads the features of configs/movielens1m_seq.yaml (``items``
ordered by ``items_time``, ``target``, the contexts gender, age, occupation: add ``user_id`` or ``zip`` for a config
with those) and the labels ``[click, conversion]``; the data section adds ``data.sequences``. The built-in test split
(``--test-fraction``) goes to ``test/``, the rest to ``train/``, each in the order of the built-in source's first
pass over it with ``data.seed`` = ``--seed`` (its shuffled first training epoch, its shuffled held-out pass): the
first pass over the files gives the built-in source's samples in its order (the built-in source shuffles every
epoch anew; the files repeat theirs).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

FORMATS = {"tfrecord": "tfrecord", "parquet": "parquet", "csv": "csv"}  # format -> file extension


def criteo_schema(num_dense=13, num_sparse=26):
    """The ``data.schema`` mapping of converted Criteo files."""
    return {"label": "label", "dense": [f"I{i}" for i in range(1, num_dense + 1)],
            "features": {f"C{i}": {"type": "string", "shape": "list"} for i in range(1, num_sparse + 1)}}


def criteo_table(paths, num_dense=13, num_sparse=26):
    """A pyarrow Table of Criteo TSV files (paths: files or globs, in order): label, I1.., C1.. as the module says.

    Raises:
      ValueError naming the file and line of a line with another number of fields or a label other than 0/1.
    """
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.csv as pacsv  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    from tf_fusedrec.data.files import expand_paths  # noqa: PLC0415

    names = ["label"] + [f"I{i}" for i in range(1, num_dense + 1)] + [f"C{i}" for i in range(1, num_sparse + 1)]
    tables = []
    for path in expand_paths(paths, "criteo input"):
        invalid = []

        def handler(row, invalid=invalid):
            invalid.append(row)
            return "error"

        try:
            raw = pacsv.read_csv(path, read_options=pacsv.ReadOptions(column_names=names, use_threads=False),
                                 parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False,
                                                                  invalid_row_handler=handler),
                                 convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names},
                                                                      strings_can_be_null=False))
        except pa.ArrowInvalid as e:
            where = f" line {invalid[0].number}" if invalid and invalid[0].number else ""
            raise ValueError(f"Criteo file {path}{where}: expected {len(names)} tab-separated fields ({e})") from None
        columns = {}
        label = raw.column("label").to_numpy(zero_copy_only=False)
        wrong = np.flatnonzero((label != "0") & (label != "1"))
        if len(wrong):
            raise ValueError(f"Criteo file {path} line {wrong[0] + 1}: the label must be 0 or 1, got "
                             f"{label[wrong[0]]!r}")
        columns["label"] = pa.array(label.astype(np.float32))
        for i in range(1, num_dense + 1):  # what data/criteo.py computes, with the same ops
            d = tf.constant(raw.column(f"I{i}").to_numpy(zero_copy_only=False).astype(object))
            d = tf.strings.to_number(tf.where(tf.equal(d, ""), "0", d), tf.float64)
            columns[f"I{i}"] = pa.array(tf.cast(tf.math.log1p(tf.maximum(d, 0.0)), tf.float32).numpy())
        for i in range(1, num_sparse + 1):
            columns[f"C{i}"] = _null_empty(pa, raw.column(f"C{i}").combine_chunks())
        tables.append(pa.table(columns))
    return pa.concat_tables(tables)


MOVIELENS_INT_COLUMNS = ("user_id", "movie_id", "gender", "age", "occupation")


def movielens_schema(to):
    """The ``data.schema`` mapping of converted MovieLens files of format `to` (CSV: genres joined by "|")."""
    features = {name: {"type": "int64"} for name in MOVIELENS_INT_COLUMNS}
    features["zip"] = {"type": "string"}
    features["genres"] = {"type": "int64", "shape": "list", **({"separator": "|"} if to == "csv" else {})}
    return {"label": "label", "features": features}


def movielens_tables(data_dir, test_fraction=0.1, seed=0, shuffle=None):
    """(train, test): pyarrow Tables of the ratings of an ML-1M directory, split as the built-in reader splits them
    (the module docstring); `shuffle`: None keeps the order of ratings.dat, an int seeds a random order of train.

    Raises:
      FileNotFoundError naming a missing file; ValueError naming the file and line of a malformed line or of a rating
      of a user or movie that users.dat or movies.dat does not hold.
    """
    import pyarrow as pa  # noqa: PLC0415

    from tf_fusedrec.data import movielens  # noqa: PLC0415

    data_dir = os.fspath(data_dir)
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(f"MovieLens directory not found: {data_dir!r}")
    # The reader's own parsing and checks of the three files (its private helpers: one home for them).
    users = movielens._load_users(os.path.join(data_dir, "users.dat"))  # noqa: SLF001
    movies = movielens._load_movies(os.path.join(data_dir, "movies.dat"))  # noqa: SLF001
    zips = _zips(data_dir)
    path = os.path.join(data_dir, "ratings.dat")
    rows = []
    lines = movielens._fields(path, 4, "UserID::MovieID::Rating::Timestamp")  # noqa: SLF001
    for no, (uid, mid, rating, _time) in lines:
        uid, mid = movielens._int(path, no, "UserID", uid), movielens._int(path, no, "MovieID", mid)  # noqa: SLF001
        if uid >= users["known"].size or not users["known"][uid]:
            raise ValueError(f"{path}:{no}: rates UserID {uid}, which users.dat does not have")
        if mid >= movies["known"].size or not movies["known"][mid]:
            raise ValueError(f"{path}:{no}: rates MovieID {mid}, which movies.dat does not have")
        try:
            rating = float(rating)
        except ValueError:
            raise ValueError(f"{path}:{no}: Rating must be a number, got {rating!r}") from None
        rows.append((uid, mid, rating))
    ratings = np.array(rows, np.float64).reshape(-1, 3)
    user, movie = ratings[:, 0].astype(np.int64), ratings[:, 1].astype(np.int64)
    label = (ratings[:, 2].astype(np.float32) >= 4.0).astype(np.float32)  # the reader's float32 rating >= 4.0
    test = movielens.movielens_is_test(user, movie, test_fraction, seed)
    genre_values, genre_splits = movies["genre_values"], movies["genre_splits"]

    def table(rows):
        u, m = user[rows], movie[rows]
        columns = {"user_id": u, "movie_id": m}
        for name in ("gender", "age", "occupation"):
            columns[name] = users[name][u]
        columns["zip"] = pa.array([zips[int(i)] for i in u], pa.string())
        starts, lengths = genre_splits[m], genre_splits[m + 1] - genre_splits[m]
        ends = np.cumsum(lengths)
        flat = genre_values[np.repeat(starts - (ends - lengths), lengths) + np.arange(int(ends[-1]) if len(m) else 0)]
        columns["genres"] = pa.ListArray.from_arrays(pa.array(np.concatenate([[0], ends]).astype(np.int32)),
                                                     pa.array(flat, pa.int64()))
        columns["label"] = label[rows]
        return pa.table(columns)

    train = np.flatnonzero(~test)
    if shuffle is not None:
        train = train[np.random.default_rng(shuffle).permutation(len(train))]
    return table(train), table(np.flatnonzero(test))


def _zips(data_dir):
    """{UserID: its Zip-code string} of users.dat (the built-in readers keep only its hash)."""
    from tf_fusedrec.data import movielens  # noqa: PLC0415

    return {int(uid): z for _, (uid, _g, _a, _o, z) in movielens._read_table(  # noqa: SLF001
        os.path.join(data_dir, "users.dat"), 5, "UserID::Gender::Age::Occupation::Zip-code")}


def movielens_seq_schema(to):
    """The ``data.schema`` mapping of converted MovieLens sequences of format `to` (the module docstring)."""
    separator = {"separator": "|"} if to == "csv" else {}
    features = {"items": {"type": "int64", "shape": "list", "order": "items_time", **separator},
                **{name: {"type": "int64"} for name in ("target", "gender", "age", "occupation")}}
    return {"label": ["click", "conversion"], "features": features}


def movielens_seq_tables(data_dir, test_fraction=0.1, seed=0, max_length=None):
    """(train, test): pyarrow Tables of the samples of the built-in movielens_seq source of an ML-1M directory, in the
    order of its first pass over each split with data.seed `seed`; `max_length`: keep the last max_length movies of a
    longer history (None: whole histories). The module docstring has the columns.

    Raises:
      FileNotFoundError naming a missing directory or file; ValueError naming the file and line of a malformed line
      (the built-in reader's checks).
    """
    import pyarrow as pa  # noqa: PLC0415

    from tf_fusedrec.data import movielens_seq  # noqa: PLC0415

    data = movielens_seq._load(data_dir)  # noqa: SLF001  (the reader's own parsing, checks and time order)
    zips = _zips(data_dir)

    def table(held_out):
        split = movielens_seq._split(data, test_fraction, held_out)  # noqa: SLF001
        order = np.random.default_rng([seed, 0]).permutation(split.row.size)  # the built-in's first pass, shuffled
        row, first = split.row[order], data.offsets[:-1][split.row[order]]
        ends = first + split.position[order]  # the target's rating, one past the history
        starts = first if max_length is None else np.maximum(ends - max_length, first)
        offsets = np.concatenate([[0], np.cumsum(ends - starts)])
        flat = np.repeat(starts - offsets[:-1], ends - starts) + np.arange(offsets[-1])
        rating = data.ratings[ends]
        columns = {name: pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(values[flat]))
                   for name, values in (("items", data.movies), ("items_time", data.stamps))}
        columns["target"] = data.movies[ends]
        for name in ("user_id", "gender", "age", "occupation"):
            columns[name] = data.contexts[name][row]
        columns["zip"] = pa.array([zips[int(u)] for u in columns["user_id"]], pa.string())
        columns["click"] = (rating >= 4).astype(np.float32)
        columns["conversion"] = (rating == 5).astype(np.float32)
        return pa.table(columns)

    return table(False), table(True)


def _null_empty(pa, column):
    import pyarrow.compute as pc  # noqa: PLC0415

    return pc.if_else(pc.equal(column, ""), pa.scalar(None, pa.string()), column)


def _tfrecord_bytes(table):
    """The serialized tf.train.Example of each row (a null: no feature), each column's list by its Arrow type:
    integers an int64_list, strings a bytes_list, floats a float_list."""
    import pyarrow as pa  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    from tf_fusedrec.data.readers import _arrow_kind  # noqa: PLC0415

    kinds = {name: _arrow_kind(pa, table.schema.field(name).type).removeprefix("list:") for name in table.column_names}
    data = table.to_pydict()
    out = []
    for row in range(table.num_rows):
        feature = {}
        for name, value in ((n, data[n][row]) for n in table.column_names):
            if value is None:
                continue
            values = value if isinstance(value, list) else [value]
            if kinds[name] == "string":
                feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(
                    value=[v.encode() if isinstance(v, str) else v for v in values]))
            elif kinds[name] == "int":
                feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
            else:
                feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
        out.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return out


def write(table, schema, out_dir, to, files=1, row_group_size=65536):
    """Writes `table` as `files` files of format `to` (tfrecord | parquet | csv) under `out_dir`, record order kept;
    returns their paths."""
    import pyarrow.csv as pacsv  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    if to not in FORMATS:
        raise ValueError(f"--to must be one of {sorted(FORMATS)}, got {to!r}")
    if files < 1:
        raise ValueError(f"--files must be >= 1, got {files}")
    os.makedirs(out_dir, exist_ok=True)
    bounds = np.linspace(0, table.num_rows, files + 1).astype(np.int64)
    paths = []
    for k in range(files):
        part = table.slice(int(bounds[k]), int(bounds[k + 1] - bounds[k]))
        path = os.path.join(out_dir, f"part-{k:05d}-of-{files:05d}.{FORMATS[to]}")
        if to == "parquet":
            pq.write_table(part, path, row_group_size=row_group_size)
        elif to == "csv":
            pacsv.write_csv(_joined_lists(part, schema), path)
        else:
            with tf.io.TFRecordWriter(path) as writer:
                for record in _tfrecord_bytes(part):
                    writer.write(record)
        paths.append(path)
    return paths


def _joined_lists(table, schema):
    """The table with each list column (a feature's, or the order column of one) as the string of its values joined
    by the feature's separator (CSV)."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.compute as pc  # noqa: PLC0415

    for name, spec in schema["features"].items():
        if spec.get("separator") is not None:
            for column in (spec.get("column", name), spec.get("order")):
                kind = None if column is None else table.column(column).type
                if kind is not None and (pa.types.is_list(kind) or pa.types.is_large_list(kind)):  # else joined already
                    strings = table.column(column).cast(pa.large_list(pa.string()))
                    table = table.set_column(table.column_names.index(column), column,
                                             pc.binary_join(strings, spec["separator"]))
    return table


def build_parser():
    p = argparse.ArgumentParser(prog="python -m tf_fusedrec.data.convert", description=__doc__.split("\n\n")[0])
    p.add_argument("dataset", choices=["criteo", "movielens", "movielens_seq"], help="the built-in format of the input")
    p.add_argument("inputs", nargs="+", help="criteo: the input files (or globs), in order; movielens, movielens_seq: "
                                             "the directory holding ratings.dat, users.dat and movies.dat")
    p.add_argument("--to", required=True, choices=sorted(FORMATS), help="the format to write")
    p.add_argument("--out", required=True, help="the output directory")
    p.add_argument("--files", type=int, default=1,
                   help="how many files to write (default 1; movielens, movielens_seq: each split)")
    p.add_argument("--num-dense", type=int, default=13, help="criteo: dense columns")
    p.add_argument("--num-sparse", type=int, default=26, help="criteo: categorical columns")
    p.add_argument("--test-fraction", type=float, default=0.1,
                   help="movielens, movielens_seq: the share of ratings in the test split (default 0.1, the built-in "
                        "reader's)")
    p.add_argument("--seed", type=int, default=0,
                   help="movielens: the split's seed; movielens_seq: the seed of the built-in source's shuffled order "
                        "the splits are written in (data.seed of either; default 0)")
    p.add_argument("--shuffle", type=int, default=None, metavar="SEED",
                   help="movielens: write the training ratings in a random order of this seed (default: the order "
                        "of ratings.dat, sorted by user)")
    p.add_argument("--max-length", type=int, default=None, metavar="N",
                   help="movielens_seq: keep the last N movies of a longer history (as data.sequences.max_length with "
                        "truncate: true; default: whole histories)")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    import pyarrow.compute as pc  # noqa: PLC0415
    import yaml  # noqa: PLC0415

    files = f"part-*.{FORMATS[args.to]}"
    out = os.path.abspath(args.out)
    try:
        if args.max_length is not None and args.dataset != "movielens_seq":
            raise ValueError(f"--max-length: movielens_seq only, not {args.dataset}")
        if args.dataset == "criteo":
            table = criteo_table(args.inputs, args.num_dense, args.num_sparse)
            schema = criteo_schema(args.num_dense, args.num_sparse)
            paths = write(table, schema, args.out, args.to, args.files)
            data = {"source": args.to, "path": os.path.join(out, files), "schema": schema}
            rows = table.num_rows
        else:
            if len(args.inputs) != 1:
                raise ValueError(f"{args.dataset}: give one directory (holding ratings.dat, users.dat and "
                                 f"movies.dat), got {len(args.inputs)} inputs")
            if not 0 <= args.test_fraction <= 1:
                raise ValueError(f"--test-fraction must be in [0, 1], got {args.test_fraction}")
            sequences = {}
            if args.dataset == "movielens":
                train, test = movielens_tables(args.inputs[0], args.test_fraction, args.seed, args.shuffle)
                schema = movielens_schema(args.to)
            else:
                if args.shuffle is not None:
                    raise ValueError("--shuffle: movielens only (movielens_seq writes the built-in source's shuffled "
                                     "order, of --seed)")
                if args.max_length is not None and args.max_length < 1:
                    raise ValueError(f"--max-length must be >= 1, got {args.max_length}")
                train, test = movielens_seq_tables(args.inputs[0], args.test_fraction, args.seed, args.max_length)
                schema = movielens_seq_schema(args.to)
                longest = max(pc.max(pc.list_value_length(t.column("items"))).as_py() or 1 for t in (train, test))
                sequences = {"sequences": {"feature": "items", "target": "target",
                                           "max_length": args.max_length or longest}}
            paths = write(train, schema, os.path.join(args.out, "train"), args.to, args.files) + \
                write(test, schema, os.path.join(args.out, "test"), args.to, args.files)
            data = {"source": args.to, "path": os.path.join(out, "train", files),
                    "eval_path": os.path.join(out, "test", files), **sequences, "schema": schema}
            rows = train.num_rows + test.num_rows
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    with open(os.path.join(args.out, "schema.yaml"), "w") as f:
        yaml.safe_dump({"data": data}, f, sort_keys=False)
    print(f"wrote {rows} records to {len(paths)} {args.to} file(s) under {args.out}; their data section: "
          f"{os.path.join(args.out, 'schema.yaml')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

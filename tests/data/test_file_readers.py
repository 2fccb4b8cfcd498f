"""The file sources (TFRecord, Parquet, CSV by a schema): converted Criteo data equals the built-in Criteo reader's
batches on 1 and 2 workers, resume and worker-count changes read every record once, the checks at start and the
bad-record errors and skips."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tf_fusedrec  # noqa: F401
import tensorflow as tf

from tests.data.test_criteo import _make_lines
from tf_fusedrec.data import convert, criteo_dataset
from tf_fusedrec.data.files import BadRecordError, FilePosition, parse_schema
from tf_fusedrec.data.readers import FileBatches

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

FORMATS = ("tfrecord", "parquet", "csv")
CRITEO_FEATURES = [f"C{i}" for i in range(1, 27)]


@pytest.fixture(scope="module", name="criteo")
def criteo_fixture(tmp_path_factory):
    """A Criteo TSV of 150 lines and its conversion to each format, as 3 files: {"tsv": path, format: glob}."""
    root = tmp_path_factory.mktemp("criteo")
    tsv = root / "train.txt"
    tsv.write_text("\n".join(_make_lines(150, seed=3)) + "\n")
    out = {"tsv": str(tsv)}
    table = convert.criteo_table(str(tsv))
    for fmt in FORMATS:
        convert.write(table, convert.criteo_schema(), str(root / fmt), fmt, files=3)
        out[fmt] = str(root / fmt / "part-*")
    return out


def _reader(criteo, fmt, batch_size, rank=0, num_ranks=1, **kw):
    schema = parse_schema(convert.criteo_schema(), fmt, CRITEO_FEATURES)
    return FileBatches(fmt, criteo[fmt], schema, batch_size, rank=rank, num_ranks=num_ranks, **kw)


def _ids(batches):
    """The record of each example: dense I1 is log1p(line index) (tests/data/test_criteo.py's lines)."""
    return [int(round(np.expm1(float(v)))) for f, _ in batches for v in f["dense"][:, 0].numpy()]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("num_ranks", [1, 2])
def test_converted_criteo_equals_the_builtin_reader(criteo, fmt, num_ranks, batches_equal):
    for rank in range(num_ranks):
        want = list(criteo_dataset(criteo["tsv"], 8, rank=rank, num_ranks=num_ranks))
        got = list(_reader(criteo, fmt, 8, rank, num_ranks, epochs=1).dataset())
        assert len(got) == 150 // (8 * num_ranks) and len(want) >= len(got)
        for a, b in zip(want, got):
            batches_equal(a, b)


@pytest.mark.parametrize("fmt", FORMATS)
def test_resume_equals_the_uninterrupted_stream(criteo, fmt, batches_equal):
    whole = list(_reader(criteo, fmt, 8, epochs=3).dataset())  # 3 passes: the stream goes on over pass ends
    first = _reader(criteo, fmt, 8, epochs=3)
    ds = iter(first.dataset())
    for _ in range(9):
        next(ds)
    position = first.position_after(7)
    assert position == FilePosition(0, 1, 6)  # 56 records: 6 into the second file of 50
    resumed = list(_reader(criteo, fmt, 8, epochs=3, position=position).dataset())
    assert len(resumed) == len(whole) - 7
    for a, b in zip(whole[7:], resumed):
        batches_equal(a, b)


@pytest.mark.parametrize("fmt", FORMATS)
def test_worker_count_change_reads_each_record_once(criteo, fmt):
    two = [_reader(criteo, fmt, 6, rank, 2, epochs=1) for rank in range(2)]
    read = []
    for reader in two:
        it = iter(reader.dataset())
        read += _ids([next(it) for _ in range(4)])  # 4 steps of 2 x 6 records
    assert two[0].position_after(4) == two[1].position_after(4) == FilePosition(0, 0, 48)
    one = _reader(criteo, fmt, 5, epochs=1, position=two[0].position_after(4))  # resumed on 1 worker, batch 5
    read += _ids(list(one.dataset()))
    assert sorted(read) == list(range(48 + (150 - 48) // 5 * 5))


def test_held_out_records_are_not_trained_on(criteo):
    held = _reader(criteo, "parquet", 4, 1, 2, epochs=1, limit=16)
    train = _reader(criteo, "parquet", 4, 1, 2, epochs=1, skip_records=16)
    assert _ids(list(held.dataset())) == list(range(1, 16, 2))
    assert _ids(list(train.dataset()))[:3] == [17, 19, 21]


# ---------------------------------------------------------------------------------------------------------------
# A small schema for the checks: an int64 id, a string id, an int64 list, a dense value, the label.
# ---------------------------------------------------------------------------------------------------------------

SMALL = {"label": "y", "dense": ["x"],
         "features": {"user": {"type": "int64"}, "city": {"type": "string"},
                      "tags": {"type": "int64", "shape": "list", "separator": "|"}}}
NAMES = ["user", "city", "tags"]


def _small_schema(fmt):
    raw = {k: v for k, v in SMALL.items()}
    if fmt != "csv":
        raw["features"] = {**SMALL["features"], "tags": {"type": "int64", "shape": "list"}}
    return parse_schema(raw, fmt, NAMES)


def _rows(n):
    return [{"user": i, "city": f"c{i % 3}", "tags": list(range(i % 3)), "x": i / 2, "y": float(i % 2)}
            for i in range(n)]


def _write(fmt, path, rows, types=None):
    """rows: dicts (a missing key or None: no value); CSV rows may be strings (written as they are)."""
    if fmt == "csv":
        lines = ["user,city,tags,x,y"]
        for r in rows:
            if isinstance(r, str):
                lines.append(r)
            else:
                lines.append(",".join("" if r.get(k) is None else "|".join(map(str, r[k])) if k == "tags" else
                                      str(r[k]) for k in ["user", "city", "tags", "x", "y"]))
        path.write_text("\n".join(lines) + "\n")
    elif fmt == "parquet":
        types = types or {"user": pa.int64(), "city": pa.string(), "tags": pa.list_(pa.int64()), "x": pa.float32(),
                          "y": pa.float32()}
        pq.write_table(pa.table({k: pa.array([r.get(k) for r in rows], t) for k, t in types.items()}), path,
                       row_group_size=4)
    else:
        with tf.io.TFRecordWriter(str(path)) as w:
            for r in rows:
                w.write(r if isinstance(r, bytes) else _example(r))


def _example(r):
    f = {}
    for k, v in r.items():
        if v is None:
            continue
        if isinstance(v, str):
            f[k] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode()]))
        elif k in ("x", "y") or isinstance(v, float):
            f[k] = tf.train.Feature(float_list=tf.train.FloatList(value=[v]))
        else:
            f[k] = tf.train.Feature(int64_list=tf.train.Int64List(value=v if isinstance(v, list) else [v]))
    return tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString()


def _small(fmt, path, batch_size=2, **kw):
    return FileBatches(fmt, str(path), _small_schema(fmt), batch_size, epochs=1, **kw)


@pytest.mark.parametrize("fmt", FORMATS)
def test_small_schema_batch(tmp_path, fmt):
    path = tmp_path / f"d.{fmt}"
    _write(fmt, path, _rows(6))
    batches = list(_small(fmt, path, 3).dataset())
    assert len(batches) == 2
    features, label = batches[1]
    assert sorted(features) == ["city", "dense", "tags", "user"]
    assert features["user"].dtype == tf.int64 and features["user"].numpy().tolist() == [3, 4, 5]
    np.testing.assert_array_equal(features["city"], tf.strings.to_hash_bucket_fast(["c0", "c1", "c2"], 2 ** 62))
    assert isinstance(features["tags"], tf.RaggedTensor) and features["tags"].to_list() == [[], [0], [0, 1]]
    assert features["dense"].dtype == tf.float32 and features["dense"].numpy().tolist() == [[1.5], [2.0], [2.5]]
    assert label.numpy().tolist() == [1.0, 0.0, 1.0]


# Every shape, a weight and two dense columns through dataset(): FileBatches hands from_generator a few packed arrays
# and its map unpacks them; each worker's batches hold its records' own values, dtypes and static shapes.
EVERY_SHAPE = {"label": "y", "weight": "w", "dense": ["x", "x2"],
               "features": {"user": {"type": "int64"}, "city": {"type": "string"},
                            "last": {"type": "int64", "shape": "fixed", "length": 2},
                            "tags": {"type": "int64", "shape": "list", "order": "tag_times"}}}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("num_ranks", [1, 2])
def test_every_shape_through_the_dataset(tmp_path, fmt, num_ranks):
    n = 24
    tags = [[(7 * i + j) % 5 for j in range(i % 4)] for i in range(n)]
    times = [[len(t) - j for j in range(len(t))] for t in tags]  # stored newest first: read in reverse
    ints = pa.list_(pa.int64())
    table = pa.table({"user": pa.array(range(n), pa.int64()), "city": [f"c{i % 3}" for i in range(n)],
                      "last": pa.array([[i, 100 + i] for i in range(n)], ints), "tags": pa.array(tags, ints),
                      "tag_times": pa.array(times, ints), "x": pa.array([i / 2 for i in range(n)], pa.float32()),
                      "x2": pa.array([-i for i in range(n)], pa.float32()),
                      "y": pa.array([i % 2 for i in range(n)], pa.float32()),
                      "w": pa.array([(i % 4) / 4 for i in range(n)], pa.float32())})
    raw = {**EVERY_SHAPE, "features": {k: {**v, **({"separator": "|"} if fmt == "csv" and k in ("last", "tags")
                                                  else {})} for k, v in EVERY_SHAPE["features"].items()}}
    convert.write(table, raw, str(tmp_path / fmt), fmt, files=2)
    schema = parse_schema(raw, fmt, list(EVERY_SHAPE["features"]))
    ids = tf.TensorSpec([None], tf.int64)
    spec = ({"user": ids, "city": ids, "last": tf.TensorSpec([None, 2], tf.int64), "dense": tf.TensorSpec([None, 2]),
             "tags": tf.RaggedTensorSpec([None, None], tf.int64, 1, tf.int64)},
            tf.TensorSpec([None], tf.float32), tf.TensorSpec([None], tf.float32))
    for rank in range(num_ranks):
        ds = FileBatches(fmt, str(tmp_path / fmt / "part-*"), schema, 3, rank=rank, num_ranks=num_ranks,
                         epochs=1).dataset()
        assert ds.element_spec == spec
        batches = list(ds)
        assert len(batches) == n // (3 * num_ranks)
        for b, (features, label, weight) in enumerate(batches):
            mine = [3 * num_ranks * b + rank + num_ranks * k for k in range(3)]
            assert features["user"].numpy().tolist() == mine
            np.testing.assert_array_equal(features["city"], tf.strings.to_hash_bucket_fast(
                [f"c{i % 3}" for i in mine], 2 ** 62))
            assert features["last"].numpy().tolist() == [[i, 100 + i] for i in mine]
            assert features["tags"].to_list() == [tags[i][::-1] for i in mine]
            assert features["dense"].numpy().tolist() == [[i / 2, -i] for i in mine]
            assert label.numpy().tolist() == [i % 2 for i in mine]
            assert weight.numpy().tolist() == [(i % 4) / 4 for i in mine]


@pytest.mark.parametrize("fmt, change, match", [
    ("parquet", {"user": pa.float64()}, "column 'user' of feature 'user' .* holds floats, not integer ids"),
    ("parquet", {"city": pa.int64()}, "column 'city' of feature 'city' .* holds integers, not strings"),
    ("parquet", {"user": None}, "no column 'user' \\(read for feature 'user'\\)"),
    ("tfrecord", {"user": 1.5}, "column 'user' of feature 'user' .* holds floats, not integer ids"),
    ("tfrecord", {"user": None}, "its first record has no feature 'user'"),
    ("csv", {"user": 1.5}, "column 'user' of feature 'user' \\(type int64\\) holds floats.*'1.5'"),
    ("csv", {"y": None}, "no column 'y' \\(read for the label values\\)"),
])
def test_files_are_checked_at_start(tmp_path, fmt, change, match):
    path = tmp_path / f"bad.{fmt}"
    rows = _rows(4)
    if fmt == "parquet":
        types = {"user": pa.int64(), "city": pa.string(), "tags": pa.list_(pa.int64()), "x": pa.float32(),
                 "y": pa.float32()}
        for k, t in change.items():
            if t is None:
                del types[k]
            else:
                types[k] = t
                for r in rows:
                    r[k] = float(r[k]) if t == pa.float64() else 7
        _write(fmt, path, rows, types)
    elif fmt == "csv" and change == {"y": None}:
        path.write_text("user,city,tags,x\n1,a,,0.5\n")
    else:
        for r in rows:
            r.update(change)
        _write(fmt, path, rows)
    with pytest.raises(ValueError, match=f"file {path}: " + match):
        _small(fmt, path)


def _bad_rows(fmt):
    """Rows 0-9 with bad records 3 (a negative id) and 6 (a label outside [0, 1]), and for each format one of its
    own at 8."""
    rows = _rows(10)
    rows[3]["user"] = -5
    rows[6]["y"] = 2.0
    if fmt == "csv":
        rows[8] = "8,c2,1|x,4.0,0"
    elif fmt == "parquet":
        rows[8]["y"] = None
    else:
        rows[8] = b"not an example"
    return rows


OWN = {"csv": "CSV file {path} line 10: column 'tags' of feature 'tags' holds 'x', not an int64 id",
       "parquet": "Parquet file {path} row 9: the label \\(column 'y'\\) has no value",
       "tfrecord": "TFRecord file {path} record 9: not a tf.train.Example of the schema"}
FIRST = {"csv": "CSV file {path} line 5: ", "parquet": "Parquet file {path} row 4: ",
         "tfrecord": "TFRecord file {path} record 4: "}


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_bad_record_stops_every_worker_at_the_same_batch(tmp_path, fmt):
    path = tmp_path / f"d.{fmt}"
    _write(fmt, path, _bad_rows(fmt))
    for rank in range(2):  # global batches of 2 x 1: records 0-1, 2-3 (holds the bad record 3)
        reader = _small(fmt, path, 1, rank=rank, num_ranks=2)
        it = iter(reader.dataset())
        next(it)
        with pytest.raises(tf.errors.OpError, match=FIRST[fmt].format(path=path) +
                           "column 'user' of feature 'user' holds the negative id -5"):
            next(it)


@pytest.mark.parametrize("fmt", FORMATS)
def test_skip_counts_bad_records(tmp_path, fmt):
    path = tmp_path / f"d.{fmt}"
    _write(fmt, path, _bad_rows(fmt))
    reader = _small(fmt, path, 1, on_bad_record="skip", max_bad_records=3)
    users = [int(f["user"][0]) for f, _ in reader.dataset()]
    assert users == [0, 1, 2, 4, 5, 7, 9]
    assert reader.position_after(7) == FilePosition(0, 0, 10, 3)
    with pytest.raises(tf.errors.OpError, match="more than data.max_bad_records = 2 bad records skipped; the last: "
                       + OWN[fmt].format(path=path)):
        list(_small(fmt, path, 1, on_bad_record="skip", max_bad_records=2).dataset())


@pytest.mark.parametrize("fmt", FORMATS)
def test_own_bad_record_error(tmp_path, fmt):
    path = tmp_path / f"d.{fmt}"
    rows = _bad_rows(fmt)
    rows[3]["user"], rows[6]["y"] = 3, 0.0
    _write(fmt, path, rows)
    with pytest.raises(tf.errors.OpError, match=OWN[fmt].format(path=path)):
        list(_small(fmt, path, 1).dataset())


def test_csv_line_with_another_field_count(tmp_path):
    path = tmp_path / "d.csv"
    rows = _rows(4)
    rows[2] = "2,c2,,1.0"
    _write("csv", path, rows)
    with pytest.raises(tf.errors.OpError, match=f"CSV file {path} line 4: 4 fields, expected 5: '2,c2,,1.0'"):
        list(_small("csv", path, 1).dataset())


def test_truncated_tfrecord(tmp_path):
    path = tmp_path / "d.tfrecord"
    _write("tfrecord", path, _rows(6))
    data = path.read_bytes()
    path.write_bytes(data[:-7])
    with pytest.raises(tf.errors.OpError, match=f"TFRecord file {path} record 6: a truncated or corrupt TFRecord"):
        list(_small("tfrecord", path, 1).dataset())
    reader = _small("tfrecord", path, 1, on_bad_record="skip", max_bad_records=1)
    assert [int(f["user"][0]) for f, _ in reader.dataset()] == [0, 1, 2, 3, 4]


def test_schema_errors():
    with pytest.raises(ValueError, match="data.schema.features: feature 'tags' of the config has no column"):
        parse_schema({"label": "y", "features": {"user": {}, "city": {}}}, "parquet", NAMES)
    with pytest.raises(ValueError, match="data.schema.features.user.type: must be one of"):
        parse_schema({"label": "y", "features": {"user": {"type": "float"}}}, "parquet", ["user"])
    with pytest.raises(ValueError, match="data.schema.features.user.separator: only for source 'csv'"):
        parse_schema({"label": "y", "features": {"user": {"shape": "list", "separator": "|"}}}, "parquet", ["user"])
    with pytest.raises(ValueError, match="data.schema.features.user.length: shape 'fixed' needs a positive int"):
        parse_schema({"label": "y", "features": {"user": {"shape": "fixed"}}}, "tfrecord", ["user"])
    with pytest.raises(ValueError, match="data.schema.label.range: expected \\[low, high\\]"):
        parse_schema({"label": {"column": "y", "range": [1, 0]}, "features": {"user": {}}}, "csv", ["user"])


def test_config_of_a_file_source(criteo):
    from tf_fusedrec.config import parse_config
    from tf_fusedrec.train import experiment

    raw = {"name": "t", "features": [{"name": "C{i}", "repeat": 26, "dim": 4}],
           "data": {"source": "parquet", "path": criteo["parquet"], "eval_batches": 1,
                    "schema": convert.criteo_schema()}}
    config = parse_config(raw)
    assert config.data.num_dense == 13 and config.data.schema.feature("C3").type == "string"
    held = list(experiment.make_dataset(config, 4, 0, 1, held_out=True))
    train = experiment.make_dataset(config, 4, 0, 1)
    assert _ids(held) == [0, 1, 2, 3] and _ids([next(iter(train))]) == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="data.num_dense: 5, but data.schema.dense names 13"):
        parse_config({**raw, "data": {**raw["data"], "num_dense": 5}})
    with pytest.raises(ValueError, match="data.schema: required for source 'csv'"):
        parse_config({**raw, "data": {"source": "csv", "path": "x"}})
    with pytest.raises(ValueError, match="data.on_bad_record: only for the file sources"):
        parse_config({**raw, "data": {"source": "criteo", "path": "x", "on_bad_record": "skip"}})


def test_convert_cli(criteo, tmp_path):
    import yaml

    assert convert.main(["criteo", criteo["tsv"], "--to", "csv", "--out", str(tmp_path), "--files", "2"]) == 0
    data = yaml.safe_load((tmp_path / "schema.yaml").read_text())["data"]
    assert sorted(os.listdir(tmp_path)) == ["part-00000-of-00002.csv", "part-00001-of-00002.csv", "schema.yaml"]
    schema = parse_schema(data["schema"], data["source"], CRITEO_FEATURES)
    assert len(list(FileBatches("csv", data["path"], schema, 50, epochs=1).dataset())) == 3


def test_the_docs_example_and_the_config(criteo, tmp_path):
    """docs/guide/your-data.md's data section reads its example columns; configs/criteo_parquet.yaml and
    movielens1m_parquet.yaml hold the converter's schemas."""
    import re

    import yaml

    from tf_fusedrec.config import load_config, parse_config
    from tf_fusedrec.train import experiment

    root = os.path.join(os.path.dirname(__file__), "..", "..")
    page = open(os.path.join(root, "docs", "guide", "your-data.md")).read()
    data = yaml.safe_load(re.findall(r"```yaml\n(.*?)```", page, re.S)[0])["data"]
    n = 12
    pq.write_table(pa.table({"user_id": pa.array(range(n), pa.int64()), "city_name": [f"c{i % 4}" for i in range(n)],
                             "genres": [[i, i + 1][: i % 3] for i in range(n)],
                             "last_items": [[i] * 5 for i in range(n)], "price": np.arange(n, dtype=np.float32),
                             "age_days": np.ones(n, np.float32), "clicked": np.arange(n) % 2,
                             "importance": np.full(n, 0.5, np.float32), "recent": [[i, i + 1, i + 2] for i in range(n)],
                             "recent_times": [[3, 1, 2]] * n}),
                   tmp_path / "part-0.parquet")
    data["path"] = str(tmp_path / "*.parquet")
    config = parse_config({"features": [{"name": f, "dim": 4, "combiner": "sum"}
                                        for f in ("user_id", "city", "genres", "last_items", "recent")],
                           "data": data})
    assert config.data.schema.weight == "importance"
    features, label = next(iter(experiment.make_dataset(config, 2, 0, 1)))  # (features, label): no weights there
    assert features["user_id"].numpy().tolist() == [8, 9] and features["last_items"].shape == (2, 5)
    assert features["dense"].numpy().tolist() == [[8.0, 1.0], [9.0, 1.0]] and label.dtype == tf.float32
    assert features["recent"].to_list() == [[9, 10, 8], [10, 11, 9]]  # sorted by recent_times
    _, _, weight = next(iter(experiment.file_batches(config, 2, 0, 1).dataset()))
    assert weight.numpy().tolist() == [0.5, 0.5]
    config = load_config(os.path.join(root, "configs", "criteo_parquet.yaml"))
    assert config.data.schema == parse_schema(convert.criteo_schema(), "parquet", CRITEO_FEATURES)
    config = load_config(os.path.join(root, "configs", "movielens1m_parquet.yaml"))
    assert config.data.schema == parse_schema(convert.movielens_schema("parquet"), "parquet",
                                              [f.name for f in config.features])
    builtin = load_config(os.path.join(root, "configs", "movielens1m.yaml"))
    assert [f.name for f in config.features] == [f.name for f in builtin.features]


# ---------------------------------------------------------------------------------------------------------------
# Sample weights (data.schema.weight): a float column delivered as (features, label, weight), checked like the label.
# ---------------------------------------------------------------------------------------------------------------

WEIGHTED = {"label": "y", "weight": "w", "features": {"user": {"type": "int64"}}}


def _write_weighted(fmt, path, users, labels, weights, weight_type=None):
    """Records (user, y, w); a weight of None: no value (CSV: an empty field); a str weight is written as it is."""
    if fmt == "csv":
        path.write_text("user,y,w\n" + "".join(f"{u},{y},{'' if w is None else w}\n"
                                               for u, y, w in zip(users, labels, weights)))
    elif fmt == "parquet":
        pq.write_table(pa.table({"user": pa.array(users, pa.int64()), "y": pa.array(labels, pa.float32()),
                                 "w": pa.array(weights, weight_type or pa.float32())}), path, row_group_size=4)
    else:
        with tf.io.TFRecordWriter(str(path)) as writer:
            for u, y, w in zip(users, labels, weights):
                f = {"user": tf.train.Feature(int64_list=tf.train.Int64List(value=[u])),
                     "y": tf.train.Feature(float_list=tf.train.FloatList(value=[y]))}
                if isinstance(w, str):
                    f["w"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[w.encode()]))
                elif w is not None:
                    f["w"] = tf.train.Feature(float_list=tf.train.FloatList(value=[w]))
                writer.write(tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString())


def _weighted(fmt, path, batch_size, **kw):
    return FileBatches(fmt, str(path), parse_schema(WEIGHTED, fmt, ["user"]), batch_size, epochs=1, **kw)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("num_ranks", [1, 2])
def test_sample_weights_come_with_the_batch(tmp_path, fmt, num_ranks):
    path = tmp_path / f"w.{fmt}"
    rng = np.random.default_rng(5)
    weights = rng.uniform(0, 3, 24).astype(np.float32)
    weights[[2, 7]] = 0.0
    _write_weighted(fmt, path, list(range(24)), [float(i % 2) for i in range(24)], weights.tolist())
    for rank in range(num_ranks):
        batches = list(_weighted(fmt, path, 4, rank=rank, num_ranks=num_ranks).dataset())
        assert len(batches) == 24 // (4 * num_ranks)
        for features, label, weight in batches:
            users = features["user"].numpy()
            assert weight.dtype == tf.float32 and weight.shape == (4,)
            np.testing.assert_array_equal(weight.numpy(), weights[users])  # the record's own weight, exactly
            np.testing.assert_array_equal(label.numpy(), (users % 2).astype(np.float32))
            assert (users % num_ranks == rank).all()
    # Without a weight in the schema, the batches are (features, label), as before.
    plain = parse_schema({"label": "y", "features": {"user": {"type": "int64"}}}, fmt, ["user"])
    assert all(len(b) == 2 for b in FileBatches(fmt, str(path), plain, 4, epochs=1).dataset())


@pytest.mark.parametrize("fmt, weights, weight_type, match", [
    ("parquet", [1.0] * 4, pa.string(), "weight column 'w' holds strings, not numbers"),
    ("parquet", None, None, "no column 'w' \\(read for the weight values\\)"),
    ("tfrecord", ["heavy"] * 4, None, "weight feature 'w' holds strings \\(not a float_list\\)"),
    ("tfrecord", [None] * 4, None, "its first record has no feature 'w' \\(read for the weight values\\)"),
    ("csv", ["heavy"] * 4, None, "weight column 'w' holds 'heavy', not a number"),
])
def test_weight_column_checked_at_start(tmp_path, fmt, weights, weight_type, match):
    path = tmp_path / f"w.{fmt}"
    if weights is None:
        pq.write_table(pa.table({"user": pa.array(range(4), pa.int64()), "y": pa.array([0.0] * 4, pa.float32())}),
                       path)
    else:
        if weight_type == pa.string():
            weights = [str(w) for w in weights]
        _write_weighted(fmt, path, list(range(4)), [0.0] * 4, weights, weight_type)
    with pytest.raises(ValueError, match=f"file {path}: " + match):
        _weighted(fmt, path, 2)


def _bad_weights(fmt, path):
    """Records 0-9 of weight 1.0 but a negative weight at 2 and a weight that is not finite at 5 (CSV: 'nan' is not
    a number, an error of its own), and no weight at 7."""
    weights = [1.0] * 10
    weights[2], weights[5], weights[7] = -0.5, float("inf"), None
    if fmt == "csv":
        weights[5] = "nan"
    _write_weighted(fmt, path, list(range(10)), [0.0] * 10, weights)


BAD_WEIGHT = {
    "parquet": ["Parquet file {path} row 3: the sample weight \\(column 'w'\\) is -0.5; a weight is a finite number",
                "Parquet file {path} row 6: the sample weight \\(column 'w'\\) is inf",
                "Parquet file {path} row 8: the sample weight \\(column 'w'\\) has no value"],
    "tfrecord": ["TFRecord file {path} record 3: the sample weight \\(column 'w'\\) is -0.5",
                 "TFRecord file {path} record 6: the sample weight \\(column 'w'\\) is inf",
                 "TFRecord file {path} record 8: the sample weight 'w' holds 0 values, not 1"],
    "csv": ["CSV file {path} line 4: the sample weight \\(column 'w'\\) is -0.5",
            "CSV file {path} line 7: the sample weight column 'w' holds 'nan', not a number",
            "CSV file {path} line 9: the sample weight column 'w' has no value"],
}


@pytest.mark.parametrize("fmt", FORMATS)
def test_bad_weights(tmp_path, fmt):
    path = tmp_path / f"w.{fmt}"
    _bad_weights(fmt, path)
    for rank in range(2):  # every worker stops at the global batch holding the bad record (records 2-3)
        it = iter(_weighted(fmt, path, 1, rank=rank, num_ranks=2).dataset())
        next(it)
        with pytest.raises(tf.errors.OpError, match=BAD_WEIGHT[fmt][0].format(path=path)):
            next(it)
    skipping = _weighted(fmt, path, 1, on_bad_record="skip", max_bad_records=3)
    batches = list(skipping.dataset())
    assert [int(f["user"][0]) for f, _, _ in batches] == [0, 1, 3, 4, 6, 8, 9]
    assert [float(w[0]) for _, _, w in batches] == [1.0] * 7
    assert skipping.position_after(7) == FilePosition(0, 0, 10, 3)
    for limit, message in ((0, BAD_WEIGHT[fmt][0]), (1, BAD_WEIGHT[fmt][1]), (2, BAD_WEIGHT[fmt][2])):
        with pytest.raises(tf.errors.OpError, match=f"more than data.max_bad_records = {limit} bad records skipped; "
                           f"the last: " + message.format(path=path)):
            list(_weighted(fmt, path, 1, on_bad_record="skip", max_bad_records=limit).dataset())


def test_weight_schema_errors():
    assert parse_schema({**WEIGHTED, "weight": {"column": "w"}}, "csv", ["user"]).weight == "w"
    assert parse_schema({"label": "y", "features": {"user": {}}}, "csv", ["user"]).weight is None
    with pytest.raises(ValueError, match="data.schema.weight: expected a column name or \\{column: ...\\}, got 3"):
        parse_schema({**WEIGHTED, "weight": 3}, "csv", ["user"])
    with pytest.raises(ValueError, match="data.schema.weight: unknown key 'range'"):
        parse_schema({**WEIGHTED, "weight": {"column": "w", "range": [0, 1]}}, "csv", ["user"])
    with pytest.raises(ValueError, match="data.schema.columns: column 'w' is read by the schema but not among"):
        parse_schema({**WEIGHTED, "columns": ["user", "y"]}, "csv", ["user"])


def test_csv_writer_joins_list_columns_and_keeps_joined_ones(tmp_path):
    """convert.write to CSV joins a list column by its feature's separator; a column already joined (strings, as a
    caller may prepare it) is written as it is, not cast to a list."""
    import pyarrow as pa  # noqa: PLC0415

    from tf_fusedrec.data import convert  # noqa: PLC0415

    table = pa.table({"a": pa.array([[1, 2], [], [3]]), "b": pa.array(["4|5", "", "6"]), "label": [1, 0, 1]})
    schema = {"label": "label", "features": {"a": {"type": "int64", "shape": "list", "separator": "|"},
                                             "b": {"type": "int64", "shape": "list", "separator": "|"}}}
    (path,) = convert.write(table, schema, str(tmp_path), "csv")
    lines = open(path).read().splitlines()
    assert lines == ['"a","b","label"', '"1|2","4|5",1', '"","",0', '"3","6",1'], lines

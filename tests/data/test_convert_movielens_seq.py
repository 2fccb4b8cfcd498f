"""Sequences in the file sources (data.sequences with data.schema) and `python -m tf_fusedrec.data.convert
movielens_seq`: the converted MovieLens sequences (TFRecord, Parquet, CSV) give the built-in movielens_seq source's
batches, token-balanced and fixed, on 1 and 2 workers, training and held out, and resume as it does; an order column
sorts each history and the cap truncates it or stops at the record; the schema, the files and the config are checked
with errors naming what is wrong; the guide's example reads. The train app on the converted files:
tests/apps/test_train_files.py."""

from __future__ import annotations

import itertools
import os
import random

import pytest
import yaml

import tf_fusedrec  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow)
import tensorflow as tf

from tests.subprocess_runner import ROOT
from tf_fusedrec import config as cfg
from tf_fusedrec.data import convert
from tf_fusedrec.data.files import FileSequence, parse_schema
from tf_fusedrec.data.readers import FileBatches
from tf_fusedrec.train import experiment

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

FORMATS = ("tfrecord", "parquet", "csv")
MAX_LENGTH = 60  # below the longest history: the built-in source and the files both truncate


def write_ml1m(path, users=110, seed=0):
    """An ML-1M directory of `users` users with 70 to 130 ratings each of 400 movies, timestamps from a narrow range
    (ties, broken by MovieID); about 10 000 training samples: more than the 4096 a token batcher's target is measured
    on per worker, with 2 workers, inside the first epoch. Ratings rise with the movie id (something to learn)."""
    rnd = random.Random(seed)
    path.mkdir(parents=True)
    lines = {"users.dat": [f"{u}::{rnd.choice('FM')}::{rnd.choice([1, 18, 25, 35, 45, 50, 56])}::{rnd.randint(0, 20)}"
                           f"::{10000 + u % 37}" for u in range(1, users + 1)],
             "movies.dat": [f"{m}::Film {m} (1999)::Drama" for m in range(1, 401)],
             "ratings.dat": [f"{u}::{m}::{min(5, 1 + m // 100 + rnd.randint(0, 1))}::{978300000 + rnd.randint(0, 500)}"
                             for u in range(1, users + 1) for m in rnd.sample(range(1, 401), rnd.randint(70, 130))]}
    rnd.shuffle(lines["ratings.dat"])
    for name, text in lines.items():
        (path / name).write_text("".join(line + "\n" for line in text), encoding="latin-1")
    return str(path)


def seq_config(data, eval_batches=4):
    """configs/movielens1m_seq.yaml with `data` as its data section (its cap MAX_LENGTH, truncating)."""
    raw = yaml.safe_load((ROOT / "configs" / "movielens1m_seq.yaml").read_text())
    raw["data"] = {**data, "eval_batches": eval_batches,
                   "sequences": {**data.get("sequences", {}), "feature": "items", "target": "target",
                                 "max_length": MAX_LENGTH, "truncate": True}}
    return cfg.parse_config(raw)


@pytest.fixture(scope="module", name="ml")
def ml_fixture(tmp_path_factory):
    """The directory converted to each format, 2 files a split: {"dir": its path, "builtin": its movielens_seq config,
    format: the config of the converted files (the command's data section)}."""
    root = tmp_path_factory.mktemp("ml-seq")
    out = {"dir": write_ml1m(root / "ml-1m")}
    out["builtin"] = seq_config({"source": "movielens_seq", "path": out["dir"], "num_dense": 0})
    for fmt in FORMATS:
        assert convert.main(["movielens_seq", out["dir"], "--to", fmt, "--out", str(root / fmt), "--files", "2"]) == 0
        out[fmt] = seq_config(yaml.safe_load((root / fmt / "schema.yaml").read_text())["data"])
    return out


def _take(batches, n):
    return list(itertools.islice(batches.dataset(), n))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("num_ranks", [1, 2])
def test_converted_sequences_equal_the_builtin_source(ml, fmt, num_ranks, batches_equal):
    for rank in range(num_ranks):
        for balance in ("tokens", "none"):
            builtin = experiment.SequenceBatches(ml["builtin"], 16, rank, num_ranks, balance)
            files = experiment.SequenceBatches(ml[fmt], 16, rank, num_ranks, balance)
            assert files.target_tokens == builtin.target_tokens
            want, got = _take(builtin, 12), _take(files, 12)  # inside the first epoch
            for a, b in zip(want, got):
                batches_equal(a, b)
            assert len(got) == 12 and files.counts[:12] == builtin.counts[:12]
            if balance == "tokens":  # the batches' token counts are the target's, their sample counts vary
                assert len({n for n, _ in files.counts[:12]}) > 1
                assert all(abs(t - files.target_tokens) <= MAX_LENGTH for _, t in files.counts[:11])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("num_ranks", [1, 2])
def test_held_out_pass_equals_the_builtin_source(ml, fmt, num_ranks, batches_equal):
    for rank in range(num_ranks):
        want = list(experiment.make_dataset(ml["builtin"], 32, rank, num_ranks, held_out=True))
        got = list(experiment.make_dataset(ml[fmt], 32, rank, num_ranks, held_out=True))
        assert len(got) == len(want) > 3  # every sample: the last batch holds the rest, as the built-in's
        for a, b in zip(want, got):
            batches_equal(a, b)


def test_resume_equals_the_uninterrupted_stream(ml, batches_equal):
    whole = experiment.SequenceBatches(ml["parquet"], 16, 1, 2, "tokens")
    batches = _take(whole, 10)
    position = whole.position_after(4)
    assert position.samples == sum(n for n, _ in whole.counts[:4]) and position.buffered > 0
    resumed = experiment.SequenceBatches(ml["parquet"], 16, 1, 2, "tokens", position=position)
    for a, b in zip(batches[4:], _take(resumed, 6)):
        batches_equal(a, b)


def test_converted_tables_hold_the_builtin_samples(ml):
    from tf_fusedrec.data.movielens_seq import MovieLensSeqSpec, movielens_seq_samples

    train, test = convert.movielens_seq_tables(ml["dir"], seed=3, max_length=5)
    spec = MovieLensSeqSpec("items", "target", ("user_id", "gender", "age", "occupation"), max_length=5,
                            truncate=True)
    for table, held_out in ((train, False), (test, True)):
        want = list(movielens_seq_samples(ml["dir"], spec, held_out=held_out, shuffle=True, seed=3))
        assert table.num_rows == len(want)
        rows = table.to_pydict()
        for i, sample in enumerate(want):
            assert rows["items"][i] == sample["items"].tolist() and rows["target"][i] == sample["target"]
            assert [rows["click"][i], rows["conversion"][i]] == sample["labels"].tolist()
            assert rows["user_id"][i] == sample["user_id"] and rows["age"][i] == sample["age"]
            times = rows["items_time"][i]
            assert len(times) == len(rows["items"][i]) and times == sorted(times)


def test_convert_cli_writes_the_data_section(ml, tmp_path, capsys):
    out = tmp_path / "out"
    assert convert.main(["movielens_seq", ml["dir"], "--to", "csv", "--out", str(out), "--max-length", "7"]) == 0
    assert sorted(os.listdir(out)) == ["schema.yaml", "test", "train"]
    data = yaml.safe_load((out / "schema.yaml").read_text())["data"]
    assert data["path"] == str(out / "train" / "part-*.csv") and data["eval_path"] == str(out / "test" / "part-*.csv")
    assert data["sequences"] == {"feature": "items", "target": "target", "max_length": 7}
    assert data["schema"] == convert.movielens_seq_schema("csv")
    header, line = (out / "train" / "part-00000-of-00001.csv").read_text().splitlines()[:2]
    assert header.startswith('"items","items_time","target"') and "|" in line
    config = seq_config(data)
    first = next(iter(experiment.sequence_dataset(config, 64, 0, 1)))[0]["items"]
    assert max(len(r) for r in first.to_list()) == 7
    for dataset, argv, message in (("movielens_seq", ["--shuffle", "1"], "--shuffle: movielens only"),
                                   ("movielens_seq", ["--max-length", "0"], "--max-length must be >= 1, got 0"),
                                   ("movielens", ["--max-length", "3"], "--max-length: movielens_seq only")):
        capsys.readouterr()
        assert convert.main([dataset, ml["dir"], "--to", "csv", "--out", str(tmp_path / "x"), *argv]) == 2
        assert message in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# The order column and the cap, on small hand-made files
# ---------------------------------------------------------------------------------------------------------------

NAMES = ["hist", "item", "city"]


def _schema(fmt, cap=3, truncate=True, order="ts"):
    features = {"hist": {"type": "int64", "shape": "list", **({"order": order} if order else {}),
                         **({"separator": "|"} if fmt == "csv" else {})},
                "item": {"type": "int64"}, "city": {"type": "string"}}
    return parse_schema({"label": ["click", "buy"], "features": features}, fmt, NAMES,
                        sequence=FileSequence("hist", cap, truncate))


def _write(fmt, path, rows):
    """rows: dicts hist, ts (lists), item, city, click, buy."""
    if fmt == "parquet":
        types = {"hist": pa.list_(pa.int64()), "ts": pa.list_(pa.int64()), "item": pa.int64(), "city": pa.string(),
                 "click": pa.float32(), "buy": pa.float32()}
        pq.write_table(pa.table({k: pa.array([r[k] for r in rows], t) for k, t in types.items()}), path)
    elif fmt == "csv":
        path.write_text("hist,ts,item,city,click,buy\n" + "".join(
            f"{'|'.join(map(str, r['hist']))},{'|'.join(map(str, r['ts']))},{r['item']},{r['city']},{r['click']},"
            f"{r['buy']}\n" for r in rows))
    else:
        with tf.io.TFRecordWriter(str(path)) as writer:
            for r in rows:
                f = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=r[k] if isinstance(r[k], list) else
                                                                          [r[k]])) for k in ("hist", "ts", "item")}
                f["city"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[r["city"].encode()]))
                for k in ("click", "buy"):
                    f[k] = tf.train.Feature(float_list=tf.train.FloatList(value=[r[k]]))
                writer.write(tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString())


ROWS = [  # histories stored out of time order; ties (equal times) keep their order in the list
    {"hist": [5, 3, 9], "ts": [30, 10, 20], "item": 1, "city": "a", "click": 1.0, "buy": 0.0},
    {"hist": [7, 8, 2, 4, 6], "ts": [9, 2, 2, 1, 5], "item": 2, "city": "b", "click": 1.0, "buy": 1.0},
    {"hist": [], "ts": [], "item": 3, "city": "a", "click": 0.0, "buy": 0.0},
    {"hist": [1], "ts": [4], "item": 4, "city": "c", "click": 0.0, "buy": 0.0},
]
ORDERED = [[3, 9, 5], [4, 8, 2, 6, 7], [], [1]]


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_order_column_sorts_each_history_and_the_cap_truncates(tmp_path, fmt):
    path = tmp_path / f"s.{fmt}"
    _write(fmt, path, ROWS)
    samples = list(FileBatches(fmt, str(path), _schema(fmt, cap=10), 1, epochs=1).samples())
    assert [s["hist"].tolist() for s in samples] == ORDERED and [s["tokens"] for s in samples] == [3, 5, 0, 1]
    assert [int(s["item"]) for s in samples] == [1, 2, 3, 4] and samples[1]["labels"].tolist() == [1.0, 1.0]
    assert int(samples[0]["city"]) == int(tf.strings.to_hash_bucket_fast(["a"], 2 ** 62)[0])
    truncated = list(FileBatches(fmt, str(path), _schema(fmt, cap=3), 2, epochs=1).samples())  # the most recent 3
    assert [s["hist"].tolist() for s in truncated] == [[3, 9, 5], [2, 6, 7], [], [1]]
    stored = list(FileBatches(fmt, str(path), _schema(fmt, cap=10, order=None), 3, epochs=1).samples())
    assert [s["hist"].tolist() for s in stored] == [r["hist"] for r in ROWS]  # without an order: as stored
    assert [s["hist"].tolist() for s in FileBatches(fmt, str(path), _schema(fmt, 10), 1, epochs=1).samples(start=2)] \
        == ORDERED[2:]
    with pytest.raises(ValueError, match="the schema has no sequence"):
        next(FileBatches(fmt, str(path), parse_schema({"label": "click", "features": {"item": {}}}, fmt, ["item"]), 1,
                         epochs=1).samples())


WHERE = {"parquet": "Parquet file {path} row {n}", "csv": "CSV file {path} line {line}",
         "tfrecord": "TFRecord file {path} record {n}"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_bad_sequence_records_name_the_file_and_record(tmp_path, fmt):
    path = tmp_path / f"b.{fmt}"
    rows = [dict(r) for r in ROWS]
    rows[1]["ts"] = [9, 2, 2]  # 3 times for 5 ids
    _write(fmt, path, rows)
    where = WHERE[fmt].format(path=path, n=2, line=3)
    with pytest.raises(ValueError, match=f"{where}: column 'ts' \\(the order of feature 'hist'\\) holds 3 values, "
                                         f"column 'hist' 5 ids"):
        list(FileBatches(fmt, str(path), _schema(fmt), 1, epochs=1).samples())
    skipping = FileBatches(fmt, str(path), _schema(fmt, cap=10), 1, epochs=1, on_bad_record="skip", max_bad_records=1)
    assert [int(s["item"]) for s in skipping.samples()] == [1, 3, 4] and skipping.skipped == 1
    _write(fmt, path, ROWS)
    with pytest.raises(ValueError, match=f"{where}: column 'hist' of feature 'hist' holds a history of 5 ids, more "
                                         f"than data.sequences.max_length = 4; raise it, or set truncate: true"):
        list(FileBatches(fmt, str(path), _schema(fmt, cap=4, truncate=False), 1, epochs=1).samples())


@pytest.mark.parametrize("fmt, change, match", [
    ("parquet", {"hist": pa.list_(pa.float64())}, "column 'hist' of feature 'hist' \\(type int64, shape list\\) holds "
                                                  "lists of floats, not integer ids"),
    ("parquet", {"ts": pa.list_(pa.string())}, "column 'ts' of the order of feature 'hist' \\(type int64, shape list\\)"
                                               " holds lists of strings, not integers"),
    ("parquet", {"ts": None}, "no column 'ts' \\(read for the order of feature 'hist'\\)"),
    ("parquet", {"buy": None}, "no column 'buy' \\(read for the label values\\)"),
    ("csv", {"ts": None}, "no column 'ts' \\(read for the order of feature 'hist'\\) in its header"),
    ("csv", {"ts": "1.5"}, "column 'ts' of the order of feature 'hist' \\(type int64\\) holds floats"),
    ("tfrecord", {"ts": 1.5}, "column 'ts' of the order of feature 'hist' \\(type int64, shape list\\) holds lists of "
                              "floats, not integers"),
])
def test_sequence_files_are_checked_at_start(tmp_path, fmt, change, match):
    path = tmp_path / f"c.{fmt}"
    name, value = next(iter(change.items()))
    if fmt == "parquet":
        types = {"hist": pa.list_(pa.int64()), "ts": pa.list_(pa.int64()), "item": pa.int64(), "city": pa.string(),
                 "click": pa.float32(), "buy": pa.float32()}
        columns = {k: [r[k] for r in ROWS] for k in types}
        if value is None:
            del types[name]
        else:
            types[name] = value
            columns[name] = [[str(v) if value == pa.list_(pa.string()) else float(v) for v in r] for r in columns[name]]
        pq.write_table(pa.table({k: pa.array(columns[k], t) for k, t in types.items()}), path)
    elif fmt == "csv":
        header = "hist,item,city,click,buy" if value is None else "hist,ts,item,city,click,buy"
        line = "5|3,1,a,1,0" if value is None else f"5|3,{value}|2,1,a,1,0"
        path.write_text(f"{header}\n{line}\n")
    else:
        with tf.io.TFRecordWriter(str(path)) as writer:
            f = {"hist": tf.train.Feature(int64_list=tf.train.Int64List(value=[5])),
                 "ts": tf.train.Feature(float_list=tf.train.FloatList(value=[value])),
                 "item": tf.train.Feature(int64_list=tf.train.Int64List(value=[1])),
                 "city": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"a"]))}
            for k in ("click", "buy"):
                f[k] = tf.train.Feature(float_list=tf.train.FloatList(value=[0.0]))
            writer.write(tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString())
    with pytest.raises(ValueError, match=f"file {path}: " + match):
        FileBatches(fmt, str(path), _schema(fmt), 1, epochs=1)


def test_sequence_schema_errors():
    seq = FileSequence("hist", 10)
    good = {"label": ["click", "buy"], "features": {"hist": {"shape": "list", "order": "ts"}, "item": {}, "city": {}}}
    assert parse_schema(good, "parquet", NAMES, sequence=seq).sequence == seq
    for change, match in (
            ({"label": "click"}, "data.schema.label: with data.sequences, the columns of the 2 tasks' labels "
                                 "\\['click', 'conversion'\\]"),
            ({"label": ["click"]}, "data.schema.label: with data.sequences"),
            ({"label": ["click", {"column": "buy", "range": [1, 0]}]}, "data.schema.label\\[1\\].range: expected"),
            ({"dense": ["price"]}, "data.schema.dense: a sequence \\(data.sequences\\) has no dense features"),
            ({"weight": "w"}, "data.schema.weight: sample weights are not taken with data.sequences"),
            ({"features": {**good["features"], "hist": {"shape": "one"}}},
             "data.schema.features.hist.shape: the sequence feature \\(data.sequences.feature\\) is a history of any "
             "length: give shape list, got 'one'"),
            ({"features": {**good["features"], "item": {"shape": "list"}}},
             "data.schema.features.item.shape: with data.sequences every feature but the sequence 'hist' holds one id"),
            ({"features": {**good["features"], "item": {"order": "ts"}}},
             "data.schema.features.item.order: only for shape 'list'"),
            ({"features": {**good["features"], "hist": {"shape": "list", "order": "hist"}}},
             "data.schema.features.hist.order: the column of the ids' sort keys, not the ids' own column 'hist'")):
        with pytest.raises(ValueError, match=match):
            parse_schema({**good, **change}, "parquet", NAMES, sequence=seq)
    with pytest.raises(ValueError, match="data.schema.label: a list of label columns is for sequences"):
        parse_schema({**good, "features": {"item": {}}}, "parquet", ["item"])
    with pytest.raises(ValueError, match="data.schema.columns: column 'ts' is read by the schema but not among"):
        parse_schema({**good, "columns": ["hist", "item", "city", "click", "buy"]}, "csv", NAMES, sequence=seq)


def test_shipped_config_and_config_errors(ml):
    config = cfg.load_config(ROOT / "configs" / "movielens1m_seq_parquet.yaml")
    assert config.data.sequential and config.model.name == "grm" and config.data.num_dense == 0
    builtin = cfg.load_config(ROOT / "configs" / "movielens1m_seq.yaml")
    assert config.data.schema == parse_schema(convert.movielens_seq_schema("parquet"), "parquet",
                                              [f.name for f in builtin.features], sequence=FileSequence("items", 200,
                                                                                                        True))
    assert config.data.sequences == builtin.data.sequences and config.features == builtin.features
    assert not ml["builtin"].data.schema and ml["parquet"].data.schema.sequence == FileSequence("items", MAX_LENGTH,
                                                                                               True)
    raw = yaml.safe_load((ROOT / "configs" / "movielens1m_seq_parquet.yaml").read_text())
    for change, match in (
            (lambda r: r["data"].update(follow=True), "data.follow: not with data.sequences"),
            (lambda r: r["model"].update(name="dcn"), "model.name: 'dcn' does not fit data.source 'parquet'"),
            (lambda r: r["data"]["sequences"].update(median_length=3), "data.sequences.median_length: a knob of the "
                                                                       "synthetic lengths; source 'parquet'"),
            (lambda r: r["data"]["sequences"].update(max_length=0), "data.sequences: max_length must be an int >= 1"),
            (lambda r: r["data"]["sequences"].update(target="genres"), "data.sequences: target: 'genres' is not "
                                                                       "among the features"),
            (lambda r: r["data"]["sequences"].update(feature="history"), "data.sequences: feature: the sequence "
                                                                         "feature 'history' is not among"),
            (lambda r: r["features"][2].update(name="labels"), "feature 'labels': the name is reserved"),
            (lambda r: r["data"]["schema"]["features"].update(items={"type": "int64"}),
             "data.schema.features.items.shape: the sequence feature")):
        bad = yaml.safe_load(yaml.safe_dump(raw))
        change(bad)
        with pytest.raises(ValueError, match=match):
            cfg.parse_config(bad)
    dlrm = yaml.safe_load(yaml.safe_dump(raw))
    dlrm["model"] = {"name": "dlrm"}
    dlrm["features"][0]["combiner"] = "mean"
    assert cfg.parse_config(dlrm).data.sequential  # the DLRM baseline: the history a pooled bag, two logits


def test_the_docs_example(tmp_path):
    """docs/guide/your-data.md's data section of sequences reads its example columns."""
    import re

    page = (ROOT / "docs" / "guide" / "your-data.md").read_text()
    data = next(yaml.safe_load(block)["data"] for block in re.findall(r"```yaml\n(.*?)```", page, re.S)
                if "sequences:" in block)
    for split in ("train", "test"):
        (tmp_path / split).mkdir()
        pq.write_table(pa.table({"history": [[7, 5, 9], [4]] * 4, "history_times": [[3, 1, 2], [8]] * 4,
                                 "item_id": list(range(8)), "device": ["ios", "web"] * 4,
                                 "clicked": [1.0, 0.0] * 4, "converted": [0.0] * 8}), tmp_path / split / "0.parquet")
    data.update(path=str(tmp_path / "train" / "*.parquet"), eval_path=str(tmp_path / "test" / "*.parquet"))
    features = [{"name": "items", "dim": 8}, {"name": "target", "dim": 8, "shares": "items"},
                {"name": "device", "dim": 4}]
    config = cfg.parse_config({"features": features, "data": data, "model": {"name": "grm"}})
    features, labels = next(iter(experiment.make_dataset(config, 2, 0, 1)))
    assert features["items"].to_list() == [[5, 9, 7], [4]] and features["target"].numpy().tolist() == [0, 1]
    assert labels.numpy().tolist() == [[1.0, 0.0], [0.0, 0.0]] and sorted(features) == ["device", "items", "target"]

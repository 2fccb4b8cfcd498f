"""python -m tf_fusedrec.data.convert movielens: the converted train and test splits (TFRecord, Parquet, CSV) give the
built-in MovieLens reader's batches (data.shuffle: false) on 1 and 2 workers; --shuffle permutes the training
ratings; the command writes the data section."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tf_fusedrec  # noqa: F401

from tests.data.test_movielens import _ratings, _split_reference, _write_dir
from tf_fusedrec.data import MOVIELENS_SPARSE, convert, movielens_dataset
from tf_fusedrec.data.files import parse_schema
from tf_fusedrec.data.readers import FileBatches

pytest.importorskip("pyarrow")

FORMATS = ("tfrecord", "parquet", "csv")
RATINGS = 403


@pytest.fixture(scope="module", name="ml")
def ml_fixture(tmp_path_factory):
    """A small ML-1M directory (tests/data/test_movielens.py's users and movies) converted to each format, 2 files a
    split: {"dir": its path, "ratings": its lines, format: the output directory}."""
    root = tmp_path_factory.mktemp("ml")
    ratings = _ratings(RATINGS, seed=4)
    out = {"dir": _write_dir(root / "ml-1m", ratings), "ratings": ratings}
    train, test = convert.movielens_tables(out["dir"])
    for fmt in FORMATS:
        schema = convert.movielens_schema(fmt)
        for name, table in (("train", train), ("test", test)):
            convert.write(table, schema, str(root / fmt / name), fmt, files=2)
        out[fmt] = str(root / fmt)
    return out


def _reader(ml, fmt, split, batch_size, rank=0, num_ranks=1):
    schema = parse_schema(convert.movielens_schema(fmt), fmt, MOVIELENS_SPARSE)
    return FileBatches(fmt, os.path.join(ml[fmt], split, "part-*"), schema, batch_size, rank=rank,
                       num_ranks=num_ranks, epochs=1)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("num_ranks", [1, 2])
@pytest.mark.parametrize("split", ["train", "test"])
def test_converted_movielens_equals_the_builtin_reader(ml, fmt, num_ranks, split, batches_equal):
    lines = _split_reference(ml["ratings"])[0 if split == "train" else 1]
    batch = 8 if split == "train" else 3
    for rank in range(num_ranks):
        want = list(movielens_dataset(ml["dir"], batch, rank=rank, num_ranks=num_ranks, split=split))
        got = list(_reader(ml, fmt, split, batch, rank, num_ranks).dataset())
        assert len(got) == len(want) == len(lines) // (batch * num_ranks) > 1
        for a, b in zip(want, got):
            batches_equal(a, b)


def test_the_tables_hold_every_rating_once_and_shuffle_permutes_train(ml):
    train, test = convert.movielens_tables(ml["dir"])
    want_train, want_test = _split_reference(ml["ratings"])
    pairs = [(int(u), int(m)) for u, m in zip(train.column("user_id").to_numpy(), train.column("movie_id").to_numpy())]
    assert pairs == [tuple(int(x) for x in line.split("::")[:2]) for line in want_train]
    assert test.num_rows == len(want_test) and train.num_rows + test.num_rows == RATINGS
    shuffled, same_test = convert.movielens_tables(ml["dir"], shuffle=7)
    assert same_test.equals(test) and not shuffled.equals(train)

    def rows(table):  # every column of each record, in order
        return [tuple(str(v) for v in r.values()) for r in table.to_pylist()]

    assert rows(shuffled) != rows(train) and sorted(rows(shuffled)) == sorted(rows(train))


def test_convert_cli_writes_the_data_section(ml, tmp_path):
    import yaml

    out = tmp_path / "out"
    assert convert.main(["movielens", ml["dir"], "--to", "csv", "--out", str(out), "--files", "2"]) == 0
    assert sorted(os.listdir(out)) == ["schema.yaml", "test", "train"]
    assert sorted(os.listdir(out / "train")) == ["part-00000-of-00002.csv", "part-00001-of-00002.csv"]
    data = yaml.safe_load((out / "schema.yaml").read_text())["data"]
    assert data["path"] == str(out / "train" / "part-*.csv") and data["eval_path"] == str(out / "test" / "part-*.csv")
    schema = parse_schema(data["schema"], data["source"], MOVIELENS_SPARSE)
    got = list(FileBatches("csv", data["eval_path"], schema, 4, epochs=1).dataset())
    want = list(movielens_dataset(ml["dir"], 4, split="test"))
    assert len(got) == len(want) and all(np.array_equal(a[1], b[1]) for a, b in zip(got, want))
    assert convert.main(["movielens", str(tmp_path / "nowhere"), "--to", "csv", "--out", str(out)]) == 2


def test_a_rating_of_an_unknown_user_names_the_line(tmp_path):
    path = _write_dir(tmp_path / "ml", ["1::1::5::1", "4::1::3::2"])  # user 4 is not in users.dat
    with pytest.raises(ValueError, match=f"{path}/ratings.dat:2: rates UserID 4, which users.dat does not have"):
        convert.movielens_tables(path)


def test_data_shuffle_is_a_movielens_key(ml):
    from tf_fusedrec.config import parse_config
    from tf_fusedrec.train import experiment

    features = [{"name": n, "dim": 4} for n in MOVIELENS_SPARSE]
    raw = {"features": features, "data": {"source": "movielens", "path": ml["dir"], "num_dense": 0, "shuffle": False}}
    config = parse_config(raw)
    assert config.data.shuffle is False
    assert parse_config({**raw, "data": {"source": "movielens", "path": "x"}}).data.shuffle is True
    got = list(experiment.make_dataset(config, 8, 1, 2).take(3))  # file order: the unshuffled reader's batches
    want = list(movielens_dataset(ml["dir"], 8, rank=1, num_ranks=2, split="train").take(3))
    assert all(np.array_equal(a[0]["user_id"], b[0]["user_id"]) for a, b in zip(got, want)) and len(got) == 3
    with pytest.raises(ValueError, match="data.shuffle: only for source 'movielens', not 'criteo'"):
        parse_config({**raw, "data": {"source": "criteo", "path": "x", "shuffle": False}})
    with pytest.raises(ValueError, match="data.shuffle: must be true or false, got 'no'"):
        parse_config({**raw, "data": {**raw["data"], "shuffle": "no"}})

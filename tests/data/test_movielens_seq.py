"""MovieLens-1M sequence mode (tf_fusedrec/data/movielens_seq.py): every sample against a plain-Python reference
built from the rating lines (histories in time order, targets, contexts, labels), the leave-last-out split, worker
shares and shuffled epochs, the cap, file errors, and the config (configs/movielens1m_seq.yaml, the train app's
dispatch in tf_fusedrec.train.experiment)."""

from __future__ import annotations

import itertools
import math
import random
import re
from collections import defaultdict

import numpy as np
import pytest
import yaml

import tf_fusedrec  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow)
import tensorflow as tf

from tf_fusedrec import config as cfg
from tf_fusedrec.data.movielens_seq import MOVIELENS_SEQ_CONTEXTS, MovieLensSeqSpec, movielens_seq_samples
from tf_fusedrec.train import experiment

from tests.data.test_movielens import _write_dir as write_movielens_dir, _zip_hash
from tests.subprocess_runner import ROOT

USERS = [
    "1::F::1::10::48067",
    "2::M::56::16::70072",
    "3::M::25::15::55117",
    "5::F::45::0::55117-1234",   # user 4 does not exist
    "6::M::50::9::02460",
    "8::F::18::4::10001",        # no ratings
]
MOVIES = [f"{m}::Film {m} (1999)::Comedy|Drama" for m in (1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 15, 20)]
MOVIE_IDS = [int(line.split("::")[0]) for line in MOVIES]
RATINGS_PER_USER = {1: 25, 2: 1, 3: 2, 5: 40, 6: 12}   # user 2: one rating, no sample; user 3: one train sample
ALL = MOVIELENS_SEQ_CONTEXTS
SPEC = MovieLensSeqSpec("items", "target", ALL)


def _ratings(seed=0):
    """Rating lines in a shuffled file order; timestamps from a small range, so a user has many ties."""
    rnd = random.Random(seed)
    lines = [f"{u}::{rnd.choice(MOVIE_IDS)}::{rnd.randint(1, 5)}::{978300000 + rnd.randint(0, 12)}"
             for u, n in RATINGS_PER_USER.items() for _ in range(n)]
    rnd.shuffle(lines)
    return lines


RATINGS = _ratings()


def _write_dir(path, ratings=RATINGS, users=USERS, movies=MOVIES, newline="\n"):
    return write_movielens_dir(path, ratings, users, movies, newline)  # with this module's files as defaults


def reference(ratings=RATINGS, test_fraction=0.1, max_length=None, contexts=ALL):
    """(train, test) sample lists in (user, t) order, computed with plain Python from the lines."""
    users = {}
    for line in USERS:
        uid, g, age, occ, z = line.split("::")
        users[int(uid)] = {"user_id": int(uid), "gender": {"F": 0, "M": 1}[g], "age": int(age),
                           "occupation": int(occ), "zip": _zip_hash(z)}
    by_user = defaultdict(list)
    for line in ratings:
        if line.strip():
            u, m, r, ts = (int(x) for x in line.split("::"))
            by_user[u].append((ts, m, r))
    train, test = [], []
    for u in sorted(by_user):
        rows = sorted(by_user[u])  # time, then MovieID, then rating
        n = len(rows)
        n_test = math.floor(test_fraction * n)
        for t in range(1, n):
            history = [m for _, m, _ in rows[:t]]
            if max_length is not None:
                history = history[-max_length:]
            _, movie, rating = rows[t]
            split = test if t >= n - n_test else train
            split.append({"index": len(split), "tokens": len(history), "items": history, "target": movie,
                          **{c: users[u][c] for c in contexts},
                          "labels": [float(rating >= 4), float(rating == 5)], "t": t})
    return train, test


def plain(sample):
    """A sample dict of the reader as plain Python values, checking the dtypes and shapes on the way."""
    out = {}
    for key, value in sample.items():
        if key in ("index", "tokens"):
            assert isinstance(value, int), key
            out[key] = value
        elif key == "labels":
            assert value.dtype == np.float32 and value.shape == (2,)
            out[key] = [float(v) for v in value]
        elif key == "items":
            assert value.dtype == np.int64 and value.ndim == 1 and value.size == sample["tokens"]
            out[key] = [int(v) for v in value]
        else:
            assert np.asarray(value).dtype == np.int64 and np.ndim(value) == 0, key
            out[key] = int(value)
    return out


def read(path, spec=SPEC, **kwargs):
    return [plain(s) for s in movielens_seq_samples(path, spec, **kwargs)]


def without_t(samples):
    return [{k: v for k, v in s.items() if k != "t"} for s in samples]


@pytest.fixture(scope="module")
def ml_dir(tmp_path_factory):
    return _write_dir(tmp_path_factory.mktemp("ml-1m"))


# ----------------------------------------------------------------------------------------------------------------
# Samples against the reference
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("held_out", [False, True])
def test_every_sample_matches_the_reference(ml_dir, held_out):
    train, test = reference()
    expected = test if held_out else train
    assert read(ml_dir, held_out=held_out) == without_t(expected)
    assert expected and all(s["tokens"] >= 1 for s in expected)  # t = 0 is never a sample


def test_histories_are_in_time_order_with_movie_id_ties(ml_dir):
    # Independent of the reference's sort: rebuild each user's last history from the lines by timestamp buckets.
    samples = read(ml_dir, spec=MovieLensSeqSpec("items", "target", ("user_id",), test_fraction=0.0))
    last = {s["user_id"]: s for s in samples}
    for user, n in RATINGS_PER_USER.items():
        if n < 2:
            assert user not in last
            continue
        rows = [tuple(int(x) for x in line.split("::")) for line in RATINGS if int(line.split("::")[0]) == user]
        stamps = sorted({r[3] for r in rows})
        in_time = [m for ts in stamps for m in sorted(r[1] for r in rows if r[3] == ts)]
        assert last[user]["items"] + [last[user]["target"]] == in_time
    assert len(samples) == sum(n - 1 for n in RATINGS_PER_USER.values() if n)


def test_labels_are_liked_and_loved(ml_dir):
    samples = read(ml_dir) + read(ml_dir, held_out=True)
    assert {tuple(s["labels"]) for s in samples} == {(0.0, 0.0), (1.0, 0.0), (1.0, 1.0)}  # conversion => click


# ----------------------------------------------------------------------------------------------------------------
# Split
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("test_fraction", [0.0, 0.1, 0.3, 1.0])
def test_split_is_disjoint_complete_and_the_future(ml_dir, test_fraction):
    spec = MovieLensSeqSpec("items", "target", ("user_id",), test_fraction=test_fraction)
    train = {(s["user_id"], s["tokens"]) for s in read(ml_dir, spec)}
    test = {(s["user_id"], s["tokens"]) for s in read(ml_dir, spec, held_out=True)}
    everything = {(u, t) for u, n in RATINGS_PER_USER.items() for t in range(1, n)}
    assert not train & test and train | test == everything
    for user in RATINGS_PER_USER:
        mine_train = [t for u, t in train if u == user]
        mine_test = [t for u, t in test if u == user]
        if mine_train and mine_test:
            assert max(mine_train) < min(mine_test)
    ref_train, ref_test = reference(test_fraction=test_fraction)
    assert train == {(s["user_id"], s["t"]) for s in ref_train} and test == {(s["user_id"], s["t"]) for s in ref_test}
    if test_fraction == 0.0:
        assert not test
    if test_fraction == 1.0:
        assert not train


# ----------------------------------------------------------------------------------------------------------------
# Workers and epochs
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("num_ranks", [1, 2, 3])
def test_worker_shares_interleave_to_the_one_worker_stream(ml_dir, num_ranks, shuffle):
    whole = read(ml_dir, shuffle=shuffle, seed=7)
    shares = [read(ml_dir, rank=r, num_ranks=num_ranks, shuffle=shuffle, seed=7) for r in range(num_ranks)]
    interleaved = [s for row in itertools.zip_longest(*shares) for s in row if s is not None]
    assert interleaved == whole
    indices = [s["index"] for share in shares for s in share]
    assert len(indices) == len(set(indices)) == len(reference()[0])


def test_shuffled_epochs(ml_dir):
    ordered = read(ml_dir)
    size = len(ordered)
    two = read(ml_dir, shuffle=True, seed=3, epochs=2)
    first, second = two[:size], two[size:]
    for epoch in (first, second):
        assert sorted(epoch, key=lambda s: s["index"]) == ordered
    assert first != ordered and first != second
    assert two == read(ml_dir, shuffle=True, seed=3, epochs=2)  # deterministic
    assert first != read(ml_dir, shuffle=True, seed=4)
    endless = [plain(s) for s in itertools.islice(movielens_seq_samples(ml_dir, SPEC, shuffle=True, seed=3,
                                                                        epochs=None), 2 * size + 1)]
    assert endless[:2 * size] == two


# ----------------------------------------------------------------------------------------------------------------
# The cap
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("held_out", [False, True])
def test_a_history_over_the_cap_is_an_error_naming_cap_user_and_length(ml_dir, held_out):
    cap = 3
    samples = reference()[1 if held_out else 0]
    first = next(s for s in samples if s["tokens"] > cap)
    longest = max(s["tokens"] for s in samples if s["user_id"] == first["user_id"])
    spec = MovieLensSeqSpec("items", "target", ALL, max_length=cap)
    message = (f"user {first['user_id']} has a history of {longest} movies in the {'test' if held_out else 'train'} "
               f"split, more than the cap max_length={cap}")
    with pytest.raises(ValueError, match=re.escape(message)):
        movielens_seq_samples(ml_dir, spec, held_out=held_out)  # before the first sample


@pytest.mark.parametrize("held_out", [False, True])
def test_truncate_keeps_the_most_recent(ml_dir, held_out):
    spec = MovieLensSeqSpec("items", "target", ALL, max_length=3, truncate=True)
    expected = reference(max_length=3)[1 if held_out else 0]
    assert read(ml_dir, spec, held_out=held_out) == without_t(expected)
    assert max(s["tokens"] for s in expected) == 3


# ----------------------------------------------------------------------------------------------------------------
# Files and errors
# ----------------------------------------------------------------------------------------------------------------

def test_crlf_blank_lines_and_file_order(tmp_path):
    path = _write_dir(tmp_path / "crlf", RATINGS[:10] + [""] + sorted(RATINGS[10:]), newline="\r\n")
    assert read(path) == without_t(reference()[0])


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no_such_dir"):
        movielens_seq_samples(str(tmp_path / "no_such_dir"))
    path = _write_dir(tmp_path / "d")
    for name in ("users.dat", "movies.dat", "ratings.dat"):
        (tmp_path / "d" / name).rename(tmp_path / "d" / (name + ".bak"))
        with pytest.raises(FileNotFoundError, match=name):
            movielens_seq_samples(path)
        (tmp_path / "d" / (name + ".bak")).rename(tmp_path / "d" / name)


@pytest.mark.parametrize("table, line, match", [
    ("users", "7::M::25", r"users.dat:7: expected 5 '::'-separated fields"),
    ("users", "7::X::25::1::12345", r"users.dat:7: Gender must be F or M"),
    ("users", "1::M::25::1::12345", r"users.dat:7: duplicate UserID 1"),
    ("movies", "21::Some Film (2000)::Comedy|Horrorr", r"movies.dat:15: unknown genre 'Horrorr'"),
    ("movies", "x::Some Film (2000)::Comedy", r"movies.dat:15: MovieID must be an integer"),
])
def test_malformed_tables_raise_naming_file_and_line(tmp_path, table, line, match):
    users = USERS + [line] if table == "users" else USERS
    movies = MOVIES + [line] if table == "movies" else MOVIES
    with pytest.raises(ValueError, match=match):
        movielens_seq_samples(_write_dir(tmp_path / "d", users=users, movies=movies))


@pytest.mark.parametrize("bad, match", [
    ("1::2::5", r"ratings.dat:5: expected 4 '::'-separated fields \(UserID::MovieID::Rating::Timestamp\), got 3"),
    ("4::1::3::0", r"ratings.dat:5: rates UserID 4 which users.dat does not have"),
    ("1::8::3::0", r"ratings.dat:5: rates MovieID 8 which movies.dat does not have"),
    ("1::99999::3::0", r"ratings.dat:5: rates MovieID 99999 which movies.dat does not have"),
    ("1::two::3::0", r"ratings.dat:5: MovieID must be an integer, got 'two'"),
    ("1::2::6::0", r"ratings.dat:5: Rating must be in 1-5, got 6"),
    ("1::2::4.5::0", r"ratings.dat:5: Rating must be an integer"),
    ("1::2::4::-3", r"ratings.dat:5: Timestamp must be >= 0"),
])
def test_malformed_ratings_raise_naming_file_and_line(tmp_path, bad, match):
    ratings = list(RATINGS)
    ratings[4] = bad
    with pytest.raises(ValueError, match=match):
        movielens_seq_samples(_write_dir(tmp_path / "d", ratings=ratings))


def test_movie_ids_must_fit_the_vocab(ml_dir):
    with pytest.raises(ValueError, match=r"MovieID 20, not below the vocab 20 of the features 'items' and 'target'"):
        movielens_seq_samples(ml_dir, MovieLensSeqSpec(vocab=20))
    assert read(ml_dir, MovieLensSeqSpec("items", "target", ALL, vocab=21)) == without_t(reference()[0])


def test_an_endless_empty_split_is_an_error(ml_dir):
    spec = MovieLensSeqSpec(test_fraction=0.0)
    assert list(movielens_seq_samples(ml_dir, spec, held_out=True)) == []
    with pytest.raises(ValueError, match="the test split .* holds no samples"):
        movielens_seq_samples(ml_dir, spec, held_out=True, epochs=None)


@pytest.mark.parametrize("kwargs, match", [
    ({"rank": 2, "num_ranks": 2}, r"rank must be an int in \[0, 1\], got 2"),
    ({"num_ranks": 0}, r"num_ranks must be an int >= 1, got 0"),
    ({"seed": -1}, r"seed must be an int >= 0, got -1"),
    ({"epochs": 0}, r"epochs must be an int >= 1 or None"),
    ({"spec": "items"}, r"spec must be a MovieLensSeqSpec, got str"),
])
def test_argument_errors(ml_dir, kwargs, match):
    with pytest.raises(ValueError, match=match):
        movielens_seq_samples(ml_dir, **kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"contexts": ("gender", "genres")}, r"feature 'genres' is not a MovieLens user feature"),
    ({"contexts": ("gender", "gender")}, r"feature 'gender' is given twice"),
    ({"target": "items"}, r"feature 'items' is given twice"),
    ({"feature": "labels"}, r"feature 'labels': the name is reserved"),
    ({"target": "user_id", "contexts": ()}, r"target 'user_id': the name of a MovieLens user feature"),
    ({"max_length": 0}, r"max_length must be an int >= 1, got 0"),
    ({"truncate": "yes"}, r"truncate must be true or false"),
    ({"test_fraction": 1.5}, r"test_fraction must be a number in \[0, 1\], got 1.5"),
])
def test_spec_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MovieLensSeqSpec(**kwargs)


# ----------------------------------------------------------------------------------------------------------------
# The config and the train app's dispatch
# ----------------------------------------------------------------------------------------------------------------

def raw_config(path="data/ml-1m"):
    with open(ROOT / "configs" / "movielens1m_seq.yaml") as f:
        raw = yaml.safe_load(f)
    raw["data"]["path"] = path
    return raw


def test_shipped_config():
    config = cfg.load_config(ROOT / "configs" / "movielens1m_seq.yaml")
    assert config.data.source == "movielens_seq" and config.data.source in cfg.SEQUENCE_SOURCES
    assert config.model.name == "grm" and config.data.path == "data/ml-1m"
    spec = MovieLensSeqSpec.from_config(config)
    assert spec == MovieLensSeqSpec("items", "target", ("gender", "age", "occupation"), max_length=200,
                                    truncate=True, vocab=3953)
    import tf_fusedrec as fr  # noqa: PLC0415

    groups = fr.FusedEmbedding(config.embedding_features()).groups
    assert {g.feature_names for g in groups} == {("items", "target"), ("age", "gender", "occupation")}
    assert {g.encoding for g in groups} == {"packed"}


@pytest.mark.parametrize("change, fragment", [
    (lambda r: r["data"].pop("path"), "data.path: required for source 'movielens_seq'"),
    (lambda r: r["data"]["sequences"].update(median_length=20), "data.sequences.median_length: a knob of the"),
    (lambda r: r["data"]["sequences"].update(empty_fraction=0.1), "data.sequences.empty_fraction"),
    (lambda r: r["data"]["sequences"].update(target=None), "target: required for the movielens_seq source"),
    (lambda r: r["features"].append({"name": "genres", "dim": 8}), "feature 'genres' is not a MovieLens user feature"),
    (lambda r: r["features"][1].update(vocab=4000), "target: feature 'target' has vocab 4000"),
    (lambda r: r["features"][2].update(hotness=[0, 2]), "feature 'gender': hotness must be 1"),
    (lambda r: r["data"]["sequences"].update(max_length=0), "max_length must be an int >= 1"),
    (lambda r: r["model"].update(name="dcn"), "model.name: 'dcn' does not fit data.source 'movielens_seq'"),
    (lambda r: r["model"].update(name="dlrm"), "the DLRM pools the sequence feature, give it combiner sum or mean"),
])
def test_config_rejections(change, fragment):
    raw = raw_config()
    change(raw)
    with pytest.raises(ValueError) as info:
        cfg.parse_config(raw)
    assert fragment in str(info.value)


def test_the_train_app_reads_the_samples_through_the_dispatch(ml_dir):
    config = cfg.parse_config(raw_config(ml_dir))
    spec = MovieLensSeqSpec.from_config(config)
    train, test = (without_t(reference(max_length=200, contexts=spec.contexts)[i]) for i in (0, 1))
    # held out: one shuffled pass over the test split, shared between the workers
    held = [[plain(s) for s in experiment.sequence_samples(config, r, 2, held_out=True)] for r in range(2)]
    assert sorted(held[0] + held[1], key=lambda s: s["index"]) == test
    # training: endless shuffled epochs of the train split
    stream = [plain(s) for s in itertools.islice(experiment.sequence_samples(config, 0, 1), 2 * len(train))]
    assert sorted(stream[:len(train)], key=lambda s: s["index"]) == train
    assert stream[len(train):] == read(ml_dir, spec, shuffle=True, seed=config.data.seed, epochs=2)[len(train):]
    # the batches make_dataset gives evaluate: ragged histories, ids [B], labels [B, 2]; every test sample once
    batches = list(experiment.make_dataset(config, 4, 0, 1, held_out=True))
    sizes = [4] * (len(test) // 4) + ([len(test) % 4] if len(test) % 4 else [])
    assert [int(y.shape[0]) for _, y in batches] == sizes
    features, labels = batches[0]
    assert isinstance(features["items"], tf.RaggedTensor) and features["items"].dtype == tf.int64
    assert sorted(features) == ["age", "gender", "items", "occupation", "target"] and labels.dtype == tf.float32
    got = sorted((tuple(h), int(t), tuple(float(v) for v in y)) for f, ys in batches
                 for h, t, y in zip(f["items"].to_list(), f["target"].numpy(), ys.numpy()))
    assert got == sorted((tuple(s["items"]), s["target"], tuple(s["labels"])) for s in test)
    first = next(iter(experiment.make_dataset(config, 5, 0, 1, start_step=2, steps=4)))[1]
    assert first.shape == (5, 2)
    assert len(list(experiment.make_dataset(config, 5, 0, 1, start_step=2, steps=4))) == 2

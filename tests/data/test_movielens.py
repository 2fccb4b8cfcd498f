"""MovieLens-1M reader: the joined features and labels against a pure-Python join, split, sharding, errors."""

from __future__ import annotations

import random

import pytest

import tf_fusedrec  # noqa: F401
import tensorflow as tf

from tf_fusedrec.data import MOVIELENS_GENRES, MOVIELENS_SPARSE, movielens_dataset, movielens_is_test

USERS = [
    "1::F::1::10::48067",
    "2::M::56::16::70072",
    "3::M::25::15::55117",
    "5::F::45::0::55117-1234",   # user 4 does not exist
    "6::M::50::9::02460",
]
MOVIES = [
    "1::Toy Story (1995)::Animation|Children's|Comedy",
    "2::Jumanji (1995)::Adventure|Children's|Fantasy",
    "3::Amélie (Fabuleux destin d'Amélie Poulain, Le) (2001)::Comedy|Romance",
    "7::Sabrina (1995)::Comedy|Romance",
    "9::Film-Noir Night (1946)::Film-Noir|Western|Action|Sci-Fi|War",
    "10::Untitled (1999)::",
]
USER_IDS = [1, 2, 3, 5, 6]
MOVIE_IDS = [1, 2, 3, 7, 9, 10]


def _ratings(n, seed=0):
    rnd = random.Random(seed)
    return [f"{rnd.choice(USER_IDS)}::{rnd.choice(MOVIE_IDS)}::{rnd.randint(1, 5)}::{978300760 + i}"
            for i in range(n)]


def _write_dir(path, ratings, users=USERS, movies=MOVIES, newline="\n"):
    path.mkdir(parents=True, exist_ok=True)
    for name, lines in (("ratings.dat", ratings), ("users.dat", users), ("movies.dat", movies)):
        (path / name).write_bytes("".join(l + newline for l in lines).encode("latin-1"))
    return str(path)


def _zip_hash(z):
    return int(tf.strings.to_hash_bucket_fast([z], 2 ** 62).numpy()[0])


def _reference(ratings):
    """Pure-Python join of rating lines with the users and movies tables."""
    users = {}
    for line in USERS:
        uid, g, age, occ, z = line.split("::")
        users[int(uid)] = {"gender": {"F": 0, "M": 1}[g], "age": int(age), "occupation": int(occ),
                           "zip": _zip_hash(z)}
    movies = {}
    for line in MOVIES:
        mid, _title, genres = line.split("::")
        movies[int(mid)] = [MOVIELENS_GENRES.index(g) for g in genres.split("|")] if genres else []
    rows = []
    for line in ratings:
        uid, mid, rating, _ts = line.split("::")
        uid, mid = int(uid), int(mid)
        feats = {"user_id": uid, "movie_id": mid, **users[uid], "genres": movies[mid]}
        rows.append((feats, 1.0 if int(rating) >= 4 else 0.0))
    return rows


def _split_reference(ratings, test_fraction=0.1, seed=0):
    """Independent statement of the split rule: fingerprint("seed:user:movie") / 2**53 < test_fraction."""
    keys = [f"{seed}:{l.split('::')[0]}:{l.split('::')[1]}" for l in ratings]
    h = tf.strings.to_hash_bucket_fast(keys, 2 ** 53).numpy()
    test = [l for l, x in zip(ratings, h) if x < test_fraction * 2 ** 53]
    train = [l for l, x in zip(ratings, h) if not x < test_fraction * 2 ** 53]
    return train, test


@pytest.fixture(scope="module")
def ml_dir(tmp_path_factory):
    ratings = _ratings(120)
    return _write_dir(tmp_path_factory.mktemp("ml-1m"), ratings), ratings


def test_constants():
    assert len(MOVIELENS_GENRES) == 18 and MOVIELENS_GENRES[0] == "Action" and MOVIELENS_GENRES[17] == "Western"
    assert MOVIELENS_GENRES.index("Children's") == 3 and MOVIELENS_GENRES.index("Film-Noir") == 9
    assert MOVIELENS_SPARSE == ["user_id", "movie_id", "gender", "age", "occupation", "zip", "genres"]


def test_format_and_latin1(ml_dir):
    path, _ = ml_dir
    with open(f"{path}/movies.dat", "rb") as f:
        assert "Amélie".encode("latin-1") in f.read()          # really latin-1 bytes, not UTF-8
    ds = movielens_dataset(path, batch_size=8, split="train")
    features, label = next(iter(ds))
    assert sorted(features) == sorted(MOVIELENS_SPARSE) and "dense" not in features
    for name in MOVIELENS_SPARSE[:-1]:
        assert features[name].dtype == tf.int64 and features[name].shape == [8], name
    assert isinstance(features["genres"], tf.RaggedTensor) and features["genres"].dtype == tf.int64
    assert label.dtype == tf.float32 and label.shape == [8]


@pytest.mark.parametrize("split", ["train", "test"])
def test_joined_rows_match_a_python_join(ml_dir, rows_of, split):
    path, ratings = ml_dir
    train, test = _split_reference(ratings)
    want_lines = train if split == "train" else test
    rows, _ = rows_of(movielens_dataset(path, batch_size=1, split=split))
    assert len(rows) == len(want_lines) > 0
    for (got, got_label), (want, want_label) in zip(rows, _reference(want_lines)):
        assert got == want
        assert got_label == want_label
    assert any(f["genres"] == [] for f, _ in _reference(ratings))   # the genre-less movie is rated somewhere
    # Batched output is the same rows, less the remainder.
    rows3, batches = rows_of(movielens_dataset(path, batch_size=3, split=split))
    assert batches == len(want_lines) // 3 and rows3 == rows[:batches * 3]


def test_split_is_disjoint_stable_and_seeded(tmp_path, rows_of):
    ratings = [f"{u}::{m}::{1 + (u + m) % 5}::0" for u in USER_IDS for m in MOVIE_IDS] * 3   # 90 ratings
    path = _write_dir(tmp_path / "d", ratings)

    def pairs(split, **kw):
        rows, _ = rows_of(movielens_dataset(path, batch_size=1, split=split, **kw))
        return [(f["user_id"], f["movie_id"]) for f, _ in rows]

    train, test = pairs("train", test_fraction=0.3), pairs("test", test_fraction=0.3)
    assert len(train) + len(test) == 90
    assert not set(train) & set(test)                        # a pair never lands in both splits
    assert pairs("test", test_fraction=0.3) == test          # stable
    assert 3 <= len(set(test)) <= 18                         # about 30% of the 30 pairs
    assert set(pairs("test", test_fraction=0.3, seed=1)) != set(test)
    assert pairs("test", test_fraction=0.0) == [] and pairs("train", test_fraction=1.0) == []
    _, ref_test = _split_reference(ratings, 0.3)
    assert test == [(int(l.split("::")[0]), int(l.split("::")[1])) for l in ref_test]
    # The public rule agrees, and the fraction is right on many pairs.
    u = list(range(1, 20_001))
    flags = movielens_is_test(u, [7] * len(u), test_fraction=0.1, seed=3)
    assert abs(flags.mean() - 0.1) < 0.01
    assert list(movielens_is_test([p[0] for p in test], [p[1] for p in test], 0.3)) == [True] * len(test)


@pytest.mark.parametrize("num_ranks", [2, 3])
def test_sharding_partitions_the_split(ml_dir, rows_of, num_ranks):
    path, ratings = ml_dir
    want = _reference(_split_reference(ratings)[0])
    for rank in range(num_ranks):
        rows, _ = rows_of(movielens_dataset(path, batch_size=1, rank=rank, num_ranks=num_ranks))
        assert rows == want[rank::num_ranks]
    rows, _ = rows_of(movielens_dataset(path, batch_size=4, rank=1, num_ranks=num_ranks))
    share = want[1::num_ranks]
    assert rows == share[:len(share) // 4 * 4]


def test_shuffle_permutes_the_share(ml_dir, rows_of):
    path, ratings = ml_dir
    plain, _ = rows_of(movielens_dataset(path, batch_size=1))
    a, _ = rows_of(movielens_dataset(path, batch_size=1, shuffle=True, seed=0, shuffle_buffer=64))
    b, _ = rows_of(movielens_dataset(path, batch_size=1, shuffle=True, seed=0, shuffle_buffer=64))
    assert a == b and a != plain
    key = lambda r: (sorted(r[0].items(), key=str), r[1])  # noqa: E731
    assert sorted(map(key, a)) == sorted(map(key, plain))


def test_crlf_and_blank_lines(tmp_path, rows_of):
    ratings = _ratings(20, seed=4)
    path = _write_dir(tmp_path / "crlf", ratings[:10] + [""] + ratings[10:], newline="\r\n")
    rows, _ = rows_of(movielens_dataset(path, batch_size=1, test_fraction=0.0))
    assert rows == _reference(ratings)


def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no_such_dir"):
        movielens_dataset(str(tmp_path / "no_such_dir"), 4)
    path = _write_dir(tmp_path / "d", _ratings(5))
    for name in ("users.dat", "movies.dat", "ratings.dat"):
        (tmp_path / "d" / name).rename(tmp_path / "d" / (name + ".bak"))
        with pytest.raises(FileNotFoundError, match=name):
            movielens_dataset(path, 4)
        (tmp_path / "d" / (name + ".bak")).rename(tmp_path / "d" / name)
    with pytest.raises(ValueError, match="split"):
        movielens_dataset(path, 4, split="valid")


@pytest.mark.parametrize("table, line, match", [
    ("users", "7::M::25", r"users.dat:6: expected 5 '::'-separated fields"),
    ("users", "7::X::25::1::12345", r"users.dat:6: Gender must be F or M"),
    ("users", "1::M::25::1::12345", r"users.dat:6: duplicate UserID 1"),
    ("users", "x::M::25::1::12345", r"users.dat:6: UserID must be an integer"),
    ("movies", "11::Some Film (2000)::Comedy|Horrorr", r"movies.dat:7: unknown genre 'Horrorr'"),
    ("movies", "11::Some Film (2000)", r"movies.dat:7: expected 3 '::'-separated fields"),
])
def test_malformed_tables_raise(tmp_path, table, line, match):
    users = USERS + [line] if table == "users" else USERS
    movies = MOVIES + [line] if table == "movies" else MOVIES
    path = _write_dir(tmp_path / "d", _ratings(5), users=users, movies=movies)
    with pytest.raises(ValueError, match=match):
        movielens_dataset(path, 4)


@pytest.mark.parametrize("bad, match", [
    ("1::2::5", r"expected 4 fields separated by ::.*ratings.dat line 5 has 3 fields: 1::2::5"),
    ("4::1::3::0", r"ratings.dat line 5 rates UserID 4 which users.dat does not have"),
    ("1::8::3::0", r"ratings.dat line 5 rates MovieID 8 which movies.dat does not have"),
    ("1::99999::3::0", r"ratings.dat line 5 rates MovieID 99999"),
    ("1::two::3::0", r"StringToNumberOp|convert"),
])
def test_malformed_ratings_raise(tmp_path, bad, match):
    ratings = _ratings(8)
    ratings[4] = bad
    path = _write_dir(tmp_path / "d", ratings)
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        list(movielens_dataset(path, batch_size=2, test_fraction=0.5))

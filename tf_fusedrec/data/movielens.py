"""MovieLens-1M ratings as click data: streamed ratings joined with the user and movie tables.

    ds = movielens_dataset("/data/ml-1m", batch_size=1024, rank=r, num_ranks=n, split="train", shuffle=True)

**Files** (in ``data_dir``, ``::``-separated, latin-1): ``ratings.dat`` (``UserID::MovieID::Rating::Timestamp``),
``users.dat`` (``UserID::Gender::Age::Occupation::Zip-code``), ``movies.dat`` (``MovieID::Title::Genres``, genres
separated by ``|``). Blank lines are skipped; ``\\r\\n`` line endings are accepted.

**Features** (all int64 ids >= 0, no ``"dense"``): ``"user_id"``, ``"movie_id"`` (the ids of the files), ``"gender"``
(F = 0, M = 1), ``"age"`` (the age code of users.dat: 1, 18, 25, 35, 45, 50, 56), ``"occupation"`` (0-20),
``"zip"`` (``tf.strings.to_hash_bucket_fast(zip, 2**62)``, in ``[0, 2**62)``), each ``[B]``, and ``"genres"``, a
``tf.RaggedTensor [B, None]`` of the movie's genres as ids ``MOVIELENS_GENRES.index(name)`` in the order of the
file (MOVIELENS_GENRES is the list of the MovieLens README: 0 Action, 1 Adventure, 2 Animation, 3 Children's,
4 Comedy, 5 Crime, 6 Documentary, 7 Drama, 8 Fantasy, 9 Film-Noir, 10 Horror, 11 Musical, 12 Mystery, 13 Romance,
14 Sci-Fi, 15 Thriller, 16 War, 17 Western). ``label``: float32 ``[B]``, 1.0 for a rating >= 4, else 0.0.

**Split.** A rating is in the test split when ``fingerprint("seed:user:movie") / 2**53 < test_fraction`` (a hash
of the pair, ``movielens_is_test``): stable across runs, machines, worker counts and file order, and a (user,
movie) pair is never in both splits. About ``test_fraction`` of the ratings are test ratings.

**Workers.** The global stream is the split's ratings in file order; worker ``rank`` keeps ratings ``rank, rank +
num_ranks, ...`` of it, optionally shuffles them (``shuffle=True``, a buffer of ``shuffle_buffer`` ratings, seeded
with ``seed + rank``, reshuffled each epoch; ratings.dat is sorted by user, so training wants this), and batches
them with ``drop_remainder=True``. One pass; ``.repeat()`` for more.

**Memory.** users.dat and movies.dat are loaded once into NumPy arrays indexed by id (``max id + 1`` entries),
embedded in the pipeline as constants; ratings are streamed.

**Errors.** A missing directory or file raises ``FileNotFoundError`` naming it; a malformed users.dat/movies.dat line
(wrong field count, unknown gender or genre, non-integer id, duplicate id) a ``ValueError`` naming the file and
line. A malformed ratings.dat line (not 4 fields, non-numeric id or rating) or a rating of a user or movie missing
from users.dat/movies.dat raises ``tf.errors.InvalidArgumentError`` naming ratings.dat, the line and the value.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

__all__ = ["MOVIELENS_GENRES", "MOVIELENS_SPARSE", "movielens_dataset", "movielens_is_test"]

MOVIELENS_GENRES = (
    "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama", "Fantasy",
    "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western",
)
MOVIELENS_SPARSE = ["user_id", "movie_id", "gender", "age", "occupation", "zip", "genres"]
GENDERS = {"F": 0, "M": 1}
HASH_BUCKETS = 2 ** 62
_SPLIT_BUCKETS = 2 ** 53
_PARSE_CHUNK = 4096


def _check_int(name, value, low, high=None):
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        rng = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"movielens_dataset: {name} must be an int {rng}, got {value!r}")
    return value


def _split_keys(user_ids, movie_ids, seed):
    return tf.strings.join([tf.strings.as_string(tf.constant(seed, tf.int64)), tf.strings.as_string(user_ids),
                            tf.strings.as_string(movie_ids)], separator=":")


def _is_test_tf(user_ids, movie_ids, test_fraction, seed):
    h = tf.strings.to_hash_bucket_fast(_split_keys(user_ids, movie_ids, seed), _SPLIT_BUCKETS)
    return tf.cast(h, tf.float64) < test_fraction * _SPLIT_BUCKETS


def movielens_is_test(user_ids, movie_ids, test_fraction: float = 0.1, seed: int = 0) -> np.ndarray:
    """Whether each (user, movie) rating is in the test split (bool array), the rule movielens_dataset uses."""
    u = tf.constant(np.asarray(user_ids, np.int64))
    m = tf.constant(np.asarray(movie_ids, np.int64))
    return _is_test_tf(u, m, float(test_fraction), int(seed)).numpy()


def _fields(path: str, num_fields: int, layout: str):
    """Yields (1-based line number, list of fields) of a ``::`` file, blank lines skipped, each line checked to hold
    `num_fields` fields."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"MovieLens file not found: {path!r}")
    with open(path, encoding="latin-1", newline=None) as f:
        for no, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            fields = line.split("::")
            if len(fields) != num_fields:
                raise ValueError(f"{path}:{no}: expected {num_fields} '::'-separated fields ({layout}), got "
                                 f"{len(fields)}: {line[:200]!r}")
            yield no, fields


def _read_table(path: str, num_fields: int, layout: str):
    """Lines of a ``::`` file as lists of fields, with 1-based line numbers; blank lines skipped."""
    return list(_fields(path, num_fields, layout))


def _int(path, no, what, text):
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{path}:{no}: {what} must be an integer, got {text!r}") from None
    if value < 0:
        raise ValueError(f"{path}:{no}: {what} must be >= 0, got {value}")
    return value


def _load_users(path):
    rows = _read_table(path, 5, "UserID::Gender::Age::Occupation::Zip-code")
    parsed = {}
    for no, (uid, gender, age, occ, zipcode) in rows:
        uid = _int(path, no, "UserID", uid)
        if uid in parsed:
            raise ValueError(f"{path}:{no}: duplicate UserID {uid}")
        if gender not in GENDERS:
            raise ValueError(f"{path}:{no}: Gender must be F or M, got {gender!r}")
        parsed[uid] = (GENDERS[gender], _int(path, no, "Age", age), _int(path, no, "Occupation", occ), zipcode)
    size = max(parsed, default=-1) + 1
    table = {"known": np.zeros(size, bool)}
    for name in ("gender", "age", "occupation", "zip"):
        table[name] = np.zeros(size, np.int64)
    if parsed:
        ids = np.fromiter(parsed, np.int64, len(parsed))
        cols = list(zip(*parsed.values()))
        table["known"][ids] = True
        table["gender"][ids] = cols[0]
        table["age"][ids] = cols[1]
        table["occupation"][ids] = cols[2]
        table["zip"][ids] = tf.strings.to_hash_bucket_fast(list(cols[3]), HASH_BUCKETS).numpy()
    return table


def _load_movies(path):
    rows = _read_table(path, 3, "MovieID::Title::Genres")
    index = {g: i for i, g in enumerate(MOVIELENS_GENRES)}
    parsed = {}
    for no, (mid, _title, genres) in rows:
        mid = _int(path, no, "MovieID", mid)
        if mid in parsed:
            raise ValueError(f"{path}:{no}: duplicate MovieID {mid}")
        ids = []
        for g in genres.split("|") if genres else []:
            if g not in index:
                raise ValueError(f"{path}:{no}: unknown genre {g!r} (known: {', '.join(MOVIELENS_GENRES)})")
            ids.append(index[g])
        parsed[mid] = ids
    size = max(parsed, default=-1) + 1
    known = np.zeros(size, bool)
    lengths = np.zeros(size, np.int64)
    for mid, ids in parsed.items():
        known[mid] = True
        lengths[mid] = len(ids)
    splits = np.zeros(size + 1, np.int64)
    np.cumsum(lengths, out=splits[1:])
    values = np.zeros(int(splits[-1]), np.int64)
    for mid, ids in parsed.items():
        values[splits[mid]:splits[mid + 1]] = ids
    return {"known": known, "genre_values": values, "genre_splits": splits}


def movielens_dataset(data_dir: str, batch_size: int, rank: int = 0, num_ranks: int = 1, split: str = "train",
                      test_fraction: float = 0.1, seed: int = 0, shuffle: bool = False,
                      shuffle_buffer: int = 100_000) -> tf.data.Dataset:
    """This worker's ``(features, label)`` batches of MovieLens-1M ratings; see the module docstring."""
    data_dir = os.fspath(data_dir)
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(f"MovieLens directory not found: {data_dir!r}")
    ratings_path = os.path.join(data_dir, "ratings.dat")
    if not os.path.isfile(ratings_path):
        raise FileNotFoundError(f"MovieLens file not found: {ratings_path!r}")
    if split not in ("train", "test"):
        raise ValueError(f"movielens_dataset: split must be 'train' or 'test', got {split!r}")
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)) or not 0 <= test_fraction <= 1:
        raise ValueError(f"movielens_dataset: test_fraction must be in [0, 1], got {test_fraction!r}")
    batch_size = _check_int("batch_size", batch_size, 1)
    num_ranks = _check_int("num_ranks", num_ranks, 1)
    rank = _check_int("rank", rank, 0, num_ranks - 1)
    seed = _check_int("seed", seed, 0)
    shuffle_buffer = _check_int("shuffle_buffer", shuffle_buffer, 1)
    users = _load_users(os.path.join(data_dir, "users.dat"))
    movies = _load_movies(os.path.join(data_dir, "movies.dat"))
    want_test = split == "test"
    test_fraction = float(test_fraction)

    user_known = tf.constant(users["known"])
    movie_known = tf.constant(movies["known"])
    n_users, n_movies = users["known"].size, movies["known"].size

    def parse(line_no, line):
        """A chunk of lines -> the split's (user, movie, rating) rows, after checking every line."""
        line = tf.strings.regex_replace(line, "\r$", "")
        keep = tf.not_equal(tf.strings.strip(line), "")
        line, line_no = tf.boolean_mask(line, keep), tf.boolean_mask(line_no, keep)
        fields = tf.strings.split(line, "::")
        counts = fields.row_lengths()
        bad = tf.math.argmax(tf.cast(tf.not_equal(counts, 4), tf.int32), output_type=tf.int64)
        def at(i):
            return f"{ratings_path} line ", tf.strings.as_string(line_no[i] + 1)

        check = tf.debugging.Assert(tf.reduce_all(tf.equal(counts, 4)), [tf.strings.join([
            "MovieLens: expected 4 fields separated by :: (UserID::MovieID::Rating::Timestamp); ", *at(bad),
            " has ", tf.strings.as_string(counts[bad]), " fields: ", tf.strings.substr(line[bad], 0, 200)])])
        with tf.control_dependencies([check]):
            cols = tf.reshape(fields.flat_values, [-1, 4])
        user = tf.strings.to_number(cols[:, 0], tf.int64)
        movie = tf.strings.to_number(cols[:, 1], tf.int64)
        rating = tf.strings.to_number(cols[:, 2], tf.float32)
        ok_user = (user >= 0) & (user < n_users)
        ok_user &= tf.gather(user_known, tf.clip_by_value(user, 0, max(n_users - 1, 0))) if n_users else ok_user
        ok_movie = (movie >= 0) & (movie < n_movies)
        ok_movie &= tf.gather(movie_known, tf.clip_by_value(movie, 0, max(n_movies - 1, 0))) if n_movies else ok_movie
        bad_user = tf.math.argmax(tf.cast(~ok_user, tf.int32), output_type=tf.int64)
        bad_movie = tf.math.argmax(tf.cast(~ok_movie, tf.int32), output_type=tf.int64)
        checks = [
            tf.debugging.Assert(tf.reduce_all(ok_user), [tf.strings.join([
                "MovieLens: ", *at(bad_user), " rates UserID ", tf.strings.as_string(user[bad_user]),
                " which users.dat does not have"])]),
            tf.debugging.Assert(tf.reduce_all(ok_movie), [tf.strings.join([
                "MovieLens: ", *at(bad_movie), " rates MovieID ", tf.strings.as_string(movie[bad_movie]),
                " which movies.dat does not have"])]),
        ]
        with tf.control_dependencies(checks):
            in_split = tf.equal(_is_test_tf(user, movie, test_fraction, seed), want_test)
        return (tf.boolean_mask(user, in_split), tf.boolean_mask(movie, in_split),
                tf.boolean_mask(rating, in_split))

    user_cols = {name: tf.constant(users[name]) for name in ("gender", "age", "occupation", "zip")}
    genres = tf.RaggedTensor.from_row_splits(tf.constant(movies["genre_values"]),
                                             tf.constant(movies["genre_splits"]), validate=False)

    def join(user, movie, rating):
        features = {"user_id": user, "movie_id": movie}
        for name, col in user_cols.items():
            features[name] = tf.gather(col, user)
        features["genres"] = tf.gather(genres, movie)
        return features, tf.cast(rating >= 4.0, tf.float32)

    lines = tf.data.Dataset.zip((tf.data.Dataset.range(2 ** 62), tf.data.TextLineDataset(ratings_path)))
    ds = lines.batch(_PARSE_CHUNK).map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).unbatch()
    ds = ds.shard(num_ranks, rank)
    if shuffle:
        ds = ds.shuffle(shuffle_buffer, seed=seed + rank, reshuffle_each_iteration=True)
    ds = ds.batch(batch_size, drop_remainder=True)
    return ds.map(join, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(tf.data.AUTOTUNE)

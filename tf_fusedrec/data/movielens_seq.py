"""MovieLens-1M as user sequences for the generative recommender (GRM): each user's ratings in time order, the next
movie as the target, whether the user liked it (and loved it) as the labels.

    spec = MovieLensSeqSpec(feature="items", target="target", contexts=("gender", "age", "occupation"))
    for sample in movielens_seq_samples("/data/ml-1m", spec, rank=r, num_ranks=n):   # one dict per rating
        sample["items"], sample["target"], sample["labels"]    # int64 [L] (the history), int64 [], float32 [2]

``MovieLensSeqSpec.from_config(config)`` builds the spec from a ``data.source: movielens_seq`` config
(configs/movielens1m_seq.yaml); the train app reads the samples through ``tf_fusedrec.train.experiment``'s
``sequence_samples``, like those of ``grm_synthetic``.

**Files** as in tf_fusedrec/data/movielens.py (``ratings.dat``, ``users.dat``, ``movies.dat`` in ``data_dir``,
``::``-separated, latin-1, blank lines skipped, ``\\r\\n`` accepted). They are read once per process into NumPy
arrays (about 40 bytes per rating) and kept while the files are unchanged (same size and mtime).

**Order.** Each user's ratings are sorted by (timestamp, MovieID, rating): MovieLens-1M gives many ratings of a
user the same timestamp, and the MovieID breaks those ties, so the order never depends on the file's line order.

**Samples.** One per rating at position ``t >= 1`` of its user's ordered ratings ``r_0, r_1, ...``: the sequence
feature holds the MovieIDs of ``r_0 .. r_{t-1}`` (the history, oldest first), the target feature the MovieID of
``r_t``, and ``labels`` is float32 ``[rating_t >= 4, rating_t == 5]``: "click" = liked, "conversion" = loved, so a
conversion implies a click, as in the synthetic source. The first rating of a user (``t = 0``) is never a sample: it
has no history, so there is nothing to predict it from but the contexts (the rest of the model would learn nothing
from it); it is the first item of every later history. A user with one rating gives no sample. The context features
are the user's, as ids like the click reader's: ``"user_id"``, ``"gender"`` (F = 0, M = 1), ``"age"`` (the age
code), ``"occupation"`` (0-20) and ``"zip"`` (hashed); a spec takes any of them (MOVIELENS_SEQ_CONTEXTS). A sample
dict also holds ``"index"`` (its position in the split's stream in (UserID, t) order) and ``"tokens"`` (its history
length after the cap).

**Split** (leave-last-out in time). Of a user's ``n`` ratings, the last ``floor(test_fraction * n)`` (float64
product) are the test ratings: the test split holds the samples at those positions (``t >= max(1, n - n_test)``),
the train split all earlier positions ``1 <= t < n - n_test``. The splits are disjoint and together hold every
sample; every test sample of a user is later than all of its train samples (the future of the train samples), and
its history holds all earlier ratings, train and test ones (what is known at that time). A user with fewer than
``1 / test_fraction`` ratings has no test sample. ``held_out=True`` reads the test split.

**Workers and epochs.** An epoch is the split's samples in (UserID, t) order, or, with ``shuffle=True``, a
permutation of them drawn from ``numpy.random.default_rng([seed, epoch])`` (the same on every worker). Worker
``rank`` of ``num_ranks`` takes the epoch's samples ``rank, rank + num_ranks, ...``: the shares are disjoint, their
union is the epoch, and the 1-worker stream is the workers' streams interleaved (whatever the worker count, the
same global order). ``epochs=None`` repeats without end (epoch ``e`` shuffled with ``[seed, e]``); an empty split
yields nothing, or raises ``ValueError`` when asked for endlessly. The train app trains on the shuffled, endless
train split (consecutive positions of one user are nearly the same sample) and evaluates on one shuffled pass over
the test split (so its first batches are a uniform sample of it).

**The cap.** ``max_length`` is the longest history the pipeline accepts. A split holding a longer one raises
``ValueError`` naming the cap, the user and the length before any sample is yielded, unless ``truncate=True``,
which keeps the last (most recent) ``max_length`` movies. MovieLens-1M's most active user has 2314 ratings.

**Errors.** A missing directory or file raises ``FileNotFoundError`` naming it. A malformed users.dat/movies.dat
line raises the ``ValueError`` of movielens.py naming the file and line; so does a malformed ratings.dat line (not 4
fields, a non-integer field, a rating outside 1-5) or a rating of a user or movie missing from users.dat/movies.dat
(the click reader, which streams the ratings, raises these as ``tf.errors.InvalidArgumentError``; this reader loads
them eagerly, before the first sample). A MovieID of movies.dat not below ``spec.vocab`` raises ``ValueError``.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import os
from array import array
from typing import Iterator, Optional

import numpy as np

from tf_fusedrec.sequence_config import SequenceConfig
from tf_fusedrec.data.movielens import _fields, _int, _load_movies, _load_users
from tf_fusedrec.data.sequences import RESERVED_KEYS, _check_worker, sequence_section
from tf_fusedrec.data.synthetic import _is_int

__all__ = ["MOVIELENS_SEQ_CONTEXTS", "MovieLensSeqSpec", "movielens_seq_samples"]

MOVIELENS_SEQ_CONTEXTS = ("user_id", "gender", "age", "occupation", "zip")
_RATING_LAYOUT = "UserID::MovieID::Rating::Timestamp"


@dataclasses.dataclass(frozen=True)
class MovieLensSeqSpec:
    """What the MovieLens sequence reader yields; see the module docstring.

    Args:
      feature: name of the sequence feature (the history's MovieIDs).
      target: name of the target feature (the next MovieID); it shares the sequence feature's vocabulary.
      contexts: names of the user features to yield, each in MOVIELENS_SEQ_CONTEXTS.
      max_length: the cap on a history, an int >= 1.
      truncate: keep the last ``max_length`` movies of a longer history instead of raising.
      test_fraction: the share of each user's ratings (the latest) in the test split, in [0, 1].
      vocab: when set, every MovieID of movies.dat must be below it (the vocab of the sequence and target features).
    """

    feature: str = "items"
    target: str = "target"
    contexts: tuple = ("gender", "age", "occupation")
    max_length: int = SequenceConfig.max_length  # the defaults of a config's data.sequences section
    truncate: bool = SequenceConfig.truncate
    test_fraction: float = 0.1
    vocab: Optional[int] = None

    def __post_init__(self):
        contexts = tuple(self.contexts)
        object.__setattr__(self, "contexts", contexts)
        for what, name in (("feature", self.feature), ("target", self.target)):
            if not isinstance(name, str) or not name:
                raise ValueError(f"{what} must be a non-empty string, got {name!r}")
            if name in MOVIELENS_SEQ_CONTEXTS:
                raise ValueError(f"{what} '{name}': the name of a MovieLens user feature {MOVIELENS_SEQ_CONTEXTS}; "
                                 f"name the sequence and the target otherwise")
        for c in contexts:
            if c not in MOVIELENS_SEQ_CONTEXTS:
                raise ValueError(f"feature '{c}' is not a MovieLens user feature; the contexts are "
                                 f"{MOVIELENS_SEQ_CONTEXTS}")
        names = [self.feature, self.target, *contexts]
        for name in names:
            if name in RESERVED_KEYS:
                raise ValueError(f"feature '{name}': the name is reserved for the sample dict ({RESERVED_KEYS})")
            if names.count(name) > 1:
                raise ValueError(f"feature '{name}' is given twice (the sequence, the target and the contexts need "
                                 f"unique names)")
        if not _is_int(self.max_length) or self.max_length < 1:
            raise ValueError(f"max_length must be an int >= 1, got {self.max_length!r}")
        if not isinstance(self.truncate, bool):
            raise ValueError(f"truncate must be true or false, got {self.truncate!r}")
        f = self.test_fraction
        if isinstance(f, bool) or not isinstance(f, numbers.Real) or not 0 <= f <= 1:
            raise ValueError(f"test_fraction must be a number in [0, 1], got {f!r}")
        if self.vocab is not None and (not _is_int(self.vocab) or self.vocab < 1):
            raise ValueError(f"vocab must be an int >= 1 or None, got {self.vocab!r}")

    @property
    def feature_names(self):
        """The sequence feature's name, the target's, then the contexts'."""
        return (self.feature, self.target) + self.contexts

    @classmethod
    def from_config(cls, config) -> "MovieLensSeqSpec":
        """The spec of an ExperimentConfig with ``data.source: movielens_seq`` (tf_fusedrec.config): the feature
        ``data.sequences.feature`` is the sequence, ``data.sequences.target`` (required) the target, and every other
        feature a user context; the vocab is the sequence feature's, which the target must share."""
        seq, by_name = sequence_section(config, "movielens_seq")
        if seq.target is None:
            raise ValueError("target: required for the movielens_seq source (the feature that holds the next "
                             "movie, the item the labels are about)")
        if seq.target not in by_name:
            raise ValueError(f"target: {seq.target!r} is not among the features {sorted(by_name)}")
        items, target = by_name[seq.feature], by_name[seq.target]
        if target.vocab != items.vocab:
            raise ValueError(f"target: feature '{target.name}' has vocab {target.vocab} but the sequence "
                             f"'{items.name}' has {items.vocab}; both are MovieIDs (one vocabulary)")
        for f in config.features:
            if f.hotness != 1:
                raise ValueError(f"feature '{f.name}': hotness must be 1 (the history lengths come from the data; a "
                                 f"target or context has one id per sample), got {f.hotness!r}")
        contexts = tuple(f.name for f in config.features if f.name not in (seq.feature, seq.target))
        return cls(seq.feature, seq.target, contexts, max_length=seq.max_length, truncate=seq.truncate,
                   vocab=items.vocab)


# ----------------------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Ratings:
    """Every rating, grouped by user (ascending UserID) and ordered in time within a user."""

    user_ids: np.ndarray     # int64 [U], the users with ratings
    offsets: np.ndarray      # int64 [U + 1], user u's ratings are [offsets[u], offsets[u + 1])
    movies: np.ndarray       # int64 [R]
    ratings: np.ndarray      # int64 [R], 1-5
    stamps: np.ndarray       # int64 [R], the Timestamps
    contexts: dict           # name in MOVIELENS_SEQ_CONTEXTS -> int64 [U]
    max_movie_id: int        # of movies.dat, -1 when it is empty


def _read_ratings(path):
    """(line, user, movie, rating, timestamp) int64 arrays of ratings.dat, each line checked."""
    cols = [array("q") for _ in range(5)]
    for no, fields in _fields(path, 4, _RATING_LAYOUT):
        rating = _int(path, no, "Rating", fields[2])
        if not 1 <= rating <= 5:
            raise ValueError(f"{path}:{no}: Rating must be in 1-5, got {rating}")
        values = (no, _int(path, no, "UserID", fields[0]), _int(path, no, "MovieID", fields[1]), rating,
                  _int(path, no, "Timestamp", fields[3]))
        for col, value in zip(cols, values):
            col.append(value)
    return [np.frombuffer(c, np.int64) if len(c) else np.zeros(0, np.int64) for c in cols]


def _check_known(path, lines, ids, known, what, table):
    if known.size:
        ok = (ids < known.size) & known[np.minimum(ids, known.size - 1)]
    else:
        ok = np.zeros(ids.shape, bool)
    if not ok.all():
        j = int(np.argmin(ok))
        raise ValueError(f"{path}:{int(lines[j])}: rates {what} {int(ids[j])} which {table} does not have")


def _stat(path):
    s = os.stat(path)
    return s.st_mtime_ns, s.st_size


def _load(data_dir):
    data_dir = os.fspath(data_dir)
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(f"MovieLens directory not found: {data_dir!r}")
    paths = [os.path.join(data_dir, name) for name in ("ratings.dat", "users.dat", "movies.dat")]
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"MovieLens file not found: {path!r}")
    return _load_cached(os.path.abspath(data_dir), tuple(_stat(p) for p in paths))


@functools.lru_cache(maxsize=2)
def _load_cached(data_dir, _stats):
    """The ratings of a directory; `_stats` (the files' mtimes and sizes) key the cache."""
    users = _load_users(os.path.join(data_dir, "users.dat"))
    movies = _load_movies(os.path.join(data_dir, "movies.dat"))
    path = os.path.join(data_dir, "ratings.dat")
    lines, user, movie, rating, stamp = _read_ratings(path)
    _check_known(path, lines, user, users["known"], "UserID", "users.dat")
    _check_known(path, lines, movie, movies["known"], "MovieID", "movies.dat")
    order = np.lexsort((rating, movie, stamp, user))
    user, movie, rating, stamp = user[order], movie[order], rating[order], stamp[order]
    user_ids, starts = np.unique(user, return_index=True)
    offsets = np.append(starts, user.size).astype(np.int64)
    contexts = {"user_id": user_ids}
    for name in ("gender", "age", "occupation", "zip"):
        contexts[name] = users[name][user_ids]
    known = np.flatnonzero(movies["known"])
    return _Ratings(user_ids, offsets, movie, rating, stamp, contexts, int(known[-1]) if known.size else -1)


@dataclasses.dataclass
class _Split:
    """The samples of a split in (user, t) order: the user's row in _Ratings and the position t."""

    row: np.ndarray        # int64 [S]
    position: np.ndarray   # int64 [S], t >= 1: the history length before the cap


def _split(data: _Ratings, test_fraction: float, held_out: bool) -> _Split:
    n = np.diff(data.offsets)
    n_test = np.floor(np.float64(test_fraction) * n).astype(np.int64)
    first_test = np.maximum(n - n_test, 1)
    start = first_test if held_out else np.ones_like(n)
    stop = n if held_out else first_test
    counts = np.maximum(stop - start, 0)
    row = np.repeat(np.arange(n.size, dtype=np.int64), counts)
    before = np.cumsum(counts) - counts
    position = start[row] + np.arange(row.size, dtype=np.int64) - before[row]
    return _Split(row, position)


# ----------------------------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------------------------

def movielens_seq_samples(data_dir, spec: Optional[MovieLensSeqSpec] = None, rank: int = 0, num_ranks: int = 1,
                          held_out: bool = False, shuffle: bool = False, seed: int = 0,
                          epochs: Optional[int] = 1, start: int = 0) -> Iterator[dict]:
    """This worker's samples of a MovieLens-1M split, one dict per rating with a history (see the module docstring).

    The files are read and the cap checked when this is called (errors surface here, not at the first ``next``).

    Args:
      data_dir: the directory of ratings.dat, users.dat and movies.dat.
      spec: a MovieLensSeqSpec (None: the defaults).
      rank, num_ranks: this worker takes samples ``rank, rank + num_ranks, ...`` of each epoch.
      held_out: the test split (else the train split).
      shuffle: each epoch in the order of a permutation seeded with ``[seed, epoch]`` (else in (UserID, t) order).
      seed: the shuffle's seed, an int >= 0.
      epochs: passes over the split, an int >= 1, or None: endless.
      start: the first sample of this worker's stream to yield (its samples over all epochs counted from 0): the
        stream resumed after `start` samples, without making the skipped ones.

    Returns:
      An iterator of dicts: ``"index"`` (int, the sample's position in the split in (UserID, t) order), ``"tokens"``
      (int, the history length after the cap), the sequence feature -> int64 ``[tokens]``, the target and each
      context -> int64 ``[]``, ``"labels"`` -> float32 ``[2]`` (click = rating >= 4, conversion = rating == 5).

    Raises:
      FileNotFoundError: a missing directory or file.
      ValueError: a malformed file (naming it and the line), a MovieID not below ``spec.vocab``, or a history
        longer than ``spec.max_length`` without ``truncate`` (naming the cap, the user and the length).
    """
    spec = MovieLensSeqSpec() if spec is None else spec
    if not isinstance(spec, MovieLensSeqSpec):
        raise ValueError(f"spec must be a MovieLensSeqSpec, got {type(spec).__name__}")
    rank, num_ranks = _check_worker(rank, num_ranks)
    if not _is_int(seed) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    if epochs is not None and (not _is_int(epochs) or epochs < 1):
        raise ValueError(f"epochs must be an int >= 1 or None (endless), got {epochs!r}")
    if not _is_int(start) or start < 0:
        raise ValueError(f"start must be an int >= 0, got {start!r}")
    data = _load(data_dir)
    if spec.vocab is not None and data.max_movie_id >= spec.vocab:
        raise ValueError(f"movies.dat has MovieID {data.max_movie_id}, not below the vocab {spec.vocab} of the "
                         f"features '{spec.feature}' and '{spec.target}'; raise their vocab to at least "
                         f"{data.max_movie_id + 1}")
    split = _split(data, spec.test_fraction, bool(held_out))
    which = "test" if held_out else "train"
    if epochs is None and not split.row.size:
        raise ValueError(f"MovieLens sequences: the {which} split of {os.fspath(data_dir)!r} holds no samples (every "
                         f"sample needs a user with an earlier rating); an endless stream of it would never yield")
    cap = spec.max_length
    if not spec.truncate and split.position.size and split.position.max() > cap:
        j = int(np.argmax(split.position > cap))
        last = np.searchsorted(split.row, split.row[j], side="right") - 1  # the user's longest history
        raise ValueError(f"MovieLens sequences: user {int(data.user_ids[split.row[j]])} has a history of "
                         f"{int(split.position[last])} movies in the {which} split, more "
                         f"than the cap max_length={cap}; raise max_length or set truncate: true to keep the last "
                         f"{cap} movies")
    return _generate(data, split, spec, rank, num_ranks, bool(shuffle), int(seed), epochs, int(start))


def _generate(data, split, spec, rank, num_ranks, shuffle, seed, epochs, start):
    size = split.row.size
    first = data.offsets[:-1][split.row]      # each sample's user's first rating
    ends = first + split.position             # the target's rating, one past the history
    starts = np.maximum(ends - spec.max_length, first) if spec.truncate else first
    rating = data.ratings[ends]
    labels = np.stack([rating >= 4, rating == 5], axis=1).astype(np.float32)
    targets = data.movies[ends]
    contexts = [(name, data.contexts[name][split.row]) for name in spec.contexts]
    per_epoch = len(range(rank, size, num_ranks))  # this worker's samples of an epoch
    epoch, skip = divmod(start, per_epoch) if per_epoch else (0, 0)
    while epochs is None or epoch < epochs:
        order = np.random.default_rng([seed, epoch]).permutation(size) if shuffle else np.arange(size)
        mine, skip = order[rank::num_ranks][skip:], 0
        for i in mine:
            i = int(i)
            sample = {"index": i, "tokens": int(ends[i] - starts[i]), spec.feature: data.movies[starts[i]:ends[i]],
                      spec.target: targets[i]}
            for name, ids in contexts:
                sample[name] = ids[i]
            sample["labels"] = labels[i]
            yield sample
        epoch += 1

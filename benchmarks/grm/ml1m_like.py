"""Writes a MovieLens-1M-sized ratings directory of made-up ratings, for timing configs/movielens1m_seq.yaml where the
real data cannot be downloaded (this project's machines have no internet).

    .venv/bin/python benchmarks/grm/ml1m_like.py OUT_DIR [--seed 0]

The shapes follow ML-1M's published statistics, not its content: 6,040 users with at least 20 ratings each (a
log-normal count of median 96 and sigma 1.0, clipped to [20, 2314]: about 0.95M ratings in all, ML-1M has 1.0M),
3,706 of the MovieIDs 1-3952 rated, by a Zipf(1.0) popularity, ratings 1-5 in ML-1M's proportions (6, 11, 26, 35,
22%), each user's timestamps increasing; users.dat with ML-1M's gender, age codes and occupations. Only the history
lengths and the id ranges matter for speed; a model trained on this data learns nothing about films.
"""

import argparse
import os

import numpy as np

USERS, MOVIE_IDS, RATED_MOVIES = 6040, 3952, 3706
AGES = (1, 18, 25, 35, 45, 50, 56)
RATING_SHARES = (0.06, 0.11, 0.26, 0.35, 0.22)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    os.makedirs(args.out, exist_ok=True)
    movies = np.sort(rng.choice(np.arange(1, MOVIE_IDS + 1), RATED_MOVIES, replace=False))
    popularity = 1.0 / np.arange(1, RATED_MOVIES + 1)
    popularity = rng.permutation(popularity / popularity.sum())
    counts = np.clip(np.rint(96 * np.exp(rng.normal(size=USERS))), 20, 2314).astype(np.int64)
    with open(os.path.join(args.out, "movies.dat"), "w", encoding="latin-1") as f:
        for m in movies:
            f.write(f"{m}::Film {m} (2000)::Drama\n")
    with open(os.path.join(args.out, "users.dat"), "w", encoding="latin-1") as f:
        for u in range(1, USERS + 1):
            f.write(f"{u}::{'MF'[rng.integers(2)]}::{AGES[rng.integers(len(AGES))]}::{rng.integers(21)}::00000\n")
    with open(os.path.join(args.out, "ratings.dat"), "w", encoding="latin-1") as f:
        for u, n in enumerate(counts, 1):
            rated = rng.choice(movies, size=min(n, RATED_MOVIES), replace=False, p=popularity)
            stars = rng.choice(np.arange(1, 6), size=rated.size, p=RATING_SHARES)
            times = 956703932 + np.cumsum(rng.integers(1, 3600, size=rated.size))
            f.writelines(f"{u}::{m}::{r}::{t}\n" for m, r, t in zip(rated, stars, times))
    print(f"{args.out}: {USERS} users, {int(counts.sum())} ratings, {RATED_MOVIES} movies")


if __name__ == "__main__":
    main()

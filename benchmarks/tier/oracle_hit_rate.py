"""The DRAM hit rate an oracle cache would reach in bench_tier.py's runs (issue 57): each feature's most likely ids
held in DRAM, the same fraction of every feature's vocabulary, against the distinct keys a worker's step reads (half
of a step's 2 x 2048 samples x 26 features, drawn from the truncated Zipf law of tf_fusedrec.data.synthetic). The
bound the tier's LFU eviction (which must learn the ids' frequencies from the reads so far) is compared with.

    python benchmarks/tier/oracle_hit_rate.py --out benchmarks/results/tier/oracle_hit_rate.json
    python benchmarks/tier/oracle_hit_rate.py --vocab 600000 --workers 1 --fractions 0.0348 \
      --out benchmarks/results/tier/oracle_hit_rate_one_worker.json
"""
import argparse
import json

import numpy as np


def oracle(vocab, zipf, cached_fraction, features=26, samples=4096, workers=2, steps=20, seed=0):
    cdf = np.cumsum(np.arange(1, vocab + 1, dtype=np.float64) ** -zipf)
    cdf /= cdf[-1]
    rng = np.random.default_rng(seed)
    top = int(cached_fraction * vocab)
    distinct = held = 0
    for _ in range(steps):
        ranks = np.searchsorted(cdf, rng.random((features, samples // workers)))  # a worker's share of the lookups
        keys = np.unique(ranks + np.arange(features)[:, None] * vocab)
        distinct += len(keys)
        held += int(np.count_nonzero(keys % vocab < top))
    return {"zipf": zipf, "cached_fraction": cached_fraction, "distinct_keys_per_step": distinct / steps,
            "hit_rate": held / distinct, "lookup_hit_rate": float(cdf[top - 1])}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=1_500_000)
    p.add_argument("--fractions", default="0.11,0.25")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=2048, help="per worker")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rows = [oracle(args.vocab, z, float(f), samples=args.batch_size * args.workers, workers=args.workers)
            for z in (0.9, 1.05, 1.2) for f in args.fractions.split(",")]
    for r in rows:
        print(f"Zipf {r['zipf']}: {100 * r['cached_fraction']:.0f}% of the ids cached: {100 * r['hit_rate']:.1f}% of a "
              f"step's {r['distinct_keys_per_step']:,.0f} distinct keys ({100 * r['lookup_hit_rate']:.1f}% of lookups)")
    with open(args.out, "w") as f:
        json.dump({"vocab": args.vocab, "workers": args.workers, "batch_size": args.batch_size, "rows": rows}, f,
                  indent=1)


if __name__ == "__main__":
    main()

"""Seconds to find a publish's delta (train/publishing.py: row_changes), as publish() calls it, in a tree.

    .venv/bin/python benchmarks/publishing/bench_row_changes.py TREE

Per group of 600,000 rows held (dims 16 and 8, the sizes one of 2 workers holds per group of criteo_synthetic after
about 2,000 steps), 10,000 new keys and 110,000 changed rows, the current rows in the table's (random) key order:
the best of 3 of sorting them (where the tree keeps versions in key order, as publish() does) and diffing them against
the last version. Prints one JSON line: {group: [seconds, rows changed, keys removed]}. Run two trees
alternately, one process each, on a quiet machine to compare them.
"""

import json
import sys
import time

import numpy as np


def main():
    tree = sys.argv[1]
    sys.path.insert(0, tree)  # this tree's tf_fusedrec, before any other
    from tf_fusedrec.train import publishing  # noqa: PLC0415
    if not publishing.__file__.startswith(tree):
        sys.exit(f"imported {publishing.__file__}, not the tree's")
    rng = np.random.default_rng(0)
    out = {}
    for n, dim in [(600_000, 16), (600_000, 8)]:
        keys = rng.permutation(np.arange(n * 3, dtype=np.int64))[:n]
        rows = rng.standard_normal((n, dim)).astype(np.float32)
        new_keys = np.concatenate([keys, rng.integers(n * 3, n * 4, 10_000)])
        order = rng.permutation(len(new_keys))
        new_keys = new_keys[order]
        new_rows = np.concatenate([rows, rng.standard_normal((10_000, dim)).astype(np.float32)])[order]
        new_rows[rng.choice(len(new_keys), 110_000, replace=False)] += 1
        sort = getattr(publishing, "sorted_rows", None)
        best = []
        for _ in range(3):
            previous = sort(keys, rows) if sort else (keys, rows)  # as the last publish kept it
            began = time.perf_counter()
            current = sort(new_keys, new_rows) if sort else (new_keys, new_rows)
            changed, removed = publishing.row_changes(previous, *current)
            best.append(time.perf_counter() - began)
        out[f"{n}x{dim}"] = [round(min(best), 3), int(changed.sum()), len(removed)]
    print(json.dumps({"tree": tree, "groups": out}), flush=True)


if __name__ == "__main__":
    main()

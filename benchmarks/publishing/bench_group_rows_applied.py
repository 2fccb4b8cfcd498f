"""What an embedding server's commit costs: GroupRows.applied of one published delta to the rows a server holds.

    .venv/bin/python benchmarks/publishing/bench_group_rows_applied.py [TREE ...]

1.2M rows held (dim 16), 225,000 staged (half of them held, half new), 2,000 removed: the shape of a server's share
of a late delta in benchmarks/results/publish/long. Each TREE (a checkout of tf_fusedrec; default: this one) is timed in its own
process, 5 calls each, min and median printed; give two trees to compare, and repeat the command to alternate.
"""

import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def measure():
    from tf_fusedrec.export import format as fmt  # noqa: PLC0415

    rng = np.random.default_rng(0)
    n, k, r, dim = 1_200_000, 225_000, 2_000, 16
    base = np.sort(rng.choice(2**50, n, replace=False).astype(np.int64))
    rows = rng.normal(size=(n, dim)).astype(np.float32)
    keys = np.concatenate([rng.choice(base, k // 2, replace=False), rng.choice(2**50, k - k // 2).astype(np.int64)])
    staged = rng.normal(size=(k, dim)).astype(np.float32)
    removed = rng.choice(base, r, replace=False)
    held = fmt.GroupRows.from_arrays({"name": "g", "dim": dim}, base, rows)
    seconds = []
    for _ in range(5):
        t = time.perf_counter()
        held.applied(removed, keys, staged)
        seconds.append(time.perf_counter() - t)
    print(f"{fmt.__file__}: applied s min {min(seconds):.3f} median {np.median(seconds):.3f}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--measure":
        sys.path.insert(0, sys.argv[2])
        measure()
    else:
        for tree in sys.argv[1:] or [str(Path(__file__).resolve().parents[2])]:
            subprocess.run([sys.executable, __file__, "--measure", tree], check=True)

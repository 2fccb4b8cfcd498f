"""Followed Parquet files read by every worker, for tests/data/test_follow.py; runs alone or under horovodrun.

    horovodrun -np 2 -H localhost:2 --gloo python tests/data/follow_scenario.py --data DIR --out OUT

Each worker follows DIR (3 records per worker and batch, the workers agreeing through the comm) until it stays idle
for --idle seconds, writes OUT/started<rank> once it has its first batch, and at the end OUT/rank<r>.npz: "users"
(the user ids of its records, in order) and "positions" (the FilePosition after every batch)."""

import argparse
import os

import numpy as np

import tf_fusedrec  # noqa: F401
from tf_fusedrec.data.files import parse_schema
from tf_fusedrec.data.follow import FollowSettings
from tf_fusedrec.data.readers import FileBatches
from tf_fusedrec.distributed import comm as comm_lib

SCHEMA = {"label": "y", "dense": ["x"], "features": {"user": {"type": "int64"}, "city": {"type": "string"},
                                                      "tags": {"type": "int64", "shape": "list"}}}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--idle", type=float, default=4.0)
    args = p.parse_args()
    comm = comm_lib.init_workers()
    reader = FileBatches("parquet", args.data, parse_schema(SCHEMA, "parquet", ["user", "city", "tags"]), 3,
                         rank=comm.rank, num_ranks=comm.size, follow=FollowSettings(0.05, args.idle), comm=comm)
    users = []
    for features, _ in reader.dataset():
        users.extend(features["user"].numpy().tolist())
        open(os.path.join(args.out, f"started{comm.rank}"), "w").close()
    positions = [list(reader.position_after(k)) for k in range(1, len(users) // 3 + 1)]
    np.savez(os.path.join(args.out, f"rank{comm.rank}.npz"), users=np.array(users, np.int64),
             positions=np.array(positions, np.int64))
    comm_lib.exit_after_success("FusedRec/test/follow_done")


if __name__ == "__main__":
    main()

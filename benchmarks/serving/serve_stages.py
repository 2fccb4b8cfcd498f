"""CPU per 64-instance request of each stage of the ranker's request path, in one process (no HTTP, no batching).

    .venv/bin/python benchmarks/serving/serve_stages.py --export EXPORT [--no-pooling] [--cache-mb 0] [--requests 300]

Starts 2 embedding servers of EXPORT (an export of configs/criteo_serve.yaml, see benchmarks/serving/bench_serve_ab.py), builds
the ranker's model as `python -m tf_fusedrec.serve.ranker` would, and sends it the bench's synthetic requests one at
a time: parse (body -> columns), prepare (columns -> checked FlatIds, per request in the server), embed (rows from
the cache and the servers) and the dense call (with the packing of its input, for an export with the packed
signature, as the ranker calls it). parse and prepare are timed with the calling thread's CPU clock; embed
and the dense call with the process's (the gRPC client's threads work for them). The first third of the requests
warms up. Prints one JSON line: ms per request by stage. Run it from two trees to compare them.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from tf_fusedrec import config as cfg  # noqa: E402
from tf_fusedrec.export import format as fmt  # noqa: E402
from serve_servers import start_embedding_servers  # noqa: E402
from tf_fusedrec.serve import bench, loadtest  # noqa: E402
from tf_fusedrec.serve import ranker as rk  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--export", required=True)
    p.add_argument("--config", default=str(ROOT / "configs/criteo_serve.yaml"))
    p.add_argument("--no-pooling", action="store_true")
    p.add_argument("--cache-mb", default="0")
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--work-dir", default="/tmp/serve_stages")
    args = p.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    spec = bench.synthetic_spec(cfg.load_config(args.config), fmt.read_manifest(args.export))
    services = []
    try:
        addresses = start_embedding_servers(args.export, args.work_dir, services)
        flags = ["--export", args.export, "--servers", addresses, "--port", "0",
                 "--cache-mb", args.cache_mb] + (["--no-pooling"] if args.no_pooling else [])
        ranker = rk.build(rk.parse_args(flags))
        model = ranker.model
        source = loadtest.SyntheticInstances(spec, seed=5)
        bodies = [json.dumps({"instances": source.next_batch(64)}).encode() for _ in range(args.requests)]
        warm = args.requests // 3
        spent = dict.fromkeys(("parse", "prepare", "embed", "dense_call"), 0.0)
        for i, body in enumerate(bodies):
            if i == warm:
                spent = dict.fromkeys(spent, 0.0)
            a = time.thread_time()
            inputs, _ = ranker.parse(body)
            b = time.thread_time()
            flats, dense, batch = ranker.prepare(inputs)
            c = time.thread_time()
            spent["parse"] += b - a
            spent["prepare"] += c - b
            d = time.process_time()
            values = {**model.embed(flats, batch), **dense}
            e = time.process_time()
            if model._packed:  # noqa: SLF001  (the packed signature's one input, as predict_versioned builds it)
                values[model._packed["input"]] = model._pack(values, batch)  # noqa: SLF001
            flat = [model._tf.constant(values[name], dtype) for name, dtype in model._flat_inputs]  # noqa: SLF001
            signature = model._signatures[model._current]  # noqa: SLF001
            signature._call_flat(flat, signature.captured_inputs)  # noqa: SLF001
            f = time.process_time()
            spent["embed"] += e - d
            spent["dense_call"] += f - e
        ranker.close()
    finally:
        for s in services:
            s.stop()
    n = args.requests - warm
    print(json.dumps({"tree": str(ROOT), "flags": sys.argv[1:], "requests": n,
                      "ms_per_request": {k: round(v / n * 1e3, 3) for k, v in spent.items()}}), flush=True)


if __name__ == "__main__":
    main()

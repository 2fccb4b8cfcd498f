"""The dense call of a served batch through the export's packed signature against the per-input one, in one process.

    .venv/bin/python benchmarks/serving/serve_packed_call.py --export EXPORT [--batch 64] [--calls 300] [--rounds 3] --out OUT.json

Loads EXPORT (an export of configs/criteo_serve.yaml, see benchmarks/serving/bench_serve_ab.py) twice with every row in this
process (load_model(packed=True) and packed=False), draws one batch of the bench's synthetic instances, checks that
both give the same scores bit for bit, then times ServingModel.predict_flat (the embeddings assembled from local rows,
the tensors built, the signature called) --calls times per variant and round, variants alternating; the median in ms.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import tf_fusedrec as fr  # noqa: E402
from tf_fusedrec import config as cfg  # noqa: E402
from tf_fusedrec.export import format as fmt  # noqa: E402
from tf_fusedrec.serve import bench, loadtest  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--export", required=True)
    p.add_argument("--config", default="configs/criteo_serve.yaml")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    models = {"packed": fr.export.load_model(args.export, packed=True),
              "per_input": fr.export.load_model(args.export, packed=False)}
    spec = bench.synthetic_spec(cfg.load_config(args.config), fmt.read_manifest(args.export))
    instances = loadtest.SyntheticInstances(spec, seed=1).next_batch(args.batch)
    batch = {k: [instance[k] for instance in instances] for k in instances[0]}
    scores = {name: m.predict(batch) for name, m in models.items()}
    if not np.array_equal(scores["packed"], scores["per_input"]):
        sys.exit("the packed signature's scores differ from the per-input signature's")
    report = {"command": "python benchmarks/serving/serve_packed_call.py " + " ".join(sys.argv[1:]),
              "load_average_start": list(os.getloadavg()), "scores_equal": True, "runs": []}
    for round_ in range(args.rounds):
        for name, model in models.items():
            flats, size = model.flatten(batch)
            dense = {n: model._dense_value(n, batch[n], size) for n in model.dense_inputs}  # noqa: SLF001
            times = []
            for _ in range(args.calls):
                began = time.perf_counter()
                model.predict_flat(flats, dense, size)
                times.append(time.perf_counter() - began)
            report["runs"].append({"round": round_, "variant": name, "median_ms": statistics.median(times) * 1e3})
            print(f"round {round_} {name}: median {report['runs'][-1]['median_ms']:.3f} ms", flush=True)
    report["load_average_end"] = list(os.getloadavg())
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How fresh a served model must be: served AUC on the coming batches against the publish interval, on a stream whose
item popularity drifts (data.drift) and, as a control, on one that does not.

    .venv/bin/python benchmarks/publishing/bench_freshness_auc.py --out benchmarks/results/publish [--config configs/criteo_synthetic.yaml]
        [--drifts 0,20] [--intervals 1,10,25,50,100,200] [--steps 400] [--from-step 200] [--batch-size 1024]

For each drift, one model trains in this process (one worker, the config's model and optimizers, fr.train's
TrainPipeline, --batch-size samples per step). Before it trains on the batch of step t, every publish interval N scores
that batch with the model a ranker publishing every N steps would serve then: the model of step N * floor(t / N) (an
export of it, fr.export.export_model, read back with fr.export.load_model: what the embedding servers and the ranker
compute). N = 1 is the model of step t itself. The AUC of an interval is over the batches of steps --from-step to
--steps - 1 (after the tables have filled), so every interval is scored on the same samples. Publishing itself takes
well under a second on loopback (benchmarks/results/publish/publish_bench.md), less than a step here, so it is left out.

Results: OUT/freshness_auc.json (per drift and interval: AUC, samples; the command) and OUT/freshness_auc.png (AUC
against the interval, one line per drift). Progress lines go to stderr.
"""

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import tf_fusedrec as fr  # noqa: E402  (selects Keras 2 before TensorFlow)
import tensorflow as tf  # noqa: E402

from tf_fusedrec import config as cfg  # noqa: E402
from tf_fusedrec.train import experiment  # noqa: E402


def log(message):
    print(f"[freshness_auc {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--config", default=str(ROOT / "configs" / "criteo_synthetic.yaml"))
    p.add_argument("--drifts", default="0,20", help="data.drift values (ids per step), comma-separated")
    p.add_argument("--intervals", default="1,10,25,50,100,200", help="publish intervals in steps")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--from-step", type=int, default=200, help="the first step whose batch is scored")
    p.add_argument("--batch-size", type=int, default=1024)
    args = p.parse_args(argv)
    args.drifts = [float(x) for x in args.drifts.split(",")]
    args.intervals = sorted(int(x) for x in args.intervals.split(","))
    if args.intervals[0] != 1 or not 0 <= args.from_step < args.steps:
        p.error("--intervals must start at 1 (the model of the step itself); --from-step must lie in [0, --steps)")
    return args


def run_drift(args, drift, work):
    """{interval: (scores, labels)} of one training run at `drift`."""
    raw = cfg.load_config(args.config)
    config = cfg.dataclasses.replace(raw, data=cfg.dataclasses.replace(raw.data, drift=drift))
    tf.keras.backend.clear_session()
    embedding = experiment.make_embedding("fused", config.embedding_features(), config, comm="single")
    model = experiment.make_model(config, embedding)
    optimizer = fr.train.make_optimizer(model, default=config.train.dense_optimizer)
    dataset = experiment.make_dataset(config, args.batch_size, 0, 1)
    pipe = fr.train.TrainPipeline(model, optimizer, experiment.binary_cross_entropy(), dataset)
    batches = iter(experiment.make_dataset(config, args.batch_size, 0, 1))  # the same stream, to score it first
    served = {}  # interval -> the ServingModel a ranker publishing every N steps serves now
    results = {n: ([], []) for n in args.intervals}
    began = time.monotonic()
    for step in range(args.steps):  # the model has trained `step` steps: it is the model of step `step`
        features, label = next(batches)
        publishing = [n for n in args.intervals[1:] if step % n == 0 and step + n > args.from_step]
        if publishing:  # the intervals that publish the model of this step (it serves until the next multiple)
            path = os.path.join(work, f"drift{drift:g}-step{step}")
            fr.export.export_model(model, path, example=features)
            for n in publishing:
                served[n] = fr.export.load_model(path)
            shutil.rmtree(path)  # every row and the dense weights are in memory now
        if step >= args.from_step:
            for n in args.intervals:
                model_n = served[n].predict(dict(features)) if n > 1 else model(features, training=False).numpy()
                results[n][0].append(np.asarray(model_n).reshape(-1))
                results[n][1].append(label.numpy())
        pipe.progress_many(1)
        if (step + 1) % 50 == 0:
            log(f"drift {drift:g}: step {step + 1}/{args.steps} ({time.monotonic() - began:.0f} s)")
    return {n: (np.concatenate(s), np.concatenate(lab)) for n, (s, lab) in results.items()}


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = tempfile.mkdtemp(prefix="freshness_auc-")
    report = {"command": shlex.join([sys.executable, *sys.argv]), "args": {k: v for k, v in vars(args).items()},
              "drifts": {}}
    try:
        for drift in args.drifts:
            results = run_drift(args, drift, work)
            report["drifts"][f"{drift:g}"] = {
                str(n): {"auc": experiment.auc(labels, scores), "samples": int(len(labels))}
                for n, (scores, labels) in results.items()}
            log(f"drift {drift:g}: " + ", ".join(f"N={n} AUC {v['auc']:.4f}"
                                                  for n, v in report["drifts"][f"{drift:g}"].items()))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["loadavg"] = os.getloadavg()
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    (out / "freshness_auc.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, out / "freshness_auc.png")
    print(json.dumps(report["drifts"], indent=1))


def plot(report, path):
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6, 4))
    for drift, by_interval in report["drifts"].items():
        intervals = [int(n) for n in by_interval]
        ax.plot(intervals, [by_interval[str(n)]["auc"] for n in intervals], marker="o",
                label=f"drift {drift} ids/step")
    ax.set_xscale("log")
    ax.set_xlabel("publish interval (steps)")
    ax.set_ylabel("AUC of the served model on the coming batches")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()

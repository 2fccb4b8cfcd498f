"""The online loop on a drifting stream: files land at a fixed rate, `python -m tf_fusedrec.train` follows them and
publishes to running embedding servers and a ranker; how fresh the served model is, and its AUC hour by hour against a
model that stopped after the first hour.

    .venv/bin/python benchmarks/publishing/bench_online_loop.py --out benchmarks/results/publish [--hours 12]
        [--every 20] [--rows 65536] [--batch-size 512] [--workers 2] [--drift 2] [--score-rows 8192]

The stream: --config's features and model (criteo_synthetic), each "hour" one step of its generator (data/synthetic.py)
of --rows samples, with data.drift --drift (new ids enter the top ranks each hour), written as
part-HHHHH.parquet under a hidden name in the followed directory and renamed into place (data/follow.py).

1. Hour 0 lands; a first training run (--workers workers under horovodrun, data.follow, --batch-size samples per
   worker and step) trains on it alone and checkpoints. Its export (python -m tf_fusedrec.export) is the frozen model,
   the model that stops at the first hour (read back here with fr.export.load_model), and the start of serving: two
   embedding servers and a ranker taking publishes (bench_publish.Stack).
2. The online run resumes that checkpoint, follows the directory and publishes after each hour's last step
   (--publish-every: an hour's steps); it ends at the last hour's. Once it waits for files, and --settle seconds later,
   hours 1 .. --hours come one every --every seconds: at its time, an hour's first --score-rows samples are scored,
   before any training on them, by the ranker (the served fresh model; requests of 1024 instances, each answer naming
   its version) and by the frozen model; then its file lands (the time taken after the rename). This process polls the
   ranker --qps times a second with a small request (bench_publish.Poller).
3. Freshness of hour h: from its landing to the first poll answered by a version that trained on all of it. The run's
   summary keeps each version's stream position (train/publishing.py: the file and record after its step), so that
   version is the first whose position is past the file's last record. p50 and p99 over the hours.
4. OUT/online_loop.json (the command, the settings, per hour: landing, freshness, AUC fresh and frozen, the versions
   that scored it and the hours they trained on; the run's published versions, load averages) and OUT/online_loop.png
   (AUC per hour, fresh against frozen; freshness per hour below). Progress lines go to stderr.

The training workers, the servers, the ranker and this process share the machine's cores; on a 2-core machine the
figures are that machine's.
"""

import argparse
import dataclasses
import json
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
import types
import urllib.request
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import bench_publish  # noqa: E402  (this directory's: Stack, Poller, train)

import tf_fusedrec as fr  # noqa: E402  (selects Keras 2 before TensorFlow)
import tensorflow as tf  # noqa: E402

from tf_fusedrec import config as cfg  # noqa: E402
from tf_fusedrec.data.follow import name_hash  # noqa: E402
from tf_fusedrec.serve import bench as serve_bench  # noqa: E402
from tf_fusedrec.train import experiment  # noqa: E402


def log(message):
    print(f"[online_loop {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--config", default=str(ROOT / "configs" / "criteo_synthetic.yaml"),
                   help="features and model of a data.source: synthetic config, whose stream becomes the files")
    p.add_argument("--hours", type=int, default=12, help="files landing after the first hour's (default 12)")
    p.add_argument("--every", type=float, default=20.0, help="seconds between two files (default 20)")
    p.add_argument("--rows", type=int, default=65536, help="samples in a file, an hour (default 65536)")
    p.add_argument("--batch-size", type=int, default=512, help="samples per worker and step (default 512)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--drift", type=float, default=2.0, help="data.drift: new ids per hour in the top ranks")
    p.add_argument("--score-rows", type=int, default=8192, help="samples of each hour scored before training on it")
    p.add_argument("--qps", type=float, default=10.0, help="polls of the ranker a second, for freshness")
    p.add_argument("--poll-seconds", type=float, default=0.5, help="data.poll_seconds of the trainer")
    p.add_argument("--settle", type=float, default=10.0, help="seconds from the online run's first wait to hour 1")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds a training run may take")
    args = p.parse_args(argv)
    if args.hours < 1 or args.rows % (args.batch_size * args.workers):
        p.error("--hours must be >= 1 and --rows a multiple of --batch-size x --workers (an hour is whole steps)")
    if not 0 < args.score_rows <= args.rows:
        p.error("--score-rows must lie in [1, --rows]")
    return args


def file_name(hour):
    return f"part-{hour:05d}.parquet"


def table_of(features, label):
    """A batch dict (data/synthetic.py's) and its labels -> a pyarrow Table: a column per feature (lists for the
    multi-hot ones), I1.. for the dense inputs, label."""
    import pyarrow as pa  # noqa: PLC0415

    columns = {}
    for name, value in features.items():
        if name == "dense":
            columns.update({f"I{i + 1}": pa.array(value[:, i].numpy()) for i in range(value.shape[1])})
        elif isinstance(value, tf.RaggedTensor):
            columns[name] = pa.ListArray.from_arrays(pa.array(value.row_splits.numpy().astype(np.int32)),
                                                     pa.array(value.flat_values.numpy()))
        else:
            columns[name] = pa.array(value.numpy())
    columns["label"] = pa.array(label.numpy())
    return pa.table(columns)


def land(table, directory, name):
    """Writes `table` as directory/name the way a committer does (a hidden name, then a rename) -> the time it
    landed."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    hidden = os.path.join(directory, f".{name}.inprogress")
    pq.write_table(table, hidden)
    os.rename(hidden, os.path.join(directory, name))
    return time.time()


def write_config(args, config, work, stream, eval_file, steps_per_hour):
    """The online config: --config's features and model, data.source parquet following `stream` -> its path."""
    with open(args.config) as f:
        raw = yaml.safe_load(f)
    schema = {"label": "label", "dense": [f"I{i + 1}" for i in range(config.data.num_dense)],
              "features": {f.name: {"shape": "list"} if f.hotness != 1 else {} for f in config.features}}
    raw["data"] = {"source": "parquet", "path": stream, "eval_path": eval_file, "eval_batches": 1, "schema": schema,
                   "follow": True, "poll_seconds": args.poll_seconds, "idle_timeout_seconds": 3 * args.every + 60}
    # Logs once an hour; checkpoints at the end of a run only (the first run's is where the online run resumes).
    raw["train"].update(batch_size=args.batch_size, log_every=steps_per_hour, checkpoint_every=10 ** 9)
    path = os.path.join(work, "online_loop.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(raw, f, sort_keys=False)
    return path


def columns(features):
    """A batch dict -> the "inputs" (columnar) shape of a predict request."""
    return {name: value.to_list() if isinstance(value, tf.RaggedTensor) else value.numpy().tolist()
            for name, value in features.items()}


def score_served(url, features, rows, chunk=1024):
    """The ranker's scores of the first `rows` samples of a batch dict -> (scores, the versions that answered)."""
    scores, versions = [], set()
    for start in range(0, rows, chunk):
        body = json.dumps({"inputs": columns({k: v[start:min(start + chunk, rows)] for k, v in features.items()})})
        request = urllib.request.Request(f"{url}:predict", data=body.encode(), headers={"Content-Type":
                                                                                        "application/json"})
        with urllib.request.urlopen(request, timeout=60) as r:
            answer = json.loads(r.read())
        scores.append(np.asarray(answer["outputs"], np.float64).reshape(-1))
        versions.add(int(answer["model_version"]))
    return np.concatenate(scores), sorted(versions)


def trained_through(position, rows):
    """The last hour a version at stream `position` ([epoch, file, record, skipped, name]) trained on whole."""
    return position[1] if position[2] >= rows else position[1] - 1


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = tempfile.mkdtemp(prefix="online_loop-")
    stream = os.path.join(work, "stream")
    os.makedirs(stream)
    steps_per_hour = args.rows // (args.batch_size * args.workers)
    raw = cfg.load_config(args.config)
    config = dataclasses.replace(raw, data=dataclasses.replace(raw.data, drift=args.drift))
    log(f"generating {args.hours + 1} hours of {args.rows} samples (drift {args.drift:g} ids an hour) in {work}")
    hours = list(experiment.make_dataset(config, args.rows, 0, 1).take(args.hours + 1))
    eval_file = os.path.join(work, "eval.parquet")
    land(table_of(*next(iter(experiment.make_dataset(config, args.batch_size * args.workers, 0, 1, held_out=True)))),
         work, "eval.parquet")
    config_path = write_config(args, config, work, stream, eval_file, steps_per_hour)
    model_dir, export = os.path.join(work, "model"), os.path.join(work, "export")
    services, landed = [], {0: land(table_of(*hours[0]), stream, file_name(0))}
    try:
        first = types.SimpleNamespace(workers=args.workers, config=config_path, steps=steps_per_hour,
                                      timeout=args.timeout, every=steps_per_hour)
        bench_publish.train(first, work, "hour0", None, extra=["--model-dir", model_dir])
        serve_bench.run_step("export", "tf_fusedrec.export", ["--config", config_path, "--model-dir", model_dir,
                                                              "--out", export], os.path.join(work, "export.log"),
                             args.timeout)
        frozen = fr.export.load_model(export)
        stack = bench_publish.Stack("plain", export, work, services)
        online = types.SimpleNamespace(**{**vars(first), "steps": steps_per_hour * (args.hours + 1)})
        lines, result = [], {}

        def run_online():
            try:
                result["summary"] = bench_publish.train(online, work, "online", stack.publish_to,
                                                        extra=["--model-dir", model_dir], lines=lines)[0]
            except Exception as e:  # noqa: BLE001  (raised in the main thread)
                result["error"] = e

        trainer = threading.Thread(target=run_online, name="online-run", daemon=True)  # no wait for it on an error
        trainer.start()
        while not any("waiting for new files" in line for _, line in list(lines)):
            if not trainer.is_alive():
                raise RuntimeError(f"the online run ended before it waited for files: {result.get('error')}")
            time.sleep(0.2)
        time.sleep(args.settle)
        poll_body = json.dumps({"inputs": columns({k: v[:8] for k, v in hours[0][0].items()})}).encode()
        poller = bench_publish.Poller(stack.url, poll_body, args.qps).start()
        scored = {}  # hour -> (fresh scores, the versions that gave them, frozen scores, labels)
        began = time.time()
        try:
            for hour in range(1, args.hours + 1):
                time.sleep(max(0.0, began + (hour - 1) * args.every - time.time()))
                features, label = hours[hour]
                head = {k: v[:args.score_rows] for k, v in features.items()}
                scoring = time.time()
                fresh, versions = score_served(stack.url, features, args.score_rows)
                scored[hour] = (fresh, versions, np.asarray(frozen.predict(head), np.float64).reshape(-1),
                                label.numpy()[:args.score_rows])
                landed[hour] = land(table_of(features, label), stream, file_name(hour))
                log(f"hour {hour}: scored by version(s) {versions} and the frozen model, landed "
                    f"{landed[hour] - scoring:.1f} s after the scoring began")
            trainer.join(args.timeout)
        finally:
            poller.stop()
        if "summary" not in result:
            raise RuntimeError(f"the online run failed: {result.get('error')}")
        report = measure(args, result["summary"], lines, landed, scored, poller)
    finally:
        for service in reversed(services):
            service.stop()
    shutil.rmtree(work)  # kept, with the runs' and services' logs, when the bench fails
    report.update(command=shlex.join([sys.executable, *sys.argv]), args=vars(args), steps_per_hour=steps_per_hour,
                  loadavg=os.getloadavg(), finished=time.strftime("%Y-%m-%d %H:%M:%S"))
    (out / "online_loop.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, out / "online_loop.png")
    f = report["freshness_s"]
    log(f"freshness p50 {f['p50']:.2f} s, p99 {f['p99']:.2f} s, max {f['max']:.2f} s over {f['files']} files; "
        f"AUC fresh {report['auc']['fresh_mean']:.4f}, frozen {report['auc']['frozen_mean']:.4f} (mean over hours)")


def measure(args, summary, lines, landed, scored, poller):
    """Per hour: freshness (landing -> first poll answered by a version that trained on the whole file), split at
    the start of the version's publish (the trainer's "published version" line, less the publish's seconds), and the
    AUC of the served and the frozen model."""
    published, started = summary["published"], bench_publish.versions_of(lines)
    versions = [(v, step, pos) for (v, step, _), pos in zip(published["versions"], published["stream_positions"])]
    for v, _, pos in versions:  # the stream's file index is the hour: checked by the file's name
        if pos[4] != name_hash(file_name(pos[1])):
            raise RuntimeError(f"version {v}'s stream position {pos} is not in {file_name(pos[1])}")
    through = {v: trained_through(pos, args.rows) for v, _, pos in versions}
    through[0] = 0  # the export: the first run's model, trained on hour 0
    hours = []
    for hour in range(1, args.hours + 1):
        version, step = next(((v, s) for v, s, p in versions if trained_through(p, args.rows) >= hour), (None, None))
        if version is None:
            raise RuntimeError(f"no published version trained on hour {hour} ({published['failures']} publishes "
                               f"failed)")
        seen = poller.first_seen(version, landed[hour])
        fresh, served_by, frozen, labels = scored[hour]
        hours.append({"hour": hour, "landed_s": landed[hour] - landed[1],
                      "freshness_s": None if seen is None else seen - landed[hour],
                      "version": version, "version_step": step,
                      "landed_to_publish_s": started[version] - landed[hour],
                      "publish_to_served_s": None if seen is None else seen - started[version],
                      "auc_fresh": experiment.auc(labels, fresh), "auc_frozen": experiment.auc(labels, frozen),
                      "scored_by_versions": served_by,
                      "scored_by_trained_through_hour": [through.get(v) for v in served_by]})
    values = [h["freshness_s"] for h in hours if h["freshness_s"] is not None]
    return {"hours": hours,
            "freshness_s": {"p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99)),
                            "max": max(values), "files": len(values), "unseen": len(hours) - len(values)},
            "auc": {"fresh_mean": float(np.mean([h["auc_fresh"] for h in hours])),
                    "frozen_mean": float(np.mean([h["auc_frozen"] for h in hours]))},
            "published": published, "held_out_auc": summary["auc"],
            "poll_answers": len(poller.answers), "poll_errors": poller.errors}


def plot(report, path):
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    hours = report["hours"]
    x = [h["hour"] for h in hours]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    top.plot(x, [h["auc_fresh"] for h in hours], marker="o", label="served (fresh: follows the stream)")
    top.plot(x, [h["auc_frozen"] for h in hours], marker="s", label="frozen after hour 0")
    top.set_ylabel("AUC on the hour's samples\n(scored before training on them)")
    top.grid(True, alpha=0.3)
    top.legend()
    f = report["freshness_s"]
    bottom.bar(x, [h["freshness_s"] or 0 for h in hours], color="tab:gray")
    bottom.axhline(f["p50"], color="tab:blue", linestyle="--", label=f"p50 {f['p50']:.2f} s")
    bottom.axhline(f["p99"], color="tab:red", linestyle=":", label=f"p99 {f['p99']:.2f} s")
    bottom.set_ylabel("freshness s\n(landed -> served)")
    bottom.set_xlabel(f"hour of the stream (a file of {report['args']['rows']:,} samples every "
                      f"{report['args']['every']:g} s, drift {report['args']['drift']:g} ids/hour)")
    bottom.grid(True, alpha=0.3)
    bottom.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()

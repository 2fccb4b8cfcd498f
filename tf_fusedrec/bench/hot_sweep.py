"""`python -m tf_fusedrec.bench.hot_sweep`: step time and all-to-all volume against the number of replicated rows R,
beside the cost model's L(R) (tf_fusedrec/distributed/replication.py).

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python -m tf_fusedrec.bench.hot_sweep \
        [--config configs/criteo_synthetic.yaml] [--rows 0,500,2000,8000,32000] [--out bench_results/hot]

The hot pairs are counted once (each worker's --sample-batches batches after the timed ones, merged) and the
costs C_ar and C_a2a measured once; then for each R (the list, plus the model's choice) a FusedEmbedding replicating
the R most counted pairs of every group trains on the same batches as the others, the R values alternating in each
repeat as in the training benchmark. Reported per R: samples/s, step seconds (median over repeats), all-to-all bytes
and in-flight seconds per step, and the model's L(R) summed over groups; then the R the model picks, the R with the
shortest measured step, and the measured step of the model's R over the best one. Writes OUT/hot_sweep.json and
OUT/hot_sweep.png (measured step time and all-to-all time against R, L(R) drawn shifted onto the measured
all-to-all time at R = 0, since the model leaves out what does not depend on R).
"""

import argparse
import json
import os
import shlex
import sys
import time

import numpy as np
import tensorflow as tf

from tf_fusedrec import config as cfg
from tf_fusedrec.distributed import comm as comm_lib
from tf_fusedrec.distributed import replication as rl
from tf_fusedrec.bench.train_bench import launcher, network_of
from tf_fusedrec.train import experiment


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m tf_fusedrec.bench.hot_sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=experiment.DEFAULT_CONFIG)
    p.add_argument("--rows", default="0,500,2000,8000,32000", help="R values (rows per group) to time")
    p.add_argument("--batch-size", type=int, help="per worker (default: the config's)")
    p.add_argument("--steps", type=int, default=8, help="timed steps per R and repeat")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batches", type=int, default=8, help="distinct pre-generated batches, cycled")
    p.add_argument("--sample-batches", type=int, default=100, help="batches each worker counts")
    p.add_argument("--out", default="bench_results/hot")
    return p.parse_args(argv)


class Runner:
    """fused with R replicated rows per group (the R most counted pairs), on the shared batches."""

    def __init__(self, rows, config, batches, comm, meter, merged):
        import tf_fusedrec as fr  # noqa: PLC0415

        with tf.compat.v1.variable_scope(f"{config.name}/hot{rows}"):
            self.embedding = experiment.make_embedding(
                "fused", config.embedding_features(), config, comm=comm,
                replication=rl.HotReplication(rows=max(rows, 1)))  # R = 0: an empty hot set, the same code path
        for hot_set, m in zip(self.embedding.hot_sets, merged):
            hot_set.assign(m["keys"][:rows], m["ids"][:rows], m["segments"][:rows])
        model = experiment.make_model(config, self.embedding)
        optimizer = fr.train.make_optimizer(model, default=config.train.dense_optimizer)
        self.pipeline = fr.train.TrainPipeline(model, optimizer, experiment.binary_cross_entropy(), batches.repeat(),
                                               meter=meter)

    def run(self, steps):
        for _ in range(steps):
            self.pipeline.progress()


def main(argv=None):
    args = parse_args(argv)
    comm = comm_lib.init_workers()
    comm_lib.overlap_collectives()  # collectives and the meter's stamps run when their inputs allow, not in order
    try:
        config = cfg.load_config(args.config)
        rows_list = sorted({int(r) for r in args.rows.split(",") if r})
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if comm.size < 2:
        print("error: the sweep needs 2 or more workers (horovodrun -np 2 ...): with one, nothing is sent",
              file=sys.stderr)
        sys.exit(2)
    from tf_fusedrec.distributed.meter import AlltoallMeter  # noqa: PLC0415

    meter = AlltoallMeter()

    def log(msg):
        if comm.rank == 0:
            print(msg, file=sys.stderr, flush=True)

    batch_size = args.batch_size or config.train.batch_size
    batches = experiment.make_dataset(config, batch_size, comm.rank, comm.size).take(args.batches).cache()
    log(f"hot sweep: {config.name}, {comm.size} workers, batch {batch_size} per worker; counting "
        f"{args.sample_batches} batches per worker")
    counter = experiment.make_embedding("fused", config.embedding_features(), config, comm=comm, name="counter",
                                        replication=rl.HotReplication(rows=1))
    sample = experiment.embedding_sample(config, batch_size, comm.rank, comm.size, args.batches,
                                         args.sample_batches)
    counted = rl.count_pairs(counter, sample)
    merged, model = [], []
    slopes = rl.measure_slopes(comm, name="FusedRec/hot_sweep/probe")
    for g, group in enumerate(counter.groups):
        m = rl.merge_counts(counted[g], comm, f"FusedRec/hot_sweep/{group.name}")
        c_ar, c_a2a = rl.group_costs(slopes, group)
        merged.append(m)
        model.append({"group": group.name, "c_ar": c_ar, "c_a2a": c_a2a,
                      "loss": rl.cost_curve(rl.sent_curve(m), c_ar, c_a2a),
                      "loss_paper": rl.cost_curve(rl.sent_curve(m, dedup=False), c_ar, c_a2a)})
    # The model's R per group; the sweep uses one R for all groups, so it also times the model's choice for the sum.
    length = min(len(m["loss"]) for m in model)
    total = np.sum([m["loss"][:length] for m in model], axis=0)
    total_paper = np.sum([m["loss_paper"][:length] for m in model], axis=0)
    chosen, _ = rl.choose_rows(total, length - 1)
    chosen_paper, _ = rl.choose_rows(total_paper, length - 1)
    rows_list = sorted(set(rows_list) | {int(chosen)})
    log(f"  model (dedup-aware): R = {chosen}; paper's formula: R = {chosen_paper}; timing R in {rows_list}")
    runners = {}
    for rows in rows_list:
        log(f"  building R = {rows}")
        runners[rows] = Runner(rows, config, batches, meter.wrap(comm), meter, merged)
        runners[rows].run(args.warmup)
    step_s = {r: [] for r in rows_list}
    traffic = {r: [] for r in rows_list}
    for rep in range(args.repeats):
        for rows in rows_list:
            meter.reset()
            t0 = time.perf_counter()
            runners[rows].run(args.steps)
            step_s[rows].append((time.perf_counter() - t0) / args.steps)
            traffic[rows].append(meter.per_step(args.steps))
        log(f"  repeat {rep + 1}/{args.repeats}: " + ", ".join(f"R={r} {1e3 * step_s[r][-1]:.1f} ms" for r in rows_list))
    results = []
    for rows in rows_list:
        entry = {"rows": rows, "step_seconds": float(np.median(step_s[rows])), "step_seconds_repeats": step_s[rows],
                 "samples_per_s": batch_size * comm.size / float(np.median(step_s[rows])),
                 "predicted_seconds": float(total[min(rows, length - 1)])}
        for key in ("alltoall_bytes_per_step", "alltoall_busy_seconds_per_step"):
            entry[key] = float(np.median([t[key] for t in traffic[rows]]))
        results.append(entry)
    best = min(results, key=lambda e: e["step_seconds"])
    picked = next(e for e in results if e["rows"] == chosen)
    base = next((e for e in results if e["rows"] == 0), None)
    report = {
        "config": config.name, "workers": comm.size, "batch_size_per_worker": batch_size,
        "network": network_of(comm.size)[0],
        "model_rows": int(chosen), "paper_formula_rows": int(chosen_paper), "best_measured_rows": best["rows"],
        "model_step_over_best": picked["step_seconds"] / best["step_seconds"],
        "groups": [{k: v for k, v in m.items() if not k.startswith("loss")} for m in model],
        "curve": curve_points(total, [e["rows"] for e in results] + [int(chosen)]),
        "results": results,
        "command": f"{launcher(comm.size)}.venv/bin/python -m tf_fusedrec.bench.hot_sweep {shlex.join(sys.argv[1:])}",
    }
    if comm.rank == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "hot_sweep.json"), "w") as f:
            json.dump(report, f, indent=2)
        print("| R (rows per group) | samples/s | step ms | all-to-all bytes / step | vs R=0 bytes | all-to-all in "
              "flight ms / step | model L(R) ms |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for e in results:
            vs = f"{e['alltoall_bytes_per_step'] / base['alltoall_bytes_per_step']:.2f}" if base else "-"
            print(f"| {e['rows']}{' (model)' if e['rows'] == chosen else ''} | {e['samples_per_s']:,.0f} | "
                  f"{1e3 * e['step_seconds']:.1f} | {e['alltoall_bytes_per_step']:,.0f} | {vs} | "
                  f"{1e3 * e['alltoall_busy_seconds_per_step']:.1f} | {1e3 * e['predicted_seconds']:.2f} |")
        print(f"model R = {chosen} (paper's formula: {chosen_paper}); best measured R = {best['rows']}; measured step "
              f"at the model's R / best = {report['model_step_over_best']:.2f}")
        chart(report, base, os.path.join(args.out, "hot_sweep.png"))
        log(f"wrote {args.out}/hot_sweep.json and {args.out}/hot_sweep.png")


def curve_points(total, keep, points=400):
    """L(R) at R = 0, `points` log-spaced R values and the R in `keep`: enough to draw, small enough to commit."""
    rows = np.unique(np.concatenate([[0], np.geomspace(1, len(total) - 1, points).round(),
                                     [r for r in keep if r < len(total)]]).astype(np.int64))
    return {"rows": rows.tolist(), "predicted_seconds": total[rows].tolist()}


def chart(report, base, path):
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    results = report["results"]
    rows = [max(e["rows"], 1) for e in results]
    axes[0].plot(rows, [1e3 * e["step_seconds"] for e in results], "o-", label="measured step")
    axes[0].plot(rows, [1e3 * e["alltoall_busy_seconds_per_step"] for e in results], "s-",
                 label="measured all-to-all in flight")
    curve_rows = np.array(report["curve"]["rows"])
    curve = 1e3 * np.array(report["curve"]["predicted_seconds"])
    if base is not None:
        shift = 1e3 * base["alltoall_busy_seconds_per_step"] - curve[0]
        keep = curve_rows >= 1
        axes[0].plot(curve_rows[keep], curve[keep] + shift, "-", label="model L(R), shifted to the measured R=0")
    axes[0].axvline(max(report["model_rows"], 1), color="gray", linestyle="--", label=f"model's R={report['model_rows']}")
    axes[0].set_xscale("log")
    axes[0].set_xlabel("replicated rows per group R (R=0 drawn at 1)")
    axes[0].set_ylabel("ms per step")
    axes[0].set_title(f"{report['config']}, {report['workers']} workers, {report['network']}")
    axes[0].legend(fontsize=8)
    axes[1].plot(rows, [e["alltoall_bytes_per_step"] / 1e6 for e in results], "o-")
    axes[1].set_xscale("log")
    axes[1].set_xlabel("replicated rows per group R (R=0 drawn at 1)")
    axes[1].set_ylabel("all-to-all MB per step (keys, rows, gradients)")
    axes[1].set_title("all-to-all volume")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    import warnings  # noqa: PLC0415

    warnings.filterwarnings("ignore", message="pkg_resources is deprecated")
    tf.get_logger().setLevel("ERROR")
    main()

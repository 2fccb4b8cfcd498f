"""`python -m tf_fusedrec.cluster.probe`: the cost of an all-to-all and of an allreduce against message size.

    python -m tf_fusedrec.cluster --hosts 2 --link-rate 1gbit -- .venv/bin/python -m tf_fusedrec.cluster.probe \
        [--sizes 1024,4096,...] [--reps 5] [--out probe_results]
    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python -m tf_fusedrec.cluster.probe     (loopback)

Message size S is what one worker puts into the collective (the bytes the training meter counts per all-to-all):
a float32 tensor of S bytes, split evenly over the N workers for the all-to-all. For each size, `calls`
collectives are chained inside one tf.function (each consumes the previous one's output, as the rounds of a
training step do) and the time per call is the median over --reps of (wall time of the function / calls), the
slowest worker's; `cpu_seconds` is the CPU time per call of the busiest worker's process (all its threads:
TensorFlow's, Horovod's background thread and Gloo's). The all-to-all is also measured batched: `calls`
independent all-to-alls in one function, which Horovod can negotiate in one cycle, as the per-feature all-to-alls
of one round of a step could be. A fit of
t(S) = latency + seconds_per_byte * S (the slope by least squares over the larger half of the sizes, the latency
as the median remainder over the smaller half) gives the two coefficients per collective, C = (latency,
seconds_per_byte) at this N: the C_a2a and C_ar of the hot-row replication model (HypeReca §5.2) and the terms of
tf_fusedrec.cluster.model.

The bytes of an all-to-all that cross a host's link are S * W * (N - W) / N for W workers per host (each worker
keeps 1/N of its tensor, and sends (W - 1)/N to workers of its own host over loopback); `link_bytes_per_byte`
records that factor, and `seconds_per_link_byte` = seconds_per_byte / link_bytes_per_byte is the link's
measured cost per byte (8 / rate for an ideal link).

Rank 0 writes OUT/probe.json and OUT/probe.png (log-log curves with the fits) and prints the coefficients.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

DEFAULT_SIZES = [1 << k for k in range(10, 25, 2)]  # 1 KiB ... 16 MiB in steps of 4x


class CollectiveComm:
    """The probe's collectives, over the project's comm (distributed/comm.py): all-to-all as the lookup sends them,
    a summing allreduce, and a max over ranks (an allgather, then the max)."""

    def __init__(self):
        from tf_fusedrec.distributed import comm as comm_lib  # noqa: PLC0415

        self.comm = comm_lib.init_workers()
        self.rank, self.size = self.comm.rank, self.comm.size
        self.local_size, self.cross_size = self.comm.local_size, self.comm.cross_size

    def alltoall(self, tensor, splits, name):
        """As the lookup's comm: explicit splits, returns (received, received_splits)."""
        return self.comm.alltoall(tensor, splits, name)

    def allreduce(self, tensor, name):
        return self.comm.allreduce([tensor], name, op="sum")[0]

    def max(self, value, name):
        import tensorflow as tf  # noqa: PLC0415

        return float(tf.reduce_max(self.comm.allgather(tf.constant([value], tf.float64), name)).numpy())


def collectives(comm, kind, nbytes, calls, batched):
    """A tf.function running `calls` collectives of nbytes each: chained (each on the previous one's output: one
    Horovod round each, like the dependent rounds of a step) or batched (independent, so Horovod negotiates them
    together, like the per-feature all-to-alls of one round)."""
    import tensorflow as tf  # noqa: PLC0415

    n = max(comm.size, (nbytes // 4) // comm.size * comm.size)  # all-to-all: divisible by N
    splits = tf.constant([n // comm.size] * comm.size, tf.int32)

    def one(x, i):
        name = f"probe/{kind}/{'batched' if batched else 'chained'}/{nbytes}/{i}"
        return comm.alltoall(x, splits, name)[0] if kind == "alltoall" else comm.allreduce(x, name) * 0.5

    @tf.function(autograph=False)
    def run(x):
        if batched:
            return tf.add_n([tf.reduce_sum(one(x + float(i), i)[:1]) for i in range(calls)])
        for i in range(calls):
            x = one(x, i)
        return tf.reduce_sum(x[:1])

    return run, tf.ones([n], tf.float32), n * 4


def calls_for(nbytes):
    """More chained calls for small messages (latency-bound), at least 2 so the chain's own cost is shared."""
    return int(np.clip((4 << 20) // max(nbytes, 1), 2, 10))


def fit(sizes, seconds):
    """t = a + b * S -> (a, b, r^2): b by least squares over the larger half of the sizes (at least 3), where the
    bytes dominate; a as the median of t - b * S over the smaller half, where the latency dominates, so that one
    slow small message (the machine is shared) does not move it and a curve that bends does not tilt the slope."""
    x, y = np.asarray(sizes, float), np.asarray(seconds, float)
    order = np.argsort(x)
    big = order[len(x) // 2:] if len(x) >= 6 else order[-min(len(x), 3):]
    b = float(np.polyfit(x[big], y[big], 1)[0]) if len(big) >= 2 and np.ptp(x[big]) > 0 else 0.0
    b = max(b, 0.0)
    small = order[:max(len(x) // 2, 1)]
    a = max(float(np.median((y - b * x)[small])), 0.0)
    total = ((y - y.mean()) ** 2).sum()
    r2 = float(1 - ((y - a - b * x) ** 2).sum() / total) if total > 0 else 1.0
    return a, b, r2


def curve(comm, kind, sizes, reps, batched, log):
    points = []
    for nbytes in sizes:
        calls = calls_for(nbytes)
        run, x, actual = collectives(comm, kind, nbytes, calls, batched)
        run(x).numpy()  # trace and warm up
        times, cpu = [], []
        for r in range(reps):
            tag = f"{kind}/{int(batched)}/{nbytes}/{r}"
            comm.max(0.0, f"probe/sync/{tag}")
            t0, cpu0 = time.perf_counter(), time.process_time()
            run(x).numpy()
            cpu.append((time.process_time() - cpu0) / calls)
            times.append(comm.max((time.perf_counter() - t0) / calls, f"probe/time/{tag}"))
        points.append({"bytes": actual, "calls": calls, "seconds": float(np.median(times)), "seconds_reps": times,
                       "cpu_seconds": comm.max(float(np.median(cpu)), f"probe/cpu/{kind}/{int(batched)}/{nbytes}")})
        log(f"  {kind:9s} {'batched' if batched else 'chained'} {actual:>10,d} B "
            f"{points[-1]['seconds'] * 1e3:9.3f} ms/call")
    a, b, r2 = fit([p["bytes"] for p in points], [p["seconds"] for p in points])
    return {"latency_s": a, "seconds_per_byte": b, "r2": r2, "points": points}


def measure(comm, sizes, reps, log, only_alltoall=False):
    """Per collective the chained curve (its fit is the collective's cost) and, for the all-to-all, the batched
    curve (what an all-to-all costs when Horovod can negotiate it together with others)."""
    curves = {"alltoall": curve(comm, "alltoall", sizes, reps, False, log)}
    if not only_alltoall:
        curves["allreduce"] = curve(comm, "allreduce", sizes, reps, False, log)
        curves["alltoall"]["batched"] = curve(comm, "alltoall", sizes, reps, True, log)
    return curves


def _curves(report):
    """(label, curve) of every curve a report has."""
    out = [("alltoall", report["alltoall"])]
    if "batched" in report["alltoall"]:
        out.append(("alltoall batched", report["alltoall"]["batched"]))
    if "allreduce" in report:
        out.append(("allreduce", report["allreduce"]))
    return out


def refit(report):
    """Recomputes a probe report's coefficients from its stored points with fit() (in place); returns it."""
    for _, c in _curves(report):
        c["latency_s"], c["seconds_per_byte"], c["r2"] = fit([p["bytes"] for p in c["points"]],
                                                            [p["seconds"] for p in c["points"]])
    a2a = report["alltoall"]
    factor = link_bytes_per_byte(report["workers"], report["workers_per_host"])
    a2a["link_bytes_per_byte"] = factor
    a2a["seconds_per_link_byte"] = a2a["seconds_per_byte"] / factor if factor else None
    return report


def link_bytes_per_byte(size, workers_per_host):
    """Bytes of an all-to-all message that cross one host's link, per byte of one worker's message."""
    return workers_per_host * (size - workers_per_host) / size if size > workers_per_host else 0.0


def build_parser():
    p = argparse.ArgumentParser(prog="python -m tf_fusedrec.cluster.probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="message bytes per worker")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions of each message size (default 5)")
    p.add_argument("--out", default="probe_results", help="directory for probe.json and probe.png")
    p.add_argument("--only-alltoall", action="store_true", help="skip the allreduce and batched curves")
    p.add_argument("--label", default=None, help="name of the network (default: $FUSEDREC_CLUSTER_LINK_RATE)")
    return p


def main(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if not sizes or min(sizes) <= 0 or args.reps < 1:
        p.error("--sizes must be positive byte counts and --reps at least 1")

    comm = CollectiveComm()

    def log(msg):
        if comm.rank == 0:
            print(msg, file=sys.stderr, flush=True)

    label = args.label or os.environ.get("FUSEDREC_CLUSTER_LINK_RATE", "loopback")
    log(f"probe: {comm.size} workers on {comm.cross_size} hosts, network {label}")
    curves = measure(comm, sizes, args.reps, log, args.only_alltoall)
    factor = link_bytes_per_byte(comm.size, comm.local_size)
    curves["alltoall"]["link_bytes_per_byte"] = factor
    curves["alltoall"]["seconds_per_link_byte"] = curves["alltoall"]["seconds_per_byte"] / factor if factor else None
    if comm.rank != 0:
        return
    report = {"network": label, "workers": comm.size, "hosts": comm.cross_size, "workers_per_host": comm.local_size,
              "reps": args.reps, "command": " ".join([os.path.basename(sys.executable), "-m",
                                                      "tf_fusedrec.cluster.probe"] + sys.argv[1:]), **curves}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "probe.json"), "w") as f:
        json.dump(report, f, indent=2)
    for kind, c in _curves(report):
        print(f"{kind}: latency {c['latency_s'] * 1e6:.1f} us/call, {c['seconds_per_byte'] * 1e9:.3f} ns/byte "
              f"({1 / c['seconds_per_byte'] / 1e6 if c['seconds_per_byte'] > 0 else float('inf'):.1f} MB/s), "
              f"r^2 {c['r2']:.3f}")
    written = chart(report, os.path.join(args.out, "probe.png"))
    log(f"wrote {args.out}/probe.json" + (f" and {written}" if written else " (no matplotlib: no PNG)"))


def chart(report, path):
    try:
        import matplotlib  # noqa: PLC0415
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    colors = {"alltoall": "tab:blue", "alltoall batched": "tab:green", "allreduce": "tab:orange"}
    for kind, c in _curves(report):
        color = colors[kind]
        x = np.array([pt["bytes"] for pt in c["points"]], float)
        ax.loglog(x, [pt["seconds"] * 1e3 for pt in c["points"]], "o", color=color, label=f"{kind} measured")
        grid = np.geomspace(x.min(), x.max(), 50)
        ax.loglog(grid, (c["latency_s"] + c["seconds_per_byte"] * grid) * 1e3, "-", color=color, alpha=0.6,
                  label=f"{kind} fit: {c['latency_s'] * 1e3:.2f} ms + S / {1e-6 / c['seconds_per_byte']:.0f} MB/s"
                  if c["seconds_per_byte"] > 0 else f"{kind} fit")
    ax.set_xlabel("message bytes per worker S")
    ax.set_ylabel("ms per call")
    ax.set_title(f"{report['workers']} workers on {report['hosts']} hosts, {report['network']}")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


if __name__ == "__main__":
    main()

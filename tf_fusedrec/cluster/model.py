"""`python -m tf_fusedrec.cluster.model`: a cost model of a training step, checked against the cluster runs and
projected to N = 8 ... 128 workers. It is a model, not a measurement.

For mode m (fused, per_feature, ...) on N workers, W per host, one step takes

    t_m(N) = C_m * s(N)                          compute
           + K_m * a(N)                          all-to-all rounds
           + T_m * W * (N - W) / N * c_link      all-to-all bytes over a host's link

* C_m: the step time of mode m with 1 worker on 1 core (its all-to-alls are skipped): the compute of one worker.
  s(N) = max(1, N / cores) when the N workers share `cores` cores (the checks on this machine, cores = 2); the
  projection gives each worker its own core, s = 1, and keeps the per-worker batch (weak scaling).
* K_m: all-to-all calls per step as measured (forward and backward: 6 for fused, 2 groups x 3; 78 for
  per_feature, 26 features x 3), each paying a(N), the probe's chained all-to-all latency. Independent calls
  could share a Horovod cycle (the probe's batched latency is 2-3x lower), but inside a step they become ready at
  different times, and the per-feature baseline's forward all-to-all time per call, as the meter measures it, is
  above the chained latency, not below it: each call is a round.
* T_m: the bytes one worker puts into all-to-alls per step, as measured (forward and backward). A worker keeps
  1/N of them and sends the rest; of these, the (W - 1)/N for its own host stay on loopback, so a host's link
  carries W * T_m * (N - W) / N bytes each way per step (the unique keys a worker sends and the rows it gets back
  depend on its own batch only, so T_m does not change with N). c_link: the probe's measured seconds per byte on
  a link (8 / rate for an ideal link; Gloo's all-to-all reaches about half of it, see the README).
* a(N), c_link: from the probe at N where one ran (the checks), else from N = 2. The N = 4 probe ran with 2
  workers per core, which slows Horovod's background thread as much as any per-peer cost would, so it cannot
  give the growth of a(N) with N; the projection holds a(N) at its N = 2 value and so leaves out the per-peer
  cost of Gloo's N - 1 pairwise messages and of Horovod's negotiation: an optimistic latency term.

Reads RUNS/*/bench.json (python -m tf_fusedrec.bench) and RUNS/*/probe.json (python -m tf_fusedrec.cluster.probe)
as `make bench-cluster` writes them, and writes OUT/model.json, OUT/model.md and OUT/model.png.
"""

import argparse
import glob
import json
import os
import sys

from tf_fusedrec.cluster import parse_rate
from tf_fusedrec.cluster.probe import refit

PROJECT_N = (8, 16, 32, 64, 128)


def load_runs(root):
    """[(name, bench, probe or None)] for every RUNS/<name>/ with a bench.json."""
    runs = []
    for path in sorted(glob.glob(os.path.join(root, "*", "bench.json"))):
        d = os.path.dirname(path)
        probe = os.path.join(d, "probe.json")
        with open(path) as f:
            bench = json.load(f)
        if os.path.exists(probe):
            with open(probe) as f:
                probe = refit(json.load(f))  # coefficients of the current fit, from the stored points
        else:
            probe = None
        runs.append((os.path.basename(d), bench, probe))
    return runs


def step_seconds(bench, mode):
    r = bench["modes"][mode]
    return bench["batch_size_per_worker"] * bench["workers"] / r["samples_per_s"]


class Network:
    """The probe coefficients of one network at the N where probes ran, with the line between them."""

    def __init__(self, name, probes):
        self.name = name
        self.by_n = {p["workers"]: p for p in probes}
        if 2 not in self.by_n:
            raise ValueError(f"network {name}: no probe with 2 workers (have {sorted(self.by_n)})")
        a2a = self.by_n[2]["alltoall"]
        # On loopback (one host) every byte a worker sends to a peer counts as "link" bytes: (N - 1) / N of S.
        self.c_link = a2a["seconds_per_link_byte"] or a2a["seconds_per_byte"] * 2

    def latency(self, n):
        def at(p):
            return max(p["alltoall"]["latency_s"], 0.0)

        return at(self.by_n[n] if n in self.by_n else self.by_n[2])

    def coefficients(self):
        return {str(n): {"a_s": self.latency(n), "c_link_s_per_byte": self.c_link,
                         "probe_workers_per_host": p["workers_per_host"]}
                for n, p in sorted(self.by_n.items())}


def predict(compute_s, calls, nbytes, network, n, workers_per_host=1, cores=None):
    """Step seconds of one mode; returns (total, parts)."""
    share = max(1.0, n / cores) if cores else 1.0
    parts = {"compute": compute_s * share}
    if n > 1:
        parts["rounds"] = calls * network.latency(n)
        w = workers_per_host
        parts["bytes"] = nbytes * w * (n - w) / n * network.c_link
    return sum(parts.values()), parts


def build(runs, cores):
    single = [b for _, b, _ in runs if b["workers"] == 1]
    if not single:
        raise ValueError("no 1-worker bench.json: the model's compute term comes from it")
    compute = {m: step_seconds(single[0], m) for m in single[0]["modes"]}
    networks = {}
    for _, bench, probe in runs:
        if probe is not None and bench["workers"] > 1:
            networks.setdefault(bench["network"], []).append(probe)
    networks = {k: Network(k, v) for k, v in networks.items() if any(p["workers"] == 2 for p in v)}
    # Calls and bytes per step of each mode, from a 2-worker run (counts, not times: the same on every network).
    traffic = {}
    for _, bench, _ in sorted(runs, key=lambda r: r[1]["workers"]):
        if bench["workers"] == 2:
            for m, r in bench["modes"].items():
                traffic.setdefault(m, {"calls": r["alltoall_calls_per_step"], "bytes": r["alltoall_bytes_per_step"]})

    checks = []
    for name, bench, _ in runs:
        n, w = bench["workers"], bench["workers"] // bench.get("hosts", 1)
        if bench["network"] == "loopback":
            w = 1  # no host links: each worker's bytes to its peers are what costs
        if n > 1 and bench["network"] not in networks:
            continue
        for m in bench["modes"]:
            if m not in compute:
                continue
            r = bench["modes"][m]
            calls = r.get("alltoall_calls_per_step", 0)
            nbytes = r.get("alltoall_bytes_per_step", 0)
            model, parts = predict(compute[m], calls, nbytes, networks.get(bench["network"]), n, w, cores)
            measured = step_seconds(bench, m)
            checks.append({"run": name, "network": bench["network"], "workers": n, "workers_per_host": w,
                           "mode": m, "measured_s": measured, "model_s": model, "parts": parts,
                           "error": model / measured - 1, "anchor": n == 1})

    projection = []
    for net in (v for k, v in networks.items() if k != "loopback"):  # no link to scale on one host
        for m, t in traffic.items():
            if m not in compute:
                continue
            batch = single[0]["batch_size_per_worker"]
            for n in PROJECT_N:
                model, parts = predict(compute[m], t["calls"], t["bytes"], net, n)
                projection.append({"network": net.name, "mode": m, "workers": n, "model_s": model, "parts": parts,
                                   "samples_per_s": batch * n / model})
    return {"formula": __doc__.split("\n\n")[1], "cores": cores, "compute_s": compute,
            "traffic": traffic, "networks": {k: v.coefficients() for k, v in networks.items()},
            "checks": checks, "projection": projection}


def measured_table(runs):
    """The 2-worker runs side by side: samples/s per mode and network, with fused's ratios to the baselines."""
    runs = [(name, b) for name, b, _ in runs if b["workers"] == 2]
    runs.sort(key=lambda r: parse_rate(r[1]["network"]) if r[1]["network"] != "loopback" else 0)
    modes = list(dict.fromkeys(m for _, b in runs for m in b["modes"]))
    nets = [b["network"] for _, b in runs]
    lines = ["| mode | " + " | ".join(f"{n} samples/s" for n in nets) + " | all-to-alls / step | bytes / step | "
             + " | ".join(f"{n} fwd all-to-all s/step" for n in nets) + " |",
             "|---|" + "---:|" * (2 * len(nets) + 2)]
    for m in modes:
        rs = [b["modes"].get(m, {}) for _, b in runs]
        first = next(r for r in rs if r)
        calls, nbytes = first.get("alltoall_calls_per_step", 0), first.get("alltoall_bytes_per_step", 0)
        lines.append(f"| {m} | " + " | ".join(f"{r.get('samples_per_s', 0):,.0f}" for r in rs) +
                     f" | {calls:.0f} | {nbytes:,.0f} | " +
                     " | ".join(f"{r.get('forward_alltoall_seconds_per_step', 0):.3f}" for r in rs) + " |")
    for base in ("per_feature", "tfra_hand_fused"):
        if all("fused" in b["modes"] and base in b["modes"] for _, b in runs):
            lines.append(f"| **fused vs {base}** | " + " | ".join(
                f"**{b['modes']['fused']['samples_per_s'] / b['modes'][base]['samples_per_s']:.2f}x**"
                for _, b in runs) + " | | | " + " | ".join("" for _ in runs) + " |")
    return "\n".join(lines)


def markdown(result, runs=()):
    lines = [measured_table(runs), ""] if runs else []
    lines += ["| run | network | N (hosts x W) | mode | measured s/step | model s/step | error |",
             "|---|---|---:|---|---:|---:|---:|"]
    for c in result["checks"]:
        shape = "1 host" if c["network"] in ("loopback", "none") else \
            f"{c['workers'] // c['workers_per_host']} x {c['workers_per_host']}"
        err = "anchor" if c["anchor"] else f"{c['error']:+.0%}"
        lines.append(f"| {c['run']} | {c['network']} | {c['workers']} ({shape}) | "
                     f"{c['mode']} | {c['measured_s']:.3f} | {c['model_s']:.3f} | {err} |")
    checked = [abs(c["error"]) for c in result["checks"] if not c["anchor"]]
    if checked:
        lines += ["", f"Checked points: {len(checked)}, mean |error| {sum(checked) / len(checked):.0%}, "
                      f"max {max(checked):.0%}; within 25%: {sum(e <= 0.25 for e in checked)} of {len(checked)}."]
    for net in sorted({p["network"] for p in result["projection"]}):
        rows = [p for p in result["projection"] if p["network"] == net]
        modes = list(dict.fromkeys(p["mode"] for p in rows))
        lines += ["", f"Projection (model) at {net}, one worker per host and per core, s/step "
                      f"(samples/s over all workers):", "",
                  "| N | " + " | ".join(modes) + " |", "|---:|" + "---:|" * len(modes)]
        for n in PROJECT_N:
            cells = [next(p for p in rows if p["mode"] == m and p["workers"] == n) for m in modes]
            lines.append(f"| {n} | " + " | ".join(f"{c['model_s']:.3f} ({c['samples_per_s']:,.0f})" for c in cells)
                         + " |")
    return "\n".join(lines)


def chart(result, path):
    try:
        import matplotlib  # noqa: PLC0415
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    nets = sorted({p["network"] for p in result["projection"]})
    fig, axes = plt.subplots(1, max(len(nets), 1), figsize=(6 * max(len(nets), 1), 4.5), squeeze=False)
    for ax, net in zip(axes[0], nets):
        rows = [p for p in result["projection"] if p["network"] == net]
        for m in dict.fromkeys(p["mode"] for p in rows):
            pts = [p for p in rows if p["mode"] == m]
            line, = ax.plot([p["workers"] for p in pts], [p["model_s"] * 1e3 for p in pts], "-", label=f"{m} (model)")
            checks = [c for c in result["checks"] if c["mode"] == m and c["network"] == net]
            ax.plot([c["workers"] for c in checks], [c["measured_s"] * 1e3 for c in checks], "o",
                    color=line.get_color())
            ax.plot([c["workers"] for c in checks], [c["model_s"] * 1e3 for c in checks], "x",
                    color=line.get_color())
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers N")
        ax.set_ylabel("ms per step")
        ax.set_title(f"{net}: model (lines, x) and measured (o)")
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tf_fusedrec.cluster.model", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="bench_results/cluster", help="directory of <run>/bench.json (+ probe.json)")
    p.add_argument("--cores", type=int, default=os.cpu_count(), help="cores the checked runs shared")
    p.add_argument("--out", default=None, help="default: --runs")
    args = p.parse_args(argv)
    try:
        result = build(load_runs(args.runs), args.cores)
    except (ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    out = args.out or args.runs
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "model.json"), "w") as f:
        json.dump(result, f, indent=2)
    text = markdown(result, load_runs(args.runs))
    with open(os.path.join(out, "model.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    written = chart(result, os.path.join(out, "model.png"))
    print(f"wrote {out}/model.json, model.md" + (f", {written}" if written else ""), file=sys.stderr)


if __name__ == "__main__":
    main()

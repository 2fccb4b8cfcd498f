"""`python -m tf_fusedrec.cluster.model`: a cost model of a training step, checked against the cluster runs and
projected to N = 8 ... 128 workers. It is a model, not a measurement.

For mode m (fused, per_feature, ...) on network X with N workers, W per host, one step takes

    t_m(X, N) = L_m                                         the local step
              - T_m * b_lo - D_m * e_lo                     less what loopback charged for its bytes
              + K_m * max(0, x_m - B_X) * c_X               all-to-all bytes over the link, beyond the bucket
              + J_m * max(0, y_m - B_X) * e_X               dense allreduce bytes over the link, likewise

* L_m: the step time of mode m measured with N = 2 workers on one machine (loopback), a core per worker. It holds
  the compute, the work only the distributed path does (partition by owner, the owner's unique, the gathers and
  the gradient all-to-all's scatter; a 1-worker run skips all of it) and the collectives' per-call cost as two
  processes on one machine pay it (Horovod's negotiation cycle, Gloo, the copies, on the worker's own core). None
  of these is a property of the network, and on this machine they cannot be predicted from a 1-worker run and
  the probe: a collective inside a step costs several times what the probe's loop measures, because its CPU work
  shares the worker's core with the step's compute (docs/guide/cluster.md).
* K_m, T_m, J_m, D_m: all-to-all calls and the bytes one worker puts into them, allreduce calls and their bytes,
  per step, as the meter counted them (forward and backward). For the same per-worker batch they do not depend on
  N (weak scaling: the keys a worker sends are the unique pairs of its own batch).
* x_m = (T_m / K_m) * W (N - W) / N: the bytes one call sends over a host's link (a worker keeps 1/N of its
  input and sends (W - 1)/N over its own host's loopback). y_m = (D_m / J_m) * 2 (N - 1) / N: a ring allreduce's.
* c_X, e_X: the probe's seconds per link byte of the all-to-all and per byte of the allreduce on network X, and
  b_lo, e_lo on loopback (slopes of its fits t(S) = latency + seconds_per_byte * S, measured at N = 2, pinned as
  the runs).
* B_X: what the link lets through at once. The cluster shapes a link with a token bucket (tc tbf) of 2 ms of
  traffic, at least 64 KiB; a full bucket passes that many bytes of a message without waiting, and it refills at
  the link's rate between calls. The model spreads a step's calls evenly over L_m, so a call finds
  B_X = min(bucket, rate * L_m / (K_m + J_m)) bytes of tokens. A real wire has no such allowance (B = 0: every
  byte is serialised). The checks are on the shaped links; the projection gives both, shaped links as checked
  and a wire with B = 0, which no run here can check (every link here is shaped).
* No latency term per network: a link adds microseconds per call (its propagation, and a TCP round trip through
  the namespaces takes 0.07 ms), far below what the probe can resolve between two networks (its fitted latencies
  are Horovod's cycle on a loaded core, 1.4-2.7 ms, and move by a millisecond between runs of the same network;
  times 78 calls that noise alone would shift per_feature by 20%). The per-call cost is Horovod's on this CPU,
  and it is in L_m. The probe's latencies are reported beside the model, not used by it.
* For N > 2 the per-call cost is held at its N = 2 value: the model leaves out the growth with N of Gloo's N - 1
  pairwise messages and of Horovod's negotiation (optimistic), and assumes a non-blocking switch.

Checks: every run on namespaced hosts with N = 2 (each mode at each link rate). The loopback run is the anchor
(L_m), equal by construction, and the 1-worker run is shown for what the distributed path costs over it. Runs are
compared only when their workers were pinned alike (bench.json's cpus_per_worker). Each check is also scored for a
null model that ignores the network, t_m(X, N) = L_m: what the model's terms add is what it scores above that.

Reads RUNS/*/bench.json (python -m tf_fusedrec.bench) and RUNS/*/probe.json (python -m tf_fusedrec.cluster.probe)
as `make bench-cluster` writes them, and writes OUT/model.json, OUT/model.md and OUT/model.png.
"""

import argparse
import glob
import json
import os
import sys

from tf_fusedrec.cluster import parse_rate, tbf_burst_bytes
from tf_fusedrec.cluster.probe import link_bytes_per_byte, refit

PROJECT_N = (8, 16, 32, 64, 128)
# The projection's links: shaped as the checked ones (token bucket), and a wire without the bucket's allowance.
LINKS = ("shaped", "wire")
LOOPBACK = "loopback"
# What the checks score: the model's error, and the null model's (t = L_m, the network ignored) beside it.
SCORED = {"model": "error", "null": "null_error"}


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


def rate_order(network):
    """Sort key of a network name: loopback first, then by link rate."""
    return 0 if network == LOOPBACK else parse_rate(network)


def step_seconds(bench, mode):
    r = bench["modes"][mode]
    return bench["batch_size_per_worker"] * bench["workers"] / r["samples_per_s"]


class Network:
    """The probe's coefficients for one network, measured at N = 2: per byte cost of the all-to-all (per message
    byte, and per byte crossing a host's link) and of the allreduce, the link's rate and token bucket from its
    name, and (reported only) the latencies."""

    def __init__(self, name, probe):
        if probe["workers"] != 2:
            raise ValueError(f"network {name}: the probe ran with {probe['workers']} workers; the model needs N = 2")
        self.name = name
        a2a, ar = probe["alltoall"], probe["allreduce"]
        self.a = max(a2a["latency_s"], 0.0)
        self.b2 = a2a["seconds_per_byte"]  # per message byte, at N = 2 as measured
        self.c_link = a2a.get("seconds_per_link_byte")  # None on loopback: no link
        self.r = max(ar["latency_s"], 0.0)
        self.e2 = ar["seconds_per_byte"]  # at N = 2 a ring allreduce sends as many bytes as the tensor has
        if self.linked:
            rate = parse_rate(name)
            self.rate_bytes, self.bucket = rate / 8, tbf_burst_bytes(rate)
        else:
            self.rate_bytes, self.bucket = None, 0

    @property
    def linked(self):
        return self.c_link is not None

    def tokens(self, gap_s):
        """Bucket tokens a call finds when calls come gap_s apart."""
        return min(self.bucket, self.rate_bytes * gap_s)

    def coefficients(self):
        return {"alltoall_latency_s": self.a, "alltoall_s_per_byte_n2": self.b2, "c_link_s_per_byte": self.c_link,
                "allreduce_latency_s": self.r, "allreduce_s_per_byte_n2": self.e2, "bucket_bytes": self.bucket,
                "rate_bytes_per_s": self.rate_bytes}


def traffic(entry):
    """(K, T, J, D) of one mode's bench entry: all-to-all calls and bytes, allreduce calls and bytes per step."""
    return (entry.get("alltoall_calls_per_step", 0.0), entry.get("alltoall_bytes_per_step", 0.0),
            entry.get("allreduce_calls_per_step", 0.0), entry.get("allreduce_bytes_per_step", 0.0))


def predict(local_s, counts, net, lo, n, w=1, bucket=True):
    """Step seconds of one mode on the linked network `net` with N workers, W per host; returns (total, parts).
    bucket=False: a wire without the token bucket's allowance (B = 0)."""
    k, t, j, d = counts
    tokens = net.tokens(local_s / max(k + j, 1)) if bucket else 0.0
    x = t / k * link_bytes_per_byte(n, w) if k else 0.0
    y = d / j * 2 * (n - 1) / n if j else 0.0
    parts = {"local": local_s,
             "loopback_bytes": -(t * lo.b2 + d * lo.e2),
             "alltoall_link": k * max(0.0, x - tokens) * net.c_link,
             "allreduce_link": j * max(0.0, y - tokens) * net.e2}
    return sum(parts.values()), parts


def _pinning(bench):
    return bench.get("cpus_per_worker")


def build(runs):
    """The model's inputs, its checks against the runs and its projection."""
    anchors = [(name, b) for name, b, _ in runs if b["network"] == LOOPBACK and b["workers"] == 2]
    if not anchors:
        raise ValueError("no 2-worker loopback bench.json: the model's local step L_m comes from it")
    anchor_name, anchor = anchors[0]
    pin = _pinning(anchor)
    probes = {}
    for _, _, probe in runs:
        if probe is not None and probe["workers"] == 2:
            probes.setdefault(probe["network"], probe)
    if LOOPBACK not in probes:
        raise ValueError("no 2-worker loopback probe.json: the model subtracts what loopback costs")
    networks = {k: Network(k, p) for k, p in probes.items()}
    lo = networks[LOOPBACK]
    local = {m: step_seconds(anchor, m) for m in anchor["modes"]}
    counts = {m: traffic(anchor["modes"][m]) for m in anchor["modes"]}

    checks = []
    for name, bench, _ in runs:
        n, hosts = bench["workers"], bench.get("hosts", 1)
        net = networks.get(bench["network"])
        if n == 1:
            kind = "one worker"
        elif bench["network"] == LOOPBACK and name == anchor_name:
            kind = "anchor"
        elif net is None or not net.linked:
            kind = "no probe"  # shown, not checked: the model needs the network's probe at N = 2
        else:
            kind = "check"
            if _pinning(bench) != pin:
                raise ValueError(f"run {name}: {_pinning(bench)} CPUs per worker, the anchor {anchor_name} "
                                 f"{pin}: pin the runs alike (make bench-cluster does)")
        w = n // hosts
        for m in bench["modes"]:
            if kind == "check" and m not in local:
                continue
            row = {"run": name, "network": bench["network"], "workers": n, "workers_per_host": w, "mode": m,
                   "measured_s": step_seconds(bench, m), "kind": kind}
            if kind == "anchor":
                row["model_s"] = local[m]
            elif kind == "check":
                row["model_s"], row["parts"] = predict(local[m], counts[m], net, lo, n, w)
                row["error"] = row["model_s"] / row["measured_s"] - 1
                row["null_s"] = local[m]  # the null model: the loopback step, whatever the network
                row["null_error"] = row["null_s"] / row["measured_s"] - 1
            checks.append(row)

    projection = []
    for net in (v for v in networks.values() if v.linked):
        for m in local:
            for n in PROJECT_N:
                for link in LINKS:
                    model, parts = predict(local[m], counts[m], net, lo, n, bucket=link == "shaped")
                    projection.append({"network": net.name, "link": link, "mode": m, "workers": n,
                                       "model_s": model, "parts": parts,
                                       "samples_per_s": anchor["batch_size_per_worker"] * n / model})
    result = {"formula": "\n\n".join(__doc__.split("\n\n")[1:3]), "anchor": anchor_name, "cpus_per_worker": pin,
              "local_s": local, "traffic": {m: dict(zip(("K", "T", "J", "D"), c)) for m, c in counts.items()},
              "networks": {k: v.coefficients() for k, v in networks.items()}, "checks": checks,
              "projection": projection}
    result["scores"] = {name: dict(zip(("checked", "mean_abs_error", "max_abs_error", "within_25_percent"),
                                       summary(result, error)))
                        for name, error in SCORED.items()}
    return result


def summary(result, error="error"):
    """(checked points, mean |error|, max |error|, within 25%) of the model, or with error="null_error" of the null
    model."""
    errors = [abs(c[error]) for c in result["checks"] if c["kind"] == "check"]
    if not errors:
        return 0, 0.0, 0.0, 0
    return len(errors), sum(errors) / len(errors), max(errors), sum(e <= 0.25 for e in errors)


def measured_table(runs):
    """The 2-worker runs side by side: samples/s per mode and network, with fused's ratios to the baselines."""
    runs = [(name, b) for name, b, _ in runs if b["workers"] == 2]
    runs.sort(key=lambda r: rate_order(r[1]["network"]))
    modes = list(dict.fromkeys(m for _, b in runs for m in b["modes"]))
    nets = [b["network"] for _, b in runs]
    lines = ["| mode | " + " | ".join(f"{n} samples/s" for n in nets) + " | all-to-alls / step | bytes / step | "
             + " | ".join(f"{n} all-to-all waiting / moving s/step" for n in nets) + " |",
             "|---|" + "---:|" * (2 * len(nets) + 2)]
    for m in modes:
        rs = [b["modes"].get(m, {}) for _, b in runs]
        first = next(r for r in rs if r)
        calls, nbytes = first.get("alltoall_calls_per_step", 0), first.get("alltoall_bytes_per_step", 0)
        lines.append(f"| {m} | " + " | ".join(f"{r.get('samples_per_s', 0):,.0f}" for r in rs) +
                     f" | {calls:.0f} | {nbytes:,.0f} | " +
                     " | ".join(f"{r.get('alltoall_wait_seconds_per_step', 0):.3f} / "
                                f"{r.get('alltoall_transfer_seconds_per_step', 0):.3f}" for r in rs) + " |")
    for base in ("per_feature", "tfra_hand_fused"):
        if all("fused" in b["modes"] and base in b["modes"] for _, b in runs):
            lines.append(f"| **fused vs {base}** | " + " | ".join(
                f"**{b['modes']['fused']['samples_per_s'] / b['modes'][base]['samples_per_s']:.2f}x**"
                for _, b in runs) + " | | | " + " | ".join("" for _ in runs) + " |")
    return "\n".join(lines)


def network_table(result):
    lines = ["| network (probe, N = 2) | all-to-all latency (reported, not a term) | all-to-all ns / message byte "
             "| ns / link byte | allreduce latency (reported) | allreduce ns / byte |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, c in sorted(result["networks"].items(), key=lambda kv: rate_order(kv[0])):
        link = f"{c['c_link_s_per_byte'] * 1e9:.2f}" if c["c_link_s_per_byte"] is not None else "-"
        lines.append(f"| {name} | {c['alltoall_latency_s'] * 1e3:.2f} ms | {c['alltoall_s_per_byte_n2'] * 1e9:.2f} | "
                     f"{link} | {c['allreduce_latency_s'] * 1e3:.2f} ms | {c['allreduce_s_per_byte_n2'] * 1e9:.2f} |")
    return "\n".join(lines)


def markdown(result, runs=()):
    lines = [measured_table(runs), ""] if runs else []
    lines += [network_table(result), ""]
    lines += ["| run | network | N (hosts x W) | mode | measured s/step | model s/step | error |",
              "|---|---|---:|---|---:|---:|---:|"]
    for c in result["checks"]:
        shape = "1 host" if c["network"] in (LOOPBACK, "none") else \
            f"{c['workers'] // c['workers_per_host']} x {c['workers_per_host']}"
        model = f"{c['model_s']:.3f}" if "model_s" in c else "-"
        err = {"anchor": "anchor (L_m)", "one worker": "not modelled",
               "no probe": "not modelled (no N = 2 probe of this network)"}.get(c["kind"]) or f"{c['error']:+.0%}"
        lines.append(f"| {c['run']} | {c['network']} | {c['workers']} ({shape}) | "
                     f"{c['mode']} | {c['measured_s']:.3f} | {model} | {err} |")
    checked, mean, worst, within = summary(result)
    if checked:
        _, null_mean, null_worst, null_within = summary(result, "null_error")
        lines += ["", f"Checked points: {checked}, mean |error| {mean:.0%}, max {worst:.0%}; "
                      f"within 25%: {within} of {checked}. A null model that ignores the network (t = L_m): "
                      f"mean |error| {null_mean:.0%}, max {null_worst:.0%}; within 25%: {null_within} of {checked}."]
    for net in sorted({p["network"] for p in result["projection"]}, key=parse_rate):
        for link in LINKS:
            rows = [p for p in result["projection"] if p["network"] == net and p["link"] == link]
            modes = list(dict.fromkeys(p["mode"] for p in rows))
            what = "links shaped as checked" if link == "shaped" else "a wire without the token bucket (B = 0)"
            lines += ["", f"Projection (model) at {net}, {what}, one worker per host and per core, s/step "
                          f"(samples/s over all workers):", "",
                      "| N | " + " | ".join(modes) + " |", "|---:|" + "---:|" * len(modes)]
            for n in PROJECT_N:
                cells = [next(p for p in rows if p["mode"] == m and p["workers"] == n) for m in modes]
                lines.append(f"| {n} | " + " | ".join(f"{c['model_s']:.3f} ({c['samples_per_s']:,.0f})"
                                                     for c in cells) + " |")
    return "\n".join(lines)


def chart(result, path):
    try:
        import matplotlib  # noqa: PLC0415
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    nets = sorted({p["network"] for p in result["projection"]}, key=parse_rate)
    fig, axes = plt.subplots(1, max(len(nets), 1), figsize=(6 * max(len(nets), 1), 4.5), squeeze=False)
    for ax, net in zip(axes[0], nets):
        rows = [p for p in result["projection"] if p["network"] == net and p["link"] == "shaped"]
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
        ax.set_title(f"{net} (shaped): model (lines, x) and measured (o)")
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def build_parser():
    p = argparse.ArgumentParser(prog="python -m tf_fusedrec.cluster.model", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="bench_results/cluster", help="directory of <run>/bench.json (+ probe.json)")
    p.add_argument("--out", default=None, help="default: --runs")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    runs = load_runs(args.runs)
    try:
        result = build(runs)
    except (ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    out = args.out or args.runs
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "model.json"), "w") as f:
        json.dump(result, f, indent=2)
    text = markdown(result, runs)
    with open(os.path.join(out, "model.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    written = chart(result, os.path.join(out, "model.png"))
    print(f"wrote {out}/model.json, model.md" + (f", {written}" if written else ""), file=sys.stderr)


if __name__ == "__main__":
    main()

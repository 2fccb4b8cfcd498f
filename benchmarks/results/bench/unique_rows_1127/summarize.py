"""Summary of run.sh's bench.json files: per steps-per-call K, round and tree, fused and dense_only samples/s (median
of 5) and step / rank 0's CPU ms, and fused's step against dense_only's.

    .venv/bin/python benchmarks/results/bench/unique_rows_1127/summarize.py > benchmarks/results/bench/unique_rows_1127/summary.txt
"""
import glob
import json
import os
import statistics

here = os.path.dirname(os.path.abspath(__file__))
print("| K | round | tree | fused samples/s | dense_only samples/s | fused step / CPU ms | dense_only step / CPU ms "
      "| fused vs dense_only |")
print("|---|---|---|---:|---:|---:|---:|---:|")
summary = {}
for k in ("k1", "k4"):
    for path in sorted(glob.glob(os.path.join(here, k, "*-*", "bench.json")), key=lambda p: (p.split("-")[-1], p)):
        tree, n = os.path.basename(os.path.dirname(path)).split("-")
        modes = json.load(open(path))["modes"]
        f, d = modes["fused"], modes["dense_only"]
        ratio = d["samples_per_s"] / f["samples_per_s"]
        summary.setdefault((k, tree), []).append((ratio, f["cpu_seconds_per_step"] * 1e3, f["samples_per_s"]))
        print(f"| {k[1:]} | {n} | {tree} | {f['samples_per_s']:,.0f} | {d['samples_per_s']:,.0f} | "
              f"{f['step_seconds'] * 1e3:.1f} / {f['cpu_seconds_per_step'] * 1e3:.1f} | "
              f"{d['step_seconds'] * 1e3:.1f} / {d['cpu_seconds_per_step'] * 1e3:.1f} | {ratio:.2f}x |")
print()
for (k, tree), rows in sorted(summary.items()):
    ratios, cpus = [r for r, _, _ in rows], [c for _, c, _ in rows]
    print(f"K={k[1:]} {tree}: fused vs dense_only {min(ratios):.2f}x-{max(ratios):.2f}x (median "
          f"{statistics.median(ratios):.2f}x); fused CPU / step {min(cpus):.1f}-{max(cpus):.1f} ms")

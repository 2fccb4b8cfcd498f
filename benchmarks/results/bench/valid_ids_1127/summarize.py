"""Summary of run.sh's bench.json files: per round and tree, fused and dense_only samples/s (medians of 5) and rank
0's step and CPU ms, and fused's step against dense_only's.

    .venv/bin/python benchmarks/results/bench/valid_ids_1127/summarize.py > benchmarks/results/bench/valid_ids_1127/summary.txt
"""
import glob
import json
import os
import statistics

here = os.path.dirname(os.path.abspath(__file__))
rows = {"base": [], "head": []}
print("| round | tree | fused samples/s | dense_only samples/s | fused step / CPU ms | dense_only step / CPU ms "
      "| fused vs dense_only |")
print("|---|---|---:|---:|---:|---:|---:|")
for path in sorted(glob.glob(os.path.join(here, "*-*", "bench.json")), key=lambda p: (p.split("-")[-1], p)):
    tree, n = os.path.basename(os.path.dirname(path)).split("-")
    modes = json.load(open(path))["modes"]
    f, d = modes["fused"], modes["dense_only"]
    ratio = d["samples_per_s"] / f["samples_per_s"]
    rows[tree].append((f["samples_per_s"], ratio))
    print(f"| {n} | {tree} | {f['samples_per_s']:,.0f} | {d['samples_per_s']:,.0f} | "
          f"{f['step_seconds'] * 1e3:.1f} / {f['cpu_seconds_per_step'] * 1e3:.1f} | "
          f"{d['step_seconds'] * 1e3:.1f} / {d['cpu_seconds_per_step'] * 1e3:.1f} | {ratio:.2f}x |")
print()
for tree, r in rows.items():
    print(f"{tree}: fused {statistics.median(x for x, _ in r):,.0f} samples/s (median of {len(r)} rounds), "
          f"fused step vs dense_only {min(y for _, y in r):.2f}x-{max(y for _, y in r):.2f}x "
          f"(median {statistics.median(y for _, y in r):.2f}x)")
pairs = [h[0] / b[0] for b, h in zip(rows["base"], rows["head"])]
print(f"head fused vs base fused, round by round: {', '.join(f'{p:.2f}x' for p in pairs)}")

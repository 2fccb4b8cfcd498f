"""Prints summary.txt from this directory's runs (python3 benchmarks/results/bench/hot_sender_1127/summarize.py)."""
import json
import os
import re
import statistics as st

HERE = os.path.dirname(os.path.abspath(__file__))
for hot, runs in (("0", 5), ("2000", 5), ("auto", 4)):
    what = " (a control: rows=0 means no replication, so fused_hot is fused built twice)" if hot == "0" else ""
    print(f"--hot {hot}{what}: fused_hot / fused samples/s (same run), rank 0's CPU ms per step, R per group")
    for tree in ("before", "after"):
        ratios, extra = [], []
        for n in range(1, runs + 1):
            modes = json.load(open(os.path.join(HERE, f"{tree}-hot{hot}-run{n}", "bench.json")))["modes"]
            fused, hot_mode = modes["fused"], modes["fused_hot"]
            ratio = hot_mode["samples_per_s"] / fused["samples_per_s"]
            cpu_f, cpu_h = fused["cpu_seconds_per_step"] * 1e3, hot_mode["cpu_seconds_per_step"] * 1e3
            rows = re.findall(r"R=(\d+)", open(os.path.join(HERE, f"{tree}-hot{hot}-run{n}.log")).read())
            ratios.append(ratio)
            extra.append(cpu_h - cpu_f)
            print(f"  {tree:6s} run {n}: {ratio:.2f}x  CPU fused {cpu_f:.1f} fused_hot {cpu_h:.1f} "
                  f"({cpu_h - cpu_f:+.1f})  R {','.join(rows)}")
        print(f"  {tree:6s} median {st.median(ratios):.2f}x, fused_hot's extra CPU median {st.median(extra):+.1f} ms")

#!/usr/bin/env python3
"""Sums a test run's CPU per module (and lists the costliest test phases) from the files TF_FUSEDREC_CPU_REPORT=DIR
makes pytest write (tests/conftest.py): the suite is CPU-bound on 2 cores, so CPU, not wall time, says what to cut.

    TF_FUSEDREC_CPU_REPORT=/tmp/cpu make test; benchmarks/suite/cpu_report.py /tmp/cpu [--top 40]
"""

import argparse
import collections
import glob
import os
import sys


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--top", type=int, default=40)
    args = p.parse_args(argv)
    files = sorted(glob.glob(os.path.join(args.dir, "cpu-*.tsv")))
    if not files:
        sys.exit(f"{args.dir}: no cpu-*.tsv files (run pytest with TF_FUSEDREC_CPU_REPORT={args.dir})")
    phases, modules, tests = [], collections.Counter(), collections.Counter()
    wall = collections.Counter()
    spans = {}  # file -> (first start, last end, seconds in test phases)
    for name in files:
        with open(name) as f:
            for n, line in enumerate(f, 1):
                parts = line.rstrip("\n").split("\t")
                if len(parts) not in (4, 5):
                    sys.exit(f"{name}:{n}: expected 4 or 5 tab-separated fields, got {len(parts)}")
                node, phase, cpu, seconds = parts[0], parts[1], float(parts[2]), float(parts[3])
                phases.append((cpu, seconds, phase, node))
                if len(parts) == 5:  # the phase's start: each process's span
                    began = float(parts[4])
                    first, last, busy = spans.get(name, (began, began, 0.0))
                    spans[name] = (min(first, began), max(last, began + seconds), busy + seconds)
                module = node.split("::")[0]
                modules[module] += cpu
                wall[module] += seconds
                tests[module] += phase == "call"
    total = sum(modules.values())
    print(f"{len(files)} pytest process(es), {sum(tests.values())} tests, {total:.0f} CPU s in test phases")
    if spans:  # a process that ends long before another left a core idle (the tail of a parallel run)
        start = min(first for first, _, _ in spans.values())
        end = max(last for _, last, _ in spans.values())
        print(f"span of the run: {end - start:.0f} s; per process: starts, ends (s from the first start), in tests")
        for name, (first, last, busy) in sorted(spans.items()):
            print(f"  {os.path.basename(name)}: {first - start:6.0f} {last - start:6.0f} {busy:8.0f}")
    print(f"\n{'CPU s':>8} {'share':>6} {'wall s':>8} {'tests':>6}  module")
    for module, cpu in modules.most_common():
        print(f"{cpu:8.1f} {cpu / total:6.1%} {wall[module]:8.1f} {tests[module]:6d}  {module}")
    print(f"\nthe {args.top} costliest phases:\n{'CPU s':>8} {'wall s':>8}  phase     test")
    for cpu, seconds, phase, node in sorted(phases, reverse=True)[:args.top]:
        print(f"{cpu:8.1f} {seconds:8.1f}  {phase:8s}  {node}")


if __name__ == "__main__":
    main()

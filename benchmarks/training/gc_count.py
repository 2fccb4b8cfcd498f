"""Counts the Python garbage collector's runs during `python -m tf_fusedrec.bench` (issue 54: does Keras 3 make the
collector run in the steady steps?). Runs the bench in this process with a gc callback and prints, as it leaves, the
collections per generation, their seconds and objects collected, the thresholds and the live objects:

    python benchmarks/training/gc_count.py --modes fused --sweep '' --steps 100 --repeats 1 --warmup 10 --out DIR

Run it at two --steps: collections the steady steps cause are the difference (tracing and warm-up are the rest).
"""
import gc
import os
import sys
import time
import runpy

_stats = {g: [0, 0.0, 0] for g in range(3)}
_start = [0.0]


def _callback(phase, info):
    if phase == "start":
        _start[0] = time.perf_counter()
        return
    s = _stats[info["generation"]]
    s[0] += 1
    s[1] += time.perf_counter() - _start[0]
    s[2] += info["collected"]


def _report():
    rows = {g: {"collections": c, "seconds": round(t, 3), "collected": n} for g, (c, t, n) in _stats.items()}
    print(f"[gc_count] steps={_steps()} {rows} threshold={gc.get_threshold()} live_objects={len(gc.get_objects())}",
          file=sys.stderr, flush=True)


def _steps():
    return sys.argv[sys.argv.index("--steps") + 1] if "--steps" in sys.argv else "default"


gc.callbacks.append(_callback)
_exit = os._exit


def _exit_reporting(code):  # the bench leaves by os._exit, without atexit handlers
    _report()
    _exit(code)


os._exit = _exit_reporting
sys.argv = ["tf_fusedrec.bench"] + sys.argv[1:]
runpy.run_module("tf_fusedrec.bench", run_name="__main__", alter_sys=True)

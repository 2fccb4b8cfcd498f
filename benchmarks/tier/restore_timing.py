"""Times the restore of a larger_than_memory.py checkpoint directory into a fresh tiered table (issue 57): the newest
checkpoint with its chain, or, with --hide STEP, with checkpoint STEP moved aside for the run (to time a full
checkpoint alone against the chain of a delta on it):

    python benchmarks/tier/restore_timing.py --dir DIR --dram-gib 1.5 [--hide 271]

Prints one line: the step restored, the kinds of its chain, the bytes read, the seconds and the peak resident memory.
"""
import argparse
import os
import shutil
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import larger_than_memory as ltm  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--dram-gib", type=float, default=1.5)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--hide", type=int, help="a checkpoint step moved aside during the restore (put back after)")
    args = p.parse_args()
    hidden = None
    if args.hide is not None:
        hidden = os.path.join(args.dir, f"hidden-ckpt-{args.hide}")
        os.rename(os.path.join(args.dir, "model", f"ckpt-{args.hide}"), hidden)
    try:
        shutil.rmtree(os.path.join(args.dir, "store"), ignore_errors=True)
        _, _, _, checkpointer = ltm.build(types.SimpleNamespace(dir=args.dir, dram_gib=args.dram_gib, dim=args.dim))
        began = time.perf_counter()
        info = checkpointer.restore()
        seconds = time.perf_counter() - began
        kinds = "+".join(link["kind"] for link in info["chain"])
        print(f"[restore_timing] step {info['step']} ({kinds}): {info['bytes_read'] / ltm.GIB:.1f} GiB read in "
              f"{seconds:.0f} s, peak RSS {ltm.memory()['VmHWM'] / ltm.GIB:.2f} GiB", flush=True)
    finally:
        shutil.rmtree(os.path.join(args.dir, "store"), ignore_errors=True)
        if hidden is not None:
            os.rename(hidden, os.path.join(args.dir, "model", f"ckpt-{args.hide}"))


if __name__ == "__main__":
    main()

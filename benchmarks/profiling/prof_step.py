"""One bench mode's steady steps, for a profiler to sample (benchmarks/profiling/perf_step.sh runs it under perf).

    horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python benchmarks/profiling/prof_step.py MODE STEPS FLAG [BATCH]

Builds MODE as tf_fusedrec.bench does (its Runner) on configs/criteo_synthetic.yaml (run from the repository root),
8 batches of BATCH samples per worker (default: the config's) cached and cycled, and warms up for 10 steps. Then rank 0
touches FLAG (the profiler attaches), every worker waits 2 s and runs STEPS steps, prints its ms/step, CPU ms/step and
samples/s, and rank 0 touches FLAG.done. GCMODE=freeze or off changes Python's garbage collection after the warm-up.
"""

import gc
import os
import sys
import time

from tf_fusedrec import config as cfg
from tf_fusedrec.bench import train_bench
from tf_fusedrec.distributed import comm as comm_lib
from tf_fusedrec.train import experiment


def main():
    mode, steps, flag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    comm = comm_lib.init_workers()
    config = cfg.load_config("configs/criteo_synthetic.yaml")
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else config.train.batch_size
    batches = experiment.make_dataset(config, batch, comm.rank, comm.size).take(8).cache()
    runner = train_bench.Runner(mode, config, batches, comm, None)
    runner.run(10)
    gc_mode = os.environ.get("GCMODE", "default")
    if gc_mode == "freeze":
        gc.collect()
        gc.freeze()
    elif gc_mode == "off":
        gc.disable()
    if comm.rank == 0:
        open(flag, "w").close()
    time.sleep(2)
    wall, cpu = time.perf_counter(), time.process_time()
    runner.run(steps)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    print(f"gc={gc_mode} rank {comm.rank} {mode}: {wall / steps * 1e3:.1f} ms/step, cpu {cpu / steps * 1e3:.1f} ms/step, "
          f"{batch * comm.size * steps / wall:,.0f} samples/s", flush=True)
    if comm.rank == 0:
        open(flag + ".done", "w").close()


if __name__ == "__main__":
    main()

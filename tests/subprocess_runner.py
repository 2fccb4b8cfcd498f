"""Running the project's programs in subprocesses from tests: alone or under horovodrun, in their own process group,
with a timeout that ends the whole group (horovodrun and its workers), in an environment without the variables that
would make a child believe it is a Horovod worker."""

import importlib.util
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# Horovod's `horovodrun` script, and the suite's launcher: the same launcher code without its per-launch check that
# Horovod was built with Gloo (tests/horovodrun.py says why).
HOROVODRUN = Path(sys.executable).with_name("horovodrun")
SUITE_HOROVODRUN = ROOT / "tests" / "horovodrun.py"
# Set by horovodrun for its workers; the programs take their presence to mean "I am a Horovod worker".
WORKER_ENV = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
              "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK")


def tail(text, n=4000):
    return text if len(text) <= n else "...\n" + text[-n:]


def child_env():
    env = {k: v for k, v in os.environ.items() if k not in WORKER_ENV}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["TF_FUSEDREC_EXIT_WITH_PARENT"] = "1"  # servers and rankers die with the test run (serve/lifetime.py)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def execute(cmd, timeout, merge_stderr=False, interrupt_when=None):
    """Runs cmd from the repository root. Returns (exit status or None on timeout, stdout, stderr); with
    merge_stderr, stderr is folded into stdout and returned as "". At the timeout the process group gets SIGTERM
    (then SIGKILL). interrupt_when: a function polled every 0.2 s; once it returns true the run is ended the same way
    and reported as timed out (None), so a test of an interruption waits for what it needs, not a fixed time."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + timeout
    while True:
        wait = deadline - time.monotonic()
        try:
            out, err = proc.communicate(timeout=max(0.0, min(wait, 0.2) if interrupt_when else wait))
            return proc.returncode, out, err or ""
        except subprocess.TimeoutExpired:  # (communicate may be called again: nothing read is lost)
            if time.monotonic() >= deadline or (interrupt_when is not None and interrupt_when()):
                break
    # Timed out, or asked to stop: the process group is ended.
    out, err = "", ""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # ended on its own meanwhile
            out, err = proc.communicate()
            break
        try:
            out, err = proc.communicate(timeout=10)
            break
        except subprocess.TimeoutExpired:
            continue
    else:
        out, err = proc.communicate()
    return None, out or "", err or ""


def horovodrun(workers, stock=False):
    """The command prefix that starts `workers` Gloo workers on this host's loopback (the one place it is built):
    the suite's launcher (tests/horovodrun.py), or with `stock` the `horovodrun` script users type."""
    assert HOROVODRUN.exists(), f"{HOROVODRUN} does not exist (scripts/install.sh installs Horovod)"
    launcher = [str(HOROVODRUN)] if stock else [sys.executable, str(SUITE_HOROVODRUN)]
    return launcher + ["-np", str(workers), "-H", f"localhost:{workers}", "--gloo"]


def horovodrun_mpi(workers):
    """The command prefix that starts `workers` Open MPI workers on this host (horovodrun --mpi: mpirun, the local
    ranks exchanging through shared memory), the suite's launcher. mpirun refuses to run as root unless told it is
    meant: the two OMPI_ALLOW_RUN_AS_ROOT variables (no effect for other users)."""
    assert HOROVODRUN.exists(), f"{HOROVODRUN} does not exist (scripts/install.sh installs Horovod)"
    return ["env", "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", sys.executable,
            str(SUITE_HOROVODRUN), "-np", str(workers), "-H", f"localhost:{workers}", "--mpi"]


def worker_command(args, workers):
    """[python, *args] for one worker, else the same under horovodrun with `workers` Gloo workers on loopback."""
    python = [sys.executable] + [str(a) for a in args]
    return python if workers == 1 else horovodrun(workers) + python


def run_scenario(name, args, workers, out, timeout):
    """Runs a scenario script (args: the script, then its flags; it writes {out}/rank{r}.npz) alone or under
    horovodrun -> [per rank {key: array}]. A failed or timed-out run raises AssertionError naming `name`, the command
    and the log's tail."""
    cmd = worker_command(args, workers)
    rc, log, _ = execute(cmd, timeout, merge_stderr=True)
    if rc != 0:
        raise AssertionError(f"{name}: exit status {rc}: {' '.join(cmd)}\n{tail(log)}")
    ranks = []
    for r in range(workers):
        with np.load(Path(out) / f"rank{r}.npz") as z:
            ranks.append({k: z[k] for k in z.files})
    return ranks


def run_scenarios(script, runs, workers, root, launch_timeout, per_run_timeout):
    """Runs a scenario script that takes a repeatable ``--run="FLAGS"`` (one run's own flags, parsed by its own parser;
    hot_scenario.py, pipeline_scenario.py) ONCE, alone or under horovodrun, training each run in turn into its own
    directory under `root`: the processes, TensorFlow's import and Horovod's start are paid once, not per run.

    runs: {key: [flags]} in training order (the script adds nothing; --out is added here). -> {key: [per rank {name:
    array}]}. A failed or timed-out launch raises AssertionError naming every run it held, the command and the log's
    tail (the scripts print "rank R: run i/n: ..." before each run, so the tail says which one was training)."""
    args, dirs = [script], {}
    for index, (key, flags) in enumerate(runs.items()):
        dirs[key] = out = Path(root) / f"run{index}"
        args.append("--run=" + shlex.join([str(f) for f in flags] + ["--out", str(out)]))
    cmd = worker_command(args, workers)
    what = f"{Path(script).name}, {workers} worker(s): " + "; ".join(" ".join(map(str, f)) for f in runs.values())
    timeout = launch_timeout + per_run_timeout * len(runs)
    start = time.monotonic()
    rc, log, _ = execute(cmd, timeout, merge_stderr=True)
    took = time.monotonic() - start
    if rc is None:
        raise AssertionError(f"{what}: timed out after {timeout} s: {' '.join(cmd)}\n{tail(log)}")
    if rc != 0:
        raise AssertionError(f"{what}: exit status {rc} after {took:.0f} s: {' '.join(cmd)}\n{tail(log)}")
    results = {}
    for key, out in dirs.items():
        results[key] = []
        for r in range(workers):
            with np.load(out / f"rank{r}.npz") as z:
                results[key].append({k: z[k] for k in z.files})
    return results


def load_script(path, name):
    """A script that is not in a package (tests/*/scenario.py, scripts/*.py) imported as module `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

"""`python -m tf_fusedrec.train` on 2 workers when one of them dies or stalls mid-training.

* SIGKILL of rank 1 while it trains: the job ends within CRASH_BOUND_S with a non-zero status, the launcher's log
  names the lost process, and nothing hangs.
* SIGSTOP of rank 1 (a stalled peer, which horovodrun cannot see): rank 0's --step-timeout watchdog gives up with
  'error: rank 0: step N did not finish within T s' and exit status 3; the test then kills the stopped worker.

The workers are found among the launcher's descendants by their environment (HOROVOD_RANK).
"""

import os
import signal
import subprocess
import time

import pytest

from tests.subprocess_runner import horovodrun, tail

CRASH_BOUND_S = 150
START_BOUND_S = 240  # start-up and tracing on a loaded 2-core machine


def descendants(pid):
    """Every live process below `pid` (horovodrun starts its workers in sessions of their own)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def worker_pid(launcher_pid, rank):
    """The pid of the train worker of `rank` started under the launcher (None until it exists)."""
    for pid in descendants(launcher_pid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if f"HOROVOD_RANK={rank}".encode() in env and b"tf_fusedrec.train" in cmd:
            return pid
    return None


def start_training(apps, tmp_path, *flags):
    config = apps.write_config(tmp_path / "tiny.yaml", apps.tiny_config("dlrm"))
    # The stock `horovodrun` script (the rest of the suite uses tests/horovodrun.py): what users type is what
    # stops the job when a worker dies.
    cmd = horovodrun(2, stock=True) + [str(apps.PYTHON), "-m", "tf_fusedrec.train", "--config", str(config),
                                       "--steps", "100000", "--no-progress", *flags]
    log = open(tmp_path / "log.txt", "w+")  # noqa: SIM115  (closed by the caller through the returned object)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log


def wait_for_step(proc, log, step, bound):
    """Waits until rank 0 logged `step` (the workers are inside the training loop)."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        log.seek(0)
        if f"step {step}/" in log.read():
            return
        assert proc.poll() is None, f"the job ended before step {step}:\n{tail(text(log))}"
        time.sleep(0.5)
    raise AssertionError(f"no step {step} within {bound} s:\n{tail(text(log))}")


def text(log):
    log.seek(0)
    return log.read()


def finish(proc, bound):
    """-> (exit status, seconds) of the launcher, killed (with its group) if it outlives `bound`."""
    start = time.monotonic()
    try:
        return proc.wait(timeout=bound), time.monotonic() - start
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None, time.monotonic() - start


@pytest.fixture
def cleanup():
    procs = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_killed_worker_ends_the_job_with_an_error(apps, tmp_path, cleanup):
    apps.require_horovod()
    proc, log = start_training(apps, tmp_path)
    cleanup.append(proc)
    wait_for_step(proc, log, 2, START_BOUND_S)
    victim = worker_pid(proc.pid, 1)
    assert victim is not None, f"rank 1's process not found\n{tail(text(log))}"
    os.kill(victim, signal.SIGKILL)
    rc, took = finish(proc, CRASH_BOUND_S)
    out = text(log)
    assert rc is not None, f"the job still ran {CRASH_BOUND_S} s after rank 1 was killed:\n{tail(out)}"
    assert rc != 0, f"exit status 0 after rank 1 was killed:\n{tail(out)}"
    assert "Process name: 1" in out or "Process 1 exit" in out, f"the lost rank is not named:\n{tail(out)}"


def test_a_stalled_worker_trips_the_step_timeout(apps, tmp_path, cleanup):
    apps.require_horovod()
    proc, log = start_training(apps, tmp_path, "--step-timeout", "20")
    cleanup.append(proc)
    wait_for_step(proc, log, 2, START_BOUND_S)
    victim = worker_pid(proc.pid, 1)
    assert victim is not None, f"rank 1's process not found\n{tail(text(log))}"
    os.kill(victim, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + CRASH_BOUND_S
        while time.monotonic() < deadline and "did not finish within 20 s" not in text(log):
            time.sleep(0.5)
        out = text(log)
        assert "error: rank 0: step" in out and "did not finish within 20 s (--step-timeout)" in out, tail(out)
    finally:
        os.kill(victim, signal.SIGKILL)  # a stopped process ignores the launcher's SIGTERM
    rc, _ = finish(proc, CRASH_BOUND_S)
    out = text(log)
    assert rc is not None and rc != 0, f"exit status {rc}:\n{tail(out)}"
    assert "Process 0 exit with status code 3" in out or "Exit code: 3" in out, tail(out)

"""What the training app shows a person: rank 0's progress line, its notes and a short summary at the end.

Where it goes. Alone, to stdout. Under a launcher a worker's stdout is not the person's: horovodrun --gloo reads each
worker's stdout and stderr through pipes and writes every line (every piece ending in a newline or a carriage return)
with a prefix, `[0]<stdout>:` (horovod/runner/common/util/safe_shell_exec.py, prefix_connection; Horovod 0.28.1 has no
option that turns it off), and horovodrun --mpi runs `mpirun --tag-output` (horovod/runner/mpi_run.py), which puts
`[1,0]<stdout>:` before every piece a worker writes, so a line written in pieces gets tags in its middle. So rank 0
writes to the launcher's own stdout whenever the launcher runs on its host: it finds the process among its ancestors
(/proc) -- horovodrun's middleman for this worker (Gloo), or mpirun (MPI) -- and opens that process's stdout, a
terminal or a pipe, for writing (`launcher_stdout()`). Elsewhere (rank 0 on another host, a launcher writing to a file
it did not open for appending, a /proc that does not allow it) rank 0 writes to its own stdout, a whole line per
write: the launcher's prefix stays, the lines stay whole.

How. On a terminal (and not --no-progress) one line that updates in place (a carriage return, then the line padded to
the previous one's length); in a log or a pipe a whole, newline-terminated line every `every` steps and at the last
step. Notes (a resumed checkpoint, the hot rows) and the summary are whole lines, which first end a progress line in
place. Every other rank prints nothing here.
"""

import math
import os
import stat
import sys
import time

_MPI_LAUNCHERS = ("mpirun", "mpiexec", "orterun", "prterun")


def _proc(pid, name):
    with open(f"/proc/{pid}/{name}", "rb") as f:
        return f.read()


def _parent(pid):
    """The parent's pid (the fourth field of /proc/PID/stat, after the parenthesised command, which may hold spaces)."""
    return int(_proc(pid, "stat").rsplit(b")", 1)[1].split()[1])


def _stdout_id(pid):
    st = os.stat(f"/proc/{pid}/fd/1")
    return st.st_dev, st.st_ino


def _is_launcher(pid, env):
    """Whether `pid` (the nearest ancestor whose stdout is not this process's) is the launcher that forwards it."""
    if env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"):  # horovodrun --gloo: a spawned middleman whose parent is horovodrun
        return b"horovod" in _proc(_parent(pid), "cmdline")
    if env.get("OMPI_COMM_WORLD_RANK") is not None:  # mpirun starts the ranks of its own host itself
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")) in _MPI_LAUNCHERS
    return False


def launcher_stdout(env=None):
    """The path (/proc/PID/fd/1) of the stdout of the launcher that forwards this process's output with a prefix, when
    that launcher runs on this host and its stdout can be shared: a terminal, a pipe, or a file it opened for
    appending (a file it writes at its own offset would be overwritten); else None. Never raises."""
    env = os.environ if env is None else env
    try:
        mine = os.fstat(1)
        mine = (mine.st_dev, mine.st_ino)
        pid = os.getppid()
        for _ in range(8):  # the worker, a shell or two, then the launcher
            if pid <= 1:
                return None
            if _stdout_id(pid) != mine:
                break
            pid = _parent(pid)
        else:
            return None
        if not _is_launcher(pid, env):
            return None
        path = f"/proc/{pid}/fd/1"
        mode = os.stat(path).st_mode
        if stat.S_ISREG(mode):
            flags = next(int(line.split()[1], 8) for line in _proc(pid, "fdinfo/1").splitlines()
                         if line.startswith(b"flags:"))
            return path if flags & os.O_APPEND else None
        return path if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) else None
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _under_launcher(env):
    return any(env.get(k) is not None for k in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"))


class Console:
    """Rank 0's output for a person: `line(text)` writes a whole line, `update(text)` the progress line (in place on a
    terminal), `close()` ends a progress line left in place. Each call is one write of whole lines, so nothing that
    forwards the output line by line can glue two together. A Console without a stream writes nothing (other ranks).

    Args:
      stream: a text stream, or None.
      fd: a file descriptor written with os.write instead of `stream` (the launcher's stdout).
      tty: whether the output ends on a terminal, so that `update` may redraw in place.
    """

    def __init__(self, stream=None, fd=None, tty=False):
        self.stream, self.fd, self.tty = stream, fd, tty
        self._shown = 0  # the length of the progress line shown in place (0: none)

    @property
    def enabled(self):
        return self.stream is not None or self.fd is not None

    def _write(self, text):
        if self.fd is not None:
            data = text.encode()
            while data:
                data = data[os.write(self.fd, data):]
        elif self.stream is not None:
            self.stream.write(text)
            self.stream.flush()

    def line(self, text):
        """Writes `text` as whole lines, after ending a progress line shown in place."""
        if self.enabled:
            self._write(("\n" if self._shown else "") + text.rstrip("\n") + "\n")
            self._shown = 0

    def update(self, text):
        """The progress line: redrawn in place on a terminal, else a whole line."""
        if not self.enabled:
            return
        if not self.tty:
            self.line(text)
            return
        self._write("\r" + text + " " * max(self._shown - len(text), 0))
        self._shown = max(len(text), 1)

    def close(self):
        """Ends a progress line shown in place (the cursor moves to the next line)."""
        if self.enabled and self._shown:
            self._write("\n")
        self._shown = 0


def open_console(rank, in_place=True, env=None):
    """The Console of this worker: rank 0's writes to the launcher's stdout (launcher_stdout()) when one forwards this
    process's output, else to sys.stdout; other ranks' write nothing. `in_place`: a progress line may redraw in place
    when the output ends on a terminal (False: whole lines always, as --no-progress)."""
    env = os.environ if env is None else env
    if rank != 0:
        return Console()
    if _under_launcher(env):
        path = launcher_stdout(env)
        if path is not None:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC)
                os.set_blocking(fd, True)  # non-blocking only so that opening a pipe nobody reads fails at once
            except OSError:
                fd = None
            if fd is not None:
                return Console(fd=fd, tty=in_place and os.isatty(fd))
        # Forwarded: whole lines, never in place (a pseudo-terminal stdout under mpirun is not the person's).
        return Console(sys.stdout)
    return Console(sys.stdout, tty=in_place and sys.stdout.isatty())


def _clock(seconds):
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes:02d}:{seconds:02d}" if minutes < 60 else f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}"


class Progress:
    """The progress of steps `start`+1 .. `total` on a Console: on a terminal a bar redrawn at every step (percentage,
    bar, step/total, elapsed<remaining, rate: tqdm's layout, which the pinned stack does not carry), else the line
    `step S/T  loss L  R samples/s` every `every` steps and at the last step; either ends with `, N bad records
    skipped` once the stream has skipped some (data.on_bad_record: skip)."""

    def __init__(self, console, total, every, start=0):
        self.console, self.total, self.every, self.start = console, total, every, start
        self.t0 = time.monotonic()

    def update(self, step, loss, samples_per_s, skipped=0):
        """Shows step `step` (of every worker: its loss, the samples/s) and the bad records skipped by then."""
        console = self.console
        if not console.enabled:
            return
        bad = f", {skipped:,} bad record{'s' if skipped != 1 else ''} skipped" if skipped else ""
        if console.tty:
            elapsed = time.monotonic() - self.t0
            done = step - self.start
            remaining = elapsed / done * (self.total - step) if done else 0.0
            width, total = 30, max(self.total, 1)
            filled = int(width * step / total)
            console.update(f"{100 * step / total:3.0f}%|{'#' * filled}{' ' * (width - filled)}| {step}/{self.total} "
                           f"[{_clock(elapsed)}<{_clock(remaining)}, {samples_per_s:,.0f} samples/s, loss {loss:.4f}"
                           f"{bad}]")
            if step == self.total:
                console.close()
        elif step % self.every == 0 or step == self.total:
            console.line(f"step {step}/{self.total}  loss {loss:.4f}  {samples_per_s:,.0f} samples/s{bad}")


def _bytes(n):
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000.0
    return f"{n:,.1f} GB"


def _number(x, spec):
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def summary_lines(result, checkpoint=None, summary_json=None):
    """The short summary a person reads at the end, from the run's summary dict: throughput, AUC and loss, the bad
    records skipped (if any), the all-to-all traffic per step, and where the checkpoint and the summary JSON went.

    Args:
      result: the summary (app.py, _TrainingRun.summarize).
      checkpoint: the directory of the last checkpoint written, or None.
      summary_json: the path of the summary JSON written, or None.
    """
    auc = result.get("auc")
    auc = ", ".join(f"{task} {_number(v, '.4f')}" for task, v in auc.items()) if isinstance(auc, dict) \
        else _number(auc, ".4f")
    tokens = f", {_number(result['tokens_per_s'], ',.0f')} tokens/s" if "tokens_per_s" in result else ""
    lines = [
        f"done: {result['steps']} steps on {result['workers']} worker{'s' if result['workers'] != 1 else ''}, "
        f"{result['embedding']} embedding, "
        f"{result['pipeline']} schedule",
        f"  throughput   {_number(result['samples_per_s'], ',.0f')} samples/s{tokens} (all workers, after warm-up)",
        f"  AUC          {auc} (held out)",
        f"  loss         {_number(result['final_loss'], '.4f')} (last step)",
    ]
    tier = result.get("tier")
    if tier:
        workers = tier["per_worker"]
        lines.append(f"  tiers        DRAM hit rate {100 * tier['hit_rate']:.1f}%, {sum(workers['dram_rows']):,} rows in "
                     f"DRAM, {sum(workers['disk_rows']):,} on disk; disk {_bytes(tier['disk_bytes_read_per_step'])} "
                     f"read, {_bytes(tier['disk_bytes_written_per_step'])} written per step (all workers)")
    skipped = result.get("bad_records_skipped")
    if skipped:
        lines.append(f"  bad records  {skipped:,} skipped (data.on_bad_record: skip)")
    if "alltoall_calls_per_step" in result:
        exposed = result.get("exposed_alltoall_seconds_per_step")
        lines.append(f"  all-to-all   {result['alltoall_calls_per_step']:g} calls, "
                     f"{_bytes(result['alltoall_bytes_per_step'])} per step (rank 0's)"
                     + (f", {1e3 * exposed:.2f} ms/step not hidden by compute" if exposed is not None else ""))
    else:
        lines.append("  all-to-all   none (one worker)")
    lines.append(f"  checkpoint   {checkpoint}" if checkpoint else "  checkpoint   none (no --model-dir)")
    lines.append(f"  summary JSON {summary_json}" if summary_json else
                 "  summary JSON not written (give --summary-json FILE or --model-dir DIR)")
    return lines

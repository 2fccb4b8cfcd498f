"""What the training app shows a person (tf_fusedrec/train/progress.py): the progress line in place on a terminal and
as whole lines in a log or a pipe, rank 0 only, around a launcher's per-line prefix, and the short summary.

The launcher cases run a stand-in for horovodrun --gloo (a launcher process, a middleman that forwards the worker's
stdout with `[0]<stdout>:` before each piece ending in a newline or carriage return, as horovod's prefix_connection
does, and the worker), so they need neither Horovod nor TensorFlow; tests/apps/test_train.py checks the app under the
real horovodrun --gloo."""

import os
import sys

import pytest

from tests.subprocess_runner import execute
from tf_fusedrec.train import progress
from tf_fusedrec.train.progress import Console, Progress, open_console, summary_lines


class Recorder:
    """A text stream that keeps each write."""

    def __init__(self):
        self.writes = []

    def write(self, text):
        self.writes.append(text)

    def flush(self):
        pass


def run_progress(console, total=10, every=4):
    bar = Progress(console, total=total, every=every)
    for step in range(1, total + 1):
        bar.update(step, 0.5 + step / 100, 1234.0)


def test_a_pipe_gets_one_whole_line_per_interval_and_the_last_step():
    out = Recorder()
    run_progress(Console(out))
    assert out.writes == [f"step {s}/10  loss {0.5 + s / 100:.4f}  1,234 samples/s\n" for s in (4, 8, 10)]


def test_a_terminal_gets_one_line_redrawn_in_place():
    out = Recorder()
    console = Console(out, tty=True)
    run_progress(console)
    assert len(out.writes) == 11  # each step redraws, then the line ends
    assert all(w.startswith("\r") and "\n" not in w for w in out.writes[:10]), out.writes
    assert "10/10" in out.writes[9] and "100%" in out.writes[9] and out.writes[10] == "\n"
    console.line("after")
    assert out.writes[-1] == "after\n"  # the bar was ended already: no empty line


def test_a_line_ends_the_progress_line_first_and_a_shorter_redraw_covers_the_longer():
    out = Recorder()
    console = Console(out, tty=True)
    console.update("abcdef")
    console.update("ab")
    console.line("resumed from here\n")
    console.close()
    assert out.writes == ["\rabcdef", "\rab    ", "\nresumed from here\n"]


def test_every_write_holds_whole_lines():
    out = Recorder()
    console = Console(out)
    console.line("one")
    console.line("two\nthree")
    console.update("step 1/1")
    assert out.writes == ["one\n", "two\nthree\n", "step 1/1\n"]


def test_only_rank_0_writes(capsys):
    for rank in (1, 2):
        console = open_console(rank, env={})
        assert not console.enabled
        run_progress(console)
        console.line("summary")
    assert capsys.readouterr() == ("", "")
    console = open_console(0, env={})
    console.line("summary")
    assert capsys.readouterr().out == "summary\n"


def test_alone_on_a_terminal_the_line_redraws_and_in_a_pipe_not(monkeypatch):
    leader, follower = os.openpty()
    with os.fdopen(follower, "w") as terminal:
        monkeypatch.setattr(sys, "stdout", terminal)
        assert open_console(0, env={}).tty
        assert not open_console(0, in_place=False, env={}).tty  # --no-progress
    os.close(leader)
    read, write = os.pipe()
    with os.fdopen(write, "w") as pipe:
        monkeypatch.setattr(sys, "stdout", pipe)
        assert not open_console(0, env={}).tty
    os.close(read)


def test_no_launcher_without_a_launcher():
    assert progress.launcher_stdout(env={}) is None
    # this process's ancestors hold no horovodrun and no mpirun, whatever the environment claims
    assert progress.launcher_stdout(env={"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1"}) is None
    assert progress.launcher_stdout(env={"OMPI_COMM_WORLD_RANK": "0"}) is None


_MIDDLEMAN = """
import os, re, subprocess, sys
env = dict(os.environ, HOROVOD_RANK=sys.argv[1], HOROVOD_GLOO_RENDEZVOUS_ADDR="127.0.0.1")
worker = subprocess.Popen([sys.executable, sys.argv[2]], stdout=subprocess.PIPE, env=env)
pending = ""
for piece in re.split(r"([\\r\\n])", worker.stdout.read().decode()):  # horovod's prefix_connection
    pending += piece
    if piece in ("\\r", "\\n"):
        sys.stdout.write(f"[{sys.argv[1]}]<stdout>:" + pending)
        pending = ""
sys.stdout.write(f"[{sys.argv[1]}]<stdout>:" + pending if pending else "")
sys.exit(worker.wait())
"""

_WORKER = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("progress", {path!r})
progress = importlib.util.module_from_spec(spec)
spec.loader.exec_module(progress)
console = progress.open_console(int(os.environ["HOROVOD_RANK"]))
print("plain print", flush=True)
bar = progress.Progress(console, total=3, every=1)
for step in (1, 2, 3):
    bar.update(step, 0.25, 100.0)
console.line("done: 3 steps\\n  summary JSON x.json")
"""

_LAUNCHER = """
import subprocess, sys
middleman = [sys.executable, {middleman!r}, sys.argv[1], {worker!r}]
if len(sys.argv) > 2:  # its stdout a file it opened itself, without O_APPEND
    with open(sys.argv[2], "w") as log:
        sys.exit(subprocess.call(middleman, stdout=log))
sys.exit(subprocess.call(middleman))
"""


@pytest.fixture
def launch(tmp_path):
    """launch(name, rank, log=None) -> what the stand-in launcher called `name` wrote (its stdout, or the file)."""
    middleman, worker = tmp_path / "middleman.py", tmp_path / "worker.py"
    middleman.write_text(_MIDDLEMAN)
    worker.write_text(_WORKER.format(path=progress.__file__))

    def run(name, rank, log=None):
        launcher = tmp_path / name
        launcher.write_text(_LAUNCHER.format(middleman=str(middleman), worker=str(worker)))
        rc, out, err = execute([sys.executable, str(launcher), str(rank)] + ([str(log)] if log else []), 60)
        assert rc == 0, (rc, out, err)
        return log.read_text() if log else out

    return run


WANTED = ["step 1/3  loss 0.2500  100 samples/s", "step 2/3  loss 0.2500  100 samples/s",
          "step 3/3  loss 0.2500  100 samples/s", "done: 3 steps", "  summary JSON x.json"]


def test_rank_0_writes_around_the_launchers_prefix(launch):
    out = launch("fake_horovodrun.py", 0)
    lines = out.splitlines()
    assert out.endswith("\n") and "\r" not in out, out
    assert sorted(lines) == sorted(WANTED + ["[0]<stdout>:plain print"]), out  # the app's lines bare, a print not
    assert [line for line in lines if line in WANTED] == WANTED, out


def test_other_ranks_print_nothing_under_the_launcher(launch):
    assert launch("fake_horovodrun.py", 1).splitlines() == ["[1]<stdout>:plain print"]


@pytest.mark.parametrize("how", ["other_launcher", "file_not_appended"])
def test_otherwise_whole_lines_through_the_launcher(launch, tmp_path, how):
    """A launcher that is not horovodrun (nor mpirun), or one writing to a file at its own offset (which rank 0's
    lines would overwrite): rank 0 writes its own stdout, one whole line per write."""
    out = launch("launcher.py", 0) if how == "other_launcher" else \
        launch("fake_horovodrun.py", 0, log=tmp_path / "log.txt")
    assert out.splitlines() == ["[0]<stdout>:" + line for line in ["plain print"] + WANTED], out


def test_the_short_summary():
    result = {"steps": 40, "workers": 2, "embedding": "fused", "pipeline": "sync", "samples_per_s": 12345.6,
              "final_loss": 0.51234, "auc": 0.712345, "alltoall_calls_per_step": 6.0,
              "alltoall_bytes_per_step": 1_234_567.0, "exposed_alltoall_seconds_per_step": 0.0012}
    lines = summary_lines(result, checkpoint="runs/x/ckpt-40", summary_json="runs/x/summary.json")
    assert lines == [
        "done: 40 steps on 2 workers, fused embedding, sync schedule",
        "  throughput   12,346 samples/s (all workers, after warm-up)",
        "  AUC          0.7123 (held out)",
        "  loss         0.5123 (last step)",
        "  all-to-all   6 calls, 1.2 MB per step (rank 0's), 1.20 ms/step not hidden by compute",
        "  checkpoint   runs/x/ckpt-40",
        "  summary JSON runs/x/summary.json",
    ]
    alone = {k: v for k, v in result.items() if not k.startswith(("alltoall", "exposed"))}
    alone = summary_lines(dict(alone, workers=1, auc={"click": 0.7, "conversion": float("nan")}, tokens_per_s=99.0))
    assert "  AUC          click 0.7000, conversion n/a (held out)" in alone
    assert "99 tokens/s" in alone[1] and "  all-to-all   none (one worker)" in alone
    assert alone[-2:] == ["  checkpoint   none (no --model-dir)",
                          "  summary JSON not written (give --summary-json FILE or --model-dir DIR)"]


def test_the_short_summary_without_timed_steps():
    result = {"steps": 4, "workers": 1, "embedding": "fused", "pipeline": "sync", "samples_per_s": float("nan"),
              "final_loss": 0.5, "auc": 0.5}
    assert summary_lines(result)[1].startswith("  throughput   n/a samples/s")



def test_skipped_bad_records_in_the_progress_and_the_summary():
    out = Recorder()
    bar = Progress(Console(out), total=3, every=1)
    for step, skipped in ((1, 0), (2, 1), (3, 1234)):
        bar.update(step, 0.5, 100.0, skipped=skipped)
    assert out.writes == ["step 1/3  loss 0.5000  100 samples/s\n",
                          "step 2/3  loss 0.5000  100 samples/s, 1 bad record skipped\n",
                          "step 3/3  loss 0.5000  100 samples/s, 1,234 bad records skipped\n"]
    tty = Recorder()
    Progress(Console(tty, tty=True), total=3, every=1).update(2, 0.5, 100.0, skipped=7)
    assert tty.writes[0].endswith("loss 0.5000, 7 bad records skipped]"), tty.writes
    result = {"steps": 4, "workers": 1, "embedding": "fused", "pipeline": "sync", "samples_per_s": 1.0,
              "final_loss": 0.5, "auc": 0.5}
    assert not any("bad records" in line for line in summary_lines(dict(result, bad_records_skipped=0)))
    lines = summary_lines(dict(result, bad_records_skipped=1234))
    assert lines[4] == "  bad records  1,234 skipped (data.on_bad_record: skip)", lines


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

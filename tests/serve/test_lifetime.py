"""Servers started with TF_FUSEDREC_EXIT_WITH_PARENT=1 (the tests' and benches' children) stop when their parent dies
(tf_fusedrec/serve/lifetime.py), so a killed test run leaves no server behind; without it a server outlives its
parent, as one started by hand or by a supervisor must."""

import ctypes
import os
import platform
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.serve import serve_fixtures
from tests.serve.serve_fixtures import start, stop
from tests.subprocess_runner import ROOT, child_env

# The parent: starts an embedding server with the environment it was given, prints its pid and dies (os._exit: no
# cleanup, as a SIGKILLed test run): once the server is ready, or at once, while the server still imports TensorFlow
# (it then finds its parent gone, and its stdout and stderr pipes without a reader).
PARENT = textwrap.dedent("""
    import subprocess, sys, os
    proc = subprocess.Popen([sys.executable, "-m", "tf_fusedrec.serve.embedding_server", "--export", sys.argv[1],
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip() if sys.argv[2] == "after_ready" else "ready"
    print(proc.pid if line == "ready" else f"not ready: {line!r}", flush=True)
    os._exit(0)
""")
WAIT_S = 60  # a server that is not gone by then never will be (it imports TensorFlow to start, and stops in 2 s)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie not reaped yet is gone too
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def orphaned_server(export, exit_with_parent, when):
    """The pid of an embedding server whose parent has died (`when`: "after_ready" or "at_once")."""
    env = child_env()
    if not exit_with_parent:
        env.pop("TF_FUSEDREC_EXIT_WITH_PARENT")
    out = subprocess.run([sys.executable, "-c", PARENT, export, when], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=180)
    assert out.stdout.strip().isdigit(), (out.stdout, out.stderr[-2000:])
    return int(out.stdout)


@pytest.mark.parametrize("exit_with_parent,when", [(True, "after_ready"), (True, "at_once"), (False, "after_ready")],
                         ids=["exits_with_parent", "exits_with_parent_gone_during_startup", "outlives_parent"])
def test_a_server_exits_with_its_parent_only_when_asked(tmp_path, exit_with_parent, when):
    assert child_env()["TF_FUSEDREC_EXIT_WITH_PARENT"] == "1"  # what every test's child gets
    export = serve_fixtures.write_fake_export(str(tmp_path / "export"), keys_per_feature=20)
    pid = orphaned_server(export, exit_with_parent, when)
    try:
        deadline = time.monotonic() + (WAIT_S if exit_with_parent else 5)
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert alive(pid) != exit_with_parent
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_volley_of_sigterms_stops_a_server(tmp_path):
    """Many SIGTERMs in a row (a test's stop, then the parent's death signal, say) stop the server like one: the
    handler takes no lock the interrupted main thread may hold."""
    export = serve_fixtures.write_fake_export(str(tmp_path / "export"), keys_per_feature=20)
    proc = subprocess.Popen([sys.executable, "-m", "tf_fusedrec.serve.embedding_server", "--export", export, "--port",
                             "0"], cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        for _ in range(200):
            if proc.poll() is not None:
                break
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.001)
        assert proc.wait(timeout=WAIT_S) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()


def signal_thread(pid, tid, sig):
    """Sends sig to thread tid of process pid only (tgkill), as Linux may deliver a signal sent to the process."""
    number = {"x86_64": 234, "aarch64": 131}[platform.machine()]  # SYS_tgkill (glibc has no wrapper before 2.30)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, pid, tid, int(sig)) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill({pid}, {tid}, {sig})")


@pytest.mark.parametrize("program", ["embedding_server", "ranker"])
def test_a_sigterm_received_by_any_thread_stops_a_server(tmp_path, tmp_path_factory, program):
    """Linux delivers a process's SIGTERM (kill, or the parent's death signal) to any thread that does not block it,
    a gRPC or handler thread too; CPython runs the Python handler only once the main thread runs Python code. An
    embedding server whose main thread waited without a timeout ignored such a SIGTERM forever (seen as a server
    that outlived its parent in CI). The first and the last thread each get one, in a server of its own."""
    if program == "embedding_server":
        export = serve_fixtures.write_fake_export(str(tmp_path / "export"), keys_per_feature=20)
        cmd = ["tf_fusedrec.serve.embedding_server", "--export", export, "--port", "0"]
    else:
        export = serve_fixtures.trained_export(tmp_path_factory)
        server = start(["tf_fusedrec.serve.embedding_server", "--export", export, "--port",
                        str(port := serve_fixtures.reserved_port())])
        cmd = ["tf_fusedrec.serve.ranker", "--export", export, "--servers", f"127.0.0.1:{port}", "--port", "0"]
    try:
        for which in (0, -1):  # the first thread started (at import) and the last (serving)
            proc = start(cmd)
            threads = sorted(int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid)
            assert threads, f"{program} runs no thread but its main one"
            tid = threads[which]
            try:
                signal_thread(proc.pid, tid, signal.SIGTERM)
                try:
                    status = proc.wait(timeout=WAIT_S)
                except subprocess.TimeoutExpired:
                    status = None
                assert status in (0, -signal.SIGTERM), (
                    f"{program}: a SIGTERM to thread {tid} (of {len(threads) + 1}) did not stop it in {WAIT_S} s"
                    if status is None else f"{program}: exit status {status} after a SIGTERM to thread {tid}")
            finally:
                stop(proc, signal.SIGKILL)
    finally:
        if program == "ranker":
            stop(server)

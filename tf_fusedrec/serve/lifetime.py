"""Servers that die with whoever started them: a killed test run or benchmark leaves no embedding server or ranker
behind, holding ports and CPU.

A parent that wants this sets ``TF_FUSEDREC_EXIT_WITH_PARENT=1`` in the child's environment (the tests' and the
benches' child_env do); the server's main() calls :func:`exit_with_parent` first thing, which asks Linux to send the
process SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``; the servers stop on SIGTERM as on Ctrl-C). The
variable is removed from the process's environment, so what the server starts in turn does not inherit it. Without
the variable, or off Linux, nothing changes: a server started by hand or by a supervisor outlives its shell as usual.
"""

import ctypes
import os
import signal
import sys

ENV = "TF_FUSEDREC_EXIT_WITH_PARENT"
_PR_SET_PDEATHSIG = 1


def exit_with_parent():
    """With ENV=1 (removed from the environment here): SIGTERM to this process when its parent dies; if the parent
    is gone already (the process was handed to init), SIGTERM now. -> whether the request was made."""
    if os.environ.pop(ENV, None) != "1" or not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        print(f"warning: {ENV}: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}", file=sys.stderr, flush=True)
        return False
    if parent == 1 or os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)
    return True

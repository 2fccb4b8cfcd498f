"""glibc malloc thresholds for training processes: freed buffers stay with the process instead of going back to the
kernel after every op.

TensorFlow's CPU tensors come from malloc. glibc serves a buffer above its mmap threshold (128 KiB at start, raised
as such buffers are freed, up to 32 MiB) with a fresh mmap and unmaps it on free, and gives the free top of a heap
back to the kernel once it exceeds the trim threshold (twice the mmap threshold). A training step allocates and frees
the same large buffers every step, so the kernel zeroed and faulted in their pages again every step: in the 2-worker
profile over MPI, page faults, page clearing and the memory cgroup's accounting took about a tenth of all samples
(docs/perf/transport/mpi_yield-sym.txt). With both thresholds fixed high the buffers are reused.

`tune()` sets them with mallopt() in this process; comm.init_workers() calls it, so the train CLI, the benchmarks and
every worker they launch start with it. The cost: up to TRIM_THRESHOLD of free memory per malloc arena may stay
mapped, which a process's peak use bounds. Left alone: a process whose GLIBC_TUNABLES sets any glibc.malloc tunable
(the user's choice wins), TF_FUSEDREC_MALLOC=default (glibc's own behaviour), and a C library without mallopt.
"""

import ctypes
import ctypes.util
import os

# mallopt's parameter numbers (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

# 32 MiB is the largest mmap threshold glibc accepts on 64-bit (HEAP_MAX_SIZE / 2): buffers up to it come from the
# heaps and are reused; above it (a whole table's export, say) they are still mapped and unmapped.
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 256 << 20

ENV = "TF_FUSEDREC_MALLOC"
CHOICES = ("tuned", "default")

_applied = None


def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "mallopt") else None


def tune(environ=None, libc=None):
    """Sets the thresholds unless the environment says otherwise (see the module's doc); once per process.

    Returns:
      "tuned", or why not: "default" (TF_FUSEDREC_MALLOC=default), "GLIBC_TUNABLES", "no mallopt".

    Raises:
      ValueError naming TF_FUSEDREC_MALLOC when it holds another value than "tuned" or "default";
      OSError when glibc refuses a threshold.
    """
    global _applied
    environ = os.environ if environ is None else environ
    choice = environ.get(ENV, "tuned")
    if choice not in CHOICES:
        raise ValueError(f"{ENV}={choice!r}: expected one of {', '.join(CHOICES)} (tuned: fixed malloc thresholds, "
                         "the default; default: glibc's own)")
    if choice == "default":
        return "default"
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    if libc is None:
        if _applied is not None:
            return _applied
        libc = _libc()
    if libc is None:
        _applied = "no mallopt"
        return _applied
    for param, name, value in ((M_MMAP_THRESHOLD, "M_MMAP_THRESHOLD", MMAP_THRESHOLD),
                               (M_TRIM_THRESHOLD, "M_TRIM_THRESHOLD", TRIM_THRESHOLD)):
        if libc.mallopt(ctypes.c_int(param), ctypes.c_int(value)) != 1:
            raise OSError(f"mallopt({name}, {value}) failed; set {ENV}=default to leave malloc as it is")
    _applied = "tuned"
    return _applied

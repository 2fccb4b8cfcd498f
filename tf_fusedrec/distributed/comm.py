"""Everything that crosses workers goes through one comm object: all-to-all, grouped allreduce, allgather and
broadcast.

Two backends: `SingleProcessComm` (one worker; every collective is the identity and none is issued) and
`HorovodComm` (Gloo on CPU, NCCL on GPU), the only place in the package that imports Horovod, lazily and with an
actionable error when it is missing. `MeteredComm` (distributed/meter.py) wraps either to count what moves.

Every collective takes a fixed name: in a graph, Horovod matches the collectives of the workers by name, so names
must be equal on every worker and distinct among the collectives in flight at the same time.

Order: inside a tf.function, TensorFlow's automatic control dependencies run every stateful op that takes no
resource in program order, one after the other. Horovod's collectives are such ops, so two independent all-to-alls
(the next batch's keys and this batch's embeddings, or two micro-batches') wait for each other and for whatever was
built between them, and nothing overlaps. Since Horovod matches collectives by name, not by order, they can be taken
out of that chain (they still run before the function returns, and after their inputs): `overlap_collectives()`
does so for Horovod's op types and for tf.timestamp, which times them. It is an explicit opt-in, because it changes a
private TensorFlow global that every tf.function of the process sees: TrainPipeline's dbp and fwp schedules, the
train app and the benchmarks call it; importing tf_fusedrec, the meter or building a comm changes nothing.
"""

import os
import sys

import tensorflow as tf
from tensorflow.python.framework import auto_control_deps

HOROVOD_OP_TYPES = ("HorovodAlltoall", "HorovodAllreduce", "HorovodGroupedAllreduce", "HorovodAllgather",
                    "HorovodBroadcast")
# What overlap_collectives() takes out of program order: the collectives, and the clock reads that time them (the
# meter's and the pipeline's stamps; in program order a stamp would wait for every collective built before it).
OVERLAPPED_OP_TYPES = HOROVOD_OP_TYPES + ("Timestamp",)

REDUCE_OPS = ("sum", "average")

# Set by horovodrun (and by tf_fusedrec.cluster) for each worker it starts.
LAUNCHER_ENV = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


class Comm:
    """The interface. `rank` and `size` are ints (`local_rank` and `local_size`: this worker's index among the workers
    on its host and their number, `cross_size`: hosts); every method takes and returns tensors."""

    rank = 0
    size = 1
    local_rank = 0
    local_size = 1
    cross_size = 1

    def alltoall(self, tensor, splits, name):
        """Sends tensor[sum(splits[:r]):sum(splits[:r+1])] to rank r; returns (received, received_splits int32 [N])."""
        raise NotImplementedError

    def allreduce(self, tensors, name, op="average"):
        """One grouped allreduce of a list of tensors ("sum" or "average" over workers); returns the list."""
        raise NotImplementedError

    def allgather(self, tensor, name):
        """Concatenates every worker's tensor along axis 0, in rank order."""
        raise NotImplementedError

    def broadcast(self, tensors, name, root_rank=0):
        """Every worker gets root_rank's tensors (a list; returns the list). This default is one grouped allreduce
        that sums root_rank's values with zeros from the others, which is exact; backends override it."""
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        mine = [t if self.rank == root_rank else tf.zeros_like(t) for t in tensors]
        return self.allreduce(mine, name=name, op="sum")


class SingleProcessComm(Comm):
    """One worker: every collective is the identity and is never issued."""

    def alltoall(self, tensor, splits, name):  # noqa: ARG002
        return tensor, splits

    def allreduce(self, tensors, name, op="average"):  # noqa: ARG002
        _check_op(op)
        return list(tensors)

    def allgather(self, tensor, name):  # noqa: ARG002
        return tensor

    def broadcast(self, tensors, name, root_rank=0):  # noqa: ARG002
        return list(tensors)

    def __repr__(self):
        return "SingleProcessComm()"


class HorovodComm(Comm):
    """Horovod collectives. Horovod must be initialised (`init_workers()` or `hvd.init()`) first."""

    def __init__(self):
        self._hvd = import_horovod()
        if not self._hvd.is_initialized():
            raise RuntimeError("comm='horovod': call hvd.init() (or fr.distributed.comm.init_workers()) before "
                               "creating the layer")
        self.rank = self._hvd.rank()
        self.size = self._hvd.size()
        self.local_rank, self.local_size = self._hvd.local_rank(), self._hvd.local_size()
        self.cross_size = self._hvd.cross_size()

    def alltoall(self, tensor, splits, name):
        return self._hvd.alltoall(tensor, splits=splits, name=name)

    def allreduce(self, tensors, name, op="average"):
        _check_op(op)
        hvd_op = self._hvd.Average if op == "average" else self._hvd.Sum
        return self._hvd.grouped_allreduce([tf.convert_to_tensor(t) for t in tensors], op=hvd_op, name=name)

    def allgather(self, tensor, name):
        return self._hvd.allgather(tensor, name=name)

    def broadcast(self, tensors, name, root_rank=0):
        return [self._hvd.broadcast(tf.convert_to_tensor(t), root_rank, name=f"{name}/{i}")
                for i, t in enumerate(tensors)]

    def __repr__(self):
        return f"HorovodComm(rank={self.rank}, size={self.size})"


def overlap_collectives():
    """Opt-in, for the whole process: in tf.functions traced from now on, Horovod's collectives and tf.timestamp no
    longer run in program order, so independent all-to-alls overlap each other and the dense compute (see the module
    docstring). Idempotent; there is no way back.

    Changes a private TensorFlow global (auto_control_deps.SKIPPED_ORDER_INSENSITIVE_STATEFUL_OPS) that every
    tf.function of the process sees, the user's too: call it only where collectives are matched by name (as
    tf_fusedrec's and TFRA's are) and no code relies on two of them, or on clock reads, running in program order.
    """
    order_insensitive(OVERLAPPED_OP_TYPES)


def order_insensitive(op_types):
    """Stateful ops of these types are no longer chained in program order in tf.functions traced from now on (see the
    module docstring): the mechanism of overlap_collectives(). For ops whose effects do not depend on each other's
    order only."""
    skipped = auto_control_deps.SKIPPED_ORDER_INSENSITIVE_STATEFUL_OPS
    if not set(op_types) <= skipped:
        auto_control_deps.SKIPPED_ORDER_INSENSITIVE_STATEFUL_OPS = frozenset(skipped | set(op_types))


def _check_op(op):
    if op not in REDUCE_OPS:
        raise ValueError(f"allreduce op must be one of {REDUCE_OPS}, got {op!r}")


def import_horovod():
    try:
        import horovod.tensorflow as hvd  # noqa: PLC0415
    except ImportError as e:
        raise ImportError(
            "comm='horovod' needs horovod built with TensorFlow support: run `make install` (scripts/install.sh "
            "builds horovod==0.28.1 with HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1)"
        ) from e
    return hvd


def launched_as_worker():
    """True when a launcher (horovodrun, tf_fusedrec.cluster) started this process as one of several workers."""
    return any(k in os.environ for k in LAUNCHER_ENV)


# Settings a worker launched by Open MPI starts with unless its environment sets them (read by MPI_Init and by
# Horovod's background thread, both inside hvd.init()).
# mpi_yield_when_idle: a rank waiting inside a collective gives its core away (sched_yield) instead of spinning on it.
# Horovod's background thread waits there while the same core has TensorFlow's work to do: yielding made `fused`
# 1.22-1.64x faster on 2 pinned workers here (benchmarks/results/bench/mpi_yield; README, "Gloo against MPI").
# HOROVOD_CYCLE_TIME (ms; Horovod's default 1): how often the background thread negotiates the collectives a step
# waits on in turn (seven for `fused`). At 0.1 ms `fused` ran 1.13-1.25x faster on 2 pinned workers over MPI, the
# TFRA modes 1.00-1.15x (benchmarks/results/bench/cycle_time_mpi*; README, "Horovod's cycle time over MPI"). Gloo launches
# keep Horovod's default (the 2026-11-24 runs over Gloo did not resolve a difference).
OPEN_MPI_DEFAULTS = {"OMPI_MCA_mpi_yield_when_idle": "1", "HOROVOD_CYCLE_TIME": "0.1"}


def init_workers():
    """Sets up this process as one of the job's workers: call it once at the start of a training script, before
    creating any layer (`fr.init_workers()`, also `fr.distributed.init_workers()`).

    Started by a launcher (horovodrun, mpirun, tf_fusedrec.cluster): initialises Horovod, under Open MPI (horovodrun
    --mpi, mpirun) after setting the OPEN_MPI_DEFAULTS the environment does not set, and returns a HorovodComm.
    Started alone: returns a SingleProcessComm and starts nothing. Calling it again initialises nothing twice.

    Returns:
      The comm: `rank`, `size`, `local_rank` (e.g. the GPU to use), `local_size`, `cross_size`. FusedEmbedding finds
      Horovod by itself once it is initialised (comm=None); passing this object as `comm=` is the same.
    """
    if not launched_as_worker():
        return SingleProcessComm()
    hvd = import_horovod()
    if not hvd.is_initialized():
        if "OMPI_COMM_WORLD_RANK" in os.environ:
            for name, value in OPEN_MPI_DEFAULTS.items():
                os.environ.setdefault(name, value)
        hvd.init()
    return HorovodComm()


def horovod_size():
    """hvd.size() if horovod is importable and initialised, else 1."""
    try:
        import horovod.tensorflow as hvd  # noqa: PLC0415

        return hvd.size() if hvd.is_initialized() else 1
    except ImportError:
        return 1


def exit_after_success(barrier_name):
    """Ends a command line's process after its normal end, skipping the interpreter's teardown (collecting models,
    tables, graphs and tf.data iterators: 0.8 s of CPU per process for a tiny training run, 12-20 s for the
    benchmark's modes; benchmarks/results/tests/teardown.txt). Everything the run writes must be closed before. Under Horovod the
    workers first meet in one allreduce named `barrier_name`, so none leaves while another still runs a collective,
    and Horovod shuts down as it would at exit. Errors keep Python's own exit and status: call it only after success."""
    if horovod_size() > 1:
        import horovod.tensorflow as hvd  # noqa: PLC0415

        hvd.allreduce(tf.constant(0.0), name=barrier_name)
        hvd.shutdown()
    remove_autograph_files()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def remove_autograph_files():
    """Deletes the temporary files of the functions AutoGraph converted in this process (tf.data's map functions,
    for one): TensorFlow removes each in an atexit handler, which os._exit skips, so every fast exit left two or
    more __autograph_generated_file*.py in the temp directory. Only this process's files (its sys.modules' own)."""
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) if name.startswith("__autograph_generated_file") else None
        if path:
            try:
                os.remove(path)
            except OSError:
                pass


def get_comm(comm=None):
    """Resolves a comm argument: None/"auto" (horovod when initialised with size > 1), "single", "horovod", or an
    object with rank, size, alltoall, allreduce, allgather and broadcast (a Comm)."""
    if comm is None or comm == "auto":
        return HorovodComm() if horovod_size() > 1 else SingleProcessComm()
    if comm == "single":
        return SingleProcessComm()
    if comm == "horovod":
        return HorovodComm()
    if all(hasattr(comm, a) for a in ("rank", "size", "alltoall")):
        return comm
    raise ValueError(f"comm must be None, 'auto', 'single', 'horovod' or a comm object, got {comm!r}")


def slot_name(prefix, kind, slot):
    """The collective name of one stage of one in-flight batch: `{prefix}/{kind}/slot{slot}`."""
    return f"{prefix}/{kind}/slot{slot}"

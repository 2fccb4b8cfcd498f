"""The all-to-all interface the lookup uses, with a single-process backend and a Horovod one.

Horovod is imported lazily, only when asked for, with an actionable error when it is missing.
"""


class SingleProcessComm:
    """One worker: all-to-alls are the identity and are never issued."""

    rank = 0
    size = 1

    def alltoall(self, tensor, splits, name):  # noqa: ARG002
        return tensor, splits

    def __repr__(self):
        return "SingleProcessComm()"


class HorovodComm:
    """Horovod all-to-all (Gloo on CPU, NCCL on GPU). Every collective gets the fixed name it is given."""

    def __init__(self):
        self._hvd = import_horovod()
        self.rank = self._hvd.rank()
        self.size = self._hvd.size()

    def alltoall(self, tensor, splits, name):
        """Sends tensor[sum(splits[:r]):sum(splits[:r+1])] to rank r; returns (received, received_splits)."""
        return self._hvd.alltoall(tensor, splits=splits, name=name)

    def __repr__(self):
        return f"HorovodComm(rank={self.rank}, size={self.size})"


def import_horovod():
    try:
        import horovod.tensorflow as hvd  # noqa: PLC0415
    except ImportError as e:
        raise ImportError(
            "comm='horovod' needs horovod built with TensorFlow support: run `make install` (scripts/install.sh "
            "builds horovod==0.28.1 with HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1)"
        ) from e
    return hvd


def horovod_size():
    """hvd.size() if horovod is importable and initialised, else 1."""
    try:
        import horovod.tensorflow as hvd  # noqa: PLC0415

        return hvd.size() if hvd.is_initialized() else 1
    except ImportError:
        return 1


def get_comm(comm=None):
    """Resolves a comm argument: None/"auto" (horovod when initialised with size > 1), "single", "horovod", or an
    object with rank, size and alltoall(tensor, splits, name)."""
    if comm is None or comm == "auto":
        return HorovodComm() if horovod_size() > 1 else SingleProcessComm()
    if comm == "single":
        return SingleProcessComm()
    if comm == "horovod":
        return HorovodComm()
    if all(hasattr(comm, a) for a in ("rank", "size", "alltoall")):
        return comm
    raise ValueError(f"comm must be None, 'auto', 'single', 'horovod' or a comm object, got {comm!r}")

"""comm.init_workers (fr.init_workers): which comm a process gets, and the defaults a worker launched by mpirun starts
with (set before hvd.init(), in which MPI_Init and Horovod's background thread read them; a value the environment
already holds is kept); a second call initialises nothing again."""

import pytest

from tf_fusedrec.distributed import comm


class FakeHorovod:
    def __init__(self, seen, environ):
        self.seen, self.environ = seen, environ

    def init(self):  # what MPI_Init would read
        self.seen.append({k: self.environ.get(k) for k in comm.OPEN_MPI_DEFAULTS})

    def is_initialized(self):
        return bool(self.seen)


@pytest.fixture
def launched(monkeypatch):
    """init_workers() with a fake Horovod; -> the environment each hvd.init() saw."""
    import os  # noqa: PLC0415

    seen = []
    for name in comm.LAUNCHER_ENV + tuple(comm.OPEN_MPI_DEFAULTS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(comm, "import_horovod", lambda: FakeHorovod(seen, os.environ))
    monkeypatch.setattr(comm, "HorovodComm", lambda: "horovod")
    return seen


def test_alone_no_horovod(launched):
    assert isinstance(comm.init_workers(), comm.SingleProcessComm)
    assert launched == []


def test_open_mpi_worker_yields_when_idle_and_cycles_at_a_tenth_of_a_ms_by_default(launched, monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    assert comm.init_workers() == "horovod"
    assert launched == [{"OMPI_MCA_mpi_yield_when_idle": "1", "HOROVOD_CYCLE_TIME": "0.1"}]


def test_an_explicit_open_mpi_setting_is_kept(launched, monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_MCA_mpi_yield_when_idle", "0")
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "2.5")  # as horovodrun --cycle-time-ms 2.5 sets it
    comm.init_workers()
    assert launched == [{"OMPI_MCA_mpi_yield_when_idle": "0", "HOROVOD_CYCLE_TIME": "2.5"}]


def test_a_second_call_initialises_nothing_again(launched, monkeypatch):
    monkeypatch.setenv("HOROVOD_RANK", "0")
    assert comm.init_workers() == comm.init_workers() == "horovod"
    assert len(launched) == 1


def test_exported_from_the_package_and_its_distributed_module():
    import tf_fusedrec as fr  # noqa: PLC0415

    assert fr.init_workers is fr.distributed.init_workers is comm.init_workers


def test_gloo_worker_gets_no_open_mpi_settings(launched, monkeypatch):
    monkeypatch.setenv("HOROVOD_RANK", "0")
    comm.init_workers()
    assert launched == [{"OMPI_MCA_mpi_yield_when_idle": None, "HOROVOD_CYCLE_TIME": None}]

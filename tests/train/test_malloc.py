"""tf_fusedrec.malloc: which thresholds a process gets, when it is left alone, and that glibc takes them (a large
buffer then comes from the heap, not from a fresh mmap)."""

import ctypes

import pytest

from tf_fusedrec import malloc


class FakeLibc:
    def __init__(self, answer=1):
        self.calls, self.answer = [], answer

    def mallopt(self, param, value):
        self.calls.append((param.value, value.value))
        return self.answer


def test_tuned_by_default():
    libc = FakeLibc()
    assert malloc.tune({}, libc) == "tuned"
    assert sorted(libc.calls) == sorted([(malloc.M_MMAP_THRESHOLD, 32 << 20), (malloc.M_TRIM_THRESHOLD, 256 << 20)])


@pytest.mark.parametrize("environ, why", [
    ({"TF_FUSEDREC_MALLOC": "default"}, "default"),
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}, "GLIBC_TUNABLES"),
    ({"GLIBC_TUNABLES": "glibc.cpu.x86_rep_movsb_threshold=1:glibc.malloc.mmap_threshold=1"}, "GLIBC_TUNABLES"),
])
def test_left_alone(environ, why):
    libc = FakeLibc()
    assert malloc.tune(environ, libc) == why
    assert libc.calls == []


def test_other_tunables_do_not_stop_it():
    libc = FakeLibc()
    assert malloc.tune({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F"}, libc) == "tuned"
    assert len(libc.calls) == 2


def test_bad_value_names_the_variable():
    with pytest.raises(ValueError, match="TF_FUSEDREC_MALLOC='on'.*tuned, default"):
        malloc.tune({"TF_FUSEDREC_MALLOC": "on"}, FakeLibc())


def test_refused_threshold_is_an_error():
    with pytest.raises(OSError, match="M_MMAP_THRESHOLD.*TF_FUSEDREC_MALLOC=default"):
        malloc.tune({}, FakeLibc(answer=0))


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def test_glibc_takes_the_thresholds():
    libc = malloc._libc()  # noqa: SLF001
    assert libc is not None, "no mallopt in this C library: the project's machines run glibc"
    assert malloc.tune({}, libc) == "tuned"
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = libc.mallinfo2().hblks
    block = libc.malloc(24 << 20)  # above glibc's default thresholds, below the tuned one
    try:
        assert block
        assert libc.mallinfo2().hblks == before, "a 24 MiB buffer was mmapped: the threshold was not raised"
    finally:
        libc.free(block)

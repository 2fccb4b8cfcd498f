"""Shared fixtures for the tf_fusedrec test suite.

* ``fro``     -- the ops package (``tf_fusedrec.ops``), imported lazily so the oracle-only tests run without the
                 compiled library.
* ``run``     -- parameterized over execution modes: calls ``fn(*tensors)`` eagerly, or inside a ``tf.function``
                 traced with unknown-length input signatures ("graph" mode), and returns NumPy outputs
                 (namedtuples stay namedtuples, ``None`` stays ``None``).
* ``session_run`` -- the same in a ``tf.compat.v1`` Graph + Session with placeholders of unknown length.
* ``gen``     -- random input generators (Zipf-skewed keys, heavy duplication, full-range keys, distinct keys).
* ``check``   -- comparison and error-message helpers.
"""

from __future__ import annotations

import os
import re
import sys
import types
from pathlib import Path

import importlib.util  # noqa: E402

# Which Keras the suite runs under is the lane's: where TFRA (the [tfra] extra) is installed, Keras 2 (tf_keras), as a
# TFRA user's process has it; elsewhere Keras 3, TensorFlow's default. tf_fusedrec itself never chooses.
TFRA_INSTALLED = importlib.util.find_spec("tensorflow_recommenders_addons") is not None
if TFRA_INSTALLED:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tf_fusedrec import _keras  # noqa: E402

KEY_DTYPES = [np.int32, np.int64]
ERRORS = (tf.errors.InvalidArgumentError, ValueError)

# Big enough for the kernels' sharded path (>= 2^18 pairs and >= 4 pool threads, see pair_dedup.h).
LARGE_N = 300_000


# --------------------------------------------------------------------------------------------------------------
# Conversion and execution helpers
# --------------------------------------------------------------------------------------------------------------

def to_numpy(x):
    if x is None:
        return None
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*[to_numpy(v) for v in x])
    if isinstance(x, (tuple, list)):
        return type(x)(to_numpy(v) for v in x)
    if isinstance(x, np.ndarray):
        return x
    return x.numpy()


def _spec(a, static):
    a = np.asarray(a)
    shape = a.shape if static else [None] * a.ndim
    return tf.TensorSpec(shape, tf.as_dtype(a.dtype))


class Runner:
    """Runs ``fn(*tensors)`` in one execution mode and returns NumPy outputs."""

    def __init__(self, mode):
        self.mode = mode

    def __call__(self, fn, *arrays):
        arrays = [np.asarray(a) for a in arrays]
        tensors = [tf.constant(a) for a in arrays]
        if self.mode == "eager":
            out = fn(*tensors)
        elif self.mode == "graph":  # unknown lengths: the kernels' runtime checks run
            out = tf.function(fn, autograph=False, input_signature=[_spec(a, False) for a in arrays])(*tensors)
        elif self.mode == "graph_static":  # fully known shapes: shape functions may reject inputs at trace time
            out = tf.function(fn, autograph=False, input_signature=[_spec(a, True) for a in arrays])(*tensors)
        else:
            raise AssertionError(self.mode)
        return to_numpy(out)

    def __repr__(self):
        return f"Runner({self.mode})"


def _flatten(out):
    """Nested outputs -> (list of non-None tensors, rebuild function)."""
    if out is None:
        return [], lambda vals: None
    if isinstance(out, tuple):
        parts = [_flatten(v) for v in out]
        sizes = [len(p[0]) for p in parts]

        def rebuild(vals):
            items, pos = [], 0
            for (_, rb), n in zip(parts, sizes):
                items.append(rb(vals[pos:pos + n]))
                pos += n
            return type(out)(*items) if hasattr(out, "_fields") else tuple(items)

        return [t for p in parts for t in p[0]], rebuild
    return [out], lambda vals: vals[0]


def session_run(fn, *arrays, intra_op_threads=0, return_static_shapes=False):
    """Build ``fn`` on tf.compat.v1 placeholders of unknown length in a fresh Graph and run it in a Session."""
    arrays = [np.asarray(a) for a in arrays]
    with tf.Graph().as_default() as graph:
        phs = [tf.compat.v1.placeholder(tf.as_dtype(a.dtype), [None] * a.ndim) for a in arrays]
        out = fn(*phs)
        tensors, rebuild = _flatten(out)
        static = rebuild([t.shape for t in tensors])
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=intra_op_threads,
                                          inter_op_parallelism_threads=intra_op_threads)
        with tf.compat.v1.Session(graph=graph, config=config) as sess:
            vals = sess.run(tensors, feed_dict=dict(zip(phs, arrays)))
    result = rebuild(list(vals))
    return (result, static) if return_static_shapes else result


MODES = ["eager", "graph"]


@pytest.fixture(params=MODES)
def run(request):
    """Run an op eagerly and inside tf.function (graph mode)."""
    return Runner(request.param)


@pytest.fixture(params=MODES + ["graph_static"])
def run_all(request):
    """Like ``run`` plus a tf.function with fully static input shapes (for error paths)."""
    return Runner(request.param)


@pytest.fixture(name="session_run")
def session_run_fixture():
    return session_run


@pytest.fixture(scope="session")
def fro():
    import tf_fusedrec.ops as ops

    return ops


@pytest.fixture(scope="session")
def ref():
    from tf_fusedrec.ops import reference

    return reference


# --------------------------------------------------------------------------------------------------------------
# Random inputs
# --------------------------------------------------------------------------------------------------------------

def zipf_keys(rng, n, dtype, a=1.2, signed=True, nonneg_limit=None):
    """Zipf-skewed keys (a few keys very frequent, a long tail), scrambled so frequent keys are not just 1, 2, 3."""
    info = np.iinfo(dtype)
    z = rng.zipf(a, n).astype(np.uint64)
    # Spread the ranks over the key space with an odd multiplier (a bijection mod 2**64), then fold into range.
    with np.errstate(over="ignore"):
        z = z * np.uint64(0x9E3779B97F4A7C15)
    if nonneg_limit is not None:
        limit = min(int(nonneg_limit), int(info.max) + 1)
        return (z % np.uint64(limit)).astype(np.int64).astype(dtype)
    if dtype == np.int64:
        k = z.view(np.int64)
    else:
        k = (z >> np.uint64(32)).astype(np.uint32).view(np.int32)
    if not signed:
        k = np.abs(k.astype(np.int64)).clip(0, info.max).astype(dtype)
    return k.astype(dtype)


def dup_keys(rng, n, dtype, distinct=50):
    """Heavy duplication: keys drawn from a small set of (negative and positive) values."""
    return rng.integers(-distinct // 2, distinct - distinct // 2, n).astype(dtype)


def wide_keys(rng, n, dtype):
    """Uniform over the whole dtype range, with min and max planted."""
    info = np.iinfo(dtype)
    k = rng.integers(info.min, info.max, n, endpoint=True, dtype=dtype)
    if n >= 4:
        k[rng.integers(0, n, 2)] = info.min
        k[rng.integers(0, n, 2)] = info.max
    return k


def distinct_keys(rng, n, dtype, nonneg=False):
    """n distinct keys in random order."""
    info = np.iinfo(dtype)
    lo = 0 if nonneg else info.min
    k = np.unique(rng.integers(lo, info.max, int(n * 1.1) + 16, dtype=np.int64))
    while k.size < n:  # pragma: no cover - practically never
        k = np.unique(np.concatenate([k, rng.integers(lo, info.max, n, dtype=np.int64)]))
    k = rng.permutation(k)[:n]
    return k.astype(dtype)


def make_keys(rng, n, dtype, dist, nonneg_limit=None):
    if dist == "zipf":
        return zipf_keys(rng, n, dtype, nonneg_limit=nonneg_limit)
    if nonneg_limit is not None:  # packed encoding: keys must be in [0, nonneg_limit)
        if dist == "dup":
            return rng.integers(0, 50, n).astype(dtype)
        if dist == "wide":
            hi = min(nonneg_limit, int(np.iinfo(dtype).max) + 1)
            return rng.integers(0, hi, n, dtype=np.int64).astype(dtype)
        if dist == "distinct":
            k = distinct_keys(rng, n, dtype, nonneg=True)
            return k if nonneg_limit > np.iinfo(dtype).max else (k % nonneg_limit).astype(dtype)
    if dist == "dup":
        return dup_keys(rng, n, dtype)
    if dist == "wide":
        return wide_keys(rng, n, dtype)
    if dist == "distinct":
        return distinct_keys(rng, n, dtype)
    raise AssertionError(dist)


def make_segments(rng, n, num_segments, skew=True):
    """Segment ids in [0, num_segments); skewed (Zipf) or uniform."""
    if skew:
        return ((rng.zipf(1.5, n) - 1) % num_segments).astype(np.int32)
    return rng.integers(0, num_segments, n).astype(np.int32)


@pytest.fixture(name="gen")
def gen_fixture():
    return types.SimpleNamespace(zipf_keys=zipf_keys, dup_keys=dup_keys, wide_keys=wide_keys,
                                 distinct_keys=distinct_keys, make_keys=make_keys, make_segments=make_segments,
                                 LARGE_N=LARGE_N)


# --------------------------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------------------------

def assert_same(got, want, fields=None):
    """Exact equality of every output (dtype, shape, values, order)."""
    if fields is None:
        fields = getattr(want, "_fields", None) or list(range(len(want)))
    for f in fields:
        g = getattr(got, f) if isinstance(f, str) else got[f]
        w = getattr(want, f) if isinstance(f, str) else want[f]
        if w is None:
            assert g is None, f"{f}: expected None, got {g!r}"
            continue
        assert g is not None, f"{f}: got None"
        g = np.asarray(g)
        assert g.dtype == w.dtype, f"{f}: dtype {g.dtype} != expected {w.dtype}"
        assert g.shape == w.shape, f"{f}: shape {g.shape} != expected {w.shape}"
        if not np.array_equal(g, w):
            bad = np.flatnonzero(g != w)
            raise AssertionError(f"{f}: {bad.size} mismatches, first at {bad[0]}: got {g[bad[0]]}, "
                                 f"expected {w[bad[0]]}\n got={g[:20]}...\nwant={w[:20]}...")


def expect_error(call, match, *values):
    """``call()`` must raise InvalidArgumentError or ValueError whose message matches ``match`` (case-insensitive)
    and mentions each of ``values`` as a whole number/word."""
    with pytest.raises(ERRORS) as info:
        call()
    msg = str(info.value)
    assert re.search(match, msg, re.IGNORECASE | re.DOTALL), f"message does not match {match!r}: {msg}"
    for v in values:
        pat = r"(?<![\w-])" + re.escape(str(v)) + r"(?!\w)"
        assert re.search(pat, msg), f"message does not mention {v!r}: {msg}"
    return msg


@pytest.fixture(name="check")
def check_fixture():
    return types.SimpleNamespace(assert_same=assert_same, expect_error=expect_error, ERRORS=ERRORS)


@pytest.fixture(autouse=True)
def fresh_keras_session():
    """Each test starts from a clear Keras session (layer and table names of earlier tests are free again) and leaves
    one (its graphs and layers are released before the next test). Keras 3's clear_session also runs a full garbage
    collection by default, 0.28 s here each time: 53 of a module's 92 s (tests/layers/test_fused_embedding.py), so
    it is skipped (Python collects as it goes; Keras 2 never ran one)."""
    _clear_session()
    yield
    _clear_session()


def _clear_session():
    if _keras.legacy():
        tf.keras.backend.clear_session()
    else:
        tf.keras.backend.clear_session(free_memory=False)


def pytest_sessionstart(session):
    """`make test` (and so CI) sets TF_FUSEDREC_REQUIRE_HOROVOD=1: the distributed tests import Horovod with
    importorskip so a bare checkout can run the rest, but where the install is meant to be complete a missing or
    broken Horovod must fail the run, not skip a third of it."""
    if os.environ.get("TF_FUSEDREC_REQUIRE_HOROVOD") == "1":
        try:
            import horovod.tensorflow  # noqa: F401,PLC0415
        except Exception as e:  # noqa: BLE001  (ImportError, or a library that fails to load)
            raise pytest.UsageError(f"TF_FUSEDREC_REQUIRE_HOROVOD=1 but horovod.tensorflow does not import ({e}); "
                                    f"run scripts/install.sh") from e
        # The suite launches workers with tests/horovodrun.py, which skips horovodrun's per-launch Gloo and MPI
        # checks (tests/distributed/test_horovod.py also trains under --mpi).
        for name, built in (("Gloo", horovod.tensorflow.gloo_built()), ("MPI", horovod.tensorflow.mpi_built())):
            if not built:
                raise pytest.UsageError(f"TF_FUSEDREC_REQUIRE_HOROVOD=1 but Horovod was built without {name}; "
                                        "run scripts/install.sh")


# --------------------------------------------------------------------------------------------------------------
# Markers and parallel runs
# --------------------------------------------------------------------------------------------------------------

# Test modules whose tests start several processes (horovodrun, the apps, servers, nvcc): `slow`. The fast tier
# (`make test-fast`) is everything else: in-process unit and oracle tests.
_MULTIWORKER = {"tests/distributed", "tests/apps/test_train.py", "tests/apps/test_train_crash.py",
                "tests/apps/test_train_grm.py", "tests/apps/test_train_movielens_seq.py",
                "tests/apps/test_train_pipeline.py", "tests/apps/test_bench.py", "tests/serve/test_export.py",
                "tests/serve/test_publish_training.py", "tests/train/test_steps_per_call.py",
                "tests/cluster/test_cluster_equality.py"}
_AREAS = {"tests/cluster": "cluster", "tests/serve": "serving"}
_SLOW = _MULTIWORKER | {"tests/cluster", "tests/cuda/test_cuda_harness.py", "tests/serve/test_serve_bench.py",
                        "tests/serve/test_ranker.py", "tests/serve/test_fuzz.py", "tests/test_entry_points.py",
                        "tests/serve/test_embedding_server.py", "tests/serve/test_loadtest.py",
                        "tests/serve/test_publish.py", "tests/apps/test_grm_quality.py"}


def _under(path, prefixes):
    return any(path == p or path.startswith(p + "/") for p in prefixes)


def pytest_configure(config):
    for name, what in (("slow", "starts processes or servers (not in `make test-fast`)"),
                       ("multiworker", "runs Horovod workers under horovodrun"),
                       ("cluster", "builds namespaced hosts (root, ip, tc)"),
                       ("serving", "starts embedding servers or a ranker"),
                       ("tfra", "needs the [tfra] extra (TFRA, Keras 2): skipped, and said so, only where it is not "
                                "installed; TF_FUSEDREC_REQUIRE_TFRA=1 (the baseline lane) fails the run instead. Also "
                                "given to every test whose name or parametrization names TFRA (TFRA_NAMES)"),
                       ("keras2", "needs Keras 2 (tf_keras: its legacy optimizers, tf.compat.v1 graphs around Keras "
                                  "layers): skipped, and said so, where tf.keras is Keras 3")):
        config.addinivalue_line("markers", f"{name}: {what}")
    if not TFRA_INSTALLED and os.environ.get("TF_FUSEDREC_REQUIRE_TFRA") == "1":
        raise pytest.UsageError("TF_FUSEDREC_REQUIRE_TFRA=1 but tensorflow-recommenders-addons is not installed: "
                                "install the [tfra] extra (scripts/install.sh does) or unset the variable")


# Words that name TFRA or a TFRA variant (a table backend, the per-feature baseline, the bench's hand fusion): a test
# whose name or parametrization id holds one (test_native_trains_like_tfra, [dlrm-per_feature]) compares against or
# runs TFRA there, and gets the `tfra` marker.
TFRA_NAMES = ("tfra", "per_feature", "perfeatureembedding", "hand_fused")


def _keras3():
    return not tf.keras.layers.Layer.__module__.startswith("tf_keras")


_NO_TFRA_REASON = "needs the [tfra] extra (TFRA, Keras 2), not installed in this environment"
_NO_KERAS2_REASON = "needs Keras 2 (tf_keras); tf.keras is Keras 3 here"


def pytest_terminal_summary(terminalreporter):
    """Says how many tests this environment skipped for lack of TFRA or of Keras 2 (counted from the reports, which
    under pytest-xdist reach this process while the collection ran in the workers)."""
    skipped = [str(r.longrepr) for r in terminalreporter.stats.get("skipped", [])]
    tfra, keras2 = (sum(reason in r for r in skipped) for reason in (_NO_TFRA_REASON, _NO_KERAS2_REASON))
    if tfra:
        terminalreporter.write_line(f"tf_fusedrec: this environment has no TFRA (the [tfra] extra): {tfra} tests "
                                    f"marked `tfra` were skipped")
    if keras2:
        terminalreporter.write_line(f"tf_fusedrec: tf.keras is Keras 3 here: {keras2} tests marked `keras2` were "
                                    f"skipped")


def _shares_module_state(item, path):
    """Whether the test uses a module- or session-scoped fixture defined in its own module: the expensive shared
    state (a horovodrun scenario run, a bench or training run, a server), cached per pytest process."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(d.scope in ("module", "session") and d.baseid.split("::")[0] == path for chain in defs for d in chain)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's loadgroup reads the xdist_group markers
def pytest_collection_modifyitems(config, items):
    """Marks each test by the module it is in (slow, multiworker, cluster, serving) and, for `pytest -n N
    --dist loadgroup` (`make test`), keeps on one xdist worker the tests of a module that share a module- or
    session-scoped fixture of that module (a horovodrun scenario, a bench or training run), so that fixture runs once; other tests are spread one
    by one. The cluster tests are one group, as they build namespaces of this machine. (pytest-xdist 3.8 sees the
    groups with pytest 8, not 9: requirements.txt pins pytest 8.4.2.)

    Then orders the tests by weight, each module's tests kept together and in order: the multi-worker modules first,
    then the other slow ones, then the in-process ones. pytest-xdist hands out work in this order, so the long module
    groups start early and the run ends on short tests that keep both workers busy, instead of one worker finishing a
    long group alone at the end (modules sort alphabetically, which put tests/serve/test_export.py and
    tests/train/test_steps_per_call.py last)."""
    weight = {}
    no_tfra = pytest.mark.skip(reason=_NO_TFRA_REASON)
    no_keras2 = pytest.mark.skip(reason=_NO_KERAS2_REASON)
    keras3 = _keras3()
    for item in items:
        callspec = getattr(item, "callspec", None)
        named = f"{getattr(item, 'originalname', item.name)}[{callspec.id if callspec is not None else ''}]".lower()
        if any(word in named for word in TFRA_NAMES):
            item.add_marker(pytest.mark.tfra)
        if not TFRA_INSTALLED and item.get_closest_marker("tfra"):
            item.add_marker(no_tfra)
        elif keras3 and item.get_closest_marker("keras2"):
            item.add_marker(no_keras2)
        path = Path(str(item.fspath)).resolve().relative_to(_ROOT).as_posix()
        weight[item.nodeid] = 0 if _under(path, _MULTIWORKER) else 1 if _under(path, _SLOW) else 2
        if _under(path, _SLOW):
            item.add_marker(pytest.mark.slow)
        if _under(path, _MULTIWORKER):
            item.add_marker(pytest.mark.multiworker)
        for prefix, marker in _AREAS.items():
            if _under(path, [prefix]):
                item.add_marker(getattr(pytest.mark, marker))
        if item.get_closest_marker("xdist_group"):
            continue
        if _under(path, ["tests/cluster"]):
            item.add_marker(pytest.mark.xdist_group("cluster"))
        elif _shares_module_state(item, path):
            item.add_marker(pytest.mark.xdist_group(path))
    items.sort(key=lambda item: weight[item.nodeid])  # stable: each module's order is kept


# --------------------------------------------------------------------------------------------------------------
# CPU per test (issue 21: the suite is CPU-bound on 2 cores, so what costs CPU is what costs CI time)
# --------------------------------------------------------------------------------------------------------------

# TF_FUSEDREC_CPU_REPORT=DIR: each pytest process (each xdist worker) writes DIR/cpu-{worker}-{pid}.tsv, a line per test
# phase: node id, phase, CPU seconds (user + sys of the pytest process and of every process it started that has been
# waited for: horovodrun and its workers, apps, servers; a server reaped at a module's end is counted in that teardown),
# wall seconds, start (Unix time). benchmarks/suite/cpu_report.py sums them per module and shows each process's busy span.
_CPU_REPORT = os.environ.get("TF_FUSEDREC_CPU_REPORT")
_cpu_lines = []


def _cpu_seconds():
    import resource  # noqa: PLC0415

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _cpu_phase(item, phase):
    import time  # noqa: PLC0415

    cpu, wall, began = _cpu_seconds(), time.monotonic(), time.time()
    yield
    _cpu_lines.append(f"{item.nodeid}\t{phase}\t{_cpu_seconds() - cpu:.3f}\t{time.monotonic() - wall:.3f}\t"
                      f"{began:.3f}\n")


if _CPU_REPORT:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(item):
        yield from _cpu_phase(item, "setup")

    # A test call still running after _STALL_S seconds has the Python stacks of all the process's threads appended to
    # DIR/stacks-{worker}-{pid}.txt (after the test's name): what an in-process test that takes far longer than its
    # CPU waits on.
    _STALL_S = 20

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(item):
        import faulthandler  # noqa: PLC0415

        os.makedirs(_CPU_REPORT, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(os.path.join(_CPU_REPORT, f"stacks-{worker}-{os.getpid()}.txt"), "a") as stacks:
            stacks.write(f"== {item.nodeid}\n")
            stacks.flush()
            faulthandler.dump_traceback_later(_STALL_S, file=stacks)
            try:
                yield from _cpu_phase(item, "call")
            finally:
                faulthandler.cancel_dump_traceback_later()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(item):
        yield from _cpu_phase(item, "teardown")

    def pytest_sessionfinish(session):  # noqa: ARG001
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        os.makedirs(_CPU_REPORT, exist_ok=True)
        # The pid too: make test runs pytest twice (the second time on tests/ops against the Bazel library).
        with open(os.path.join(_CPU_REPORT, f"cpu-{worker}-{os.getpid()}.tsv"), "w") as f:
            f.writelines(_cpu_lines)

"""AdaptiveCache (capacity, eviction policies, load-driven resizing, threads) and CachedBackend (exact rows, pooled
sums, hit counts) against LocalBackend on a small export written with NumPy only."""

import threading

import numpy as np
import pytest

from tf_fusedrec import initializers
from tf_fusedrec.export import format as fmt
from tf_fusedrec.serve.backend import LocalBackend, Lookup
from tf_fusedrec.serve.cache import AdaptiveCache, CachedBackend, LFUPolicy, LRUPolicy, entry_bytes

DIM = 4
EB = entry_bytes(DIM)  # 8 + 16 = 24 bytes an entry


def _rows_of(keys, dim=DIM):
    """Rows that say which key they belong to, so a row cached under the wrong key shows."""
    keys = np.asarray(keys, np.int64)
    return (keys[:, None] * 10 + np.arange(dim)[None, :]).astype(np.float32)


def _held(cache, keys, group="g"):
    return cache.get_many(group, np.asarray(keys, np.int64))[1].tolist()


# --- AdaptiveCache ---------------------------------------------------------------------------------------------------


def test_entry_bytes_are_key_plus_row():
    assert entry_bytes(4) == 8 + 4 * 4
    cache = AdaptiveCache(10 * EB)
    cache.put_many("g", [1, 2, 3], _rows_of([1, 2, 3]))
    stats = cache.stats()
    assert (stats["entries"], stats["bytes"]) == (3, 3 * EB)


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_capacity_never_exceeded_under_a_tiny_budget(policy):
    budget = 5 * EB + EB // 2  # room for 5 entries and a half: the half must stay unused
    cache = AdaptiveCache(budget, policy=policy)
    rng = np.random.default_rng(0)
    for _ in range(200):
        keys = rng.integers(0, 40, rng.integers(1, 12))
        _, hit = cache.get_many("g", keys)
        cache.put_many("g", keys[~hit], _rows_of(keys[~hit]))
        stats = cache.stats()
        assert stats["bytes"] <= stats["capacity_bytes"] == budget
        assert stats["entries"] <= 5 and stats["bytes"] == stats["entries"] * EB
    assert cache.stats()["evictions"] > 0
    # A batch bigger than the cache keeps its last entries, which evict everything older.
    cache.put_many("g", np.arange(100, 120), _rows_of(np.arange(100, 120)))
    assert _held(cache, np.arange(100, 120)) == [False] * 15 + [True] * 5


def test_rows_come_back_for_their_keys_across_groups_and_slot_reuse():
    cache = AdaptiveCache(6 * EB + 3 * entry_bytes(8))
    for start in range(0, 60, 3):
        keys = np.arange(start, start + 3)
        cache.put_many("small", keys, _rows_of(keys))
        cache.put_many("wide", keys, _rows_of(keys, dim=8))
        rows, hit = cache.get_many("small", np.arange(0, 64))
        np.testing.assert_array_equal(rows, _rows_of(np.arange(0, 64)[hit]))
        rows, hit = cache.get_many("wide", np.arange(0, 64))
        np.testing.assert_array_equal(rows, _rows_of(np.arange(0, 64)[hit], dim=8))
    assert cache.stats()["bytes"] <= cache.stats()["capacity_bytes"]


def test_get_many_of_a_group_never_put_misses_everything():
    cache = AdaptiveCache(1000)
    rows, hit = cache.get_many("none", np.array([1, 2], np.int64))
    assert rows.shape == (0, 0) and hit.tolist() == [False, False]
    assert cache.stats()["misses"] == 2 and cache.stats()["hit_rate"] == 0.0


def test_lru_evicts_the_least_recently_used():
    cache = AdaptiveCache(3 * EB, policy="lru")
    cache.put_many("g", [1, 2, 3], _rows_of([1, 2, 3]))
    cache.get_many("g", [1])  # 2 is now the least recently used
    cache.put_many("g", [4], _rows_of([4]))
    assert _held(cache, [1, 2, 3, 4]) == [True, False, True, True]  # this get touches 1, 3, 4 in that order
    cache.put_many("g", [5], _rows_of([5]))
    assert _held(cache, [1, 3, 4, 5]) == [False, True, True, True]
    rows, _ = cache.get_many("g", [3, 5])
    np.testing.assert_array_equal(rows, _rows_of([3, 5]))


def test_lru_put_of_a_held_key_counts_as_use():
    cache = AdaptiveCache(3 * EB, policy="lru")
    cache.put_many("g", [1, 2, 3], _rows_of([1, 2, 3]))
    cache.put_many("g", [1], _rows_of([7]))  # refreshes 1 (and its row)
    cache.put_many("g", [4], _rows_of([4]))
    assert _held(cache, [1, 2, 3, 4]) == [True, False, True, True]
    np.testing.assert_array_equal(cache.get_many("g", [1])[0], _rows_of([7]))


def test_lfu_evicts_the_least_frequently_used_then_the_least_recent():
    cache = AdaptiveCache(3 * EB, policy="lfu")
    cache.put_many("g", [1, 2, 3], _rows_of([1, 2, 3]))
    cache.get_many("g", [1])
    cache.get_many("g", [1])
    cache.get_many("g", [2])  # counts: 1 -> 3, 2 -> 2, 3 -> 1
    cache.put_many("g", [4], _rows_of([4]))
    hits = cache.stats()["hits"]
    assert _held(cache, [3]) == [False]
    cache.put_many("g", [5], _rows_of([5]))  # 4 is the only entry at count 1
    assert _held(cache, [4]) == [False]
    assert _held(cache, [1, 2]) == [True, True]  # unlike LRU, 1 and 2 outlive the newer 4 and 5
    assert cache.stats()["hits"] == hits + 2
    # Ties at the lowest count go to the least recently used.
    tie = AdaptiveCache(3 * EB, policy="lfu")
    tie.put_many("g", [1, 2, 3], _rows_of([1, 2, 3]))
    tie.get_many("g", [3, 1, 2])  # all at count 2; 3 used first
    tie.put_many("g", [4], _rows_of([4]))
    assert _held(tie, [1, 2, 3]) == [True, True, False]


@pytest.mark.parametrize("policy_class", [LRUPolicy, LFUPolicy])
def test_policies_pop_every_entry_exactly_once(policy_class):
    policy = policy_class()
    policy.insert(list(range(10)))
    policy.touch([3, 3, 7, 0])
    popped = [policy.pop_victim() for _ in range(10)]
    assert sorted(popped) == list(range(10)) and len(policy) == 0
    if policy_class is LRUPolicy:
        assert popped == [1, 2, 4, 5, 6, 8, 9, 3, 7, 0]
    else:
        assert popped == [1, 2, 4, 5, 6, 8, 9, 7, 0, 3]


def test_shrinks_under_load_and_grows_when_idle():
    budget = 64 * EB
    cache = AdaptiveCache(budget, min_fraction=0.25, window=4, high_load=100, low_load=10, policy="lru")
    cache.put_many("g", np.arange(64), _rows_of(np.arange(64)))
    for _ in range(3):
        assert cache.observe(500) == budget  # the window is not full yet
    assert cache.observe(500) == budget // 2
    stats = cache.stats()
    assert stats["entries"] == 32 and stats["bytes"] == 32 * EB and stats["load"] == 500.0
    assert _held(cache, [31, 32, 63]) == [False, True, True]  # the 32 most recently inserted stay
    for _ in range(3):
        assert cache.observe(500) == budget // 2  # a full window of new evidence before the next step
    assert cache.observe(500) == budget // 4
    for _ in range(8):
        cache.observe(500)
    assert cache.stats()["capacity_bytes"] == budget // 4 == cache.stats()["min_capacity_bytes"]
    assert cache.stats()["resizes"] == 2 and cache.stats()["entries"] <= 16
    for _ in range(8):
        cache.observe(50)  # between low_load and high_load: the capacity holds
    assert cache.stats()["capacity_bytes"] == budget // 4
    for _ in range(4):
        cache.observe(1)  # the window now averages 1: idle
    assert cache.stats()["capacity_bytes"] == budget // 2
    for _ in range(12):
        cache.observe(0)
    stats = cache.stats()
    assert stats["capacity_bytes"] == budget and stats["resizes"] == 4 and stats["load"] == 0.0
    cache.put_many("g", np.arange(100, 164), _rows_of(np.arange(100, 164)))
    assert cache.stats()["entries"] == 64  # grown back: the whole budget holds entries again


def test_a_window_mean_just_under_high_load_does_not_shrink():
    cache = AdaptiveCache(1000, window=2, high_load=100, low_load=10)
    cache.observe(100)
    cache.observe(100)  # mean 100 is not above 100
    assert cache.stats()["capacity_bytes"] == 1000
    cache.observe(101)  # mean 100.5
    assert cache.stats()["capacity_bytes"] == 500


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_concurrent_use_keeps_rows_and_accounting_right(policy):
    cache = AdaptiveCache(50 * EB, min_fraction=0.2, window=8, high_load=30, low_load=5, policy=policy)
    errors = []
    stop = threading.Event()

    def user(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(300):
                keys = rng.integers(0, 200, rng.integers(1, 40))
                rows, hit = cache.get_many("g", keys)
                # reshape: a get before any thread's first put gives [0, 0] rows (the dim is not known yet)
                np.testing.assert_array_equal(rows.reshape(-1, DIM), _rows_of(keys[hit]))
                cache.put_many("g", keys[~hit], _rows_of(keys[~hit]))
                cache.observe(int(rng.choice([0, 100])))  # load flips: the capacity moves while others read
        except Exception as e:  # noqa: BLE001  (reported by the main thread)
            errors.append(e)

    def watcher():
        while not stop.is_set():
            stats = cache.stats()
            if not stats["bytes"] <= stats["capacity_bytes"] or stats["bytes"] != stats["entries"] * EB:
                errors.append(AssertionError(f"inconsistent stats {stats}"))

    threads = [threading.Thread(target=user, args=(seed,)) for seed in range(4)]
    watch = threading.Thread(target=watcher)
    watch.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watch.join()
    assert not errors, errors[0]
    stats = cache.stats()
    assert stats["hits"] + stats["misses"] > 0 and stats["resizes"] > 0 and stats["evictions"] > 0
    keys = np.arange(200)
    rows, hit = cache.get_many("g", keys)
    assert hit.sum() == stats["entries"]
    np.testing.assert_array_equal(rows, _rows_of(keys[hit]))


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="policy 'fifo'"):
        AdaptiveCache(100, policy="fifo")
    with pytest.raises(ValueError, match="low_load < high_load"):
        AdaptiveCache(100, high_load=10, low_load=10)
    with pytest.raises(ValueError, match="min_fraction"):
        AdaptiveCache(100, min_fraction=0.0)
    with pytest.raises(ValueError, match="budget_bytes"):
        AdaptiveCache(0)
    cache = AdaptiveCache(1000)
    with pytest.raises(ValueError, match="batch_size"):
        cache.observe(-1)
    cache.put_many("g", [1], _rows_of([1]))
    with pytest.raises(ValueError, match="group 'g' holds rows of dim 4"):
        cache.put_many("g", [2], _rows_of([2], dim=8))
    with pytest.raises(ValueError, match=r"rows must be \[2, dim\]"):
        cache.put_many("g", [2, 3], _rows_of([2]))
    with pytest.raises(ValueError, match="1-D"):
        cache.get_many("g", np.zeros((2, 2), np.int64))


# --- CachedBackend against LocalBackend ------------------------------------------------------------------------------

PACKED = ("pa", "pb")
HASHED = ("hx", "hy", "hz")


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    """A packed group (2 features, dim 4, Constant initializer) and a hashed group (3 features, dim 8, Hashed
    initializer): ids 0..59 of each feature trained (every other one), 60..119 never trained."""
    root = str(tmp_path_factory.mktemp("export"))
    rng = np.random.default_rng(1)
    groups = []
    for name, features, dim, encoding, initializer in [
        ("packed", PACKED, 4, "packed", {"class_name": "Constant", "config": {"value": 0.25}}),
        ("hashed", HASHED, 8, "hashed", {"class_name": "Hashed", "config": {"seed": 0, "stddev": 0.05}}),
    ]:
        ids = np.tile(np.arange(0, 60, 2, dtype=np.int64), len(features))
        categories = np.repeat(np.arange(len(features)), 30)
        keys = fmt.table_keys(ids, categories, len(features), encoding)
        group = {"name": name, "dim": dim, "encoding": encoding, "features": list(features),
                 "salts": [initializers.feature_salt(0, f) for f in features], "initializer": initializer}
        rows = rng.normal(0, 1, (len(keys), dim)).astype(np.float32)
        groups.append(fmt.write_group(root, group, keys, rows, parts=3))
    fmt.write_manifest(root, {"groups": groups})
    return root


@pytest.fixture(scope="module")
def local(export_dir):
    return LocalBackend(export_dir)


def _request(group, n, seed):
    """ids with repeats, half of them never trained, and their categories."""
    rng = np.random.default_rng(seed)
    num_features = len(PACKED if group == "packed" else HASHED)
    return rng.integers(0, 120, n), rng.integers(0, num_features, n)


def _distinct(local, group, ids, categories):
    spec = fmt.group_of(local.manifest, group)
    return len(np.unique(fmt.table_keys(ids, categories, len(spec["features"]), spec["encoding"])))


@pytest.mark.parametrize("group", ["packed", "hashed"])
@pytest.mark.parametrize("budget_entries", [10_000, 7])  # everything fits / evictions inside every request
def test_cached_rows_equal_local_rows_exactly(export_dir, local, group, budget_entries):
    dim = fmt.group_of(local.manifest, group)["dim"]
    inner = LocalBackend(export_dir)
    backend = CachedBackend(inner, AdaptiveCache(budget_entries * entry_bytes(dim)))
    for seed in [0, 1, 0, 2, 2]:
        ids, categories = _request(group, 200, seed)
        expected = local.rows(group, ids, categories)
        got = backend.rows(group, ids, categories)
        assert got.dtype == np.float32 and got.shape == (200, dim)
        np.testing.assert_array_equal(got, expected)
    assert inner.stats()["rows_not_trained"] > 0  # never trained ids went through (and were cached)


@pytest.mark.parametrize("group", ["packed", "hashed"])
def test_hits_are_counted_on_a_repeat(export_dir, local, group):
    inner = LocalBackend(export_dir)
    backend = CachedBackend(inner, AdaptiveCache(1 << 20))
    ids, categories = _request(group, 300, 3)
    distinct = _distinct(local, group, ids, categories)
    assert distinct < 300  # the request repeats pairs, which are fetched once
    backend.rows(group, ids, categories)
    stats = backend.stats()
    assert (stats["cache"]["hits"], stats["cache"]["misses"], stats["cache"]["entries"]) == (0, distinct, distinct)
    assert stats["rows_looked_up"] == distinct == stats["cache"]["rows_fetched"]
    np.testing.assert_array_equal(backend.rows(group, ids, categories), local.rows(group, ids, categories))
    stats = backend.stats()
    assert (stats["cache"]["hits"], stats["cache"]["misses"]) == (distinct, distinct)
    assert stats["rows_looked_up"] == distinct  # the repeat asked nothing of the inner backend
    assert stats["cache"]["hit_rate"] == 0.5 and "table_bytes" in stats


@pytest.mark.parametrize("group", ["packed", "hashed"])
def test_pooled_equals_local_pooled(export_dir, local, group):
    inner = LocalBackend(export_dir)
    backend = CachedBackend(inner, AdaptiveCache(1 << 20))
    ids, categories = _request(group, 400, 4)
    segments = np.sort(np.random.default_rng(5).integers(0, 50, 400))
    num_segments = 53  # the last segments are empty
    expected_sums, expected_counts = local.pooled(group, ids, categories, segments, num_segments)
    distinct = _distinct(local, group, ids, categories)
    # 1st call: nothing cached, all pooled by inner; 2nd: every key missed before, so fetched as rows, cached and
    # pooled here; 3rd: all hits. Columns: cumulative pairs pooled here, by inner, rows fetched, cache hits.
    expected = [(0, 400, 0, 0), (400, 400, distinct, 0), (800, 400, distinct, distinct)]
    for here, by_inner, fetched, hits in expected:
        sums, counts = backend.pooled(group, ids, categories, segments, num_segments)
        np.testing.assert_allclose(sums, expected_sums, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(counts, expected_counts)
        assert sums.dtype == np.float32 and counts.dtype == np.int64
        stats = backend.stats()["cache"]
        assert (stats["pairs_pooled_here"], stats["pairs_pooled_by_inner"], stats["rows_fetched"],
                stats["hits"]) == (here, by_inner, fetched, hits)
    assert backend.stats()["cache"]["rows_admitted_from_pooled"] == distinct


@pytest.mark.parametrize("group", ["packed", "hashed"])
def test_pooled_mixes_cached_and_inner_pairs(export_dir, local, group):
    inner = LocalBackend(export_dir)
    backend = CachedBackend(inner, AdaptiveCache(1 << 20), admit_from_pooled=False)
    ids, categories = _request(group, 400, 6)
    segments = np.random.default_rng(7).integers(0, 40, 400)  # unsorted segments
    backend.rows(group, ids[:150], categories[:150])  # caches some of the pairs
    cached = backend.stats()["cache"]["entries"]
    for _ in range(2):  # without admission, pooled() never fills the cache
        sums, counts = backend.pooled(group, ids, categories, segments, 40)
        expected_sums, expected_counts = local.pooled(group, ids, categories, segments, 40)
        np.testing.assert_allclose(sums, expected_sums, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(counts, expected_counts)
    stats = backend.stats()["cache"]
    assert stats["entries"] == cached and stats["rows_admitted_from_pooled"] == 0
    assert 0 < stats["pairs_pooled_here"] < 800 and stats["pairs_pooled_here"] + stats["pairs_pooled_by_inner"] == 800


class _CountingBackend(LocalBackend):
    """A LocalBackend that records the lookups of each lookup_many call (a remote backend sends one round per call)."""

    def __init__(self, export_dir):
        super().__init__(export_dir)
        self.calls = []

    def lookup_many(self, lookups, version=None):
        self.calls.append([(q.group, q.segments is not None, len(q.ids)) for q in lookups])
        return super().lookup_many(lookups, version)


@pytest.mark.parametrize("budget_entries", [10_000, 7])
def test_lookup_many_asks_inner_once_per_call_and_equals_each_call(export_dir, local, budget_entries):
    # Rows and pooled bags of both groups, three times (cold, then with admissions and hits): every answer is
    # LocalBackend's, and each call asks the inner backend at most once, for the misses of all of them together.
    inner = _CountingBackend(export_dir)
    backend = CachedBackend(inner, AdaptiveCache(budget_entries * entry_bytes(8)))
    rng = np.random.default_rng(11)
    lookups = []
    for seed, group in enumerate(["packed", "hashed"]):
        ids, categories = _request(group, 150, 20 + seed)
        lookups.append(Lookup(group, ids, categories))
        ids, categories = _request(group, 300, 30 + seed)
        lookups.append(Lookup(group, ids, categories, rng.integers(0, 60, 300), 64))
    lookups.append(Lookup("packed", np.zeros(0, np.int64), np.zeros(0, np.int64)))
    for call in range(3):
        before = len(inner.calls)
        answers = backend.lookup_many(lookups)
        made = len(inner.calls) - before
        assert len(answers) == len(lookups) and made <= 1 and (made == 1 or call > 0)  # none once every key hits
        for q, answer in zip(lookups, answers):
            if q.segments is None:
                np.testing.assert_array_equal(answer, local.rows(q.group, q.ids, q.categories))
            else:
                want_sums, want_counts = local.pooled(q.group, q.ids, q.categories, q.segments, q.num_segments)
                np.testing.assert_allclose(answer[0], want_sums, rtol=0, atol=1e-6)
                np.testing.assert_array_equal(answer[1], want_counts)
    first, second = inner.calls[0], inner.calls[1]
    assert any(pooled for _, pooled, _ in first)  # cold: the bags are pooled by inner
    # warm: the keys that missed before are admitted and fetched as rows, in the same single call
    assert sum(n for _, pooled, n in second if not pooled) > 0


def test_cached_backend_errors(export_dir):
    backend = CachedBackend(LocalBackend(export_dir), AdaptiveCache(1000))
    with pytest.raises(fmt.ExportError, match="no group 'nope'"):
        backend.rows("nope", [1], [0])
    with pytest.raises(ValueError, match=r"categories must lie in \[0, 2\)"):
        backend.rows("packed", [1], [2])
    with pytest.raises(ValueError, match="one length"):
        backend.rows("packed", [1, 2], [0])
    with pytest.raises(ValueError, match=r"segments must lie in \[0, 3\)"):
        backend.pooled("packed", [1], [0], [3], 3)
    with pytest.raises(ValueError, match="has no manifest"):
        CachedBackend(object(), AdaptiveCache(1000))
    assert backend.rows("hashed", np.zeros(0, np.int64), np.zeros(0, np.int64)).shape == (0, 8)

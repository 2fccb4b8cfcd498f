"""fmt.InitialRowCache (the embedding servers' cache of initializer rows) against fmt.initial_rows, and the server's
use of it: every row it answers is initial_rows' row, bit for bit, whatever the evictions, threads and flags."""

import threading

import numpy as np
import pytest

from tests.serve import serve_fixtures
from tf_fusedrec.export import format as fmt
from tf_fusedrec.serve import embedding_server

HASHED = serve_fixtures.fake_tables()["hashed"][0]  # the group dict: Hashed initializer, its salts


def reference(group, ids, categories):
    return fmt.initial_rows(group["initializer"], group["salts"], ids, categories, group["dim"])


def pairs(rng, n, id_space=500, categories=None):
    categories = len(HASHED["features"]) if categories is None else categories
    return rng.integers(0, id_space, n), rng.integers(0, categories, n)


def assert_bits_equal(got, want):
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("max_bytes", [1 << 20, 2000, 100])  # roomy, a few slots (evictions), under one slot
def test_rows_equal_initial_rows_across_calls(max_bytes):
    cache = fmt.InitialRowCache(HASHED, max_bytes)
    slot_bytes = 16 + 4 * HASHED["dim"]
    assert cache.slots == (0 if max_bytes < slot_bytes else 1 << ((max_bytes // slot_bytes).bit_length() - 1))
    assert cache.nbytes <= max_bytes
    rng = np.random.default_rng(1)
    for n in (0, 1, 7, 300, 300, 2000):
        ids, categories = pairs(rng, n)
        assert_bits_equal(cache.rows(ids, categories), reference(HASHED, ids, categories))


def test_a_repeated_call_hits_and_pairs_not_keys_are_cached():
    cache = fmt.InitialRowCache(HASHED, 1 << 20)
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 2**62, 400)
    categories = rng.integers(0, len(HASHED["features"]), 400)
    first = cache.rows(ids, categories)
    assert (cache.hits, cache.misses) == (0, 400)  # probed before any is stored
    before = cache.hits
    again = cache.rows(ids, categories)
    assert_bits_equal(again, first)
    assert cache.hits - before >= 380  # a roomy cache keeps nearly all (two pairs may share a slot)
    # The same id in every category: each category its own row (salts differ), from the cache as computed.
    same = np.full(len(HASHED["features"]), 12345)
    every = np.arange(len(HASHED["features"]))
    rows = cache.rows(same, every)
    assert_bits_equal(rows, reference(HASHED, same, every))
    assert len({r.tobytes() for r in rows}) == len(every)
    assert_bits_equal(cache.rows(same, every), rows)


def test_a_tiny_cache_evicts_and_still_answers_right():
    cache = fmt.InitialRowCache(HASHED, 4 * (16 + 4 * HASHED["dim"]))
    assert cache.slots == 4
    rng = np.random.default_rng(3)
    for _ in range(20):
        ids, categories = pairs(rng, 50, id_space=30)
        assert_bits_equal(cache.rows(ids, categories), reference(HASHED, ids, categories))
    assert cache.hits > 0 and cache.misses > 0


@pytest.mark.parametrize("initializer", [{"class_name": "Constant", "config": {"value": 0.25}},
                                         {"class_name": "Zeros", "config": {}}])
def test_other_initializers_are_not_cached(initializer):
    group = {**HASHED, "initializer": initializer}
    cache = fmt.InitialRowCache(group, 1 << 20)
    assert cache.slots == 0 and cache.nbytes == 0
    ids, categories = pairs(np.random.default_rng(4), 30)
    assert_bits_equal(cache.rows(ids, categories), reference(group, ids, categories))


def test_threads_share_a_small_cache():
    cache = fmt.InitialRowCache(HASHED, 64 * (16 + 4 * HASHED["dim"]))
    failures = []

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(60):
            ids, categories = pairs(rng, 120, id_space=200)
            got = cache.rows(ids, categories)
            if not np.array_equal(got.view(np.uint32), reference(HASHED, ids, categories).view(np.uint32)):
                failures.append(seed)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert failures == []
    assert cache.hits + cache.misses == 4 * 60 * 120


def test_group_rows_lookup_with_and_without_the_cache(tmp_path):
    export = serve_fixtures.write_fake_export(str(tmp_path / "export"))
    manifest = fmt.read_manifest(export)
    rng = np.random.default_rng(5)
    for group in manifest["groups"]:
        held = fmt.GroupRows(export, manifest, group)
        cache = fmt.InitialRowCache(group, 1 << 20)
        trained = rng.choice(len(held.keys), 100)
        _, ids, categories, _, _ = serve_fixtures.fake_tables()[group["name"]]
        q_ids = np.concatenate([ids[trained], rng.integers(serve_fixtures.ID_SPACE, 2 * serve_fixtures.ID_SPACE, 80)])
        q_categories = np.concatenate([categories[trained], rng.integers(0, len(group["features"]), 80)])
        for _ in range(2):
            want, want_missing = held.lookup(q_ids, q_categories)
            got, got_missing = held.lookup(q_ids, q_categories, cache)
            assert_bits_equal(got, want)
            assert got_missing == want_missing >= 80
        assert cache.hits >= 75  # the second round's untrained pairs (two may share a slot)


def test_server_with_and_without_the_cache_answer_alike(tmp_path):
    export = serve_fixtures.write_fake_export(str(tmp_path / "export"))
    servers = [embedding_server.EmbeddingServer(export, initializer_cache_mb=mb) for mb in (0, 0.01, 16)]
    assert [sum(c["slots"] for c in s.initializer_cache_stats().values()) > 0 for s in servers] == [False, True, True]
    assert "initializer cache" in servers[2].describe()
    rng = np.random.default_rng(6)
    from tf_fusedrec.serve import embedding_pb2 as pb  # noqa: PLC0415

    for name, group in serve_fixtures.fake_tables().items():
        spec = group[0]
        ids = rng.integers(serve_fixtures.ID_SPACE, 2 * serve_fixtures.ID_SPACE, 300)
        categories = rng.integers(0, len(spec["features"]), 300)
        request = pb.LookupRequest(groups=[
            pb.GroupLookup(group=name, ids=ids.astype("<i8").tobytes(), categories=categories.astype("<i4").tobytes()),
            pb.GroupLookup(group=name, ids=ids.astype("<i8").tobytes(), categories=categories.astype("<i4").tobytes(),
                           pool=True, segments=(np.arange(300) // 7).astype("<i4").tobytes(), num_segments=43)])
        for _ in range(2):
            answers = [s._answer(request.SerializeToString()) for s in servers]  # noqa: SLF001
            assert answers[1] == answers[0] and answers[2] == answers[0]
    assert servers[2].initializer_cache_stats()[name]["hits"] > 0
    for bad in (-1, "16", 2**30):
        with pytest.raises(ValueError, match="initializer_cache_mb"):
            embedding_server.EmbeddingServer(export, initializer_cache_mb=bad)
    args = embedding_server.parse_args(["--export", "e", "--port", "1", "--initializer-cache-mb", "0"])
    assert args.initializer_cache_mb == 0
    assert embedding_server.parse_args(["--export", "e", "--port", "1"]).initializer_cache_mb == 16

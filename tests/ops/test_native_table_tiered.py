"""The tiered native table (tier_path, tier_dram_bytes: a DRAM cache over a RocksDB store, cc/kernels/
native_table_op.cc TieredStore) against the all-DRAM native table as the reference: with a cache far smaller than the
table, every op gives the same bits (rows, slots, access stats, changes), eagerly and in a tf.function; and its errors
(a call larger than the cache, a store of another table, a foreign directory) name the table and the path.

RocksDB's shared library is required here: without it creating a tiered table fails, and so do these tests."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tf_fusedrec.initializers import feature_salt
from tf_fusedrec.ops import native_table_ops as nt

SALTS = [feature_salt(3, "user"), feature_salt(3, "item")]
OPTIMIZERS = {"sgd": ("sgd", {}), "adagrad": ("adagrad", {}), "adam": ("adam", {}),
              "momentum": ("sgd", {"momentum": 0.9}), "ftrl": ("ftrl", {"l1_regularization_strength": 0.001})}
DIM = 8
ID_SPACE = 20_000


def budget(num_slots, storage="float32", capacity=512):
    """dram_bytes for a cache of `capacity` slots (3/4 of them rows): key, row, slots, access stats, bitmaps."""
    entry = 8 + DIM * (2 if storage == "float16" else 4) + num_slots * DIM * 4 + 16
    return capacity * entry + capacity // 4 + 64


def make_pair(tmp_path, name, optimizer="adagrad", storage="float32", rounding="nearest", track_access=True,
              dram_bytes=None, init="hashed"):
    """(all-DRAM table, tiered table) of one config; the tiered one's cache holds 384 rows."""
    opt, hyper = OPTIMIZERS[optimizer]
    if dram_bytes is None:
        dram_bytes = budget(len(nt.slot_names(opt, hyper)), storage)
    args = dict(dim=DIM, optimizer=opt, hyperparameters=hyper, storage=storage, rounding=rounding, salts=SALTS,
                track_access=track_access, init=init, seed=5)
    dram = nt.NativeTableResource(f"{name}_dram", **args)
    tiered = nt.NativeTableResource(f"{name}_tiered", tier_path=str(tmp_path / name), tier_dram_bytes=dram_bytes,
                                    **args)
    return dram, tiered


def step_keys(rng, n=400):
    """Distinct Zipf-skewed keys of one step and their categories."""
    keys = np.unique((rng.zipf(1.1, n) * 7919) % ID_SPACE).astype(np.int64)
    return keys, (keys % 2).astype(np.int32)


def sorted_export(table):
    keys, rows, slots = (x.numpy() for x in nt.native_table_export(table))
    order = np.argsort(keys)
    return keys[order], rows[order], slots[order]


def assert_same_tables(a, b):
    for x, y, what in zip(sorted_export(a), sorted_export(b), ("keys", "rows", "slots")):
        np.testing.assert_array_equal(x, y, err_msg=what)


def stats(table):
    return dict(zip(nt.TIER_STATS, nt.native_table_tier_stats(table).numpy().tolist()))


def train(tables, steps, seed=0, graph=False, remove_every=7, repeated_every=5):
    """The same lookups and updates on every table; the lookups' rows must agree at every step."""
    rng = np.random.default_rng(seed)

    def one(table, keys, cats, grads, step, distinct):
        rows = nt.native_table_lookup_or_init(table, keys, cats, keys)
        upd = nt.native_table_apply_sparse(table, keys if distinct else tf.concat([keys, keys[:5]], 0),
                                           grads if distinct else tf.concat([grads, grads[:5]], 0),
                                           cats if distinct else tf.concat([cats, cats[:5]], 0),
                                           keys if distinct else tf.concat([keys, keys[:5]], 0),
                                           0.05, update_count=step, distinct_keys=distinct)
        with tf.control_dependencies([upd] if upd is not None else []):
            return tf.identity(rows)

    run = tf.function(one, reduce_retracing=True) if graph else one
    for step in range(1, steps + 1):
        keys, cats = step_keys(rng)
        grads = rng.standard_normal((len(keys), DIM)).astype(np.float32)
        distinct = step % repeated_every != 0
        outs = [run(t, tf.constant(keys), tf.constant(cats), tf.constant(grads), tf.constant(step, tf.int64),
                    distinct).numpy() for t in tables]
        for o in outs[1:]:
            np.testing.assert_array_equal(o, outs[0], err_msg=f"step {step} lookup rows")
        if remove_every and step % remove_every == 0:
            gone = rng.choice(ID_SPACE, 300, replace=False).astype(np.int64)
            for t in tables:
                nt.native_table_remove(t, gone)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_tiered_trains_bit_for_bit_as_all_dram(tmp_path, optimizer, graph):
    dram, tiered = make_pair(tmp_path, f"t_{optimizer}", optimizer)
    train([dram, tiered], 24, graph=graph)
    assert_same_tables(dram, tiered)
    s = stats(tiered)
    # The cache was far smaller than the table: rows went to disk and came back.
    assert s["disk_rows"] > 2 * s["dram_rows"], s
    assert s["dram_rows"] <= s["dram_capacity_rows"] and s["evicted_rows"] > 0 and s["disk_hits"] > 0, s
    assert s["dram_capacity_rows"] == 384 and s["bytes_written"] > 0 and s["bytes_read"] > 0, s
    assert int(nt.native_table_size(tiered)) == int(nt.native_table_size(dram)) == s["dram_rows"] + s["disk_rows"]
    assert stats(dram)["dram_capacity_rows"] == -1 and stats(dram)["disk_rows"] == 0


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_float16_rows_survive_the_disk_tier(tmp_path, rounding):
    dram, tiered = make_pair(tmp_path, f"f16_{rounding}", "adam", storage="float16", rounding=rounding)
    train([dram, tiered], 16, seed=1)
    assert_same_tables(dram, tiered)
    assert stats(tiered)["disk_rows"] > 0


@pytest.mark.parametrize("init", ["normal", "constant"])
def test_reads_of_cold_rows_and_of_absent_keys(tmp_path, init):
    """Inference lookups (insert=False) and find (rows and each slot) read disk rows in place, give absent keys
    their initial rows (or zeros and exists=False), and change nothing."""
    dram, tiered = make_pair(tmp_path, f"reads_{init}", "adam", init=init)
    train([dram, tiered], 12, seed=2)
    before = stats(tiered)
    probe = np.arange(0, ID_SPACE + 500, 13, dtype=np.int64)
    cats = (probe % 2).astype(np.int32)
    exists = nt.native_table_find(dram, probe).exists.numpy()
    assert exists.any() and not exists.all()
    np.testing.assert_array_equal(nt.native_table_lookup_or_init(tiered, probe, cats, probe, insert=False).numpy(),
                                  nt.native_table_lookup_or_init(dram, probe, cats, probe, insert=False).numpy())
    for part in range(3):
        a, b = nt.native_table_find(dram, probe, part=part), nt.native_table_find(tiered, probe, part=part)
        np.testing.assert_array_equal(a.values.numpy(), b.values.numpy(), err_msg=f"part {part}")
        np.testing.assert_array_equal(a.exists.numpy(), b.exists.numpy())
    after = stats(tiered)
    assert (after["dram_rows"], after["disk_rows"]) == (before["dram_rows"], before["disk_rows"])
    assert_same_tables(dram, tiered)


def test_upserts_of_cold_and_new_keys(tmp_path):
    dram, tiered = make_pair(tmp_path, "upsert", "adagrad")
    train([dram, tiered], 10, seed=3)
    rng = np.random.default_rng(9)
    keys = rng.choice(ID_SPACE * 2, 150, replace=True).astype(np.int64)  # cold, cached, new and repeated keys
    for part in (0, 1):
        values = rng.standard_normal((len(keys), DIM)).astype(np.float32)
        for table in (dram, tiered):
            nt.native_table_upsert(table, keys, values, part=part)
    assert_same_tables(dram, tiered)


def test_changes_follow_rows_across_tiers(tmp_path):
    """What a publish reads (changed rows, removed keys) is the all-DRAM table's, whichever tier holds a row."""
    dram, tiered = make_pair(tmp_path, "changes", "adagrad")
    train([dram, tiered], 8, seed=4, remove_every=0)
    for table in (dram, tiered):
        nt.native_table_clear_changes(table)
    train([dram, tiered], 10, seed=5, remove_every=3)
    (ka, ra, sa, rma), (kb, rb, sb, rmb) = ([x.numpy() for x in nt.native_table_changes(t)] for t in (dram, tiered))
    oa, ob = np.argsort(ka), np.argsort(kb)
    np.testing.assert_array_equal(ka[oa], kb[ob])
    np.testing.assert_array_equal(ra[oa], rb[ob])
    np.testing.assert_array_equal(sa[oa], sb[ob])
    np.testing.assert_array_equal(rma, rmb)
    assert len(rma) > 0 and len(ka) > stats(tiered)["dram_capacity_rows"]  # changed rows on disk too
    for table in (dram, tiered):
        nt.native_table_clear_changes(table)
    assert all(len(x.numpy()) == 0 for x in (nt.native_table_changes(tiered)[0], nt.native_table_changes(tiered)[3]))


def test_access_status_across_tiers(tmp_path):
    dram, tiered = make_pair(tmp_path, "access", "sgd")
    train([dram, tiered], 12, seed=6)

    def status(table):
        keys, counts, last, clock = (x.numpy() for x in nt.native_table_access_status(table))
        order = np.argsort(keys)
        return keys[order], counts[order], last[order], clock

    for x, y in zip(status(dram), status(tiered)):
        np.testing.assert_array_equal(x, y)
    keys = status(dram)[0][::3]  # held keys, most of them on disk in the tiered table
    counts, last = np.arange(len(keys), dtype=np.int64) + 1, np.full(len(keys), 5, np.int64)
    for table in (dram, tiered):
        nt.native_table_set_access_status(table, keys, counts, last, 20)
    for x, y in zip(status(dram), status(tiered)):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(tf.errors.InvalidArgumentError, match="is not in the table"):
        nt.native_table_set_access_status(tiered, np.array([keys[0], 10**12], np.int64), np.ones(2, np.int64),
                                          np.ones(2, np.int64), 20)
    assert_same_tables(dram, tiered)


def test_a_call_larger_than_the_cache_is_an_error_naming_the_table(tmp_path):
    _, tiered = make_pair(tmp_path, "small", "adagrad", dram_bytes=20_000)
    capacity = stats(tiered)["dram_capacity_rows"]
    keys = np.arange(capacity + 10, dtype=np.int64)
    with pytest.raises(tf.errors.ResourceExhaustedError, match=r"small_tiered.*needs \d+ keys in DRAM.*raise "
                                                               r"dram_bytes"):
        nt.native_table_lookup_or_init(tiered, keys, np.zeros_like(keys, np.int32), keys)
    assert int(nt.native_table_size(tiered)) == 0  # nothing half-done


def test_budget_and_path_checks(tmp_path):
    with pytest.raises(tf.errors.FailedPreconditionError, match="holds no rows"):
        nt.NativeTableResource("tiny", dim=DIM, salts=SALTS, tier_path=str(tmp_path / "tiny"), tier_dram_bytes=100)
    with pytest.raises(ValueError, match="needs a tier_path"):
        nt.NativeTableResource("nopath", dim=DIM, salts=SALTS, tier_dram_bytes=10_000)
    with pytest.raises(ValueError, match="tier_dram_bytes > 0"):
        nt.NativeTableResource("nobytes", dim=DIM, salts=SALTS, tier_path=str(tmp_path / "x"))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(tf.errors.FailedPreconditionError, match=r"foreign is a directory that is not empty.*left "
                                                                r"alone"):
        nt.NativeTableResource("f", dim=DIM, salts=SALTS, tier_path=str(foreign), tier_dram_bytes=60_000)
    assert (foreign / "notes.txt").read_text() == "mine"


def test_a_store_of_another_table_is_refused_naming_the_file(tmp_path):
    path = str(tmp_path / "shared")
    first = nt.NativeTableResource("first", dim=DIM, salts=SALTS, tier_path=path, tier_dram_bytes=60_000)
    with pytest.raises(tf.errors.FailedPreconditionError, match=r"holds the store of another table \(.*shared/"
                                                                r"FUSEDREC_TABLE names 'table=first"):
        nt.NativeTableResource("second", dim=DIM, salts=SALTS, tier_path=path, tier_dram_bytes=60_000)
    del first


def test_the_store_is_removed_with_its_table(tmp_path):
    dram, tiered = make_pair(tmp_path, "gone", "sgd")
    train([tiered], 6, seed=7, remove_every=0)
    store = tmp_path / "gone"
    assert (store / "FUSEDREC_TABLE").exists() and stats(tiered)["disk_rows"] > 0
    del tiered
    import gc  # noqa: PLC0415
    gc.collect()
    assert not store.exists()


_KILLED = """
import os, sys, numpy as np
from tf_fusedrec.ops import native_table_ops as nt
t = nt.NativeTableResource("crash", dim=8, salts=[1], tier_path=sys.argv[1], tier_dram_bytes=30000)
k = np.arange(2000, dtype=np.int64)
for s in range(0, 2000, 100):
    nt.native_table_lookup_or_init(t, k[s:s + 100], np.zeros(100, np.int32), k[s:s + 100])
print(int(nt.native_table_tier_stats(t)[1]), flush=True)
os._exit(0)  # like a SIGKILL: no destructor runs, the store stays
"""


def test_a_killed_runs_store_of_the_same_table_starts_empty(tmp_path):
    path = tmp_path / "crash"
    out = subprocess.run([sys.executable, "-c", _KILLED, str(path)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[-1]) > 0 and (path / "FUSEDREC_TABLE").exists()
    table = nt.NativeTableResource("crash", dim=8, salts=[1], tier_path=str(path), tier_dram_bytes=30000)
    assert int(nt.native_table_size(table)) == 0
    s = stats(table)
    assert s["disk_rows"] == 0
    assert len(nt.native_table_export(table).keys.numpy()) == 0


_MEMORY = """
import json, sys, numpy as np
from tf_fusedrec.ops import native_table_ops as nt

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))

budget, tiered, path = int(sys.argv[1]), sys.argv[2] == "tiered", sys.argv[3]
kw = dict(tier_path=path, tier_dram_bytes=budget) if tiered else {}
t = nt.NativeTableResource("mem", dim=32, optimizer="adagrad", salts=[1], **kw)
batch = 20000
k = np.arange(batch, dtype=np.int64)
c = np.zeros(batch, np.int32)
nt.native_table_lookup_or_init(t, k, c, k)  # warm up TensorFlow's own allocations
base = rss()
peak = 0
for s in range(1, 80):
    keys = k + s * batch
    nt.native_table_lookup_or_init(t, keys, c, keys)
    peak = max(peak, rss() - base)
print(json.dumps({"rows": int(nt.native_table_size(t)), "peak_growth": peak,
                  "stats": nt.native_table_tier_stats(t).numpy().tolist()}))
"""


def test_resident_memory_stays_within_the_budget(tmp_path):
    """A table of 1.6M rows of dim 32 with Adagrad (over 4x its budget in a tiered table): the process's resident
    set grows by at most dram_bytes plus the stated overhead (RocksDB's block cache and write buffers,
    tier.STORE_OVERHEAD_BYTES); the all-DRAM table grows past that bound, so the check can fail."""
    from tf_fusedrec.distributed.tier import STORE_OVERHEAD_BYTES  # noqa: PLC0415

    budget = 96 << 20
    results = {}
    for mode in ("tiered", "dram"):
        out = subprocess.run([sys.executable, "-c", _MEMORY, str(budget), mode, str(tmp_path / mode)],
                             capture_output=True, text=True, timeout=300,
                             env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        assert out.returncode == 0, out.stderr[-3000:]
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    tiered, dram = results["tiered"], results["dram"]
    row_bytes = 8 + 2 * 32 * 4  # key, row, accumulator
    assert tiered["rows"] == dram["rows"] == 80 * 20000
    assert tiered["rows"] * row_bytes >= 4 * budget  # the table is over 4x the budget
    assert tiered["stats"][1] > 0  # rows on disk
    bound = budget + STORE_OVERHEAD_BYTES + (32 << 20)  # + slack for the step's tensors and allocator pages
    assert tiered["peak_growth"] <= bound, (tiered, bound)
    assert dram["peak_growth"] > bound, (dram, bound)


def chunked_export(table, max_rows, graph=False):
    """(keys, rows, slots, counts, lasts) of every chunk of native_table_export_chunk, concatenated, and the number of
    calls it took."""
    call = nt.native_table_export_chunk
    if graph:
        call = tf.function(lambda cursor: nt.native_table_export_chunk(table, cursor, max_rows))
    parts, cursor, calls = [], nt.EXPORT_START, 0
    while tuple(cursor) != nt.EXPORT_DONE:
        out = call(tf.constant(cursor, tf.int64)) if graph else call(table, cursor, max_rows)
        parts.append([x.numpy() for x in out[:5]])
        cursor, calls = tuple(out.next.numpy().tolist()), calls + 1
        assert calls < 10_000
    return [np.concatenate([p[i] for p in parts]) for i in range(5)], calls


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("max_rows", [1, 97, 100_000])
def test_a_chunked_export_gives_every_row_once(tmp_path, max_rows, graph):
    """Chunks over a tiered table (most rows on disk) and an all-DRAM one give each key once, with the rows, slots and
    access stats the whole export and native_table_access_status give; the tiered table's chunks hold its DRAM rows
    then its stored rows."""
    dram, tiered = make_pair(tmp_path, f"chunks{max_rows}{graph}", optimizer="adam")
    train([dram, tiered], 12, seed=3)
    assert stats(tiered)["disk_rows"] > 1000
    for table in (dram, tiered):
        (keys, rows, slots, counts, lasts), calls = chunked_export(table, max_rows, graph)
        size = int(nt.native_table_size(table))
        assert len(keys) == size and len(np.unique(keys)) == size
        assert calls >= -(-size // max_rows)
        order = np.argsort(keys)
        for x, y, what in zip(sorted_export(table), (keys[order], rows[order], slots[order]), ("keys", "rows", "slots")):
            np.testing.assert_array_equal(x, y, err_msg=what)
        status_keys, status_counts, status_lasts, clock = (x.numpy() for x in nt.native_table_access_status(table))
        assert int(nt.native_table_export_chunk(table, nt.EXPORT_START, 1).clock) == clock == 12
        at = np.argsort(status_keys)
        np.testing.assert_array_equal(status_counts[at], counts[order])
        np.testing.assert_array_equal(status_lasts[at], lasts[order])


def test_a_chunked_export_of_an_empty_table_and_bad_cursors(tmp_path):
    """An empty table exports in one empty chunk (a tiered one in two: DRAM, then the store); an unknown phase or
    max_rows < 1 is an error naming the table; a table not counting accesses gives zero stats."""
    dram, tiered = make_pair(tmp_path, "chunks_empty", track_access=False)
    for table, expected_calls in ((dram, 1), (tiered, 2)):
        (keys, rows, slots, counts, lasts), calls = chunked_export(table, 10)
        assert (len(keys), rows.shape, calls) == (0, (0, DIM), expected_calls)
        with pytest.raises(tf.errors.InvalidArgumentError, match="chunks_empty.*phase 7"):
            nt.native_table_export_chunk(table, [7, 0], 10)
        with pytest.raises(tf.errors.InvalidArgumentError, match="chunks_empty.*max_rows >= 1"):
            nt.native_table_export_chunk(table, nt.EXPORT_START, 0)
    train([dram], 2)
    (keys, _, _, counts, lasts), _ = chunked_export(dram, 50)
    assert len(keys) and not counts.any() and not lasts.any()

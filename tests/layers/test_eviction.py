"""Tables that evict (FusedEmbedding(eviction=fr.Eviction(...)), tf_fusedrec/distributed/eviction.py) on one worker.

* victims() against a NumPy sort on random statuses with ties, both policies, protected keys, capacity above the
  size, and protected keys alone over the capacity;
* a training run keeps exactly the rows a plain-Python simulation of the counts, recency and eviction rule keeps,
  after every step, LFU and LRU, eager and tf.function, float32 and float16 storage; optimizer slots leave with their
  rows; the keys of the step just trained are never evicted;
* an evicted id comes back with its initializer's row and fresh optimizer state (as an id never seen);
* checkpoints keep the access status (both backends, LFU and LRU, with expiry too): a restored layer exports the
  saved status, clock and counters and evicts, step after step, exactly the rows the uninterrupted run evicts; full +
  delta checkpoints restore the status of a full checkpoint; restored onto 2 workers each key's status goes with its
  row; a checkpoint without a status (written before it was saved) restores an empty one (and then evicts other
  rows);
* bad capacities, policies, intervals and feature names are ValueErrors naming them.
"""

import hashlib
import io
import json

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tf_fusedrec import initializers
from tf_fusedrec.distributed import eviction
from tf_fusedrec.distributed.comm import SingleProcessComm
from tf_fusedrec.ops import reference as ops_reference
from tf_fusedrec.train import checkpoint as checkpoint_lib
from tf_fusedrec.train.checkpoint import Checkpointer

VOCAB = 16


# --- the choice -----------------------------------------------------------------------------------------------------

def numpy_victims(keys, counts, lasts, clock, capacity, policy):
    excess = max(len(keys) - capacity, 0)
    rows = [(c, l, k) if policy == "lfu" else (l, c, k) for k, c, l in zip(keys, counts, lasts) if l != clock]
    return [r[2] for r in sorted(rows)[:excess]]


@pytest.mark.parametrize("policy", ["lfu", "lru"])
@pytest.mark.parametrize("seed", range(8))
def test_victims_equal_numpy(policy, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 40))
    keys = rng.choice(2 ** 40, n, replace=False).astype(np.int64) - 2 ** 39  # negative keys too
    counts = rng.integers(1, 4, n).astype(np.int64)   # few values: ties
    clock = 10
    lasts = rng.integers(7, clock + 1, n).astype(np.int64)
    for capacity in (0, 1, n // 2, n, n + 3):
        got = eviction.victims(tf.constant(keys), tf.constant(counts), tf.constant(lasts), tf.constant(clock, tf.int64),
                               capacity, policy).numpy().tolist()
        assert got == numpy_victims(keys, counts, lasts, clock, capacity, policy), (capacity, policy)


def test_protected_keys_alone_over_capacity_are_kept():
    keys, counts = tf.constant([1, 2, 3], tf.int64), tf.constant([1, 1, 1], tf.int64)
    got = eviction.victims(keys, counts, tf.constant([5, 5, 4], tf.int64), tf.constant(5, tf.int64), 1, "lfu")
    assert got.numpy().tolist() == [3]


# --- training ---------------------------------------------------------------------------------------------------------

class Simulation:
    """The counts, recency and eviction rule of eviction.py, in plain Python, on ids (one feature, one table)."""

    def __init__(self, capacity, policy, interval):
        self.capacity, self.policy, self.interval = capacity, policy, interval
        self.held, self.status, self.clock, self.updates = set(), {}, 0, 0

    def step(self, ids):
        self.clock += 1
        for i in set(ids.tolist()):
            count = self.status.get(i, (0, 0))[0]
            self.status[i] = (count + 1, self.clock)
            self.held.add(i)
        self.updates += 1
        if self.updates % self.interval == 0:
            keys = sorted(self.held)
            gone = numpy_victims(keys, [self.status[k][0] for k in keys], [self.status[k][1] for k in keys],
                                 self.clock, self.capacity, self.policy)
            self.held -= set(gone)
            for k in gone:
                del self.status[k]
        return self.held


def make_layer(policy, storage="float32", capacity=5, interval=2, name="ev"):
    features = [fr.Feature("a", dim=4, max_id_bits=8, optimizer={"name": "adagrad", "learning_rate": 0.3})]
    # The TFRA backend's tables: these tests read its status table and optimizer slots directly (the native
    # backend evicts the same rows: test_native_backend.py, test_native_eviction_evicts_like_tfra).
    layer = fr.FusedEmbedding(features, eviction=fr.Eviction(capacity=capacity, policy=policy, interval=interval),
                              storage=storage, table_backend="tfra", name=name)
    optimizer = fr.train.make_optimizer(layer, default="sgd")

    def step(ids):
        with tf.GradientTape() as tape:
            out = layer({"a": ids}, training=True)["a"]
            loss = tf.reduce_sum(tf.square(out - 0.5))
        optimizer.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))
        return out

    return layer, optimizer, step


def held_ids(layer, optimizer):
    """Ids of the rows of the layer's table, checking the slots and the status hold the same keys."""
    sharded = layer.sharded_tables()[0]
    keys = sharded.params.export()[0].numpy()
    table = layer.tables[0]
    slot = optimizer.sparse_optimizer_of(table.shadow).get_slot(table.shadow, "accumulator").params
    assert sorted(slot.export()[0].numpy().tolist()) == sorted(keys.tolist()), "slots not evicted with their rows"
    assert sorted(table.status.export()[0].numpy().tolist()) == sorted(keys.tolist()), "status out of step"
    return set(sharded.ids_of_keys(keys).tolist())


@pytest.mark.parametrize("policy, storage, mode", [
    ("lfu", "float32", "function"), ("lru", "float32", "function"), ("lfu", "float16", "function"),
    ("lru", "float32", "eager")])
@pytest.mark.tfra
def test_training_keeps_what_the_simulation_keeps(policy, storage, mode):
    layer, optimizer, step = make_layer(policy, storage)
    step = tf.function(step) if mode == "function" else step
    sim = Simulation(capacity=5, policy=policy, interval=2)
    rng = np.random.default_rng(3)
    for s in range(12):
        ids = (rng.zipf(1.3, 4) % VOCAB).astype(np.int64)
        step(tf.constant(ids))
        want = sim.step(ids)
        assert held_ids(layer, optimizer) == want, f"step {s}"
        assert set(ids.tolist()) <= want, "a row of the step just trained was evicted"
    stats = layer.eviction_statistics()
    (group,) = stats
    assert stats[group]["capacity"] == 5 and stats[group]["evicted"] > 0 and stats[group]["rows"] == len(sim.held)


@pytest.mark.tfra
def test_one_step_over_capacity_keeps_its_rows():
    layer, optimizer, step = make_layer("lru", capacity=2, interval=1)
    step(tf.constant([1, 2, 3, 4, 5], tf.int64))
    assert held_ids(layer, optimizer) == {1, 2, 3, 4, 5}
    step(tf.constant([6], tf.int64))
    assert held_ids(layer, optimizer) == {6, 5}  # 5 was read in step 1 like the others: the larger key stays


@pytest.mark.tfra
def test_evicted_id_comes_back_as_new():
    layer, optimizer, step = make_layer("lru", capacity=1, interval=1, name="back")
    fresh, fresh_optimizer, fresh_step = make_layer("lru", capacity=100, interval=1, name="fresh")
    init = initializers.hashed_rows_numpy([7], [initializers.feature_salt(0, "a")], 4, 0.05)
    np.testing.assert_array_equal(step(tf.constant([7], tf.int64)).numpy(), init)
    step(tf.constant([8], tf.int64))  # 7 is evicted
    assert held_ids(layer, optimizer) == {8}
    np.testing.assert_array_equal(layer({"a": tf.constant([7], tf.int64)}, training=False)["a"].numpy(), init)
    # Read again, it trains like an id never seen: its row and accumulator start anew.
    np.testing.assert_array_equal(step(tf.constant([7], tf.int64)).numpy(), init)
    fresh_step(tf.constant([7], tf.int64))
    np.testing.assert_array_equal(layer({"a": tf.constant([7], tf.int64)}, training=False)["a"].numpy(),
                                  fresh({"a": tf.constant([7], tf.int64)}, training=False)["a"].numpy())


# --- checkpoints ------------------------------------------------------------------------------------------------------

class Holder(tf.Module):
    def __init__(self, layer):
        super().__init__()
        self.emb = layer


class Checkpointed:
    """An evicting (and expiring) layer of two features sharing one table (packed keys: ids differ from keys), its
    optimizer and step counter: what a Checkpointer takes."""

    def __init__(self, backend, eviction=None, expiry=None, name="ck"):
        opt = {"name": "adagrad", "learning_rate": 0.3}
        features = [fr.Feature(n, dim=4, max_id_bits=8, optimizer=opt) for n in ("a", "b")]
        self.layer = fr.FusedEmbedding(features, eviction=eviction, expiry=expiry, table_backend=backend, name=name)
        self.optimizer = fr.train.make_optimizer(self.layer, default="sgd")
        self.counter = tf.Variable(0, dtype=tf.int64)
        self._train = tf.function(self._train_step)

    def _train_step(self, inputs):
        with tf.GradientTape() as tape:
            out = self.layer(inputs, training=True)
            loss = tf.reduce_sum(tf.square(out["a"] - 0.5)) + tf.reduce_sum(tf.square(out["b"] + 0.5))
        variables = self.layer.trainable_variables
        self.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    def step(self, s):
        rng = np.random.default_rng([7, s])
        # Skewed ids from uniform draws (NumPy 2 changed Generator.zipf's stream, not Generator.random's): the same
        # ids under NumPy 1 and 2.
        loss = self._train({n: tf.constant((VOCAB * rng.random(5) ** 3).astype(np.int64), tf.int64)
                            for n in ("a", "b")})
        self.counter.assign_add(1)
        return float(loss)

    def checkpointer(self, model_dir, full_every=0, comm=None, part_bytes=None):
        """part_bytes: a native table over it is written in part files (a few rows each at 200)."""
        parts = {} if part_bytes is None else {"part_bytes": part_bytes}
        return Checkpointer(str(model_dir), Holder(self.layer), self.optimizer, self.counter,
                            comm or SingleProcessComm(), keep=5, full_every=full_every, **parts)

    def status(self):
        """(sorted [(key, count, last)], clock, evicted, expired) of the table."""
        table = self.layer.tables[0]
        keys, counts, lasts, clock = (np.asarray(x) for x in table.access_status())
        return (sorted(zip(keys.tolist(), counts.tolist(), lasts.tolist())), int(clock), int(table.evicted.numpy()),
                int(table.expired.numpy()))

    def rows(self):
        """{(key, "row" or slot name): values} of every row and optimizer slot held."""
        table = self.layer.tables[0]
        self.optimizer.create_slots([table.trainable])
        keys = table.export()[0]
        out = {}
        for what, part in [("row", table.rows)] + self.optimizer.slot_tables(table.trainable):
            values, exists = part.lookup(keys, return_exists=True)
            out.update({(int(k), what): v for k, v, e in zip(keys.numpy(), values.numpy(), exists.numpy()) if e})
        return out


class RankOfTwo(SingleProcessComm):
    """Rank `rank` of 2 as the checkpoint restore sees it (every collective it issues is the identity here)."""

    size = 2

    def __init__(self, rank):
        self.rank = rank


def assert_same_rows(got, want, what):
    assert sorted(got) == sorted(want), f"{what}: {sorted(set(got) ^ set(want))[:6]}"
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"{what}: {k}")


def strip_status(model_dir, step):
    """Makes ckpt-{step} what a checkpoint written before the status was saved looks like: its shards without the
    status arrays and counters (the manifest's digests follow)."""
    directory = model_dir / f"ckpt-{step}"
    manifest = json.loads((directory / "manifest.json").read_text())
    for name, entry in manifest["files"].items():
        if name.startswith("shard-"):
            with np.load(directory / name) as z:
                kept = {k: z[k] for k in z.files if ".status." not in k and not k.endswith((".evicted", ".expired"))}
                assert len(kept) < len(z.files), "no status to strip"
            buffer = io.BytesIO()
            np.savez(buffer, **kept)
            data = buffer.getvalue()
            (directory / name).write_bytes(data)
            entry.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (directory / "manifest.json").write_text(json.dumps(manifest))


# The native table also written in part files of a few rows (Checkpointer(part_bytes=...)): each part carries its
# rows' status, the shard the clock and counters.
BACKENDS = [("tfra", None), ("native", None), ("native", 200)]


def assert_parts(model_dir, step, part_bytes):
    """The checkpoint has part files (format 3) when part_bytes was given, none (format 2) otherwise."""
    directory = model_dir / f"ckpt-{step}"
    manifest = json.loads((directory / "manifest.json").read_text())
    parts = sorted(p.name for p in directory.glob("*.part-*.npz"))
    assert (manifest["format"], bool(parts)) == ((3, True) if part_bytes else (2, False)), (manifest, parts)
    if part_bytes:
        with np.load(directory / "shard-0-of-1.npz") as z:
            assert "t0.keys" not in z.files and "t0.status.clock" in z.files and len(z["parts.bytes"]) == len(parts)


@pytest.mark.parametrize("backend, part_bytes", BACKENDS, ids=["tfra", "native", "native-parts"])
@pytest.mark.parametrize("policy", ["lfu", "lru"])
def test_restored_layer_evicts_like_the_uninterrupted_one(tmp_path, backend, part_bytes, policy):
    evict = fr.Eviction(capacity=14, policy=policy, interval=3)  # a restore without the status evicts other rows
    writer = Checkpointed(backend, evict)
    for s in range(7):
        writer.step(s)
    writer.checkpointer(tmp_path, part_bytes=part_bytes).save()
    if backend == "native":
        assert_parts(tmp_path, 7, part_bytes)
    saved, rows = writer.status(), writer.rows()
    assert saved[2] > 0 and max(c for _, c, _ in saved[0]) > 1, "nothing evicted or read twice: the test tests little"
    losses, held = [], []
    for s in range(7, 16):
        losses.append(writer.step(s))
        held.append((sorted({k for k, _ in writer.rows()}), writer.status()[2]))
    tf.keras.backend.clear_session()

    reader = Checkpointed(backend, evict)
    assert reader.checkpointer(tmp_path).restore()["step"] == 7
    assert reader.status() == saved
    assert_same_rows(reader.rows(), rows, "restored rows and slots")
    for s, loss, (keys, evicted) in zip(range(7, 16), losses, held):
        assert reader.step(s) == loss, f"loss at step {s}"
        assert (sorted({k for k, _ in reader.rows()}), reader.status()[2]) == (keys, evicted), f"after step {s}"
    assert reader.status() == writer.status()
    assert_same_rows(reader.rows(), writer.rows(), "rows and slots after training on")


def test_a_restore_from_parts_reads_each_part_once(tmp_path, monkeypatch):
    """The rows' status is in their part file: set from the same read as the rows (it was read a second time, after
    every row), and equal to what the uninterrupted table holds."""
    writer = Checkpointed("native", fr.Eviction(capacity=14, policy="lfu", interval=3))
    for s in range(7):
        writer.step(s)
    writer.checkpointer(tmp_path, part_bytes=200).save()
    saved, rows = writer.status(), writer.rows()
    tf.keras.backend.clear_session()
    reads = []
    read_part = checkpoint_lib._read_part
    monkeypatch.setattr(checkpoint_lib, "_read_part", lambda path, *a: reads.append(path) or read_part(path, *a))
    reader = Checkpointed("native", fr.Eviction(capacity=14, policy="lfu", interval=3))
    assert reader.checkpointer(tmp_path).restore()["step"] == 7
    parts = sorted(str(p) for p in (tmp_path / "ckpt-7").glob("*.part-*.npz"))
    assert len(parts) > 2 and sorted(reads) == parts, (reads, parts)
    assert reader.status() == saved
    assert_same_rows(reader.rows(), rows, "restored rows and slots")


def test_deltas_after_a_full_checkpoint_in_parts_restore_the_newest_status(tmp_path):
    """A run that checkpointed in parts, resumed with delta checkpoints (full_every > 0): the chain is the full
    checkpoint in parts and the deltas, and the status restored is the uninterrupted table's (the newest delta's)."""
    evict = fr.Eviction(capacity=14, policy="lru", interval=3)
    writer = Checkpointed("native", evict)
    for s in range(7):
        writer.step(s)
    writer.checkpointer(tmp_path, part_bytes=200).save()
    assert_parts(tmp_path, 7, 200)
    resumed = writer.checkpointer(tmp_path, full_every=100)
    assert resumed.restore()["step"] == 7
    for s in range(7, 12):
        writer.step(s)
    resumed.save()
    assert resumed.written[-1]["kind"] == "delta"
    live, rows = writer.status(), writer.rows()
    tf.keras.backend.clear_session()
    reader = Checkpointed("native", evict)
    info = reader.checkpointer(tmp_path, full_every=100).restore()
    assert [link["kind"] for link in info["chain"]] == ["full", "delta"]
    assert reader.status() == live
    assert_same_rows(reader.rows(), rows, "rows and slots")


@pytest.mark.parametrize("backend, part_bytes", BACKENDS + [("native", 700), ("native", 950)],
                         ids=["tfra", "native", "native-parts", "native-into-parts", "native-in-and-out-of-parts"])
def test_full_plus_deltas_restore_the_status_of_a_full_restore(tmp_path, backend, part_bytes):
    """Every delta holds the whole status: a key read without its row changing (Adagrad's zero gradient) still has a
    new count and last; the chain restores what the full checkpoint of the same step restores. native-parts: the
    table in part files of a few rows, the deltas' parts holding the changed rows (found by digests) and the whole
    status; native-into-parts: the table outgrows part_bytes after the first checkpoint (a delta against the rows
    held whole, written in parts); native-in-and-out-of-parts: then shrinks below it (a delta held whole against the
    digests of the parts)."""
    evict, expiry = fr.Eviction(capacity=16, policy="lru", interval=3), fr.Expiry(4, interval=2)
    writer = Checkpointed(backend, evict, expiry)
    delta = writer.checkpointer(tmp_path / "delta", full_every=100, part_bytes=part_bytes)
    full = writer.checkpointer(tmp_path / "full", part_bytes=part_bytes)
    sizes = []
    for s in range(6):
        writer.step(s)
        if s % 2 == 1:
            delta.save()
            full.save()
            sizes.append(int(writer.layer.tables[0].params.size()))
    assert [w["kind"] for w in delta.written] == ["full", "delta", "delta"]
    if part_bytes is None:
        with np.load(tmp_path / "delta" / "ckpt-6" / "shard-0-of-1.npz") as z:
            assert len(z["t0.status.keys"]) == len(z["t0.status.counts"]) > len(z["t0.keys"]), "a delta of every row"
    else:
        entry = writer.layer.tables[0].params.entry_bytes()
        in_parts = [size * entry > part_bytes for size in sizes]
        assert in_parts == {200: [True] * 3, 700: [False, True, True], 950: [False, True, False]}[part_bytes], sizes
        for step, expected in zip((2, 4, 6), in_parts):
            parts = sorted((tmp_path / "delta" / f"ckpt-{step}").glob("*.part-*.npz"))
            assert bool(parts) == expected, (step, parts)
            if parts and step > 2:
                changed = status = 0
                for part in parts:
                    with np.load(part) as z:
                        changed += len(z["t0.keys"])
                        status += len(z["t0.status.keys"])
                assert status == sizes[step // 2 - 1] > changed > 0, ("a delta's parts: the changed rows and every "
                                                                      "key's status", step, status, changed, sizes)
    live, rows = writer.status(), writer.rows()
    assert live[2] > 0 and live[3] > 0, "nothing evicted or expired: the test tests little"
    restored = {}
    for kind in ("delta", "full"):
        tf.keras.backend.clear_session()
        reader = Checkpointed(backend, evict, expiry)
        info = reader.checkpointer(tmp_path / kind).restore()
        assert [link["kind"] for link in info["chain"]] == (["full", "delta", "delta"] if kind == "delta" else ["full"])
        restored[kind] = reader.status()
        assert_same_rows(reader.rows(), rows, f"{kind}: rows and slots")
    assert restored["delta"] == restored["full"] == live


@pytest.mark.parametrize("backend, kind", [(b, k) for b in ("tfra", "native") for k in ("full", "delta")]
                         + [("native", "parts")])  # part files: native tables only
def test_status_goes_with_its_row_onto_two_workers(tmp_path, backend, kind):
    """A 1-worker checkpoint restored by each rank of 2: each key's status lands where its row does (the rows' owner
    filter, from the ids a delta's status carries too, or a part file's), every rank takes the clock, rank 0 the
    evicted counter."""
    evict = fr.Eviction(capacity=14, policy="lfu", interval=3)
    writer = Checkpointed(backend, evict)
    checkpointer = writer.checkpointer(tmp_path, full_every=100 if kind == "delta" else 0,
                                       part_bytes=200 if kind == "parts" else None)
    for s in range(7):
        writer.step(s)
        if s in (3, 6):
            checkpointer.save()
    assert [w["kind"] for w in checkpointer.written] == ["full", "delta" if kind == "delta" else "full"]
    if kind == "parts":
        assert_parts(tmp_path, 7, 200)
    entries, clock, evicted, _ = writer.status()
    assert evicted > 0
    union = []
    for rank in range(2):
        tf.keras.backend.clear_session()
        reader = Checkpointed(backend, evict)
        assert reader.checkpointer(tmp_path, comm=RankOfTwo(rank)).restore()["step"] == 7
        got, got_clock, got_evicted, _ = reader.status()
        counted = [e for e in got if e[1:] != (0, 0)]
        keys = np.array([k for k, _, _ in counted], np.int64)
        ids = reader.layer.sharded_tables()[0].ids_of_keys(keys)
        assert (ops_reference.owner_of(ids, 2) == rank).all(), f"rank {rank} holds the status of keys it does not own"
        assert set(keys.tolist()) <= {k for k, _ in reader.rows()}, f"rank {rank}: a status without its row"
        assert (got_clock, got_evicted) == (clock, evicted if rank == 0 else 0)
        union += counted
    assert sorted(union) == [e for e in entries if e[1:] != (0, 0)]


@pytest.mark.parametrize("backend", ["tfra", "native"])
def test_checkpoint_without_status_restores_an_empty_status(tmp_path, backend):
    evict = fr.Eviction(capacity=14, policy="lfu", interval=3)
    writer = Checkpointed(backend, evict, fr.Expiry(5, interval=2))
    for s in range(7):
        writer.step(s)
    writer.checkpointer(tmp_path).save()
    rows = writer.rows()
    held = []
    for s in range(7, 16):
        writer.step(s)
        held.append(sorted({k for k, _ in writer.rows()}))
    strip_status(tmp_path, 7)
    tf.keras.backend.clear_session()

    reader = Checkpointed(backend, evict, fr.Expiry(5, interval=2))
    assert reader.checkpointer(tmp_path).restore()["step"] == 7
    assert_same_rows(reader.rows(), rows, "restored rows and slots")
    entries, clock, evicted, expired = reader.status()
    # TFRA: no entry; native: an entry (0, 0) beside each row.
    assert [e for e in entries if e[1:] != (0, 0)] == [] and (clock, evicted, expired) == (0, 0, 0)
    got = []
    for s in range(7, 16):
        reader.step(s)
        got.append(sorted({k for k, _ in reader.rows()}))
    assert got != held, "the status made no difference: the tests of its checkpoint test nothing"


# --- errors -----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    ({"capacity": 0}, "capacity must be an integer >= 1"),
    ({"capacity": -3}, "capacity must be an integer >= 1"),
    ({"capacity": True}, "capacity must be an integer >= 1"),
    ({"capacity": 2.5}, "capacity must be an integer >= 1"),
    ({"capacity": {"a": 0}}, "capacity of feature 'a' must be an integer >= 1"),
    ({"capacity": 5, "policy": "fifo"}, "policy must be one of"),
    ({"capacity": 5, "interval": 0}, "interval must be an integer >= 1"),
])
def test_bad_eviction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fr.Eviction(**kwargs)


def test_capacity_of_unknown_or_conflicting_features():
    features = [fr.Feature("a", dim=4), fr.Feature("b", dim=4)]  # one group
    with pytest.raises(ValueError, match=r"names features the layer does not have: \['zz'\]"):
        fr.FusedEmbedding(features, eviction=fr.Eviction(capacity={"zz": 3}), name="e1")
    with pytest.raises(ValueError, match="share one table .* different capacities"):
        fr.FusedEmbedding(features, eviction=fr.Eviction(capacity={"a": 3, "b": 4}), name="e2")
    with pytest.raises(ValueError, match="eviction must be None or fr.Eviction"):
        fr.FusedEmbedding(features, eviction=5, name="e3")
    layer = fr.FusedEmbedding(features, eviction=fr.Eviction(capacity={"a": 3}), name="e4")
    assert layer.access_tables() == layer.tables  # what checkpoints save the status of

"""Delta checkpoints (tf_fusedrec/train/checkpoint.py, full_every; tests/distributed/delta_scenario.py).

Three launches, shared by the module (each trains and restores every case of delta_scenario.CASES: native float32
Adagrad; native float16 Adam with eviction; native float32 Adagrad with eviction, every checkpoint in part files of a
couple of rows; TFRA float16 Adam with eviction, where the [tfra] extra is installed):

* 2 workers train 6 steps, saving at 2 (full), 4 and 6 (deltas) and a full checkpoint at each of those steps beside;
* 1 worker does the same in its own directory, and restores the 2-worker directory (2 -> 1);
* 2 workers restore the 1-worker directory (1 -> 2), try damaged copies of the 2-worker one, then continue the
  1-worker directory to step 8 (a delta written by 2 workers on a chain written by 1) and restore it again.

Each restore from full + deltas equals, bit for bit, the restore of the full checkpoint of the same step (rows, slot
rows, dense weights and slots, the step; with eviction each row's access status, the clock and every worker's evicted
counter, also onto another worker count), and the trained model it came from; a damaged chain stops every worker
with a CheckpointError naming the file; retention keeps whole chains. In-process (one worker): a delta is a small
fraction of a full checkpoint when few rows change, the full/delta schedule, retention dropping a superseded chain,
and the config and constructor checks.
"""

import json
import shutil
import types
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.subprocess_runner import load_script, run_scenario
from tf_fusedrec import config as config_lib
from tf_fusedrec.train import checkpoint as checkpoint_lib

SCENARIO = Path(__file__).resolve().with_name("delta_scenario.py")
TIMEOUT_S = 400
_scenario = load_script(SCENARIO, "delta_scenario")
CASES = tuple(_scenario.CASES)  # what the launches train here
ALL_CASES = tuple(_scenario.ALL_CASES)  # what the tests name (the TFRA ones skipped where TFRA is not installed)


def damage(source, where):
    """Damaged copies of a 2-worker delta directory (checkpoints 2 full, 4 and 6 deltas) -> {label: (path, the file
    the error must name, a phrase of it)}."""
    def copy(label):
        target = where / label
        shutil.copytree(source, target)
        return target

    def flip(path):
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))

    cases = {}
    target = copy("corrupt_delta")  # rank 1 reads it; rank 0 must stop too
    flip(target / "ckpt-6" / "shard-1-of-2.npz")
    cases["corrupt_delta"] = (target, target / "ckpt-6" / "shard-1-of-2.npz", "does not match its sha256")
    target = copy("corrupt_parent")
    flip(target / "ckpt-2" / "shard-0-of-2.npz")
    cases["corrupt_parent"] = (target, target / "ckpt-2" / "shard-0-of-2.npz", "does not match its sha256")
    target = copy("missing_parent_shard")
    (target / "ckpt-4" / "shard-1-of-2.npz").unlink()
    cases["missing_parent_shard"] = (target, target / "ckpt-4" / "shard-1-of-2.npz", "is missing")
    target = copy("missing_link")  # ckpt-4 unpublished: ckpt-6's parent is gone
    (target / "ckpt-4" / "manifest.json").unlink()
    cases["missing_link"] = (target, target / "ckpt-4" / "manifest.json", "cannot be read")
    return cases


def listing(model_dir):
    return sorted(p.name for p in Path(model_dir).iterdir())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    pytest.importorskip("horovod.tensorflow", reason="Horovod (horovod.tensorflow) is not importable")
    where = tmp_path_factory.mktemp("delta")
    root1, root2 = where / "root1", where / "root2"
    two = run_scenario("2 workers train", [SCENARIO, "--train", f"two={root2}", "--steps", 6, "--out", where / "a"],
                       2, where / "a", TIMEOUT_S)
    damaged = damage(root2 / "native" / "delta", where / "damaged")
    one = run_scenario("1 worker trains, restores the 2-worker directory",
                       [SCENARIO, "--train", f"one={root1}", "--steps", 6, "--verify", f"two_on_one={root2}",
                        "--out", where / "b"], 1, where / "b", TIMEOUT_S)
    listings = {f"{root}/{case}/{kind}": listing(path / case / kind) for root, path in (("two", root2), ("one", root1))
                for case in CASES for kind in ("delta", "full")}
    more = run_scenario("2 workers restore the 1-worker directory, try damaged ones, continue it",
                        [SCENARIO, "--verify", f"one_on_two={root1}"]
                        + [a for label, (path, _, _) in damaged.items() for a in ("--damaged", f"{label}={path}")]
                        + ["--train", f"more={root1}", "--steps", 8, "--out", where / "c"], 2, where / "c", TIMEOUT_S)
    listings.update({f"more/{case}/{kind}": listing(root1 / case / kind)
                     for case in CASES for kind in ("delta", "full")})
    ranks = {"two": two, "two_on_one": one, "one": one, "one_on_two": more, "more": more}
    return types.SimpleNamespace(ranks=ranks, root2=root2, damaged=damaged, listings=listings)


def union(ranks, prefix, trained=False):
    """{name: array} of a restored (or `trained`) state over the workers: each table's rows by key (a key held by
    two workers fails), the dense values (equal on every worker after a restore; rank 0's, which the checkpoint
    holds, for a trained model: its per-worker statistics counters differ)."""
    merged, tables = {}, {}
    for data in ranks:
        for name, value in data.items():
            if not name.startswith(prefix + "/") or name.endswith("/restored"):
                continue
            what = name[len(prefix) + 1:]
            if what.startswith("dense/"):
                if what in merged and not trained:
                    np.testing.assert_array_equal(value, merged[what], err_msg=f"{name} differs between workers")
                merged.setdefault(what, value)
            else:
                tables.setdefault(what, []).append(value)
    assert merged, f"nothing under {prefix}"
    for name in [n for n in tables if n.endswith("/keys")]:
        keys = np.concatenate(tables[name])
        assert len(np.unique(keys)) == len(keys), f"{prefix}/{name}: a key held by two workers"
        order = np.argsort(keys)
        table = name[:-len("keys")]
        for part in [n for n in tables if n.startswith(table)]:
            merged[part] = np.concatenate(tables[part])[order]
    return merged


def assert_same(got, want, what):
    assert sorted(got) == sorted(want), f"{what}: {sorted(set(got) ^ set(want))}"
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"{what}: {name}")


def restored_info(ranks, prefix):
    return [json.loads(str(data[f"{prefix}/restored"])) for data in ranks]


# label: (workers that restored, worker count of each checkpoint of the chain, steps of the chain)
RESTORES = {"two": (2, [2, 2, 2], [2, 4, 6]), "two_on_one": (1, [2, 2, 2], [2, 4, 6]),
            "one": (1, [1, 1, 1], [2, 4, 6]), "one_on_two": (2, [1, 1, 1], [2, 4, 6]),
            "more": (2, [1, 1, 1, 2], [2, 4, 6, 8])}


@pytest.mark.parametrize("case", ALL_CASES)
@pytest.mark.parametrize("label", list(RESTORES))
def test_full_plus_deltas_restore_equals_full_restore(runs, label, case):
    ranks = runs.ranks[label]
    workers, writers, chain = RESTORES[label]
    assert len(ranks) == workers
    prefix = f"{label}/{case}"
    delta, full = union(ranks, f"{prefix}/delta"), union(ranks, f"{prefix}/full")
    assert int(full["dense/step"]) == chain[-1]
    assert_same(delta, full, f"{prefix}: full + deltas vs full")
    assert any(len(v) for k, v in full.items() if k.endswith("/keys")), f"{prefix}: no rows restored"
    if "evict" in case:  # the access status is compared too
        assert any(v.any() for k, v in full.items() if k.endswith("/status/counts")), f"{prefix}: no access status"
        assert all(int(v) == chain[-1] for k, v in full.items() if k.endswith("/clock")), f"{prefix}: clock"
    if any(name.startswith(f"{prefix}/live/") for name in ranks[0]):  # the run that trained and saved them
        live = union(ranks, f"{prefix}/live", trained=True)
        assert_same(delta, live, f"{prefix}: full + deltas vs the trained model")
    for info in restored_info(ranks, f"{prefix}/delta"):
        assert [link["step"] for link in info["chain"]] == chain, info
        assert [link["kind"] for link in info["chain"]] == ["full"] + ["delta"] * (len(chain) - 1), info
        assert [link["workers"] for link in info["chain"]] == writers, info
        assert info["step"] == chain[-1] and info["files"][0] == "dense.npz", info
        assert all("dense.npz" not in link["files"] for link in info["chain"][:-1]), info
    for info in restored_info(ranks, f"{prefix}/full"):
        assert [link["kind"] for link in info["chain"]] == ["full"], info


@pytest.mark.parametrize("case", ALL_CASES)
def test_checkpoints_written_and_kept(runs, case):
    for label, steps in (("two", [2, 4, 6]), ("one", [2, 4, 6]), ("more", [8])):
        written = [json.loads(str(data[f"{label}/{case}/written"])) for data in runs.ranks[label]]
        for w in written:
            assert [x["step"] for x in w["delta"]] == steps and [x["step"] for x in w["full"]] == steps, w
            kinds = ["full", "delta", "delta"] if label != "more" else ["delta"]
            assert [x["kind"] for x in w["delta"]] == kinds, w
            assert all(x["kind"] == "full" for x in w["full"]), w
            assert w == written[0], "the workers disagree on what was written"
    # keep=1: the full directory keeps the newest checkpoint, the delta one its whole chain
    for root in ("two", "one"):
        assert runs.listings[f"{root}/{case}/delta"] == ["ckpt-2", "ckpt-4", "ckpt-6"]
        assert runs.listings[f"{root}/{case}/full"] == ["ckpt-6"]
    assert runs.listings[f"more/{case}/delta"] == ["ckpt-2", "ckpt-4", "ckpt-6", "ckpt-8"]
    assert runs.listings[f"more/{case}/full"] == ["ckpt-8"]


@pytest.mark.parametrize("case", ["native_fp16_evict", "native_parts_evict", "tfra_fp16_evict"])
def test_another_worker_count_keeps_the_evicted_totals(runs, case):
    """Old worker s's evicted counter goes to new worker s mod M: the same count gives each its own (compared in
    test_full_plus_deltas_restore_equals_full_restore), another keeps the total."""
    def totals(label):
        state = union(runs.ranks[label], f"{label}/{case}/delta")
        return {k: int(v.sum()) for k, v in state.items() if k.startswith("counters") and k.endswith("/evicted")}

    assert totals("two") and all(totals("two").values()), totals("two")
    assert totals("two_on_one") == totals("two")
    assert totals("one_on_two") == totals("one")


@pytest.mark.parametrize("case", ["native_fp16_evict", "native_parts_evict", "tfra_fp16_evict"])
def test_deltas_carry_the_evicted_keys(runs, case):
    removed = 0
    for step in (4, 6):
        manifest = json.loads((runs.root2 / case / "delta" / f"ckpt-{step}" / "manifest.json").read_text())
        assert manifest["kind"] == "delta" and manifest["parent"] == step - 2, manifest
        for r in range(2):
            with np.load(runs.root2 / case / "delta" / f"ckpt-{step}" / f"shard-{r}-of-2.npz") as z:
                removed += sum(len(z[name]) for name in z.files if name.endswith(".removed"))
    assert removed > 0, "no delta removed a key: the eviction case tests nothing"


def test_deltas_in_parts_hold_the_changed_rows_and_every_status(runs):
    """native_parts_evict: every checkpoint of the chain lists part files (format 3), the shards none of the rows; the
    parts hold rows and the status (a delta's: of every key; here each step reads most rows, so its deltas hold most
    rows: that a delta holds only the changed rows is test_a_delta_holds_only_the_changed_rows[native-parts])."""
    for step in (2, 4, 6):
        directory = runs.root2 / "native_parts_evict" / "delta" / f"ckpt-{step}"
        manifest = json.loads((directory / "manifest.json").read_text())
        assert manifest["format"] == 3 and manifest["kind"] == ("full" if step == 2 else "delta"), manifest
        rows = status = 0
        for r in range(2):
            with np.load(directory / f"shard-{r}-of-2.npz") as z:
                assert len(z["parts.bytes"]) > 0 and not any(name.endswith(".keys") for name in z.files), z.files
            for part in sorted(directory.glob(f"shard-{r}-of-2.part-*.npz")):
                with np.load(part) as z:
                    rows += sum(len(z[n]) for n in z.files if n.endswith(".keys") and ".status." not in n)
                    status += sum(len(z[n]) for n in z.files if n.endswith(".status.counts"))
        assert rows > 0 and status >= rows, (step, rows, status)


@pytest.mark.parametrize("label", ["corrupt_delta", "corrupt_parent", "missing_parent_shard", "missing_link"])
def test_damaged_chain_stops_every_worker_naming_the_file(runs, label):
    _, path, phrase = runs.damaged[label]
    errors = [str(data[f"{label}/error"]) for data in runs.ranks["more"]]
    assert errors[0] and errors[0] == errors[1], errors
    assert f"{path} {phrase}" in errors[0], errors[0]
    assert str(Path(path).parent.parent / "ckpt-6") in errors[0], errors[0]  # what to remove: the chain from there


# --------------------------------------------------------------------------------------------------------------
# In-process, one worker
# --------------------------------------------------------------------------------------------------------------

class Tiny(tf.keras.Model):
    def __init__(self, layer):
        super().__init__()
        self.embedding, self.dense = layer, tf.keras.layers.Dense(1)

    def call(self, inputs, training=None):
        return self.dense(self.embedding(inputs, training=training)["item"])


@pytest.mark.parametrize("backend, part_bytes", [("tfra", None), ("native", None), ("native", 8192)],
                         ids=["tfra", "native", "native-parts"])
def test_a_delta_holds_only_the_changed_rows(tmp_path, backend, part_bytes):
    """native-parts: the table in part files of 8 KiB (the deltas' changed rows found by digests)."""
    import tf_fusedrec as fr  # noqa: PLC0415

    with tf.compat.v1.variable_scope(f"delta_bytes_{backend}_{part_bytes}"):
        layer = fr.FusedEmbedding([fr.Feature("item", dim=16, optimizer={"name": "adagrad", "learning_rate": 0.1})],
                                  name="sparse", comm="single", table_backend=backend)
        model = Tiny(layer)
        model({"item": tf.range(4, dtype=tf.int64)}, training=False)
    optimizer = fr.train.make_optimizer(model, default={"name": "sgd", "learning_rate": 0.1})
    step = tf.Variable(0, dtype=tf.int64)
    checkpointer = checkpoint_lib.Checkpointer(str(tmp_path), model, optimizer, step, layer.comm, keep=1,
                                               full_every=4, part_bytes=part_bytes or checkpoint_lib.PART_BYTES)

    def train(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model({"item": tf.constant(ids, tf.int64)}, training=True) - 1.0))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        step.assign_add(1)
        checkpointer.save()

    train(np.arange(2000))
    train(np.arange(8))
    train(np.arange(4, 12))
    assert listing(tmp_path) == ["ckpt-1", "ckpt-2", "ckpt-3"]  # keep=1, and ckpt-3 needs 1 and 2
    train(np.arange(8))
    assert listing(tmp_path) == ["ckpt-4"]  # a full checkpoint at a multiple of full_every: the old chain goes
    written = checkpointer.written
    assert [w["kind"] for w in written] == ["full", "delta", "delta", "full"], written
    full, delta = written[0]["bytes"], written[1]["bytes"]
    assert delta < full / 10, written  # 8 of 2000 rows changed (and the dense weights, written whole)
    summary = checkpointer.written_summary()
    assert summary["full_every"] == 4 and summary["full"]["count"] == 2 and summary["delta"]["count"] == 2, summary
    assert summary["delta"]["mean_bytes"] < summary["full"]["mean_bytes"] / 10, summary
    assert summary["full"]["mean_seconds"] > 0 and summary["delta"]["mean_seconds"] > 0, summary
    held = 0
    for path in [tmp_path / "ckpt-4" / "shard-0-of-1.npz"] + sorted((tmp_path / "ckpt-4").glob("*.part-*.npz")):
        with np.load(path) as z:
            held += len(z["t0.keys"]) if "t0.keys" in z.files else 0
    assert held == 2000
    assert bool(list((tmp_path / "ckpt-4").glob("*.part-*.npz"))) == (part_bytes is not None)
    manifest = json.loads((tmp_path / "ckpt-4" / "manifest.json").read_text())
    assert manifest["kind"] == "full" and manifest["parent"] is None, manifest


def test_changes_compares_bits_and_slots():
    state = checkpoint_lib.TableState
    rows = np.arange(8, dtype=np.float32).reshape(4, 2)
    exists = np.array([True, True, False, True])
    before = state(np.array([1, 3, 5, 7]), rows, ((rows * 2, exists),))
    after_rows = rows[1:].copy()
    after_rows[0, 0] = np.nan  # key 3: changed
    after_exists = np.array([True, True, True])  # key 5: its slot row appears
    after_slots = (rows[1:] * 2).copy()
    after_slots[2, 1] = -after_slots[2, 1]  # key 7: its slot changed
    after = state(np.array([3, 5, 7]), after_rows, ((after_slots, after_exists),))
    changed, removed = checkpoint_lib.changes(before, after)
    assert changed.tolist() == [True, True, True] and removed.tolist() == [1]
    same, removed = checkpoint_lib.changes(after, after)
    assert not same.any() and removed.size == 0  # NaN rows compare equal bit for bit
    new = state(np.array([3, 9]), np.zeros((2, 2), np.float32), ((np.zeros((2, 2), np.float32), np.ones(2, bool)),))
    changed, removed = checkpoint_lib.changes(after, new)
    assert changed.tolist() == [True, True] and removed.tolist() == [5, 7]


def tiny_raw(**train):
    return {"name": "tiny", "features": [{"name": "A", "dim": 4, "vocab": 100}],
            "train": {"checkpoint_every": 10, **train}}


@pytest.mark.parametrize("value", [15, 5, -10, True, "20"])
def test_config_checkpoint_full_every_must_be_a_multiple(value):
    with pytest.raises(ValueError) as info:
        config_lib.parse_config(tiny_raw(checkpoint_full_every=value))
    message = str(info.value)
    assert "train.checkpoint_full_every" in message and "multiple of train.checkpoint_every (10)" in message, message


def test_config_checkpoint_full_every_default_is_every_checkpoint_full():
    assert config_lib.parse_config(tiny_raw()).train.checkpoint_full_every == 0
    assert config_lib.parse_config(tiny_raw(checkpoint_full_every=30)).train.checkpoint_full_every == 30


@pytest.mark.parametrize("arguments, name", [({"full_every": -1}, "full_every"), ({"full_every": 2.5}, "full_every"),
                                             ({"keep": 0}, "keep")])
def test_checkpointer_checks_its_arguments(arguments, name):
    with pytest.raises(ValueError, match=f"Checkpointer: {name} must be an int"):
        checkpoint_lib.Checkpointer("unused", None, None, None, None, **arguments)

"""fr.export: export round trips (tests/serve/export_scenario.py), the export CLI, and bad input.

* A DLRM trained on 2 workers (fused, the default native tables; fused with hot-row replication; fused on TFRA's
  tables and per-feature TFRA layers, where the [tfra] extra is installed) and on 1 worker,
  checkpointed, restored into one process and exported: fr.export.load_model predicts the training model's
  training=False scores on held-out batches (ids never trained included) of each rank to 1e-6, with pooling on and
  off; packed and hashed groups, int32 ids, a ragged bag with mean, a padded bag with sum, a padded sequence.
* The export of the 2-worker run holds the 1-worker run's rows (2 workers == 1), every key once.
* The dense part is a plain SavedModel (tf.saved_model.load, signature serving_default); its packed signature
  (serving_packed: every float32 [B, d] input in one) gives the same scores bit for bit, and an export without one
  (written before it) is served input by input.
* python -m tf_fusedrec.export on a 2-worker criteo_synthetic checkpoint; corrupt and missing files; bad requests.
"""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.subprocess_runner import execute, tail, worker_command

pytest.importorskip("horovod.tensorflow", reason="Horovod (horovod.tensorflow) is not importable")

import tensorflow as tf  # noqa: E402

import tf_fusedrec as fr  # noqa: E402
from tf_fusedrec.export import format as fmt  # noqa: E402
from tf_fusedrec.serve.model import InputError  # noqa: E402

SCENARIO = Path(__file__).resolve().with_name("export_scenario.py")
ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600  # per subprocess: the 4 of the exports fixture took 87 s in all in a CI run, 200 s in a slow-tier one
RUNS = [("fused", 2), ("fused_hot", 2), ("fused_tfra", 2), ("per_feature", 2), ("fused", 1)]
# The runs on TFRA's tables: trained only where TFRA is installed (their tests carry the `tfra` marker by name).
TFRA_LAYERS = ("fused_tfra", "per_feature")
TFRA_INSTALLED = importlib.util.find_spec("tensorflow_recommenders_addons") is not None


def run(cmd):
    rc, log, _ = execute([str(c) for c in cmd], TIMEOUT_S, merge_stderr=True)
    assert rc == 0, f"exit status {rc}: {' '.join(map(str, cmd))}\n{tail(log)}"
    return log


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """{(layer, workers): (export dir, [per-rank eval npz dicts])}. One horovodrun launch trains every 2-worker
    layer, one process the 1-worker run, and one process exports them all (a process per run costs ~15 s more)."""
    by_workers = {}
    for layer, workers in RUNS:
        if layer not in TFRA_LAYERS or TFRA_INSTALLED:
            by_workers.setdefault(workers, []).append(layer)
    out = {}
    for workers, layers in by_workers.items():
        where = tmp_path_factory.mktemp(f"{workers}workers")
        run(worker_command([SCENARIO, "train", "--layers", ",".join(layers), "--where", where], workers))
        run([sys.executable, SCENARIO, "export", "--layers", ",".join(layers), "--where", where])
        for layer in layers:
            ranks = []
            for r in range(workers):
                with np.load(where / layer / "out" / f"rank{r}.npz") as z:
                    ranks.append({k: z[k] for k in z.files})
            out[(layer, workers)] = (where / layer / "export", ranks)
    return out


def eval_batches(rank_data):
    """[(inputs dict, scores)] of one rank's held-out batches."""
    batches = []
    e = 0
    while f"eval{e}/scores" in rank_data:
        prefix = f"eval{e}/"
        inputs = {k[len(prefix):]: v for k, v in rank_data.items()
                  if k.startswith(prefix) and k.count("/") == 1 and k not in (prefix + "scores", prefix + "label")}
        inputs["tags"] = tf.RaggedTensor.from_row_lengths(rank_data[prefix + "tags/values"],
                                                          rank_data[prefix + "tags/lengths"])
        batches.append((inputs, rank_data[prefix + "scores"]))
        e += 1
    return batches


@pytest.mark.parametrize("run_key", RUNS, ids=[f"{layer}-{n}workers" for layer, n in RUNS])
@pytest.mark.parametrize("pooling", [True, False], ids=["pooled", "rows"])
def test_load_model_predicts_the_training_model(exports, run_key, pooling):
    export_dir, ranks = exports[run_key]
    served = fr.export.load_model(str(export_dir), pooling=pooling)
    for rank, data in enumerate(ranks):
        for inputs, want in eval_batches(data):
            np.testing.assert_allclose(served.predict(inputs), want, rtol=1e-6, atol=1e-7,
                                       err_msg=f"{run_key} rank {rank}")
    stats = served.stats()
    assert stats["rows_not_trained"] > 0, "the held-out batches should hold ids never trained"


def test_export_manifest_describes_the_tables(exports):
    manifest = fmt.read_manifest(str(exports[("fused", 2)][0]))
    assert manifest["source"] == {"step": 4, "workers": 2}
    encodings = {g["name"]: g["encoding"] for g in manifest["groups"]}
    assert sorted(encodings.values()) == ["hashed", "hashed", "packed"], encodings
    layouts = {f["name"]: f["layout"] for f in manifest["features"]}
    assert layouts == {"user_id": "one", "item_id": "one", "country": "one", "tags": "bag", "genres": "bag",
                       "history": "sequence"}
    for group in manifest["groups"]:
        fmt.check_ranges([(p["start"], p["end"]) for p in group["parts"]])
        assert sum(p["rows"] for p in group["parts"]) == group["rows"] > 0


def test_per_feature_export_has_one_identity_group_per_feature(exports):
    per_feature = fmt.read_manifest(str(exports[("per_feature", 2)][0]))
    assert {g["encoding"] for g in per_feature["groups"]} == {"identity"}
    assert len(per_feature["groups"]) == 6


@pytest.mark.parametrize("layer", ["fused", "fused_hot"])
def test_two_worker_export_holds_the_one_worker_rows(exports, layer):
    """Training on 2 workers equals training on 1 (lossless, Hashed initial rows): so do their exports, key by
    key; the hot rows replicated on every worker are exported once."""
    one = fmt.read_manifest(str(exports[("fused", 1)][0]))
    two_dir = str(exports[(layer, 2)][0])
    two = fmt.read_manifest(two_dir)
    for g1, g2 in zip(one["groups"], two["groups"]):
        a = fmt.GroupRows(str(exports[("fused", 1)][0]), one, g1)
        b = fmt.GroupRows(two_dir, two, g2)
        np.testing.assert_array_equal(a.keys, b.keys, err_msg=g1["name"])
        np.testing.assert_allclose(a.rows, b.rows, rtol=1e-6, atol=1e-7, err_msg=g1["name"])


def test_dense_part_is_a_plain_saved_model(exports):
    export_dir, _ = exports[("fused", 2)]
    manifest = fmt.read_manifest(str(export_dir))
    loaded = tf.saved_model.load(str(export_dir / "dense"))
    signature = loaded.signatures["serving_default"]
    names = set(signature.structured_input_signature[1])
    expected = {"dense"} | {n for f in manifest["features"] for n in f["inputs"].values()}
    assert names == expected
    batch = 5
    feeds = {"dense": tf.zeros([batch, 3])}
    for f in manifest["features"]:
        if f["layout"] == "sequence":
            feeds[f["inputs"]["values"]] = tf.zeros([2 * batch, f["dim"]])
            feeds[f["inputs"]["row_lengths"]] = tf.fill([batch], tf.constant(2, tf.int64))
        else:
            feeds[f["inputs"]["rows"]] = tf.zeros([batch, f["dim"]])
    assert signature(**feeds)["scores"].shape == [batch]


def test_packed_signature_lists_every_float_matrix_input_once(exports):
    export_dir, _ = exports[("fused", 2)]
    manifest = fmt.read_manifest(str(export_dir))
    packed = manifest["dense"]["packed"]
    assert packed["signature"] == "serving_packed" and packed["input"] == "packed"
    dims = {f["inputs"]["rows"]: f["dim"] for f in manifest["features"] if f["layout"] != "sequence"}
    assert packed["members"] == [["dense", 3]] + [[name, dims[name]] for name in sorted(dims, key=lambda n:
                                                                                         int(n.split("_")[1]))]
    signature = tf.saved_model.load(str(export_dir / "dense")).signatures["serving_packed"]
    history = next(f["inputs"] for f in manifest["features"] if f["layout"] == "sequence")
    assert set(signature.structured_input_signature[1]) == {"packed", history["values"], history["row_lengths"]}


@pytest.mark.parametrize("run_key", RUNS, ids=[f"{layer}-{n}workers" for layer, n in RUNS])
def test_packed_signature_scores_equal_the_per_input_signature(exports, run_key):
    export_dir, ranks = exports[run_key]
    packed = fr.export.load_model(str(export_dir))
    flat = fr.export.load_model(str(export_dir), packed=False)
    for inputs, _ in eval_batches(ranks[0]):
        np.testing.assert_array_equal(packed.predict(inputs), flat.predict(inputs), err_msg=str(run_key))


def test_an_export_without_the_packed_signature_is_served_input_by_input(exports, tmp_path):
    """Exports written before the packed signature have no manifest entry for it (their SavedModel has no such
    signature either): the model calls serving_default."""
    import shutil  # noqa: PLC0415

    export_dir, ranks = exports[("fused", 2)]
    old = tmp_path / "old"
    shutil.copytree(export_dir, old)
    manifest = json.loads((old / "manifest.json").read_text())
    del manifest["dense"]["packed"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    inputs, want = eval_batches(ranks[0])[0]
    np.testing.assert_allclose(fr.export.load_model(str(old)).predict(inputs), want, rtol=1e-6, atol=1e-7)


def test_corrupt_or_missing_files_are_named(exports, tmp_path):
    import shutil  # noqa: PLC0415

    export_dir = tmp_path / "copy"
    shutil.copytree(exports[("fused", 2)][0], export_dir)
    manifest = fmt.read_manifest(str(export_dir))
    part = export_dir / manifest["groups"][0]["parts"][1]["path"]
    data = bytearray(part.read_bytes())
    data[-20] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(fmt.ExportError, match=r"part-1-of-3\.npz: sha256 differs"):
        fr.export.load_model(str(export_dir))
    part.unlink()
    with pytest.raises(fmt.ExportError, match=r"part-1-of-3\.npz: missing"):
        fr.export.load_model(str(export_dir))
    (export_dir / "manifest.json").unlink()
    with pytest.raises(fmt.ExportError, match="manifest.json: no such file"):
        fr.export.load_model(str(export_dir))


@pytest.fixture(scope="module")
def served(exports):
    return fr.export.load_model(str(exports[("fused", 2)][0]))


def good_request(n=2):
    return {"dense": np.zeros((n, 3), np.float32), "user_id": [1] * n, "item_id": [2] * n, "country": [3] * n,
            "tags": [[1, 2]] * n, "genres": [[4]] * n, "history": [[5, 6]] * n}


@pytest.mark.parametrize("change, message", [
    (lambda r: r.update(colour=[1, 2]), "unknown feature 'colour'"),
    (lambda r: r.pop("tags"), "feature 'tags' is missing"),
    (lambda r: r.update(user_id=[1.5, 2.0]), "feature 'user_id': ids must be integers"),
    (lambda r: r.update(user_id=[1, -3]), "feature 'user_id': ids must be >= 0"),
    (lambda r: r.update(item_id=[1, 1 << 12]), "feature 'item_id': id 4096 is too large"),
    (lambda r: r.update(country=[1, 1 << 31]), "feature 'country': id 2147483648 is too large"),
    (lambda r: r.update(user_id=[[1, 2], [3]]), "feature 'user_id': takes one id per instance"),
    (lambda r: r.update(tags=[[1]] * 3), "feature 'tags' has 3 instances"),
    (lambda r: r.update(dense=np.zeros((2, 4))), r"input 'dense': shape \[2, 4\], expected \[2, 3\]"),
    (lambda r: r.update(dense=[["a"] * 3] * 2), r"input 'dense': values must be float32 of shape \[2, 3\]"),
])
def test_bad_requests_name_the_feature(served, change, message):
    request = good_request()
    change(request)
    with pytest.raises(InputError, match=message):
        served.predict(request, allow_padding=False)
    assert served.predict(good_request()).shape == (2,)  # still serving


def test_export_refusals(tmp_path):
    embedding = fr.FusedEmbedding([fr.Feature("a", 4)], fusion="source_hash", name="refused", comm="single")
    from tf_fusedrec import models  # noqa: PLC0415

    model = models.DLRM(embedding, bottom_mlp=(4,), top_mlp=(4,), num_dense=2)
    model({"dense": tf.zeros([1, 2]), "a": tf.constant([1], tf.int64)}, training=False)
    with pytest.raises(ValueError, match="refused: export needs fusion='deferred'"):
        fr.export.export_model(model, str(tmp_path / "e"))
    (tmp_path / "taken").mkdir()
    with pytest.raises(ValueError, match="taken exists"):
        fr.export.export_model(model, str(tmp_path / "taken"))
    with pytest.raises(ValueError, match="parts must be a positive int"):
        fr.export.export_model(model, str(tmp_path / "e2"), parts=0)


def test_export_cli_on_a_two_worker_checkpoint(tmp_path):
    """The train app on 2 workers, then `python -m tf_fusedrec.export`: the export predicts what the checkpoint,
    restored into this process, predicts."""
    config = ROOT / "configs" / "criteo_synthetic.yaml"
    model_dir, export_dir = tmp_path / "model", tmp_path / "export"
    run(worker_command(["-m", "tf_fusedrec.train", "--config", config, "--steps", 4, "--batch-size", 128, "--model-dir",
                        model_dir, "--no-progress"], 2))
    log = run([sys.executable, "-m", "tf_fusedrec.export", "--config", config, "--model-dir", model_dir, "--out",
               export_dir])
    assert "exported step 4 (trained on 2 worker(s))" in log, tail(log)
    manifest = json.loads((export_dir / "manifest.json").read_text())
    assert manifest["source"]["workers"] == 2 and manifest["source"]["embedding"] == "fused"
    # The same checkpoint restored here, as the training model predicts with training=False.
    from tf_fusedrec import config as cfg  # noqa: PLC0415
    from tf_fusedrec.train import checkpoint as ckpt  # noqa: PLC0415
    from tf_fusedrec.train import experiment  # noqa: PLC0415

    tf.keras.backend.clear_session()
    conf = cfg.load_config(str(config))
    embedding = experiment.make_embedding("fused", conf.embedding_features(), conf, comm="single")
    model = experiment.make_model(conf, embedding)
    optimizer = fr.train.make_optimizer(model, default=conf.train.dense_optimizer)
    batch = next(iter(experiment.make_dataset(conf, 64, 0, 1, held_out=True).take(1)))[0]
    model(batch, training=False)
    ckpt.Checkpointer(str(model_dir), model, optimizer, tf.Variable(0, dtype=tf.int64), embedding.comm).restore()
    want = model(batch, training=False).numpy()
    served = fr.export.load_model(str(export_dir))
    np.testing.assert_allclose(served.predict(dict(batch)), want, rtol=1e-6, atol=1e-7)
    rc, log, _ = execute([sys.executable, "-m", "tf_fusedrec.export", "--config", str(config), "--model-dir",
                          str(tmp_path / "nothing"), "--out", str(tmp_path / "e2")], TIMEOUT_S, merge_stderr=True)
    assert rc == 2 and "no published checkpoint" in log, tail(log)

"""The train app on the file sources (docs/guide/your-data.md): sample weights (data.schema.weight) train with the
weighted mean loss over the global batch (all weights 1.0 train bit for bit as no weights; 2 workers as 1 on skewed
weights), converted MovieLens and MovieLens sequences (token-balanced, data.sequences) train as the built-in sources,
and the skipped bad records show in the progress lines and the short summary."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pyarrow")

STEPS, BATCH = 6, 64
SCHEMA = {"label": "label", "dense": ["d0", "d1", "d2"],
          "features": {"A1": {}, "A2": {}, "B1": {}, "B2": {"shape": "list"}}}


def _tiny_table(n, weight=None, negative=()):
    """n records of the app tests' tiny experiment (features A1, A2, B1, multi-hot B2, 3 dense, label); `weight`:
    a float32 [n] column "w"; `negative`: records whose A1 is a negative id (bad records)."""
    import pyarrow as pa

    i = np.arange(n)
    a1 = i % 1000
    a1[list(negative)] = -1
    columns = {"A1": a1, "A2": (i * 7) % 1000, "B1": (i * 3) % 1000,
               "B2": pa.array([[int(v) % 1000] * int(v % 4) for v in i], pa.list_(pa.int64())),
               "d0": (i % 5).astype(np.float32), "d1": np.ones(n, np.float32), "d2": (i % 2).astype(np.float32),
               "label": ((i * 13) % 3 == 0).astype(np.float32)}
    if weight is not None:
        columns["w"] = np.asarray(weight, np.float32)
    return pa.table(columns)


def _train(apps, tmp_path, name, table, schema, workers=1, batch=BATCH, data=None):
    import pyarrow.parquet as pq

    path = tmp_path / f"{name}.parquet"
    pq.write_table(table, path, row_group_size=100)
    raw = apps.tiny_config(data={"source": "parquet", "path": str(path), "schema": schema, **(data or {})})
    return _run(apps, tmp_path, name, raw, workers, batch)


def _run(apps, tmp_path, name, raw, workers=1, batch=BATCH, flags=()):
    """STEPS steps of `batch` per worker of the config `raw` (written as NAME.yaml) with `flags` -> (run, summary)."""
    config = apps.write_config(tmp_path / f"{name}.yaml", raw)
    run = apps.run_app("tf_fusedrec.train", ["--config", config, "--steps", STEPS, "--batch-size", batch,
                                             "--no-progress", *flags], workers=workers)
    assert run.rc == 0, run.describe()
    return run, apps.the_summary(run)


def test_sample_weights(apps, tmp_path):
    n = 1000
    _, plain = _train(apps, tmp_path, "plain", _tiny_table(n), SCHEMA)
    weighted_schema = {**SCHEMA, "weight": "w"}
    _, ones = _train(apps, tmp_path, "ones", _tiny_table(n, np.ones(n)), weighted_schema)
    # All weights 1.0: the weighted mean is the plain mean, bit for bit (loss, and so every update, and the AUC).
    assert ones["final_loss"] == plain["final_loss"] and ones["auc"] == plain["auc"], (ones, plain)
    # Skewed weights: even records (worker 0's of 2) weigh 16 times the odd ones (worker 1's), and some are 0.
    weights = np.where(np.arange(n) % 2 == 0, 4.0, 0.25)
    weights[np.arange(n) % 7 == 0] = 0.0
    _, one = _train(apps, tmp_path, "skewed", _tiny_table(n, weights), weighted_schema)
    assert abs(one["final_loss"] - plain["final_loss"]) > 1e-3  # the weights change training
    apps.require_horovod()
    run, two = _train(apps, tmp_path, "skewed2", _tiny_table(n, weights), weighted_schema, workers=2,
                      batch=BATCH // 2)
    # The same global batches on 2 workers train as on 1: the weighted mean is over the global batch.
    np.testing.assert_allclose(two["final_loss"], one["final_loss"], rtol=1e-6, err_msg=run.describe())
    np.testing.assert_allclose(two["auc"], one["auc"], atol=1e-6, err_msg=run.describe())


def test_micro_batches_refused_with_weights(apps, tmp_path):
    import pyarrow.parquet as pq

    path = tmp_path / "w.parquet"
    pq.write_table(_tiny_table(300, np.ones(300)), path)
    config = apps.write_config(tmp_path / "w.yaml", apps.tiny_config(
        data={"source": "parquet", "path": str(path), "schema": {**SCHEMA, "weight": "w"}}))
    apps.run_app("tf_fusedrec.train", ["--config", config, "--pipeline", "fwp", "--micro-batches", "2"]) \
        .expect_error("--micro-batches 2", "data.schema.weight: w")


def _skipped_at_steps(n_held_out, bad, steps, batch):
    """Reference: the bad records skipped by the end of each step, when training reads the records after the held-out
    ones and skips those in `bad` (sorted)."""
    out, record, good, skipped = [], n_held_out, 0, 0
    for step in range(1, steps + 1):
        while good < step * batch:
            if record in bad:
                skipped += 1
            else:
                good += 1
            record += 1
        out.append(skipped)
    return out


def test_skipped_bad_records_show_in_the_progress(apps, tmp_path):
    bad = [130, 200, 201, 300]  # after the 2 x 64 held-out records; steps 1-3 read them
    run, summary = _train(apps, tmp_path, "bad", _tiny_table(1000, negative=bad), SCHEMA,
                          data={"on_bad_record": "skip", "max_bad_records": 10})
    want = _skipped_at_steps(2 * BATCH, set(bad), STEPS, BATCH)
    assert want == [1, 3, 4, 4, 4, 4]
    assert summary["bad_records_skipped"] == 4, run.describe()
    lines = [line for line in run.stdout.splitlines() if line.startswith("step ")]
    assert len(lines) == STEPS, run.describe()
    for step, (line, skipped) in enumerate(zip(lines, want), 1):
        assert line.startswith(f"step {step}/{STEPS}  loss "), line
        suffix = f", {skipped} bad record{'s' if skipped != 1 else ''} skipped"
        assert line.endswith(suffix), (line, suffix)
    assert "  bad records  4 skipped (data.on_bad_record: skip)" in run.stdout.splitlines(), run.describe()
    clean, _ = _train(apps, tmp_path, "clean", _tiny_table(1000), SCHEMA, data={"on_bad_record": "skip"})
    assert "bad record" not in clean.stdout, clean.describe()
    # Without on_bad_record: skip, the first bad record (index 130: row 131, counted from 1) stops the run with the
    # reader's error alone (exit status 2).
    config = apps.write_config(tmp_path / "stop.yaml", apps.tiny_config(
        data={"source": "parquet", "path": str(tmp_path / "bad.parquet"), "schema": SCHEMA}))
    apps.run_app("tf_fusedrec.train", ["--config", config, "--steps", STEPS, "--batch-size", BATCH, "--no-progress"]) \
        .expect_error("bad.parquet row 131", "column 'A1' of feature 'A1' holds the negative id -1")


# ---------------------------------------------------------------------------------------------------------------
# MovieLens converted (python -m tf_fusedrec.data.convert movielens) trains as the built-in source
# ---------------------------------------------------------------------------------------------------------------

ML_FEATURES = [{"name": "user_id", "dim": 8, "max_id_bits": 16}, {"name": "movie_id", "dim": 8, "max_id_bits": 16},
               {"name": "genres", "dim": 8, "combiner": "mean", "max_id_bits": 16},
               {"name": "gender", "dim": 4, "max_id_bits": 16}, {"name": "age", "dim": 4, "max_id_bits": 16},
               {"name": "occupation", "dim": 4, "max_id_bits": 16}, {"name": "zip", "dim": 4}]


@pytest.fixture(scope="module")
def movielens(tmp_path_factory):
    from tests.data.test_movielens import _ratings, _write_dir
    from tf_fusedrec.data import convert

    root = tmp_path_factory.mktemp("ml-app")
    ml_dir = _write_dir(root / "ml-1m", _ratings(2000, seed=11))
    out = {"dir": ml_dir}
    for fmt in ("parquet", "csv"):
        assert convert.main(["movielens", ml_dir, "--to", fmt, "--out", str(root / fmt), "--files", "2"]) == 0
        out[fmt] = str(root / fmt / "schema.yaml")
    return out


def _movielens_run(apps, tmp_path, name, data, workers):
    raw = apps.tiny_config(features=ML_FEATURES, model={"name": "dlrm", "bottom_mlp": [8], "top_mlp": [8]})
    raw["data"] = {"eval_batches": 2, **data}
    raw["feature_defaults"] = {"optimizer": {"name": "adagrad", "learning_rate": 0.05}}  # zip: hashed, 62 bits
    return _run(apps, tmp_path, name, raw, workers, batch=16)[1]


@pytest.mark.parametrize("fmt, workers", [("parquet", 1), ("csv", 2)])
def test_converted_movielens_trains_as_the_builtin_source(apps, tmp_path, movielens, fmt, workers):
    import yaml

    if workers > 1:
        apps.require_horovod()
    builtin = _movielens_run(apps, tmp_path, "builtin", {"source": "movielens", "path": movielens["dir"],
                                                         "num_dense": 0, "shuffle": False}, workers)
    data = yaml.safe_load(open(movielens[fmt]))["data"]
    converted = _movielens_run(apps, tmp_path, fmt, data, workers)
    assert converted["final_loss"] == builtin["final_loss"] and converted["auc"] == builtin["auc"], \
        (converted, builtin)


# ---------------------------------------------------------------------------------------------------------------
# MovieLens sequences converted (python -m tf_fusedrec.data.convert movielens_seq) train as the built-in source
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def movielens_seq(tmp_path_factory):
    from tests.data.test_convert_movielens_seq import write_ml1m
    from tf_fusedrec.data import convert

    root = tmp_path_factory.mktemp("ml-seq-app")
    out = {"dir": write_ml1m(root / "ml-1m")}
    for fmt in ("parquet", "csv"):
        assert convert.main(["movielens_seq", out["dir"], "--to", fmt, "--out", str(root / fmt), "--files", "2"]) == 0
        out[fmt] = str(root / fmt / "schema.yaml")
    return out


def _seq_config(apps, data):
    """The MovieLens sequence config, small, on `data`."""
    import yaml

    raw = yaml.safe_load((apps.ROOT / "configs" / "movielens1m_seq.yaml").read_text())
    raw["data"] = {**data, "eval_batches": 2,
                   "sequences": {"feature": "items", "target": "target", "max_length": 60, "truncate": True}}
    raw["model"].update(num_blocks=1, hidden_dim=16, experts=2, expert_units=[16], tower_units=[8])
    return raw


def _movielens_seq_run(apps, tmp_path, name, data, workers):
    return _run(apps, tmp_path, name, _seq_config(apps, data), workers, batch=16, flags=("--balance", "tokens"))[1]


@pytest.mark.parametrize("fmt, workers", [("parquet", 1), ("csv", 2)])
def test_converted_movielens_seq_trains_as_the_builtin_source(apps, tmp_path, movielens_seq, fmt, workers):
    import yaml

    if workers > 1:
        apps.require_horovod()
    builtin = _movielens_seq_run(apps, tmp_path, "builtin", {"source": "movielens_seq", "path": movielens_seq["dir"],
                                                             "num_dense": 0}, workers)
    data = yaml.safe_load(open(movielens_seq[fmt]))["data"]
    converted = _movielens_seq_run(apps, tmp_path, fmt, data, workers)
    # Token-balanced: the same samples and tokens per worker and step as the built-in source, and so the same loss
    # and AUC (to float tolerance: the GRM's reductions on several threads and workers may sum in another order).
    assert converted["balance"] == "tokens" and converted["target_tokens_per_step"] > 0
    for key in ("target_tokens_per_step", "samples_per_worker", "tokens_per_worker"):
        assert converted[key] == builtin[key], (key, converted, builtin)
    assert len(converted["samples_per_worker"]["total"]) == workers
    np.testing.assert_allclose(converted["final_loss"], builtin["final_loss"], rtol=1e-6)
    for task in ("click", "conversion"):
        np.testing.assert_allclose(converted["auc"][task], builtin["auc"][task], atol=1e-6)


def test_skipped_bad_records_of_sequences_show_in_the_progress(apps, tmp_path, movielens_seq):
    """Sequences from files (token-balanced) count the bad records they skip, in the progress lines and the summary;
    without data.on_bad_record: skip the run stops naming the file and the record."""
    import glob

    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    data = yaml.safe_load(open(movielens_seq["parquet"]))["data"]
    first = sorted(glob.glob(data["path"]))[0]
    table = pq.read_table(first)
    age = table.column("age").to_numpy().copy()
    age[5:9] = -1  # 4 bad records among the first that training reads
    damaged = tmp_path / "train"
    damaged.mkdir()
    for path in sorted(glob.glob(data["path"])):
        out = table.set_column(table.schema.get_field_index("age"), "age", pa.array(age)) if path == first \
            else pq.read_table(path)
        pq.write_table(out, damaged / path.rsplit("/", 1)[1])
    data["path"] = str(damaged / "part-*.parquet")
    run, summary = _run(apps, tmp_path, "seq_bad", _seq_config(apps, {**data, "on_bad_record": "skip"}), batch=16,
                        flags=("--balance", "tokens"))
    assert summary["bad_records_skipped"] == 4, run.describe()
    lines = [line for line in run.stdout.splitlines() if line.startswith("step ")]
    assert lines and all(line.endswith(", 4 bad records skipped") for line in lines), run.describe()
    assert "  bad records  4 skipped (data.on_bad_record: skip)" in run.stdout.splitlines(), run.describe()
    config = apps.write_config(tmp_path / "seq_error.yaml", _seq_config(apps, data))
    apps.run_app("tf_fusedrec.train", ["--config", config, "--steps", STEPS, "--batch-size", 16, "--no-progress",
                                       "--balance", "tokens"]).expect_error(first.rsplit("/", 1)[1], "age")

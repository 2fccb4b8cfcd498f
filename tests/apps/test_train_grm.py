"""`python -m tf_fusedrec.train` on a sequence config (configs/grm_synthetic.yaml, the GRM): token-balanced batches.
Every run takes the shipped config with a smaller dense model (1 block, 2 experts), 2 held-out batches, a checkpoint
every 2 steps and a log line (TensorBoard loss) every step.

* 2 workers with --balance tokens: the summary holds the balance, the token target, the token imbalance (mean over
  steps of max/min tokens across workers), samples and tokens per worker (the workers' sample counts differ: that is
  what balancing does) and one held-out AUC per task; with --balance none every worker holds batch_size samples.
* with --model-dir (the token-balanced run), rank 0's TensorBoard events hold one AUC scalar per task (auc/click,
  auc/conversion) and the loss, equal to the summary's.
* resume: the token-balanced run checkpoints every 2 steps into its --model-dir; its step-2 checkpoint alone (a
  run that died after it) resumed to step 4 on 2 workers equals the uninterrupted run: the losses of steps 3 and 4,
  the final loss and AUCs, the step-4 checkpoint's tables, optimizer slots and dense weights, and each worker's
  position in its sample stream (the manifest's stream_positions; the samples the resumed run trained on are the
  uninterrupted run's between the two positions).
* --table-storage float16 --hot 40 (mixed precision: float16 rows, 40 hot rows per group replicated in float32) with
  --evict-capacity 200 --evict-interval 2 on 2 workers trains and reports its table bytes (fewer row bytes than the
  float32 run over the same batches), its table rows over time (fewer) and the rows each worker evicted; its dense
  layers run under mixed_float16 with the dynamic loss scale (the workers agree on skipped steps).
* The flags a sequence config refuses are checked in-process, in tests/apps/test_refusals.py.
"""

import glob
import json
import shutil

import numpy as np
import pytest
import yaml

CONFIG = "configs/grm_synthetic.yaml"
STEPS, BATCH = 4, 32
RESUME_AT = 2  # the checkpoint the resumed run starts from (train.checkpoint_every)
RTOL, ATOL = 1e-6, 1e-7  # as tests/distributed/test_checkpoints.py


@pytest.fixture(scope="module")
def runs(apps, tmp_path_factory):
    out = {}
    where = tmp_path_factory.mktemp("grm")
    raw = yaml.safe_load((apps.ROOT / CONFIG).read_text())
    raw["train"].update({"checkpoint_every": RESUME_AT, "log_every": 1})  # a loss per step in TensorBoard
    # A smaller dense model and held-out set than the shipped config's: every launch traces and evaluates less.
    raw["model"].update({"num_blocks": 1, "experts": 2, "expert_units": [16], "tower_units": [8]})
    raw["data"]["eval_batches"] = 2
    config = apps.write_config(where / "grm.yaml", raw)
    model_dir = where / "model"
    for name, extra in (("tokens", ["--model-dir", model_dir]), ("none", []),
                        ("mixed", ["--table-storage", "float16", "--hot", "40", "--hot-sample-batches", "2",
                                   "--evict-capacity", "200", "--evict-interval", "2",
                                   "--dense-precision", "mixed_float16"])):
        balance = "none" if name == "none" else "tokens"
        run = apps.run_app("tf_fusedrec.train", ["--config", config, "--steps", STEPS, "--batch-size", BATCH,
                                                 "--balance", balance, "--no-progress"] + extra, workers=2)
        assert run.rc == 0, run.describe()
        (rank, summary), = apps.summaries(run)
        out[name] = (run, summary)
    out["model_dir"], out["config"] = model_dir, config
    return out


def scalars_of(model_dir):
    """{tag: {step: value}} of rank 0's TensorBoard events under model_dir."""
    import tensorflow as tf  # noqa: PLC0415

    scalars = {}
    for path in glob.glob(str(model_dir / "tensorboard" / "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    return scalars


def test_balanced_summary(runs):
    run, s = runs["tokens"]
    assert s["balance"] == "tokens" and s["workers"] == 2 and s["target_tokens_per_step"] > 0, run.describe()
    assert s["token_imbalance"] >= 1.0
    totals = s["samples_per_worker"]["total"]
    assert len(totals) == 2 and all(t > 0 for t in totals) and len(s["tokens_per_worker"]) == 2
    assert s["samples_per_s"] > 0 and s["tokens_per_s"] > 0
    waits = s["allreduce_seconds_per_step_per_worker"]
    assert len(waits) == 2 and all(w > 0 for w in waits) and s["allreduce_seconds_per_step"] == waits[0]
    assert set(s["auc"]) == {"click", "conversion"} and all(0.0 <= v <= 1.0 for v in s["auc"].values())


def test_fixed_sample_counts_without_balance(runs):
    run, s = runs["none"]
    assert s["balance"] == "none" and s["target_tokens_per_step"] is None, run.describe()
    assert s["samples_per_worker"]["total"] == [STEPS * BATCH, STEPS * BATCH]


def test_tensorboard_holds_one_auc_per_task(runs):
    run, s = runs["tokens"]
    files = glob.glob(str(runs["model_dir"] / "tensorboard" / "events.out.tfevents.*"))
    assert files, f"no event file under {runs['model_dir']}\n{run.describe()}"
    scalars = scalars_of(runs["model_dir"])
    assert sorted(t for t in scalars if t.startswith("auc")) == ["auc/click", "auc/conversion"], sorted(scalars)
    for task, auc in s["auc"].items():
        assert scalars[f"auc/{task}"] == {STEPS: np.float32(auc)}, (task, scalars[f"auc/{task}"], auc)
    assert scalars["loss"][STEPS] == np.float32(s["final_loss"]), (scalars["loss"], s["final_loss"])


def test_mixed_precision_tables(runs):
    run, s = runs["mixed"]
    _, plain = runs["tokens"]  # the same balanced batches, float32 rows, nothing replicated
    assert s["table_storage"] == "float16" and plain["table_storage"] == "float32", run.describe()
    assert s["dense_precision"] == "mixed_float16" and s["loss_scale"]["skipped_steps"] < STEPS
    assert [h["rows"] for h in s["hot"]] == [40] * len(s["hot"]) and s["hot"], run.describe()
    mixed_rows, plain_rows = s["table_bytes_per_worker"]["rows"], plain["table_bytes_per_worker"]["rows"]
    assert len(mixed_rows) == 2 and all(b > 0 for b in mixed_rows)
    assert sum(mixed_rows) < 0.75 * sum(plain_rows), (mixed_rows, plain_rows)
    assert all(b > 0 for b in s["table_bytes_per_worker"]["slots"])  # Adagrad's accumulators, float32
    over_time, plain_over_time = s["table_rows_over_time"], plain["table_rows_over_time"]
    assert over_time["steps"] == plain_over_time["steps"] == list(range(1, STEPS + 1))  # log_every 1
    for r in range(2):
        assert 0 < over_time["rows_per_worker"][r][-1] < plain_over_time["rows_per_worker"][r][-1]
    assert s["eviction"]["capacity"] == 200 and s["eviction"]["policy"] == "lfu"
    assert len(s["eviction"]["evicted_per_worker"]) == 2 and all(n > 0 for n in s["eviction"]["evicted_per_worker"])
    assert set(s["auc"]) == {"click", "conversion"} and s["final_loss"] == s["final_loss"]  # not NaN


def checkpoint_arrays(directory):
    """{file: {key: array}} of a checkpoint's .npz files, and its manifest."""
    arrays = {}
    for path in sorted(directory.glob("*.npz")):
        with np.load(path, allow_pickle=False) as z:
            arrays[path.name] = {k: z[k] for k in z.files}
    return arrays, json.loads((directory / "manifest.json").read_text())


def test_resume_equals_the_uninterrupted_run(runs, apps, tmp_path):
    apps.require_horovod()
    straight_run, straight = runs["tokens"]
    straight_dir = runs["model_dir"]
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    shutil.copytree(straight_dir / f"ckpt-{RESUME_AT}", model_dir / f"ckpt-{RESUME_AT}")  # died after step 2
    run = apps.run_app("tf_fusedrec.train", ["--config", runs["config"], "--steps", STEPS, "--batch-size", BATCH,
                                             "--balance", "tokens", "--no-progress", "--model-dir", model_dir],
                       workers=2)
    assert run.rc == 0, run.describe()
    assert f"at step {RESUME_AT} (written by 2 worker(s), restored onto 2)" in run.stdout, run.describe()
    resumed = apps.the_summary(run)
    assert resumed["restored"]["step"] == RESUME_AT, resumed["restored"]

    want, got = scalars_of(straight_dir)["loss"], scalars_of(model_dir)["loss"]
    assert sorted(got) == list(range(RESUME_AT + 1, STEPS + 1)), got
    np.testing.assert_allclose([got[s] for s in sorted(got)], [want[s] for s in sorted(got)], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(resumed["final_loss"], straight["final_loss"], rtol=RTOL, atol=ATOL)
    for task, auc in straight["auc"].items():
        np.testing.assert_allclose(resumed["auc"][task], auc, rtol=RTOL, atol=ATOL, err_msg=task)

    (want_files, want_manifest), (got_files, got_manifest) = (checkpoint_arrays(d / f"ckpt-{STEPS}")
                                                              for d in (straight_dir, model_dir))
    assert sorted(got_files) == sorted(want_files) == ["dense.npz", "shard-0-of-2.npz", "shard-1-of-2.npz"]
    for name, arrays in want_files.items():
        assert sorted(got_files[name]) == sorted(arrays), name
        for key, value in arrays.items():
            np.testing.assert_allclose(got_files[name][key], value, rtol=RTOL, atol=ATOL, err_msg=f"{name}: {key}")
    positions = want_manifest["stream_positions"]
    assert got_manifest["stream_positions"] == positions and len(positions) == 2, (got_manifest, want_manifest)
    before = json.loads((straight_dir / f"ckpt-{RESUME_AT}" / "manifest.json").read_text())["stream_positions"]
    assert resumed["samples_per_worker"]["total"] == [p[0] - b[0] for p, b in zip(positions, before)], (
        resumed["samples_per_worker"], positions, before)
    assert positions[0][0] != positions[1][0], positions  # token-balanced: the workers consumed different counts

"""`python -m tf_fusedrec.train` on a sequence config (configs/grm_synthetic.yaml, the GRM): token-balanced batches.

* 2 workers with --balance tokens: the summary holds the balance, the token target, the token imbalance (mean over
  steps of max/min tokens across workers), samples and tokens per worker (the workers' sample counts differ: that is
  what balancing does) and one held-out AUC per task; with --balance none every worker holds batch_size samples.
* with --model-dir (the fixed-count run), rank 0's TensorBoard events hold one AUC scalar per task (auc/click,
  auc/conversion) and the loss, equal to the summary's.
* --table-storage float16 --hot 40 (mixed precision: float16 rows, 40 hot rows per group replicated in float32) with
  --evict-capacity 200 --evict-interval 2 on 2 workers trains and reports its table bytes (fewer row bytes than the
  float32 run over the same batches), its table rows over time (fewer) and the rows each worker evicted; its dense
  layers run under mixed_float16 with the dynamic loss scale (the workers agree on skipped steps).
* The flags a sequence config refuses are checked in-process, in tests/apps/test_refusals.py.
"""

import glob

import numpy as np
import pytest

CONFIG = "configs/grm_synthetic.yaml"
STEPS, BATCH = 4, 32


@pytest.fixture(scope="module")
def runs(apps, tmp_path_factory):
    out = {}
    model_dir = tmp_path_factory.mktemp("grm") / "model"
    for name, extra in (("tokens", []), ("none", ["--model-dir", model_dir]),
                        ("mixed", ["--table-storage", "float16", "--hot", "40", "--hot-sample-batches", "2",
                                   "--evict-capacity", "200", "--evict-interval", "2",
                                   "--dense-precision", "mixed_float16"])):
        balance = "none" if name == "none" else "tokens"
        run = apps.run_app("tf_fusedrec.train", ["--config", CONFIG, "--steps", STEPS, "--batch-size", BATCH,
                                                 "--balance", balance, "--no-progress"] + extra, workers=2)
        assert run.rc == 0, run.describe()
        (rank, summary), = apps.summaries(run)
        out[name] = (run, summary)
    out["model_dir"] = model_dir
    return out


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
    import tensorflow as tf  # noqa: PLC0415

    run, s = runs["none"]
    files = glob.glob(str(runs["model_dir"] / "tensorboard" / "events.out.tfevents.*"))
    assert files, f"no event file under {runs['model_dir']}\n{run.describe()}"
    scalars = {}
    for path in files:
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
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
    assert over_time["steps"] == plain_over_time["steps"] == [STEPS]
    for r in range(2):
        assert 0 < over_time["rows_per_worker"][r][-1] < plain_over_time["rows_per_worker"][r][-1]
    assert s["eviction"]["capacity"] == 200 and s["eviction"]["policy"] == "lfu"
    assert len(s["eviction"]["evicted_per_worker"]) == 2 and all(n > 0 for n in s["eviction"]["evicted_per_worker"])
    assert set(s["auc"]) == {"click", "conversion"} and s["final_loss"] == s["final_loss"]  # not NaN

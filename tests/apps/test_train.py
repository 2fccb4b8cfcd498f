"""`python -m tf_fusedrec.train` in subprocesses: one worker, and two Gloo workers under horovodrun.

One worker (the tiny config of conftest, DLRM and DCN-v2):
* a run exits 0, writes its summary to --summary-json, with samples/s > 0, an AUC in [0, 1], a finite final loss, no
  all-to-all and 1 worker, and ends its stdout with a short summary naming that file; the progress lines are on
  stdout, one per log step; without --summary-json the JSON goes to DIR/summary.json of --model-dir;
* checkpoints DIR/ckpt-{step}/ (manifest.json, dense.npz, shard-0-of-1.npz), the last two kept, and TensorBoard
  events under DIR/tensorboard;
* 3 steps, then the same command with --steps 6 on that directory ("resumed from") ends with exactly the final loss
  and AUC of 6 steps straight;
* resuming a directory already at step >= --steps, a missing config file: exit status 2 and "error: ..." on stderr
  naming the problem (the other refusals are checked in-process: tests/apps/test_refusals.py).

Two workers (horovodrun -np 2 -H localhost:2 --gloo): rank 0 alone prints, whole lines without horovodrun's
`[0]<stdout>:` prefix, and writes the summary JSON; the training step graph holds
3 all-to-alls per spec group for FusedEmbedding (keys, embeddings, gradients) and 3 per feature for
PerFeatureEmbedding, as many all-to-all calls run per step and they carry bytes; checkpoints hold shard-0-of-2 and
shard-1-of-2, and one worker resumes them (reading both shards) where they stopped. The two workers of batch 64 train
like one worker of batch 128 (the same samples): the same final loss (the mean over both workers' samples, not rank
0's) and held-out AUC.

Each configuration runs once per module (cached); the tests only read what the runs left.
"""

import glob
import json
import math
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

import tf_fusedrec as fr
from tf_fusedrec import config as cfg

MODULE = "tf_fusedrec.train"
STEPS = 6  # the straight run; the resumed run stops at STEPS // 2 first
HVD_STEPS = 4
SUMMARY_KEYS = {"config", "embedding", "workers", "batch_size_per_worker", "steps", "final_loss", "samples_per_s",
                "alltoall_ops_in_step_graph", "auc"}
METER_KEYS = {"alltoall_calls_per_step", "alltoall_bytes_per_step", "alltoall_mean_message_bytes",
              "forward_alltoall_seconds_per_step"}


class Cache:
    """Runs each configuration once; a failed run is remembered and fails every test that needs it."""

    def __init__(self, tmp_path_factory, apps):
        self.tmp, self.apps, self.results = tmp_path_factory, apps, {}

    def get(self, key, make):
        if key not in self.results:
            try:
                self.results[key] = make(self.tmp.mktemp("-".join(map(str, key))))
            except AssertionError as e:
                self.results[key] = e
        if isinstance(self.results[key], AssertionError):
            pytest.fail(str(self.results[key]), pytrace=False)
        return self.results[key]


@pytest.fixture(scope="module")
def cache(tmp_path_factory, apps):
    return Cache(tmp_path_factory, apps)


def config_path(apps, where, model_name):
    return apps.write_config(where / "tiny.yaml", apps.tiny_config(model_name))


def read_json(path, run):
    assert os.path.exists(path), f"no {path}\n{run.describe()}"
    with open(path) as f:
        return json.load(f)


def straight(cache, model_name):
    """6 steps into a fresh --model-dir with --summary-json: {run, summary, json, dir, config}."""

    def make(where):
        apps = cache.apps
        config = config_path(apps, where, model_name)
        model_dir, summary_json = where / "model", where / "summary.json"
        run = apps.run_app(MODULE, ["--config", config, "--steps", STEPS, "--no-progress", "--model-dir", model_dir,
                                    "--summary-json", summary_json])
        run.expect_ok()
        return {"run": run, "summary": apps.the_summary(run), "json": read_json(summary_json, run),
                "dir": model_dir, "config": config}

    return cache.get(("straight", model_name), make)


def resumed(cache, model_name):
    """3 steps into a fresh --model-dir, then the same command with --steps 6: {first, second, summary}."""

    def make(where):
        apps = cache.apps
        config = config_path(apps, where, model_name)
        model_dir = where / "model"
        common = ["--config", config, "--no-progress", "--model-dir", model_dir]
        first = apps.run_app(MODULE, common + ["--steps", STEPS // 2]).expect_ok()
        first_summary = apps.the_summary(first)  # DIR/summary.json, which the second run rewrites
        second = apps.run_app(MODULE, common + ["--steps", STEPS]).expect_ok()
        return {"first": first, "second": second, "summary": apps.the_summary(second),
                "first_summary": first_summary, "dir": model_dir}

    return cache.get(("resumed", model_name), make)


def two_workers(cache, model_name, embedding):
    """4 steps with 2 Gloo workers into a fresh --model-dir: {run, summary, json, dir, config}."""
    cache.apps.require_horovod()

    def make(where):
        apps = cache.apps
        config = config_path(apps, where, model_name)
        model_dir, summary_json = where / "model", where / "summary.json"
        run = apps.run_app(MODULE, ["--config", config, "--steps", HVD_STEPS, "--no-progress", "--embedding",
                                    embedding, "--model-dir", model_dir, "--summary-json", summary_json], workers=2)
        run.expect_ok()
        return {"run": run, "summary": apps.the_summary(run), "json": read_json(summary_json, run),
                "dir": model_dir, "config": config}

    return cache.get(("hvd", model_name, embedding), make)


def check_common_summary(summary, run, workers, steps, embedding="fused"):
    where = run.describe()
    assert SUMMARY_KEYS <= set(summary), f"summary lacks {sorted(SUMMARY_KEYS - set(summary))}\n{where}"
    assert summary["workers"] == workers, where
    assert summary["steps"] == steps and summary["embedding"] == embedding and summary["config"] == "tiny", where
    assert summary["batch_size_per_worker"] == 64, where
    for key in ("samples_per_s", "final_loss", "auc"):
        assert isinstance(summary[key], float), f"{key}: {summary[key]!r}\n{where}"
    assert math.isfinite(summary["samples_per_s"]) and summary["samples_per_s"] > 0, where
    assert 0.0 <= summary["auc"] <= 1.0, f"auc {summary['auc']!r}\n{where}"
    assert math.isfinite(summary["final_loss"]) and summary["final_loss"] > 0, where
    assert isinstance(summary["alltoall_ops_in_step_graph"], int), where


PROGRESS_LINE = re.compile(r"^step (\d+)/(\d+)  loss \d+\.\d{4}  [\d,]+ samples/s$")


def check_person_output(run, steps, model_dir):
    """stdout is what rank 0 shows a person, whole lines without a launcher prefix: a progress line per log step
    (the tiny config logs every step; --no-progress), then the short summary naming the last checkpoint and the
    summary JSON. No tag glued into a line, no stray carriage return, nothing of it on stderr."""
    lines = run.stdout.splitlines()
    assert run.stdout.endswith("\n") and "\r" not in run.stdout, run.describe()
    assert not [line for line in lines if "<stdout>:" in line or "<stderr>:" in line], run.describe()
    progress = [PROGRESS_LINE.match(line) for line in lines if line.startswith("step ")]
    assert all(progress), f"a progress line that is not whole\n{run.describe()}"
    assert [int(m.group(1)) for m in progress] == list(range(1, steps + 1)), run.describe()
    summary = lines[lines.index(next(line for line in lines if line.startswith("done: "))):]
    assert [line.split()[0] for line in summary[1:]] == ["throughput", "AUC", "loss", "all-to-all", "checkpoint",
                                                          "summary"], run.describe()
    assert f"  checkpoint   {model_dir / f'ckpt-{steps}'}" in summary, run.describe()
    assert "samples/s" in summary[1] and "done: " not in run.stderr and "step 1/" not in run.stderr, run.describe()


def checkpoint_steps(model_dir):
    """Published checkpoint steps of a model directory (ckpt-N/manifest.json), ascending."""
    return sorted(int(os.path.basename(os.path.dirname(p))[len("ckpt-"):])
                  for p in glob.glob(os.path.join(model_dir, "ckpt-*", "manifest.json")))


def spec_groups(config_file):
    config = cfg.load_config(config_file)
    return len(fr.FusedEmbedding(config.embedding_features()).groups), len(config.features)


# --------------------------------------------------------------------------------------------------------------
# One worker
# --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("model_name", ["dlrm", "dcn"])
def test_one_worker_run_and_summary(cache, model_name):
    r = straight(cache, model_name)
    run, summary = r["run"], r["summary"]
    assert r["json"] == summary, f"--summary-json {r['json']} differs from the summary the run named {summary}"
    check_common_summary(summary, run, workers=1, steps=STEPS)
    assert summary["alltoall_ops_in_step_graph"] == 0, run.describe()
    assert summary["cpu_allocator"] == "bfc", summary  # the app's default (tf_fusedrec/train/__main__.py)
    assert not METER_KEYS & set(summary), f"all-to-all traffic reported for one worker: {summary}"
    assert "resumed from" not in run.stdout, run.describe()
    check_person_output(run, STEPS, r["dir"])
    assert "all-to-all   none (one worker)" in run.stdout, run.describe()


def test_one_worker_checkpoints(cache):
    r = straight(cache, "dlrm")
    model_dir = r["dir"]
    assert sorted(os.listdir(model_dir)) == ["ckpt-4", "ckpt-6", "tensorboard"], os.listdir(model_dir)
    # checkpoint_every 2 and at the end, the last two kept
    assert checkpoint_steps(model_dir) == [4, 6]
    assert sorted(os.listdir(model_dir / "ckpt-6")) == ["dense.npz", "manifest.json", "shard-0-of-1.npz"]


def test_one_worker_tensorboard_events(cache):
    r = straight(cache, "dlrm")
    files = glob.glob(str(r["dir"] / "tensorboard" / "events.out.tfevents.*"))
    assert files, f"no event file under {r['dir'] / 'tensorboard'}"
    scalars = {}
    for path in files:
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                scalars.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    assert sorted(scalars["loss"]) == list(range(1, STEPS + 1)), scalars.get("loss")  # log_every 1
    assert scalars["loss"][STEPS] == np.float32(r["summary"]["final_loss"]), (scalars["loss"], r["summary"])
    assert sorted(scalars["auc"]) == [STEPS]
    assert scalars["auc"][STEPS] == np.float32(r["summary"]["auc"])
    # per-feature statistics of the fused layer
    assert {f"features/{n}/ids" for n in cache.apps.TINY_FEATURES} <= set(scalars), sorted(scalars)


@pytest.mark.parametrize("model_name", ["dlrm", "dcn"])
def test_resume_equals_straight_run(cache, model_name):
    a = straight(cache, model_name)["summary"]
    r = resumed(cache, model_name)
    first, second, b = r["first"], r["second"], r["summary"]
    assert "resumed from" not in first.stdout, first.describe()
    assert r["first_summary"]["steps"] == STEPS // 2
    assert "resumed from" in second.stdout and f"at step {STEPS // 2}" in second.stdout, second.describe()
    # no --summary-json: the JSON went to the model directory, and the short summary says so
    assert f"  summary JSON {r['dir'] / 'summary.json'}\n" in second.stdout, second.describe()
    assert b["steps"] == STEPS
    assert (b["final_loss"], b["auc"]) == (a["final_loss"], a["auc"]), (
        f"{model_name}: {STEPS // 2} steps + resume to {STEPS} gives final_loss {b['final_loss']!r} auc "
        f"{b['auc']!r}; {STEPS} steps straight give {a['final_loss']!r} {a['auc']!r}")
    assert checkpoint_steps(r["dir"])[-1] == STEPS


def test_resume_at_or_past_the_end_is_an_error(cache, apps):
    r = straight(cache, "dlrm")
    for steps in (STEPS, STEPS - 1):
        run = apps.run_app(MODULE, ["--config", r["config"], "--steps", steps, "--no-progress",
                                    "--model-dir", r["dir"]])
        message = run.expect_error(f"step {STEPS}", f"--steps {steps}")
        assert "summary JSON" not in run.stdout, run.describe()
        assert "model-dir" in message, message
    # nothing was written
    assert checkpoint_steps(r["dir"]) == [4, 6]


def test_missing_config_file_exits_2(apps, tmp_path):
    missing = tmp_path / "nowhere.yaml"
    run = apps.run_app(MODULE, ["--config", missing, "--no-progress"])
    run.expect_error("nowhere.yaml")


# --------------------------------------------------------------------------------------------------------------
# Two workers
# --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("model_name, embedding", [("dlrm", "fused"), ("dcn", "fused"), ("dlrm", "per_feature")])
def test_two_workers_summary_and_alltoalls(cache, model_name, embedding):
    r = two_workers(cache, model_name, embedding)
    run, summary = r["run"], r["summary"]
    assert r["json"] == summary, f"--summary-json {r['json']} differs from the printed summary {summary}"
    check_common_summary(summary, run, workers=2, steps=HVD_STEPS, embedding=embedding)
    groups, features = spec_groups(r["config"])
    assert (groups, features) == (2, 4)  # the tiny config: two dims, four features
    # forward keys + forward embeddings + backward embeddings, per group (fused) or per feature (per_feature)
    expected = 3 * (groups if embedding == "fused" else features)
    assert summary["alltoall_ops_in_step_graph"] == expected, f"expected {expected}\n{run.describe()}"
    assert METER_KEYS <= set(summary), f"summary lacks {sorted(METER_KEYS - set(summary))}\n{run.describe()}"
    assert summary["alltoall_calls_per_step"] == expected, f"expected {expected}\n{run.describe()}"
    assert summary["alltoall_bytes_per_step"] > 0 and summary["alltoall_mean_message_bytes"] > 0, run.describe()
    # rank 1 trained too (it wrote its shard of the last checkpoint) but printed no summary (the_summary checks it).
    # Its log used to show TFRA's start-up print, which tf_fusedrec now drops: the shard is the evidence.
    assert (r["dir"] / f"ckpt-{HVD_STEPS}" / "shard-1-of-2.npz").exists(), run.describe()


def test_two_workers_stdout_is_rank0s_whole_lines_without_a_prefix(cache):
    """horovodrun --gloo writes every line a worker writes to its stdout with `[rank]<stdout>:` before it; rank 0
    writes around it, to horovodrun's own stdout (train/progress.py): one progress line per log step, the short
    summary once, no prefix, no line glued to another; and the summary JSON is where it says."""
    r = two_workers(cache, "dlrm", "fused")
    run = r["run"]
    check_person_output(run, HVD_STEPS, r["dir"])
    assert "calls" in next(line for line in run.stdout.splitlines() if line.startswith("  all-to-all")), run.describe()
    assert r["json"]["workers"] == 2  # read from --summary-json


def test_two_workers_print_the_loss_of_one_worker_on_their_union(cache, apps):
    r = two_workers(cache, "dlrm", "fused")
    run = apps.run_app(MODULE, ["--config", r["config"], "--steps", HVD_STEPS, "--no-progress", "--batch-size",
                                2 * apps.TINY_BATCH]).expect_ok()
    one, two = apps.the_summary(run), r["summary"]
    assert one["workers"] == 1 and two["workers"] == 2
    assert math.isclose(two["final_loss"], one["final_loss"], rel_tol=1e-5), (two["final_loss"], one["final_loss"])
    assert math.isclose(two["auc"], one["auc"], rel_tol=1e-4), (two["auc"], one["auc"])


def test_two_workers_checkpoint_directories(cache):
    r = two_workers(cache, "dlrm", "fused")
    model_dir = r["dir"]
    assert checkpoint_steps(model_dir) == [2, 4]
    assert sorted(os.listdir(model_dir / f"ckpt-{HVD_STEPS}")) == ["dense.npz", "manifest.json", "shard-0-of-2.npz",
                                                                   "shard-1-of-2.npz"]


def test_resume_two_worker_dir_with_one_worker(cache, apps, tmp_path):
    r = two_workers(cache, "dlrm", "fused")
    model_dir = tmp_path / "model"
    shutil.copytree(r["dir"], model_dir)
    run = apps.run_app(MODULE, ["--config", r["config"], "--steps", HVD_STEPS + 2, "--no-progress",
                                "--model-dir", model_dir]).expect_ok()
    assert f"at step {HVD_STEPS} (written by 2 worker(s), restored onto 1)" in run.stdout, run.describe()
    restored = apps.the_summary(run)["restored"]
    assert restored["from_workers"] == 2 and restored["bytes_read_per_rank"][0] > 0, restored
    assert checkpoint_steps(model_dir)[-1] == HVD_STEPS + 2

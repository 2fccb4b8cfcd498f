"""The train app following a directory of arriving Parquet files (data.follow, docs/guide/your-data.md): it trains on
the files there, ends cleanly once none arrived for data.idle_timeout_seconds, and a restart continues after the new
ones."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip("pyarrow")


def _tiny_part(path, first, n):
    """n records of the app tests' tiny experiment (features A1, A2, B1, multi-hot B2, 3 dense) as a Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    i = np.arange(first, first + n)
    table = pa.table({"A1": i % 1000, "A2": (i * 7) % 1000, "B1": (i * 3) % 1000,
                      "B2": pa.array([[int(v) % 1000] * int(v % 4) for v in i], pa.list_(pa.int64())),
                      "d0": (i % 5).astype(np.float32), "d1": np.ones(n, np.float32), "d2": np.zeros(n, np.float32),
                      "label": (i % 3 == 0).astype(np.float32)})
    hidden = path.parent / f".{path.name}"
    pq.write_table(table, hidden)
    os.rename(hidden, path)


def _clicks(tmp_path):
    """A directory holding 3 Parquet files of 200 records each (part-0..2), and the schema of their columns."""
    data = tmp_path / "clicks"
    data.mkdir()
    for k in range(3):
        _tiny_part(data / f"part-{k}.parquet", 200 * k, 200)
    schema = {"label": "label", "dense": ["d0", "d1", "d2"],
              "features": {"A1": {}, "A2": {}, "B1": {}, "B2": {"shape": "list"}}}
    return data, schema


def test_train_app_follows_until_idle_then_resumes_with_new_files(tmp_path, apps):
    """The train app with data.follow and --steps trains on the files there, ends cleanly when no new file came for
    idle_timeout_seconds (checkpoint and summary at that step) or at --steps while it waits, and restarts continue
    with the new files, each record once."""
    data, schema = _clicks(tmp_path)
    config = apps.write_config(tmp_path / "follow.yaml", apps.tiny_config(data={
        "source": "parquet", "path": str(data), "schema": schema, "follow": True, "poll_seconds": 0.1,
        "idle_timeout_seconds": 1.0}))
    model_dir = tmp_path / "model"
    args = ["--config", config, "--steps", 1000, "--model-dir", model_dir, "--no-progress"]
    first = apps.run_app("tf_fusedrec.train", args).expect_ok()
    summary = json.loads((model_dir / "summary.json").read_text())
    # 600 records, the first 2 x 64 held out: 472 to train on, 7 steps of 64
    assert summary["stream_ended_at_step"] == 7, first.describe()
    assert "training ends at step 7 of 1000" in first.stdout
    assert f"waiting for new files under {data} (" in first.stdout  # the progress shows the wait
    for k in (3, 4):
        _tiny_part(data / f"part-{k}.parquet", 200 * k, 200)
    # Waiting for ever (no idle timeout), the run ends at --steps while its reader waits for files: 400 new records
    # make 6 more steps, 5 are asked for.
    raw = apps.tiny_config(data={"source": "parquet", "path": str(data), "schema": schema, "follow": True})
    endless = apps.write_config(tmp_path / "endless.yaml", raw)
    second = apps.run_app("tf_fusedrec.train", ["--config", endless, "--steps", 12, "--model-dir", model_dir,
                                                "--no-progress"]).expect_ok()
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["restored"]["step"] == 7 and "stream_ended_at_step" not in summary, second.describe()
    third = apps.run_app("tf_fusedrec.train", args).expect_ok()
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["restored"]["step"] == 12 and summary["stream_ended_at_step"] == 13, third.describe()



def test_two_workers_train_on_files_landing_while_they_run(tmp_path, apps):
    """horovodrun -np 2: files land while the workers train (after their checkpoint of step 2); they take them, agree
    on where the stream ends, and end together at the idle timeout."""
    import threading
    import time

    apps.require_horovod()
    data, schema = _clicks(tmp_path)
    config = apps.write_config(tmp_path / "follow.yaml", apps.tiny_config(data={
        "source": "parquet", "path": str(data), "schema": schema, "follow": True, "poll_seconds": 0.1,
        "idle_timeout_seconds": 20.0}))  # the wait starts when the reader runs out, before step 1 was traced
    model_dir = tmp_path / "model"
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("run", apps.run_app(
        "tf_fusedrec.train", ["--config", config, "--steps", 1000, "--model-dir", model_dir, "--no-progress"],
        workers=2)))
    thread.start()
    # 600 records, 2 x 2 x 64 held out: 344 to train on, 2 steps of 2 x 64; then 400 more: 744, 5 steps
    while not (model_dir / "ckpt-2").exists() and thread.is_alive():
        time.sleep(0.1)
    for k in (3, 4):
        _tiny_part(data / f"part-{k}.parquet", 200 * k, 200)
    thread.join()
    run = result["run"].expect_ok()
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["stream_ended_at_step"] == 5, run.describe()


def test_a_publish_carries_the_stream_position_after_its_step():
    """The train app hands each publish the file stream's position after the published step (counted from the step
    the run started at), which the summary keeps beside the version (tests/serve/test_publish_training.py); a
    source without a file stream hands None."""
    from types import SimpleNamespace

    from tf_fusedrec.train import app

    published = []
    run = SimpleNamespace(start=3, watchdog=app.Watchdog(0, 0), file_batches=SimpleNamespace(
        position_after=lambda batches: ("position after batches", batches)), publisher=SimpleNamespace(
        publish=lambda step, stream_position: published.append((step, stream_position))))
    app._TrainingRun._publish(run, 7)
    run.file_batches = None
    app._TrainingRun._publish(run, 9)
    assert published == [(7, ("position after batches", 4)), (9, None)]

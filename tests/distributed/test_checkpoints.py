"""Checkpoints across worker counts and damaged checkpoints (tests/distributed/checkpoint_scenario.py).

* 2 workers train 6 steps straight, checkpointing at 3 and 6 (the reference);
* its step-3 checkpoint restored onto 1, 2 and 3 workers and continued to step 6, and a 1-worker step-3 checkpoint
  continued on 2 workers, end with the reference's tables and dense weights (1e-6 relative): rows, Adagrad slots,
  dense Adam slots and iterations, and the data position all came back;
* each new rank read only the shards that can hold its ids (2 -> 1: both, 1 -> 2: shard 0, 2 -> 3: both);
* written in part files (Checkpointer(part_bytes=...), a few rows each), the same run ends at the same state and its
  step-3 checkpoint restores onto 1 and 3 workers; a damaged or missing part stops both workers naming it;
* a corrupt shard stops both workers with exit status 2 and an error naming the file; an unpublished staging
  directory (a kill between two ranks' saves) is ignored;
* crashes: rank 1 SIGKILLs itself right before step 5 (rank 0 is then inside the step's collectives), halfway
  through writing its step-6 shard, or before writing it (rank 0 has written its own): the job ends within
  CRASH_BOUND_S with a non-zero status naming the lost process (horovodrun terminates the survivors), only ckpt-3
  is published, and the restarted job ends with the uninterrupted run's tables and weights.
"""

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from tests.subprocess_runner import execute, tail, worker_command

pytest.importorskip("horovod.tensorflow", reason="Horovod (horovod.tensorflow) is not importable")

SCENARIO = Path(__file__).resolve().with_name("checkpoint_scenario.py")
TIMEOUT_S = 240
CRASH_BOUND_S = 150  # the crashed job, start-up included, on a loaded 2-core machine
RTOL, ATOL = 1e-6, 1e-7


def run(workers, model_dir, out, steps=6, expect=0, kill=None, part_bytes=None):
    """-> per-rank dicts; with expect="error" (any non-zero status) or a non-zero int, the merged log."""
    cmd = worker_command([SCENARIO, "--model-dir", model_dir, "--steps", steps, "--out", out]
                         + (["--kill", kill] if kill else [])
                         + (["--part-bytes", part_bytes] if part_bytes else []), workers)
    rc, log, _ = execute(cmd, TIMEOUT_S, merge_stderr=True)
    assert rc is not None, f"timed out after {TIMEOUT_S} s: {' '.join(cmd)}\n{tail(log)}"
    ok = rc != 0 if expect == "error" else rc == expect
    assert ok, f"exit status {rc}, expected {expect}: {' '.join(cmd)}\n{tail(log)}"
    if rc:
        return log
    ranks = []
    for r in range(workers):
        with np.load(Path(out) / f"rank{r}.npz") as z:
            ranks.append({k: z[k] for k in z.files})
    return ranks


def union_tables(ranks):
    rows = {}
    for data in ranks:
        for k, v in data.items():
            if k.startswith("table/"):
                assert k not in rows, f"{k} held by two ranks"
                rows[k] = v
    return rows


def assert_same_state(got, want, what):
    a, b = union_tables(got), union_tables(want)
    assert sorted(a) == sorted(b), f"{what}: rows differ: {sorted(set(a) ^ set(b))[:5]}"
    for k in b:
        np.testing.assert_allclose(a[k], b[k], rtol=RTOL, atol=ATOL, err_msg=f"{what}: {k}")
    for k in ("kernel", "bias"):
        for r in got:
            np.testing.assert_allclose(r[k], want[0][k], rtol=RTOL, atol=ATOL, err_msg=f"{what}: {k}")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    where = tmp_path_factory.mktemp("ckpt-reference")
    ranks = run(2, where / "model", where / "out")
    return where / "model", ranks


def step3_copy(reference, where):
    """The reference's directory as it was after step 3."""
    model_dir = where / "model"
    shutil.copytree(reference[0], model_dir)
    shutil.rmtree(model_dir / "ckpt-6")
    return model_dir


@pytest.mark.parametrize("workers, files", [(1, [["dense.npz", "shard-0-of-2.npz", "shard-1-of-2.npz"]]),
                                            (2, [["dense.npz", "shard-0-of-2.npz"], ["dense.npz", "shard-1-of-2.npz"]]),
                                            (3, [["dense.npz", "shard-0-of-2.npz", "shard-1-of-2.npz"]] * 3)])
def test_two_worker_checkpoint_continues_on_any_count(reference, tmp_path, workers, files):
    ranks = run(workers, step3_copy(reference, tmp_path), tmp_path / "out")
    assert_same_state(ranks, reference[1], f"2 -> {workers} workers")
    for r, data in enumerate(ranks):
        restored = json.loads(str(data["restored"]))
        assert restored["step"] == 3 and restored["workers"] == 2 and restored["files"] == files[r], restored
        assert restored["bytes_read"] > 0


def test_one_worker_checkpoint_continues_on_two(reference, tmp_path):
    model_dir = tmp_path / "model"
    run(1, model_dir, tmp_path / "first", steps=3)
    ranks = run(2, model_dir, tmp_path / "out")
    assert_same_state(ranks, reference[1], "1 -> 2 workers")
    for data in ranks:
        assert json.loads(str(data["restored"]))["files"] == ["dense.npz", "shard-0-of-1.npz"]


def test_corrupt_shard_stops_every_worker_naming_it(reference, tmp_path):
    model_dir = tmp_path / "model"
    shutil.copytree(reference[0], model_dir)
    shard = model_dir / "ckpt-6" / "shard-1-of-2.npz"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    log = run(2, model_dir, tmp_path / "out", steps=8, expect="error")
    errors = [line for line in log.splitlines() if "error: checkpoint" in line]
    assert {line.split("]")[0] for line in errors} == {"[0", "[1"}, tail(log)
    assert all("shard-1-of-2.npz" in line and "sha256" in line for line in errors), tail(log)


def test_unpublished_checkpoint_is_ignored(reference, tmp_path):
    """A kill between the two ranks' saves of step 6 leaves its staging directory: the run resumes at 3."""
    model_dir = step3_copy(reference, tmp_path)
    staging = model_dir / ".tmp-ckpt-6"
    staging.mkdir()
    shutil.copy(reference[0] / "ckpt-6" / "shard-0-of-2.npz", staging)
    ranks = run(2, model_dir, tmp_path / "out")
    assert json.loads(str(ranks[0]["restored"]))["step"] == 3
    assert not staging.exists()
    assert_same_state(ranks, reference[1], "resumed past an unpublished checkpoint")


@pytest.mark.parametrize("point, step", [("step", 5), ("mid-save", 6), ("before-save", 6)])
def test_killed_worker_then_restart_equals_uninterrupted(reference, tmp_path, point, step):
    model_dir = tmp_path / "model"
    start = time.monotonic()
    log = run(2, model_dir, tmp_path / "crashed", kill=f"1:{step}:{point}", expect="error")
    took = time.monotonic() - start
    assert took < CRASH_BOUND_S, f"the crashed job took {took:.0f} s\n{tail(log)}"
    assert "Process name: 1" in log or "Process 1 exit" in log, f"the lost rank is not named\n{tail(log)}"
    assert sorted(p.name for p in model_dir.glob("ckpt-*")) == ["ckpt-3"], sorted(model_dir.iterdir())
    ranks = run(2, model_dir, tmp_path / "out")
    assert json.loads(str(ranks[0]["restored"]))["step"] == 3
    assert not list(model_dir.glob(".tmp-ckpt-*")), sorted(model_dir.iterdir())
    assert_same_state(ranks, reference[1], f"killed at {point} {step}, restarted")


# --- part files (a native table larger than Checkpointer(part_bytes): written and restored in pieces) -----------------

PART_BYTES = 300  # a few rows per part file


@pytest.fixture(scope="module")
def parts_reference(tmp_path_factory):
    """The reference run again, its checkpoints' tables in part files."""
    where = tmp_path_factory.mktemp("ckpt-parts")
    ranks = run(2, where / "model", where / "out", part_bytes=PART_BYTES)
    return where / "model", ranks


def test_part_files_hold_the_tables(reference, parts_reference):
    """The same training with its checkpoints in parts ends where the reference does; the shards list their parts,
    hold no rows of their own, and the manifest says format 3 (a reader of format 2 would miss the parts)."""
    assert_same_state(parts_reference[1], reference[1], "checkpointed in parts")
    directory = parts_reference[0] / "ckpt-3"
    assert json.loads((directory / "manifest.json").read_text())["format"] == 3
    for rank in range(2):
        with np.load(directory / f"shard-{rank}-of-2.npz") as z:
            listed = len(z["parts.bytes"])
            assert listed >= 2 and not any(k.endswith(".keys") and k.count(".") == 1 for k in z.files), z.files
        assert len(list(directory.glob(f"shard-{rank}-of-2.part-*.npz"))) == listed
    assert json.loads((reference[0] / "ckpt-3" / "manifest.json").read_text())["format"] == 2


@pytest.mark.parametrize("workers", [1, 3])
def test_parts_restore_onto_another_worker_count(reference, parts_reference, tmp_path, workers):
    ranks = run(workers, step3_copy(parts_reference, tmp_path), tmp_path / "out", part_bytes=PART_BYTES)
    assert_same_state(ranks, reference[1], f"parts, 2 -> {workers} workers")
    for data in ranks:
        restored = json.loads(str(data["restored"]))
        assert restored["step"] == 3 and restored["workers"] == 2


@pytest.mark.parametrize("damage", ["flip", "remove"])
def test_a_damaged_part_stops_every_worker_naming_it(parts_reference, tmp_path, damage):
    model_dir = tmp_path / "model"
    shutil.copytree(parts_reference[0], model_dir)
    part = model_dir / "ckpt-6" / "shard-1-of-2.part-1.npz"
    if damage == "remove":
        part.unlink()
    else:
        data = bytearray(part.read_bytes())
        data[len(data) // 2] ^= 0xFF
        part.write_bytes(bytes(data))
    log = run(2, model_dir, tmp_path / "out", steps=8, expect="error")
    errors = [line for line in log.splitlines() if "error: checkpoint" in line]
    assert {line.split("]")[0] for line in errors} == {"[0", "[1"}, tail(log)
    what = "is missing" if damage == "remove" else "does not match the sha256"
    assert all("shard-1-of-2.part-1.npz" in line and what in line for line in errors), tail(log)

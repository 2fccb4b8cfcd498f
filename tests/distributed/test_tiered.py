"""Tiered tables (a DRAM cache of 1,536 rows over a RocksDB store, tests/distributed/tier_scenario.py) train exactly as
all-DRAM ones: bit for bit on 1 worker and on 2 (SGD, Adagrad, Adam), 2 tiered workers equal 1 worker, and through
checkpoints written in part files (the table read in chunks, never whole): restored onto 1 worker, and after a
SIGKILL mid-run (rank 1 dies before step 6; its store is left on disk) the restarted job ends where the
uninterrupted one does."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.subprocess_runner import execute, tail, worker_command

pytest.importorskip("horovod.tensorflow", reason="Horovod (horovod.tensorflow) is not importable")

SCENARIO = Path(__file__).resolve().with_name("tier_scenario.py")
TIMEOUT_S = 300
OPTIMIZERS = ["sgd", "adagrad", "adam"]
# The checkpointed runs: the table's rows (a few thousand, of 120 bytes with Adam's slots, most on disk) go to part
# files of about 150 rows, read from the table in chunks as a table larger than memory is.
CKPT_FLAGS = "--save-every 4 --name ckpt --part-bytes 18000"


def launch(workers, root, runs, expect_ok=True):
    """Runs tier_scenario.py once with `runs` ({label: flags}); -> {label: [per rank {key: array}]} (or the log of a
    launch expected to fail)."""
    args = [SCENARIO, "--tier-root", root / "tier"]
    for label, flags in runs.items():
        args += ["--run", f"{flags} --out {root / label}"]
    cmd = worker_command(args, workers)
    rc, log, _ = execute(cmd, TIMEOUT_S, merge_stderr=True)
    if not expect_ok:
        assert rc not in (0, None), f"expected a failure: {' '.join(map(str, cmd))}\n{tail(log)}"
        return log
    assert rc == 0, f"exit status {rc}: {' '.join(map(str, cmd))}\n{tail(log)}"
    out = {}
    for label in runs:
        out[label] = []
        for r in range(workers):
            with np.load(root / label / f"rank{r}.npz") as z:
                out[label].append({k: z[k] for k in z.files})
    return out


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    root = tmp_path_factory.mktemp("tier_two")
    runs = {f"tier_{o}": f"--optimizer {o} --tier 1" for o in ("sgd", "adagrad")}
    runs["tier_adam"] = f"--optimizer adam --tier 1 --model-dir {root / 'model'} {CKPT_FLAGS}"  # reference
    runs["dram_adam"] = "--optimizer adam --tier 0"
    return root, launch(2, root, runs)


@pytest.fixture(scope="module")
def one(tmp_path_factory, two):
    root = tmp_path_factory.mktemp("tier_one")
    model = root / "model"
    shutil.copytree(two[0] / "model", model)  # the 2-worker run as it was after step 4
    shutil.rmtree(model / "ckpt-8")
    runs = {f"{kind}_{o}": f"--optimizer {o} --tier {int(kind == 'tier')}" for kind in ("tier", "dram")
            for o in OPTIMIZERS}
    runs["restored"] = f"--optimizer adam --tier 1 --model-dir {model} --save-every 100 --name ckpt --part-bytes 18000"
    return launch(1, root, runs)


def assert_equal_runs(a, b, what):
    for key in ("losses", "keys", "rows", "slots", "kernel", "bias"):
        np.testing.assert_array_equal(a[key], b[key], err_msg=f"{what}: {key}")


def union(ranks):
    keys = np.concatenate([r["keys"] for r in ranks])
    order = np.argsort(keys)
    return (keys[order], np.concatenate([r["rows"] for r in ranks])[order],
            np.concatenate([r["slots"] for r in ranks])[order])


def assert_close_tables(got, want, what):
    """2 workers against 1: a key's gradient is summed in another order (its parts arrive from two workers), and
    Adam's m / sqrt(v) turns a last-bit difference of a near-zero gradient into up to ~1e-6 of a row: atol 1e-5.
    (Tiered against all-DRAM on the same worker count is compared bit for bit.)"""
    (ka, ra, sa), (kb, rb, sb) = union(got), union(want)
    np.testing.assert_array_equal(ka, kb, err_msg=f"{what}: keys")
    np.testing.assert_allclose(ra, rb, rtol=1e-5, atol=1e-5, err_msg=f"{what}: rows")
    np.testing.assert_allclose(sa, sb, rtol=1e-5, atol=1e-5, err_msg=f"{what}: slots")


def stats(rank):
    return json.loads(str(rank["stats"]))


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_tiered_equals_all_dram_on_one_worker(one, optimizer):
    tiered, dram = one[f"tier_{optimizer}"][0], one[f"dram_{optimizer}"][0]
    assert_equal_runs(tiered, dram, f"1 worker, {optimizer}")
    s = stats(tiered)
    assert len(tiered["keys"]) > 2 * s["dram_capacity_rows"] and s["disk_rows"] > 0 and s["disk_hits"] > 0, s
    assert 0 < s["hit_rate"] < 1 and stats(dram)["dram_capacity_rows"] == -1


def test_two_tiered_workers_equal_two_all_dram_workers(two):
    for r in range(2):
        assert_equal_runs(two[1]["tier_adam"][r], two[1]["dram_adam"][r], f"2 workers, rank {r}")
        assert stats(two[1]["tier_adam"][r])["disk_rows"] > 0


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_two_tiered_workers_equal_one(one, two, optimizer):
    got, want = two[1][f"tier_{optimizer}"], one[f"dram_{optimizer}"]
    assert_close_tables(got, want, f"{optimizer}: 2 tiered workers vs 1 all-DRAM worker")
    np.testing.assert_allclose(np.mean([r["losses"] for r in got], axis=0), want[0]["losses"], rtol=1e-5, atol=1e-6)
    for r in got:
        np.testing.assert_allclose(r["kernel"], want[0]["kernel"], rtol=1e-5, atol=1e-6)


def test_tiered_checkpoint_restores_onto_one_worker(one, two):
    restored = one["restored"][0]
    info = json.loads(str(restored["restored"]))
    assert info["step"] == 4
    manifest = json.loads((two[0] / "model" / "ckpt-4" / "manifest.json").read_text())
    parts = sorted((two[0] / "model" / "ckpt-4").glob("shard-*.part-*.npz"))
    assert manifest["format"] == 3 and len(parts) >= 6, (manifest, parts)  # each rank's table in several parts
    assert info["bytes_read"] > sum(p.stat().st_size for p in parts)
    assert_close_tables([restored], two[1]["tier_adam"], "2 -> 1 workers from the step-4 checkpoint")
    np.testing.assert_allclose(restored["kernel"], two[1]["tier_adam"][0]["kernel"], rtol=1e-5, atol=1e-6)


def test_killed_tiered_run_restarts_to_the_uninterrupted_result(two, tmp_path):
    flags = f"--optimizer adam --tier 1 --model-dir {tmp_path / 'model'} {CKPT_FLAGS}"
    launch(2, tmp_path, {"crashed": f"{flags} --kill 6"}, expect_ok=False)
    assert sorted(p.name for p in (tmp_path / "model").glob("ckpt-*")) == ["ckpt-4"]
    assert (tmp_path / "tier" / "ckpt").exists()  # the killed job's stores are left behind
    resumed = launch(2, tmp_path, {"resumed": flags})["resumed"]
    for r in range(2):
        assert json.loads(str(resumed[r]["restored"]))["step"] == 4
        want = two[1]["tier_adam"][r]
        for key in ("keys", "rows", "slots", "kernel", "bias"):
            np.testing.assert_array_equal(resumed[r][key], want[key], err_msg=f"rank {r}: {key}")
        np.testing.assert_array_equal(resumed[r]["losses"], want["losses"][4:])


def test_killed_tiered_run_with_delta_checkpoints_restarts_to_the_uninterrupted_result(two, tmp_path):
    """Delta checkpoints of a tiered table in part files (the changed rows found by digests, the table read in
    chunks): saves at 2 (full), 4 and 6 (deltas), a SIGKILL before step 8, and the restart from the chain ends where
    the uninterrupted run does, bit for bit."""
    flags = (f"--optimizer adagrad --tier 1 --model-dir {tmp_path / 'model'} --save-every 2 --full-every 100 "
             "--name ckpt --part-bytes 18000")
    launch(2, tmp_path, {"crashed": f"{flags} --kill 8"}, expect_ok=False)
    assert sorted(p.name for p in (tmp_path / "model").glob("ckpt-*")) == ["ckpt-2", "ckpt-4", "ckpt-6"]
    for step, kind in ((2, "full"), (4, "delta"), (6, "delta")):
        manifest = json.loads((tmp_path / "model" / f"ckpt-{step}" / "manifest.json").read_text())
        assert (manifest["kind"], manifest["format"]) == (kind, 3), manifest
    resumed = launch(2, tmp_path, {"resumed": flags})["resumed"]
    for r in range(2):
        info = json.loads(str(resumed[r]["restored"]))
        assert [link["kind"] for link in info["chain"]] == ["full", "delta", "delta"], info
        want = two[1]["tier_adagrad"][r]
        for key in ("keys", "rows", "slots", "kernel", "bias"):
            np.testing.assert_array_equal(resumed[r][key], want[key], err_msg=f"rank {r}: {key}")
        np.testing.assert_array_equal(resumed[r]["losses"], want["losses"][6:])


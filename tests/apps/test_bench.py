"""`python -m tf_fusedrec.bench` under horovodrun with two Gloo workers, on the tiny config of conftest.

One short run (2 timed steps, 1 repeat, sweep over M = 2 and 4 features) checked for what it writes and prints:
OUT/bench.json with every mode and the sweep, OUT/bench.png, and the table on stdout. Nothing here asserts on
timings or on ratios between modes: only that they were measured (> 0). An unknown --modes value exits with 2.
"""

import importlib.util
import json
import math
import os

import pytest

import tf_fusedrec as fr
from tf_fusedrec import config as cfg

MODULE = "tf_fusedrec.bench"
ALL_MODES = ("fused", "per_feature", "fused_nodedup", "fused_source_hash", "tfra_hand_fused", "fused_dbp", "fused_fwp",
             "fused_hot", "fused_hot_dbp", "fused_tfra")  # the default --modes
TFRA_MODES = ("per_feature", "tfra_hand_fused", "fused_tfra")
# Without TFRA (the current stack) the default modes leave out TFRA's, and the bench says so; the tests of those
# modes carry the `tfra` marker (their names).
TFRA_INSTALLED = importlib.util.find_spec("tensorflow_recommenders_addons") is not None
MODES = tuple(m for m in ALL_MODES if TFRA_INSTALLED or m not in TFRA_MODES)
HOT_ROWS = 20
SWEEP_MODES = tuple(m for m in ("fused", "per_feature", "tfra_hand_fused") if m in MODES)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def bench(tmp_path_factory, apps):
    """{run, out, report, config} of one 2-worker benchmark run (run once per module)."""
    apps.require_horovod()
    where = tmp_path_factory.mktemp("bench")
    config = apps.write_config(where / "tiny.yaml", apps.tiny_config())
    out = where / "out"
    run = apps.run_app(MODULE, ["--config", config, "--steps", 2, "--repeats", 1, "--warmup", 1, "--batches", 2,
                                "--sweep", "2,4", "--sweep-steps", 1, "--hot", HOT_ROWS, "--hot-sample-batches", 4,
                                "--out", out], workers=2,
                       # Nine modes, each traced, plus the sweep: about 2.5 minutes alone, more than 300 s when the
                       # 2 cores are shared with another test run (197 s in a slow-tier run): a bound for a hang only.
                       timeout=3 * apps.RUN_TIMEOUT_S)
    result = {"run": run, "out": out, "config": config, "report": None}
    if run.rc == 0 and (out / "bench.json").exists():
        with open(out / "bench.json") as f:
            result["report"] = json.load(f)
    return result


def ok(bench):
    run = bench["run"]
    run.expect_ok()
    assert bench["report"] is not None, f"no {bench['out'] / 'bench.json'}\n{run.describe()}"
    return run, bench["report"]


def check_mode_entry(entry, what):
    assert isinstance(entry, dict), f"{what}: {entry!r}"
    sps = entry.get("samples_per_s")
    assert isinstance(sps, float) and math.isfinite(sps) and sps > 0, f"{what}: samples_per_s {sps!r}"
    ops = entry.get("alltoall_ops_in_step_graph")
    assert isinstance(ops, int) and not isinstance(ops, bool) and ops > 0, f"{what}: alltoall_ops_in_step_graph {ops!r}"
    calls = entry.get("alltoall_calls_per_step")
    assert isinstance(calls, (int, float)) and calls > 0, f"{what}: alltoall_calls_per_step {calls!r}"
    mean_bytes = entry.get("alltoall_mean_message_bytes")
    assert isinstance(mean_bytes, (int, float)) and mean_bytes > 0, f"{what}: alltoall_mean_message_bytes {mean_bytes!r}"
    # the meter counts what the graph holds: one call per all-to-all op per step
    assert calls == ops, f"{what}: {calls} all-to-all calls per step, {ops} all-to-all ops in the step graph"


def test_bench_exits_0_and_writes_the_report(bench):
    run, report = ok(bench)
    assert report["workers"] == 2 and report["config"] == "tiny", report
    assert report["batch_size_per_worker"] == 64 and report["steps"] == 2 and report["repeats"] == 1, report
    assert list(report["modes"]) == list(MODES), list(report["modes"])
    if not TFRA_INSTALLED:
        assert "default modes leave out per_feature, tfra_hand_fused, fused_tfra" in run.stderr, run.describe()
    for mode in MODES:
        check_mode_entry(report["modes"][mode], mode)
        assert len(report["modes"][mode]["samples_per_s_repeats"]) == 1, report["modes"][mode]


def test_bench_alltoall_counts(bench):
    _, report = ok(bench)
    config = cfg.load_config(bench["config"])
    groups = len(fr.FusedEmbedding(config.embedding_features()).groups)
    features = len(config.features)
    dims = len({f.dim for f in config.features})
    modes = report["modes"]
    for mode in ("fused", "fused_nodedup", "fused_source_hash", "fused_dbp", "fused_hot", "fused_hot_dbp"):
        assert modes[mode]["alltoall_ops_in_step_graph"] == 3 * groups, (mode, modes[mode])
    # Hot pairs never enter an all-to-all: replicating R pairs per group moves fewer bytes on the same batches.
    for mode in ("fused_hot", "fused_hot_dbp"):
        assert [h["rows"] for h in modes[mode]["hot"]] == [HOT_ROWS] * groups, modes[mode]["hot"]
        assert modes[mode]["alltoall_bytes_per_step"] < modes["fused"]["alltoall_bytes_per_step"], (mode, modes)
    # fwp: per micro-batch and group, the next batch's keys, the embeddings and their gradients.
    k = config.train.micro_batches
    assert modes["fused_fwp"]["alltoall_ops_in_step_graph"] == 3 * k * groups, modes["fused_fwp"]
    for mode in ("fused_dbp", "fused_fwp"):
        busy, exposed = (modes[mode][key] for key in ("alltoall_busy_seconds_per_step",
                                                      "exposed_alltoall_seconds_per_step"))
        assert 0 < exposed <= busy, (mode, busy, exposed)


def test_bench_alltoall_counts_of_per_feature_and_tfra(bench):
    _, report = ok(bench)
    config = cfg.load_config(bench["config"])
    groups = len(fr.FusedEmbedding(config.embedding_features()).groups)
    features = len(config.features)
    dims = len({f.dim for f in config.features})
    modes = report["modes"]
    assert modes["per_feature"]["alltoall_calls_per_step"] > modes["fused"]["alltoall_calls_per_step"], modes
    assert modes["fused_tfra"]["alltoall_ops_in_step_graph"] == 3 * groups, modes["fused_tfra"]
    assert modes["per_feature"]["alltoall_ops_in_step_graph"] == 3 * features, modes["per_feature"]
    assert modes["tfra_hand_fused"]["alltoall_ops_in_step_graph"] == 3 * dims, modes["tfra_hand_fused"]


def test_bench_sweep(bench):
    _, report = ok(bench)
    sweep = report["sweep"]
    assert sorted(sweep) == ["2", "4"], sorted(sweep)
    for m, entry in sweep.items():
        assert sorted(entry) == sorted(SWEEP_MODES), (m, sorted(entry))
        for mode in SWEEP_MODES:
            check_mode_entry(entry[mode], f"sweep M={m} {mode}")


def test_bench_sweep_per_feature(bench):
    _, report = ok(bench)
    for m, entry in report["sweep"].items():
        # one table per feature for per_feature: 3 all-to-alls per feature
        assert entry["per_feature"]["alltoall_ops_in_step_graph"] == 3 * int(m), (m, entry["per_feature"])


def test_bench_png(bench):
    ok(bench)
    path = bench["out"] / "bench.png"
    assert path.exists(), f"no {path}"
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000, (len(data), data[:8])


def test_bench_prints_the_table(bench):
    run, _ = ok(bench)
    assert "| fused |" in run.stdout and "vs per_feature" in run.stdout, run.describe()
    for mode in MODES:
        assert f"| {mode} |" in run.stdout, f"no row for {mode}\n{run.describe()}"
    # sweep rows
    assert "| 2 |" in run.stdout and "| 4 |" in run.stdout, run.describe()
    # rank 0 prints the table, rank 1 does not
    assert "[1]<stdout>:| fused |" not in run.stdout, run.describe()
    assert str(bench["out"]) in run.stderr and "bench.json" in run.stderr, run.describe()


@pytest.mark.parametrize("modes", [["fused_native", "fused_keras", "dense_only"], ["fused_tfra"]],
                         ids=["native", "tfra"])
def test_bench_table_backends_and_dense_only_on_one_worker(apps, tiny_yaml, tmp_path, modes):
    """fused_native and fused_tfra (fused on each table backend), fused_keras (the layer's defaults and a plain Keras
    optimizer) and dense_only (constant embeddings: no lookup, no all-to-all) are measured; on 1 worker nothing is
    sent."""
    out = tmp_path / "out"
    run = apps.run_app(MODULE, ["--config", tiny_yaml(), "--modes", ",".join(modes), "--steps", 2,
                                "--repeats", 1, "--warmup", 1, "--batches", 2, "--sweep", "", "--out", out])
    run.expect_ok()
    with open(out / "bench.json") as f:
        measured = json.load(f)["modes"]
    assert list(measured) == modes, list(measured)
    for mode, entry in measured.items():
        assert entry["samples_per_s"] > 0 and entry["alltoall_ops_in_step_graph"] == 0, (mode, entry)


def test_bench_refuses_a_mode_it_cannot_run(apps, tiny_yaml, tmp_path):
    """Asked for by name where TFRA cannot run, a TFRA mode is an error saying how to get it (here, the current
    stack); where it can, the same flags run."""
    out = tmp_path / "out"
    run = apps.run_app(MODULE, ["--config", tiny_yaml(), "--modes", "fused,per_feature", "--steps", 1, "--repeats", 1,
                                "--warmup", 1, "--batches", 1, "--sweep", "", "--out", out])
    if TFRA_INSTALLED:
        run.expect_ok()
    else:
        run.expect_error("--modes per_feature run on TFRA")
        assert "tf_fusedrec[tfra]" in run.stderr, run.describe()


def test_bench_unknown_mode_exits_2(apps, tiny_yaml, tmp_path):
    out = tmp_path / "out"
    run = apps.run_app(MODULE, ["--config", tiny_yaml(), "--modes", "fused,warp_speed", "--out", out])
    run.expect_error("warp_speed")
    assert not os.path.exists(out / "bench.json")


def test_bench_counts_the_dense_allreduce_and_splits_the_time_in_flight(bench):
    _, report = ok(bench)
    assert report["cpus_per_worker"] == len(os.sched_getaffinity(0)), report["cpus_per_worker"]
    modes = report["modes"]
    # One grouped allreduce of the dense gradients per step, the same model (so the same bytes) in every mode
    # without hot rows; replicated hot rows add their gradients to it.
    dense = modes["fused"]["allreduce_bytes_per_step"]
    assert dense > 0 and dense % 4 == 0, modes["fused"]
    for mode in [m for m in ("fused", "per_feature", "fused_nodedup", "fused_source_hash", "tfra_hand_fused",
                              "fused_dbp") if m in MODES]:
        assert modes[mode]["allreduce_calls_per_step"] == 1, (mode, modes[mode])
        assert modes[mode]["allreduce_bytes_per_step"] == dense, (mode, modes[mode])
    assert modes["fused_hot"]["allreduce_bytes_per_step"] > dense, modes["fused_hot"]
    for mode in MODES:
        for kind in ("alltoall", "allreduce"):
            wait, moving = (modes[mode][f"{kind}_{part}_seconds_per_step"] for part in ("wait", "transfer"))
            assert wait >= 0 and moving > 0, (mode, kind, wait, moving)


@pytest.mark.parametrize("steps_per_call", [1, 3])
def test_bench_runner_runs_each_step_once_at_any_steps_per_call(tiny_yaml, steps_per_call):
    """Runner.run(7) with --steps-per-call K runs 7 steps (calls of K, the last shorter): the dense optimizer applied
    its update 7 times, and the pipeline was built with K."""
    import tensorflow as tf  # noqa: PLC0415

    from tf_fusedrec.bench import train_bench  # noqa: PLC0415
    from tf_fusedrec.distributed import comm as comm_lib  # noqa: PLC0415
    from tf_fusedrec.train import experiment  # noqa: PLC0415

    tf.keras.backend.clear_session()
    config = cfg.load_config(tiny_yaml(name=f"tiny_k{steps_per_call}.yaml"))
    comm = comm_lib.SingleProcessComm()
    batches = experiment.make_dataset(config, config.train.batch_size, 0, 1).take(2).cache()
    runner = train_bench.Runner("fused_native", config, batches, comm, None, steps_per_call=steps_per_call)
    assert runner.pipeline.steps_per_call == steps_per_call
    variables = runner.optimizer.variables
    variables = variables() if callable(variables) else variables  # a method in Keras 2, a property in Keras 3
    iterations = [v for v in variables if "iteration" in v.name]
    assert iterations, [v.name for v in variables]
    loss = runner.run(7)
    assert math.isfinite(loss)
    assert [int(v.numpy()) for v in iterations] == [7] * len(iterations)


def test_bench_steps_per_call_below_1_exits_2(apps, tiny_yaml, tmp_path):
    out = tmp_path / "out"
    run = apps.run_app(MODULE, ["--config", tiny_yaml(), "--steps-per-call", 0, "--out", out])
    run.expect_error("--steps-per-call must be >= 1, got 0")
    assert not os.path.exists(out / "bench.json")

"""`python -m tf_fusedrec.train --pipeline ...` in subprocesses: the schedules train the same model as sync, the
summary says which schedule ran and, with 2 workers, how much all-to-all time was in flight and exposed; --hot
replicates hot rows without changing the result (the flags these refuse: tests/apps/test_refusals.py)."""

import math


import tf_fusedrec as fr
from tf_fusedrec import config as cfg

MODULE = "tf_fusedrec.train"
STEPS = 4
PIPELINE_KEYS = {"pipeline", "micro_batches", "cluster_samples"}


def run(apps, where, *flags, workers=1):
    config = apps.write_config(where / "tiny.yaml", apps.tiny_config("dlrm"))
    result = apps.run_app(MODULE, ["--config", config, "--steps", STEPS, "--no-progress", *flags], workers=workers)
    return apps.the_summary(result.expect_ok()), config


def test_fwp_with_clustering_trains_like_sync(apps, tmp_path):
    sync, _ = run(apps, tmp_path / "sync", "--pipeline", "sync")
    fwp, _ = run(apps, tmp_path / "fwp", "--pipeline", "fwp", "--micro-batches", "2", "--cluster-samples")
    assert PIPELINE_KEYS <= set(fwp)
    assert (sync["pipeline"], sync["micro_batches"], sync["cluster_samples"]) == ("sync", 1, False)
    assert (fwp["pipeline"], fwp["micro_batches"], fwp["cluster_samples"]) == ("fwp", 2, True)
    # Same data, same model, same update: the schedules differ only in float summation order.
    assert math.isclose(fwp["final_loss"], sync["final_loss"], rel_tol=1e-5), (fwp["final_loss"], sync["final_loss"])
    assert math.isclose(fwp["auc"], sync["auc"], rel_tol=1e-4), (fwp["auc"], sync["auc"])


def test_dbp_on_two_workers_reports_exposed_alltoall_time(apps, tmp_path):
    apps.require_horovod()
    summary, config = run(apps, tmp_path, "--pipeline", "dbp", workers=2)
    groups = len(fr.FusedEmbedding(cfg.load_config(config).embedding_features()).groups)
    assert summary["pipeline"] == "dbp" and summary["workers"] == 2
    # Per group: the next batch's keys, this batch's embeddings and their gradients.
    assert summary["alltoall_ops_in_step_graph"] == 3 * groups, summary
    busy, exposed = summary["alltoall_busy_seconds_per_step"], summary["exposed_alltoall_seconds_per_step"]
    assert 0 < exposed <= busy, summary


def test_hot_rows_on_two_workers_report_the_choice_and_the_hits(apps, tmp_path):
    """--hot R: the summary says what was replicated and how many ids were served locally; the loss equals the run
    without replication (replication changes where rows live, not what is computed)."""
    apps.require_horovod()
    plain, _ = run(apps, tmp_path / "plain", workers=2)
    hot, _ = run(apps, tmp_path / "hot", "--hot", "8", "--hot-sample-batches", "3", workers=2)
    assert "hot" not in plain
    assert [g["rows"] for g in hot["hot"]] == [8] * len(hot["hot"]) and hot["hot"][0]["sample_batches"] == 6, hot
    assert sum(hot["hot_hits_per_step"].values()) > 0, hot
    assert math.isclose(hot["final_loss"], plain["final_loss"], rel_tol=1e-5), (hot["final_loss"], plain["final_loss"])
    assert math.isclose(hot["auc"], plain["auc"], rel_tol=1e-4), (hot["auc"], plain["auc"])
    assert hot["alltoall_bytes_per_step"] < plain["alltoall_bytes_per_step"], (hot, plain)



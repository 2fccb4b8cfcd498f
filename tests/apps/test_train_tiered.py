"""`python -m tf_fusedrec.train` with tiered tables (tables larger than memory): the tiny config (tables of about 2,000
rows per group) with 24 KiB of DRAM per table (192 rows) trains to exactly the all-DRAM run's final loss and held-out
AUC, given as the config's embedding.tier or as --tier-dram-bytes/--tier-path; the summary reports the tiers (rows
in DRAM and on disk, hit rate, disk bytes per step) and so does the short summary; a tiered run resumed from its
checkpoint ends where the straight one does; and the flags' misuse is refused naming them."""

import pytest

from tf_fusedrec.train import app

MODULE = "tf_fusedrec.train"
STEPS = 6


@pytest.fixture(scope="module")
def runs(apps, tmp_path_factory):
    where = tmp_path_factory.mktemp("tiered_app")
    plain = apps.write_config(where / "tiny.yaml", apps.tiny_config())
    tiered = apps.write_config(where / "tiered.yaml", apps.tiny_config(
        embedding={"tier": {"dram_bytes": "24KiB", "path": str(where / "stores-config")}}))
    common = ["--steps", STEPS, "--no-progress"]
    out = {"dram": apps.run_app(MODULE, ["--config", plain] + common).expect_ok(),
           "tiered": apps.run_app(MODULE, ["--config", tiered] + common).expect_ok()}
    flags = ["--config", plain, "--no-progress", "--model-dir", where / "model", "--tier-dram-bytes", "24576",
             "--tier-path", where / "stores-flags"]
    out["first"] = apps.run_app(MODULE, flags + ["--steps", STEPS // 2]).expect_ok()
    out["resumed"] = apps.run_app(MODULE, flags + ["--steps", STEPS]).expect_ok()
    return {k: (run, apps.the_summary(run)) for k, run in out.items()}


def test_tiered_run_trains_as_the_all_dram_run(runs):
    (_, dram), (run, tiered) = runs["dram"], runs["tiered"]
    assert tiered["final_loss"] == dram["final_loss"], run.describe()
    assert tiered["auc"] == dram["auc"], run.describe()
    tier = tiered["tier"]
    assert tier["dram_bytes"] == 24 * 1024 and tier["path"].endswith("stores-config")
    assert sum(tier["per_worker"]["disk_rows"]) > 0 and sum(tier["per_worker"]["evicted_rows"]) > 0, tier
    assert 0 < tier["hit_rate"] < 1 and tier["disk_bytes_written_per_step"] > 0, tier
    assert "tier" not in dram
    assert "  tiers        DRAM hit rate" in run.stdout, run.describe()


def test_tiered_run_resumes_to_the_straight_result(runs):
    (_, straight), (run, resumed) = runs["tiered"], runs["resumed"]
    assert resumed["final_loss"] == straight["final_loss"], run.describe()
    assert resumed["auc"] == straight["auc"], run.describe()


@pytest.mark.parametrize("argv, message", [
    (["--tier-dram-bytes", "1GiB"], "--tier-dram-bytes and --tier-path go together"),
    (["--tier-dram-bytes", "lots", "--tier-path", "/tmp/x"], "--tier-dram-bytes: expected bytes"),
    (["--tier-dram-bytes", "1GiB", "--tier-path", "/tmp/x", "--embedding", "per_feature"], "needs a fused"),
])
def test_tier_flags_are_checked(apps, tmp_path, argv, message):
    config = apps.write_config(tmp_path / "tiny.yaml", apps.tiny_config())
    args = app.parse_args(["--config", str(config)] + argv)
    from tf_fusedrec import config as cfg  # noqa: PLC0415

    with pytest.raises(ValueError, match=message):
        app.plan_of(args, cfg.load_config(str(config)))


def test_config_tier_is_checked(apps, tmp_path):
    from tf_fusedrec import config as cfg  # noqa: PLC0415

    for tier, message in (({"dram_bytes": 0, "path": "/tmp/x"}, "must be > 0"),
                          ({"dram_bytes": "1GiB"}, "tier takes dram_bytes and path"),
                          ("2GiB", "tier must be None")):
        path = apps.write_config(tmp_path / "bad.yaml", apps.tiny_config(embedding={"tier": tier}))
        with pytest.raises(ValueError, match=message):
            cfg.load_config(str(path))

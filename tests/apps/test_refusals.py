"""`python -m tf_fusedrec.train` refuses flags that do not fit, before any worker starts: exit status 2 and one
'error: ...' line naming the flag (or the config key), in-process (tf_fusedrec.train.app.main).

The app checks every flag against the others and the config (app.plan_of) before Horovod starts or anything is built;
these tests run main(argv) in the pytest process with the worker start replaced by a failure, so a refusal that does
not happen fails the test instead of training here. The exit status and the clean message of the real command line
are checked end to end once, in tests/apps/test_train.py (a missing config file).
"""

import pytest

from tf_fusedrec.train import app

GRM = "configs/grm_synthetic.yaml"


@pytest.fixture
def refuse(monkeypatch, capsys):
    """refuse(argv, *fragments): main(argv) exits 2 before any worker starts, with an 'error: ...' line on stderr
    holding every fragment; -> that line."""

    def no_workers():
        raise AssertionError("the flags were accepted: the app went on to start its workers")

    monkeypatch.setattr(app.comm_lib, "init_workers", no_workers)

    def check(argv, *fragments):
        with pytest.raises(SystemExit) as exit_info:
            app.main([str(a) for a in argv])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2, f"exit status {exit_info.value.code}\n{err}"
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, err
        for fragment in fragments:
            assert fragment in errors[0], (fragment, errors[0])
        return errors[0]

    return check


def test_bad_config_names_the_key(apps, refuse, tmp_path):
    config = apps.write_config(tmp_path / "bad.yaml", apps.tiny_config(model={"cross_layer": 2}))
    refuse(["--config", config, "--no-progress", "--model-dir", tmp_path / "model"], "unknown key 'cross_layer'",
           "model")
    assert not (tmp_path / "model").exists(), "a failed config check left a model directory"


@pytest.mark.parametrize("flag, value", [("--steps", 0), ("--steps", -1), ("--batch-size", 0)])
def test_non_positive_overrides(refuse, tiny_yaml, flag, value):
    refuse(["--config", tiny_yaml(), "--no-progress", flag, value], "must be positive")


def test_steps_per_call_below_one(refuse, tiny_yaml):
    refuse(["--config", tiny_yaml(), "--no-progress", "--steps-per-call", "0"], "--steps-per-call must be >= 1")


@pytest.mark.parametrize("flags, fragment", [
    (["--pipeline", "dbp", "--embedding", "per_feature"], "--pipeline dbp needs a FusedEmbedding"),
    (["--pipeline", "fwp", "--micro-batches", "0"], "--micro-batches must be >= 1"),
    (["--hot", "-2"], "--hot must be auto or a number of rows >= 0"),
    (["--hot", "3", "--embedding", "per_feature"], "--hot needs --embedding fused"),
    (["--hot-repeek"], "--hot-repeek needs --hot auto or R > 0"),
    (["--hot", "3", "--hot-repeek", "--pipeline", "dbp"], "--hot-repeek needs --pipeline sync"),
    (["--table-backend", "native", "--embedding", "per_feature"], "--table-backend native needs a fused --embedding"),
    (["--evict-capacity", "10", "--embedding", "per_feature"], "--evict-capacity needs a fused --embedding"),
    (["--admission-min-count", "3", "--embedding", "per_feature"], "--admission-min-count needs a fused --embedding"),
    (["--expiry-steps", "5", "--embedding", "per_feature"], "--expiry-steps needs a fused --embedding"),
    (["--admission-min-count", "0"], "--admission-min-count must be >= 1, got 0"),
    (["--expiry-steps", "0"], "--expiry-steps must be >= 1, got 0"),
    (["--expiry-steps", "5", "--expiry-interval", "-1"], "--expiry-interval must be >= 1, got -1"),
    (["--expiry-interval", "5"], "--expiry-interval needs --expiry-steps"),
])
def test_flags_that_do_not_fit(refuse, tiny_yaml, flags, fragment):
    refuse(["--config", tiny_yaml(), "--steps", 2, "--no-progress", *flags], fragment)


@pytest.mark.parametrize("embedding, fragment", [
    ({"admission_min_count": 0}, "embedding.admission_min_count: must be a positive int or null, got 0"),
    ({"expiry_steps": "often"}, "embedding.expiry_steps: must be a positive int or null, got 'often'"),
    ({"expiry_interval": 0}, "embedding.expiry_interval: must be a positive int, got 0"),
])
def test_bad_table_policy_keys_name_the_key(refuse, tiny_yaml, embedding, fragment):
    refuse(["--config", tiny_yaml(embedding=embedding), "--steps", 2, "--no-progress"], fragment)


@pytest.mark.parametrize("args, fragment", [
    (["--config", "configs/criteo_synthetic.yaml", "--balance", "tokens"], "--balance tokens needs a sequence config"),
    (["--config", GRM, "--pipeline", "fwp"], "--pipeline fwp weights micro-batches by their local size"),
    (["--config", GRM, "--embedding", "per_feature", "--table-storage", "float16"],
     "--table-storage float16 needs a fused --embedding"),
    (["--config", GRM, "--evict-capacity", "0"], "Eviction: capacity must be an integer >= 1, got 0"),
])
def test_sequence_config_refusals(refuse, args, fragment):
    refuse(args + ["--steps", "2", "--batch-size", "8", "--no-progress"], fragment)

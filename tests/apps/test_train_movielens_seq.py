"""`python -m tf_fusedrec.train` on configs/movielens1m_seq.yaml (the GRM on MovieLens-1M sequences), pointed at a
small ml-1m directory the test writes (data.path, as for configs/movielens1m.yaml).

* 1 process, --balance tokens and --balance none: a finite loss, one held-out AUC per task (click, conversion); with
  none every step holds batch_size samples.
* 2 workers under horovodrun with --balance tokens: both workers train and the summary has both tasks' AUC.
"""

import math
import random

import pytest
import yaml

STEPS, BATCH = 3, 16


def _write_ml1m(path, seed=0):
    """40 users with 8 to 40 ratings each of 60 movies; ratings rise with the movie id (something to learn)."""
    rnd = random.Random(seed)
    path.mkdir(parents=True)
    users = [f"{u}::{rnd.choice('FM')}::{rnd.choice([1, 18, 25, 35, 45, 50, 56])}::{rnd.randint(0, 20)}::{10000 + u}"
             for u in range(1, 41)]
    movies = [f"{m}::Film {m} (1999)::Drama" for m in range(1, 61)]
    ratings = [f"{u}::{m}::{min(5, 1 + m // 15 + rnd.randint(0, 1))}::{978300000 + rnd.randint(0, 10 ** 6)}"
               for u in range(1, 41) for m in rnd.sample(range(1, 61), rnd.randint(8, 40))]
    for name, lines in (("users.dat", users), ("movies.dat", movies), ("ratings.dat", ratings)):
        (path / name).write_text("".join(line + "\n" for line in lines), encoding="latin-1")
    return path


@pytest.fixture(scope="module")
def config_path(apps, tmp_path_factory):
    root = tmp_path_factory.mktemp("movielens_seq")
    raw = yaml.safe_load((apps.ROOT / "configs" / "movielens1m_seq.yaml").read_text())
    raw["data"]["path"] = str(_write_ml1m(root / "ml-1m"))
    return apps.write_config(root / "movielens1m_seq.yaml", raw)


def _train(apps, config_path, balance, workers=1):
    run = apps.run_app("tf_fusedrec.train", ["--config", config_path, "--steps", STEPS, "--batch-size", BATCH,
                                             "--balance", balance, "--no-progress"], workers=workers)
    assert run.rc == 0, run.describe()
    return run, apps.the_summary(run)


def _check_summary(run, s, balance, workers):
    assert s["config"] == "movielens1m_seq" and s["balance"] == balance and s["workers"] == workers, run.describe()
    assert math.isfinite(s["final_loss"]) and s["final_loss"] > 0
    assert set(s["auc"]) == {"click", "conversion"} and all(0.0 <= v <= 1.0 for v in s["auc"].values())
    totals = s["samples_per_worker"]["total"]
    assert len(totals) == workers and all(t > 0 for t in totals)


@pytest.mark.parametrize("balance", ["tokens", "none"])
def test_one_process(apps, config_path, balance):
    run, s = _train(apps, config_path, balance)
    _check_summary(run, s, balance, 1)
    if balance == "none":
        assert s["target_tokens_per_step"] is None and s["samples_per_worker"]["total"] == [STEPS * BATCH]
    else:
        assert s["target_tokens_per_step"] > 0 and s["tokens_per_worker"][0] > 0


def test_two_workers(apps, config_path):
    apps.require_horovod()
    run, s = _train(apps, config_path, "tokens", workers=2)
    _check_summary(run, s, "tokens", 2)
    assert len(s["tokens_per_worker"]) == 2

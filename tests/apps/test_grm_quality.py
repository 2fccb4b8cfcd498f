"""The GRM beats its DLRM baseline on grm_synthetic (issue 23 item 2): configs/grm_synthetic.yaml and
configs/grm_synthetic_dlrm.yaml (the same data, seed, batches and held-out batches; the DLRM pools the history into a
bag) trained by `python -m tf_fusedrec.train` on one worker for STEPS steps. grm_synthetic's labels depend on the
history's most recent items and on how the history's items relate to the candidate (tf_fusedrec/data/sequences.py):
a sequence model reads both, a pooled bag only an average. The held-out AUC of each task must be higher for the GRM
(here by 0.047 and 0.038 at 200 steps, 0.013 and 0.036 at 100; benchmarks/grm/bench_grm_quality.sh measures the issue's
0.01 margin at 300 steps on 2 workers and three data seeds: benchmarks/results/grm/quality). The test asks only for the ordering:
a run's AUC moves by up to 0.01 with the dense kernels' last bits alone (benchmarks/results/grm/noise), which a margin close to the
measured one would turn into a flaky test on other CPUs."""

import pytest
import yaml

STEPS, BATCH = 200, 128


@pytest.fixture(scope="module")
def aucs(apps, tmp_path_factory):
    where = tmp_path_factory.mktemp("grm_quality")
    out = {}
    for model, path in (("grm", "configs/grm_synthetic.yaml"), ("dlrm", "configs/grm_synthetic_dlrm.yaml")):
        raw = yaml.safe_load((apps.ROOT / path).read_text())
        raw["data"]["eval_batches"] = 16
        config = apps.write_config(where / f"{model}.yaml", raw)
        run = apps.run_app("tf_fusedrec.train", ["--config", config, "--steps", STEPS, "--batch-size", BATCH,
                                                 "--balance", "none", "--no-progress"], workers=1)
        assert run.rc == 0, run.describe()
        (_, summary), = apps.summaries(run)
        out[model] = summary["auc"]
    return out


@pytest.mark.parametrize("task", ["click", "conversion"])
def test_the_grm_beats_the_dlrm_on_sequences(aucs, task):
    assert aucs["grm"][task] > aucs["dlrm"][task], aucs

"""python -m tf_fusedrec.serve.bench, end to end on a tiny config (one-process training, export, 2 embedding servers,
4 rankers, 8 one-second load tests, a 2-point saturation curve), the same with --tls --tls-client-auth (mutual TLS on
every hop, a throwaway CA made by the documented openssl commands; no curve), and its synthetic spec of
configs/criteo_serve.yaml.

Behaviour only, never timing: every run answered requests, none failed at the low load, bytes moved, pooling on the
servers moves fewer bytes back than fetching the rows when there is no cache, the cache gets hits, and the curve's
points, summary and plot are written.
"""

import json
import subprocess
import sys

import pytest

from tests.serve import serve_fixtures
from tests.subprocess_runner import ROOT, execute, tail
from tf_fusedrec import config as cfg
from tf_fusedrec.serve import bench, security

# 2 one-hot features and 2 bags of 1 to 30 ids: the bags are what pooling on the servers saves on.
TINY_CONFIG = """
name: serve_bench_smoke
data: {source: synthetic, num_dense: 4, seed: 0, eval_batches: 1}
feature_defaults: {vocab: 20000, zipf: 1.2, max_id_bits: 15, optimizer: {name: adagrad, learning_rate: 0.05}}
features:
  - {name: user, dim: 8}
  - {name: item, dim: 8}
  - {name: tags, dim: 8, hotness: [1, 30], combiner: mean}
  - {name: history, dim: 8, hotness: [1, 30], combiner: mean}
model: {name: dlrm, bottom_mlp: [16, 8], top_mlp: [16]}
train: {batch_size: 256, steps: 3, checkpoint_every: 3, log_every: 1}
"""


def manifest_of(config, dense_width):
    """The parts of an export's manifest synthetic_spec reads."""
    return {"features": [{"name": f.name} for f in config.features],
            "dense": {"inputs": {"dense": {"shape": [None, dense_width], "dtype": "float32"}}}}


def test_the_serve_config_gives_bags_with_a_combiner_to_pool():
    config = cfg.load_config(ROOT / "configs" / "criteo_serve.yaml")
    bags = [f for f in config.features if f.hotness != 1]
    assert bags and all(f.combiner == "mean" and f.to_feature().combiner == "mean" for f in bags)
    spec = bench.synthetic_spec(config, manifest_of(config, config.data.num_dense))
    assert spec["dense"] == {"name": "dense", "width": 13}
    assert len(spec["features"]) == len(config.features) == 26
    for f in config.features:
        entry = spec["features"][f.name]
        assert entry["range"] == [0, f.vocab] and entry["zipf"] == f.zipf
        assert entry.get("length") == (list(f.hotness) if f.hotness != 1 else None)


def test_an_export_of_another_config_is_refused_naming_a_feature():
    config = cfg.load_config(ROOT / "configs" / "criteo_serve.yaml")
    manifest = manifest_of(config, 13)
    manifest["features"][0]["name"] = "colour"
    with pytest.raises(ValueError, match="'C1' is in only one|'colour' is in only one"):
        bench.synthetic_spec(config, manifest)


def test_the_bench_end_to_end(tmp_path):
    config_path = tmp_path / "tiny.yaml"
    config_path.write_text(TINY_CONFIG)
    out = tmp_path / "out"
    code, stdout, stderr = execute(
        [sys.executable, "-m", "tf_fusedrec.serve.bench", "--config", str(config_path), "--steps", "3",
         "--train-batch-size", "256", "--duration", "1", "--warmup", "0.5", "--low-qps", "4", "--high-qps", "12",
         "--burst-every", "0.5", "--burst-size", "2", "--timeout", "10", "--curve-qps", "8,3", "--out", str(out)],
        timeout=600)  # 46 s in a CI run, 150 s on 2 cores at a load average of 15: a bound for a hang only
    assert code == 0, tail(stderr)
    result = json.loads((out / "serve_bench.json").read_text())
    assert result["command"].startswith("python -m tf_fusedrec.serve.bench --config")
    assert len(result["machine"]["load_average_start"]) == 3
    runs = result["runs"]
    assert [(r["pooling"], r["cache_mb"] > 0, r["load"]) for r in runs] == [
        (pooling, cache, load) for pooling in (True, False) for cache in (True, False) for load in ("low", "high")]
    for run in runs:
        where = f"pooling {run['pooling']}, cache {run['cache_mb']}, {run['load']} load"
        assert run["ok"] > 0 and run["requests_per_s"] > 0 and run["instances_per_s"] > 0, where
        assert run["p50_ms"] is not None and run["p50_ms"] <= run["p99_ms"], where
        assert run["bytes_from_servers_per_request"] > 0 and run["bytes_to_servers_per_request"] > 0, where
        if run["load"] == "low":
            assert run["errors"] == 0 and run["dropped"] == 0, (where, run["errors_by_kind"])
        if run["cache_mb"]:
            assert run["cache_hit_rate"] > 0, where
        else:
            assert run["cache_hit_rate"] is None, where
    # Without a cache, the servers' partial sums (one per bag and server) are fewer bytes than the bags' rows.
    # (With the cache, what reaches the servers is the tail, about one id per bag, where pooling saves nothing.)
    for load in ("low", "high"):
        pooled, fetched = (next(r for r in runs if r["pooling"] is p and not r["cache_mb"] and r["load"] == load)
                           for p in (True, False))
        assert pooled["bytes_from_servers_per_request"] < fetched["bytes_from_servers_per_request"], load
    table = (out / "serve_bench.md").read_text()
    assert table.count("\n| on |") + table.count("\n| off |") == 8
    assert "| pooling | cache | load |" in stdout

    curve = json.loads((out / "serve_curve.json").read_text())
    assert curve["setup"]["pooling"] is True and curve["setup"]["cache_mb"] > 0
    assert curve["settings"]["curve_qps"] == [3.0, 8.0]
    assert len(curve["machine"]["load_average_start"]) == len(curve["machine"]["load_average_end"]) == 3
    points = curve["points"]
    assert [p["offered_qps"] for p in points] == [3.0, 8.0]
    for p in points:
        assert p["load"] == "curve" and p["burst_size"] == 0, p["offered_qps"]
        assert p["ok"] > 0 and p["requests_per_s"] > 0 and p["p50_ms"] <= p["p99_ms"], p["offered_qps"]
        assert p["errors"] >= 0 and p["dropped"] >= 0 and p["ok"] + p["errors"] <= p["sent"] <= p["arrivals"]
        assert set(p["cpu_s_per_s"]) == {"ranker", "servers", "load_generator"}
        assert all(v is None or v >= 0 for v in p["cpu_s_per_s"].values()), p["cpu_s_per_s"]
    sat = curve["saturation"]
    assert sat["max_requests_per_s"] == max(p["requests_per_s"] for p in points)
    assert sat["highest_offered_qps_all_served"] in (None, 3.0, 8.0)
    assert (out / "serve_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "## Saturation curve: pooling on, cache" in table and "| offered q/s | achieved req/s |" in table
    assert "| offered q/s | achieved req/s |" in stdout


def test_the_throwaway_ca_is_made_by_the_documented_commands(tmp_path):
    # security.PKI_COMMANDS is the page's CA and `cert` function, line for line (the page's block is tested by
    # tests/serve/test_tls.py, which runs it).
    documented = [line.strip() for line in serve_fixtures.documented_pki_commands().splitlines()]
    lines = [line.strip() for line in security.PKI_COMMANDS.strip().splitlines()]
    assert len(lines) == 13 and [line for line in lines if line not in documented] == []
    if not serve_fixtures.HAS_OPENSSL:
        pytest.skip("the openssl CLI is not installed")
    transport = bench.Transport.make(True, True, str(tmp_path))
    ca, (cert, key) = transport.pki["ca"], transport.pki["local"]
    out = subprocess.run(["openssl", "verify", "-CAfile", ca, cert], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert transport.label == "mutual TLS" and transport.url(8501, "m") == "https://127.0.0.1:8501/v1/models/m"
    assert transport.server_flags() == ["--tls-cert", cert, "--tls-key", key, "--tls-ca", ca, "--tls-client-auth"]
    assert transport.ranker_flags() == ["--tls-cert", cert, "--tls-key", key, "--tls-ca", ca, "--tls-client-auth"]
    client = transport.client_tls()
    assert client.verifies and client.cert is not None  # the load generator presents the certificate
    one_way = bench.Transport(transport.pki)
    assert one_way.label == "TLS" and "--tls-client-auth" not in one_way.server_flags() + one_way.ranker_flags()
    assert one_way.server_flags() == ["--tls-cert", cert, "--tls-key", key] and one_way.client_tls().cert is None
    plain = bench.Transport.make(False, False, str(tmp_path / "unused"))
    assert plain.label == "plain" and plain.server_flags() == plain.ranker_flags() == [] and plain.client_tls() is None
    assert plain.url(8501, "m") == "http://127.0.0.1:8501/v1/models/m" and not (tmp_path / "unused").exists()
    with pytest.raises(SystemExit):
        bench.parse_args(["--tls-client-auth"])  # mutual TLS needs --tls


@pytest.mark.skipif(not serve_fixtures.HAS_OPENSSL, reason="the openssl CLI is not installed")
def test_the_bench_over_mutual_tls(tmp_path):
    config_path = tmp_path / "tiny.yaml"
    config_path.write_text(TINY_CONFIG)
    out = tmp_path / "out"
    code, stdout, stderr = execute(
        [sys.executable, "-m", "tf_fusedrec.serve.bench", "--config", str(config_path), "--steps", "3",
         "--train-batch-size", "256", "--duration", "1", "--warmup", "0.5", "--low-qps", "4", "--high-qps", "8",
         "--burst-size", "0", "--timeout", "10", "--curve-qps", "", "--tls", "--tls-client-auth", "--out", str(out)],
        timeout=600)  # as long as the plain bench's, less the curve: a bound for a hang only
    assert code == 0, tail(stderr)
    assert "embedding servers ready on" in stderr and "(mutual TLS)" in stderr
    result = json.loads((out / "serve_bench.json").read_text())
    assert result["transport"] == "mutual TLS" and "--tls --tls-client-auth" in result["command"]
    assert len(result["runs"]) == 8 and not (out / "serve_curve.json").exists()
    for run in result["runs"]:
        where = f"pooling {run['pooling']}, cache {run['cache_mb']}, {run['load']} load"
        # Every request answered over HTTPS, the ranker's stats read over HTTPS, the rows fetched over gRPC TLS.
        assert run["ok"] > 0 and run["errors"] == 0, (where, run["errors_by_kind"])
        assert run["report"]["url"].startswith("https://127.0.0.1:"), where
        assert run["bytes_from_servers_per_request"] > 0, where
    assert "over mutual TLS (certificates of a throwaway CA)" in (out / "serve_bench.md").read_text()

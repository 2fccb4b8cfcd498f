"""The cluster cost model (tf_fusedrec/cluster/model.py) on made-up runs whose answers are worked out by hand here:
the probe fits it reads back, each term of the formula, the checks, the projection and its refusals."""

import json
import os

import pytest

from tf_fusedrec.cluster import model

SIZES = [1 << k for k in range(10, 25, 2)]
BATCH = 1000
# mode: (local step s, all-to-all calls, all-to-all bytes, allreduce calls, allreduce bytes) per step
MODES = {"fused": (0.100, 6, 6_000_000, 1, 100_000), "per_feature": (0.200, 78, 6_000_000, 1, 100_000)}


def probe(network, a, b, r, e, workers=2, workers_per_host=1):
    """A probe.json whose points lie on t = a + b S (all-to-all) and r + e S (allreduce)."""
    def curve(lat, slope):
        return {"latency_s": 0.0, "seconds_per_byte": 0.0, "r2": 0.0,
                "points": [{"bytes": s, "calls": 2, "seconds": lat + slope * s} for s in SIZES]}

    return {"network": network, "workers": workers, "hosts": 1 if network == "loopback" else 2,
            "workers_per_host": workers if network == "loopback" else workers_per_host, "reps": 1,
            "alltoall": curve(a, b), "allreduce": curve(r, e)}


def bench(network, workers, steps, pinned=1):
    """A bench.json whose modes take `steps[mode]` seconds per step, with MODES' traffic."""
    modes = {}
    for m, seconds in steps.items():
        _, calls, nbytes, ar_calls, ar_bytes = MODES[m]
        modes[m] = {"samples_per_s": BATCH * workers / seconds, "alltoall_calls_per_step": calls,
                    "alltoall_bytes_per_step": nbytes, "allreduce_calls_per_step": ar_calls,
                    "allreduce_bytes_per_step": ar_bytes}
    return {"config": "made_up", "workers": workers, "hosts": 1 if network in ("loopback", "none") else 2,
            "network": network, "cpus_per_worker": pinned, "batch_size_per_worker": BATCH, "modes": modes}


def write(root, name, bench_json, probe_json=None):
    os.makedirs(root / name)
    (root / name / "bench.json").write_text(json.dumps(bench_json))
    if probe_json is not None:
        (root / name / "probe.json").write_text(json.dumps(probe_json))


LO = dict(a=0.002, b=0.5e-9, r=0.004, e=1e-9)
LINK = dict(a=0.003, b=80e-9, r=0.006, e=85e-9)  # at N = 2 on 2 hosts: half of a message crosses the link
RATE, BUCKET = 100e6 / 8, 64 * 1024  # 100mbit: the cluster's tbf bucket is its 64 KiB floor


@pytest.fixture
def runs(tmp_path):
    write(tmp_path, "loopback-n2", bench("loopback", 2, {m: v[0] for m, v in MODES.items()}), probe("loopback", **LO))
    write(tmp_path, "100mbit-n2", bench("100mbit", 2, {"fused": 0.500, "per_feature": 0.300}),
          probe("100mbit", **LINK))
    write(tmp_path, "n1-1core", bench("none", 1, {"fused": 0.040, "per_feature": 0.045}))
    return tmp_path


def expected(mode, n):
    """The formula written out for this test's numbers: bytes beyond the bucket tokens a call finds, with the
    calls spread evenly over the local step."""
    local, k, t, j, d = MODES[mode]
    tokens = min(BUCKET, RATE * local / (k + j))
    c_link = LINK["b"] / 0.5
    alltoall = k * max(0.0, t / k * (n - 1) / n - tokens) * c_link
    allreduce = j * max(0.0, d / j * 2 * (n - 1) / n - tokens) * LINK["e"]
    return local - t * LO["b"] - d * LO["e"] + alltoall + allreduce


def test_probe_fits_are_read_back_exactly(runs):
    (_, _, lo), _, _ = sorted(model.load_runs(runs), key=lambda r: r[0] != "loopback-n2")
    net = model.Network("loopback", lo)
    assert net.a == pytest.approx(LO["a"]) and net.b2 == pytest.approx(LO["b"]) and not net.linked
    assert net.r == pytest.approx(LO["r"]) and net.e2 == pytest.approx(LO["e"])


def test_checks_and_anchor(runs):
    result = model.build(model.load_runs(runs))
    by = {(c["run"], c["mode"]): c for c in result["checks"]}
    for m, (local, *_) in MODES.items():
        anchor = by[("loopback-n2", m)]
        assert anchor["kind"] == "anchor" and anchor["model_s"] == pytest.approx(local) == anchor["measured_s"]
        check = by[("100mbit-n2", m)]
        assert check["kind"] == "check"
        assert check["model_s"] == pytest.approx(expected(m, 2), rel=1e-9)
        assert check["error"] == pytest.approx(check["model_s"] / check["measured_s"] - 1)
        assert sum(check["parts"].values()) == pytest.approx(check["model_s"])
        assert by[("n1-1core", m)]["kind"] == "one worker" and "model_s" not in by[("n1-1core", m)]
    # fused: calls 14.3 ms apart refill the whole 65,536-byte bucket; each of 6 sends 500,000 bytes over the link,
    # 434,464 beyond it at 160 ns; the allreduce's 100,000 bytes 34,464 beyond it at 85 ns; loopback charged
    # 6e6 * 0.5 ns + 1e5 * 1 ns. The latencies are not terms.
    assert by[("100mbit-n2", "fused")]["model_s"] == pytest.approx(
        0.100 - 0.0031 + 6 * 434_464 * 160e-9 + 34_464 * 85e-9)
    # per_feature: 79 calls in 0.2 s leave 2.53 ms to refill, 31,646 bytes of tokens, below the bucket.
    assert by[("100mbit-n2", "per_feature")]["parts"]["alltoall_link"] == pytest.approx(
        78 * (6e6 / 78 / 2 - RATE * 0.2 / 79) * 160e-9)
    checked, mean, worst, within = model.summary(result)
    errors = [abs(by[("100mbit-n2", m)]["error"]) for m in MODES]
    assert (checked, within) == (2, sum(e <= 0.25 for e in errors))
    assert mean == pytest.approx(sum(errors) / 2) and worst == pytest.approx(max(errors))


def test_projection_grows_the_bytes_that_leave_a_worker(runs):
    result = model.build(model.load_runs(runs))
    rows = {(p["mode"], p["workers"]): p for p in result["projection"] if p["link"] == "shaped"}
    wire = {(p["mode"], p["workers"]): p for p in result["projection"] if p["link"] == "wire"}
    assert {p["network"] for p in result["projection"]} == {"100mbit"}  # loopback has no link to scale
    for m in MODES:
        for n in model.PROJECT_N:
            assert rows[(m, n)]["model_s"] == pytest.approx(expected(m, n), rel=1e-9)
            assert rows[(m, n)]["samples_per_s"] == pytest.approx(BATCH * n / rows[(m, n)]["model_s"])
        assert rows[(m, 128)]["model_s"] > rows[(m, 8)]["model_s"]
        local, k, t, j, d = MODES[m]
        # A wire lets nothing through free: every byte that crosses pays.
        assert wire[(m, 8)]["model_s"] == pytest.approx(
            local - t * LO["b"] - d * LO["e"] + t * 7 / 8 * LINK["b"] / 0.5 + d * 2 * 7 / 8 * LINK["e"])


def test_refusals(tmp_path):
    write(tmp_path, "100mbit-n2", bench("100mbit", 2, {"fused": 0.1}), probe("100mbit", **LINK))
    with pytest.raises(ValueError, match="no 2-worker loopback bench.json"):
        model.build(model.load_runs(tmp_path))
    write(tmp_path, "loopback-n2", bench("loopback", 2, {"fused": 0.1}, pinned=2))
    with pytest.raises(ValueError, match="no 2-worker loopback probe.json"):
        model.build(model.load_runs(tmp_path))
    (tmp_path / "loopback-n2" / "probe.json").write_text(json.dumps(probe("loopback", **LO)))
    with pytest.raises(ValueError, match="run 100mbit-n2: 1 CPUs per worker, the anchor loopback-n2 2"):
        model.build(model.load_runs(tmp_path))


def test_main_writes_the_report(runs, capsys):
    model.main(["--runs", str(runs), "--out", str(runs / "out")])
    text = (runs / "out" / "model.md").read_text()
    assert "Checked points: 2" in text and "| 100mbit-n2 | 100mbit | 2 (2 x 1) | fused |" in text
    assert json.loads((runs / "out" / "model.json").read_text())["anchor"] == "loopback-n2"
    assert "Projection (model) at 100mbit" in capsys.readouterr().out


def test_main_exits_2_naming_what_is_missing(tmp_path, capsys):
    write(tmp_path, "n1-1core", bench("none", 1, {"fused": 0.04}))
    with pytest.raises(SystemExit) as e:
        model.main(["--runs", str(tmp_path)])
    assert e.value.code == 2 and "loopback bench.json" in capsys.readouterr().err


def test_a_run_on_a_network_without_its_probe_is_shown_not_checked(runs):
    write(runs, "1gbit-n4", bench("1gbit", 4, {"fused": 0.2, "per_feature": 0.4}))
    result = model.build(model.load_runs(runs))
    rows = [c for c in result["checks"] if c["run"] == "1gbit-n4"]
    assert [c["kind"] for c in rows] == ["no probe", "no probe"] and all("model_s" not in c for c in rows)
    assert model.summary(result)[0] == 2  # still only the two 100mbit points count as checks
    assert "not modelled (no N = 2 probe of this network)" in model.markdown(result)

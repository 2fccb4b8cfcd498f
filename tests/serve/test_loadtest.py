"""The load test against a small in-test HTTP server that answers :predict (200, or the status an instance asks for)
and /stats, and records what it saw: counts by status and the most requests it held at once; the same server over
HTTPS (and mutual TLS) with certificates of a throwaway CA (tests/serve/test_tls.py runs the load test against the
HTTPS ranker)."""

import http.server
import json
import math
import shutil
import ssl
import sys
import threading
import time

import pytest

from tf_fusedrec.serve import loadtest, security

# The server's counters before the test, so the report must use deltas.
BASE = {"requests": 1000, "bytes_from_servers": 123_456, "hits": 50, "misses": 70}
BYTES_PER_REQUEST = 1000
HITS_PER_REQUEST, MISSES_PER_REQUEST = 3, 1

# Wall-clock bounds only check that a run stops (no test here times anything): generous, because the tests share two
# cores with the rest of the suite and CI machines are shared too (a run that does not stop never returns, so any
# finite bound tells it apart).
SLACK_S = 15.0

OK, FAIL_500, FAIL_400 = {"x": 1}, {"x": 2, "status": 500}, {"x": 3, "status": 400}


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    # The listen backlog (socketserver's default is 5): an open loop opens a connection per request in flight, and on a
    # busy machine more than 5 can wait to be accepted, which the kernel would refuse (a "connection" error).
    request_queue_size = 256

    def __init__(self, delay_s=0.0, with_stats=True, ssl_context=None):
        super().__init__(("127.0.0.1", 0), _Handler)
        if ssl_context is not None:  # HTTPS: each accepted connection's handshake is made in accept()
            self.socket = ssl_context.wrap_socket(self.socket, server_side=True)
        self.scheme = "http" if ssl_context is None else "https"
        self.delay_s = delay_s
        self.with_stats = with_stats
        self.lock = threading.Lock()
        self.by_status = {}
        self.instances = 0
        self.xs = []  # every instance's "x", in the order the requests were handled
        self.in_flight = self.max_in_flight = 0
        self.handler_errors = []

    def handle_error(self, request, client_address):
        # A client that timed out closed its end: writing the late answer fails, as it should. Anything else is a bug
        # in the test server (or a request it did not expect), which the fixture reports.
        error = sys.exc_info()[1]
        if not isinstance(error, ConnectionError):
            self.handler_errors.append(error)

    @property
    def url(self):
        return f"{self.scheme}://127.0.0.1:{self.server_address[1]}/v1/models/m"

    def handled(self):
        with self.lock:
            return sum(self.by_status.values())


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the load test's connections expect

    def log_message(self, *args):
        pass

    def _answer(self, status, payload):
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802  (http.server's name)
        server = self.server
        with server.lock:
            server.in_flight += 1
            server.max_in_flight = max(server.max_in_flight, server.in_flight)
        try:
            instances = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["instances"]
            assert self.path == "/v1/models/m:predict", self.path
            status = max([i.get("status", 200) for i in instances])
            time.sleep(server.delay_s)
            with server.lock:
                server.by_status[status] = server.by_status.get(status, 0) + 1
                server.instances += len(instances)
                server.xs.extend(i["x"] for i in instances if "x" in i)
        finally:
            with server.lock:
                server.in_flight -= 1
        if status == 200:
            self._answer(200, {"predictions": [0.5] * len(instances)})
        else:
            self._answer(status, {"error": f"asked for {status}"})

    def do_GET(self):  # noqa: N802
        server = self.server
        if self.path != "/v1/models/m/stats" or not server.with_stats:
            self._answer(404, {"error": "no such path"})
            return
        n = server.handled()
        self._answer(200, {"requests": BASE["requests"] + n,
                           "bytes_from_servers": BASE["bytes_from_servers"] + BYTES_PER_REQUEST * n,
                           "cache": {"hits": BASE["hits"] + HITS_PER_REQUEST * n,
                                     "misses": BASE["misses"] + MISSES_PER_REQUEST * n}})


@pytest.fixture
def serve():
    servers = []

    def start(**kwargs):
        server = _Server(**kwargs)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
        assert not server.handler_errors, server.handler_errors


def _run(server, instances, loop, batch=1, duration_s=1.0, timeout_s=2.0):
    test = loadtest.LoadTest(server.url, loadtest.CycledInstances(instances), loop, batch, duration_s, timeout_s)
    began = time.perf_counter()
    report = test.run()
    return report, time.perf_counter() - began


def _check_counts_match_the_server(report, server):
    statuses = {str(s): n for s, n in server.by_status.items() if s != 200}
    assert report["ok"] == server.by_status.get(200, 0)
    assert report["errors"] == statuses and report["error_count"] == sum(statuses.values())
    assert report["sent"] == server.handled() == report["ok"] + report["error_count"]
    assert report["unfinished"] == 0


# --- statistics ------------------------------------------------------------------------------------------------------


def test_percentile_is_the_nearest_rank():
    values = list(range(100, 0, -1))  # 1..100, unsorted
    assert [loadtest.percentile(values, q) for q in (0, 1, 50, 90, 99, 100)] == [1, 1, 50, 90, 99, 100]
    assert loadtest.percentile(values, 50.5) == 51
    assert loadtest.percentile(range(1, 1001), 99.9) == 999
    assert loadtest.percentile([7.5], 99) == 7.5
    assert loadtest.percentile([3, 1, 2], 50) == 2 and loadtest.percentile([4, 1, 3, 2], 50) == 2
    assert loadtest.percentile([], 50) is None
    with pytest.raises(ValueError, match=r"q must be in \[0, 100\]"):
        loadtest.percentile([1], 101)


def test_latency_summary_in_milliseconds():
    summary = loadtest.latency_summary([i / 1000 for i in range(20, 0, -1)])  # 1..20 ms
    assert summary["count"] == 20
    assert summary["p50"] == pytest.approx(10.0) and summary["p90"] == pytest.approx(18.0)
    assert summary["p99"] == pytest.approx(20.0) and summary["max"] == pytest.approx(20.0)
    assert summary["mean"] == pytest.approx(10.5)
    assert loadtest.latency_summary([]) == {"count": 0, "p50": None, "p90": None, "p99": None, "max": None,
                                            "mean": None}


def test_stats_delta():
    before = {"requests": 10, "bytes_from_servers": 100, "cache": {"hits": 5, "misses": 5}}
    after = {"requests": 14, "bytes_from_servers": 900, "cache": {"hits": 11, "misses": 7}}
    hit_rate, per_request, delta = loadtest.stats_delta(before, after)
    assert hit_rate == 0.75 and per_request == 200.0 and delta["requests"] == 4
    assert loadtest.stats_delta({}, after)[:2] == (None, None)
    assert loadtest.stats_delta(before, before)[:2] == (None, None)  # nothing moved: no rate to give


# --- instances -------------------------------------------------------------------------------------------------------


def test_cycled_instances_wrap_around(tmp_path):
    source = loadtest.CycledInstances([1, 2, 3])
    assert [source.next_batch(2) for _ in range(3)] == [[1, 2], [3, 1], [2, 3]]
    assert loadtest.CycledInstances([1, 2]).next_batch(5) == [1, 2, 1, 2, 1]
    for name, text in [("list.json", '[{"a": 1}, {"a": 2}]'), ("object.json", '{"instances": [{"a": 1}, {"a": 2}]}'),
                       ("lines.jsonl", '{"a": 1}\n\n{"a": 2}\n')]:
        (tmp_path / name).write_text(text)
        assert loadtest.load_instances(str(tmp_path / name)) == [{"a": 1}, {"a": 2}]
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(ValueError, match="non-empty list"):
        loadtest.load_instances(str(tmp_path / "empty.json"))


def test_synthetic_instances_follow_the_spec():
    spec = {"features": {"user": {"range": [100, 200], "zipf": 1.2},
                         "tags": {"range": [0, 50], "zipf": 0, "length": [0, 3]},
                         "pair": {"range": [0, 10], "zipf": 1.0, "length": 2}},
            "dense": {"name": "dense", "width": 5}}
    batch = loadtest.SyntheticInstances(spec, seed=3).next_batch(2000)
    assert batch == loadtest.SyntheticInstances(spec, seed=3).next_batch(2000)  # reproducible
    assert batch != loadtest.SyntheticInstances(spec, seed=4).next_batch(2000)
    users = [i["user"] for i in batch]
    assert all(100 <= u < 200 for u in users) and max(users) > 150
    counts = [users.count(100 + k) for k in range(4)]
    assert counts == sorted(counts, reverse=True) and counts[0] > 10 * users.count(199)  # zipf: low ids are hot
    assert all(len(i["tags"]) <= 3 and all(0 <= t < 50 for t in i["tags"]) for i in batch)
    assert {len(i["tags"]) for i in batch} == {0, 1, 2, 3}
    assert all(len(i["pair"]) == 2 and len(i["dense"]) == 5 for i in batch)
    for bad, message in [({"features": {"f": {"range": [5, 5]}}}, "feature 'f': \"range\""),
                         ({"features": {"f": {"range": [0, 5], "zipf": -1}}}, "feature 'f': \"zipf\""),
                         ({"features": {"f": {"range": [0, 5], "length": 0}}}, "feature 'f': \"length\""),
                         ({"features": {}}, "needs \"features\""),
                         ({"features": {"f": {"range": [0, 5]}}, "dense": {"width": 3}}, '"dense" must be')]:
        with pytest.raises(ValueError, match=message):
            loadtest.SyntheticInstances(bad)


# --- runs against a server -------------------------------------------------------------------------------------------


def test_open_loop_counts_requests_and_errors_and_stops_on_time(serve):
    server = serve(delay_s=0.005)
    # The cap is far above any arrival count, so nothing is dropped however slowly a loaded machine serves.
    loop = loadtest.OpenLoop(qps=60, max_in_flight=1000, seed=1)
    report, wall = _run(server, [OK, OK, FAIL_500, OK, FAIL_400], loop, batch=1, duration_s=1.0)
    assert wall < 1.0 + SLACK_S and report["elapsed_s"] < 1.0 + SLACK_S  # it stops; SLACK_S absorbs a busy machine
    _check_counts_match_the_server(report, server)
    assert report["dropped"] == 0 and report["arrivals"] == report["sent"]
    assert 25 <= report["sent"] <= 110  # Poisson at 60/s over 1 s
    assert report["errors"].keys() == {"400", "500"}
    assert report["latency_ms"]["count"] == report["ok"] and report["latency_ms"]["p50"] >= 5.0
    assert report["requests_per_s"] == pytest.approx(report["ok"] / report["elapsed_s"])
    assert report["cache_hit_rate"] == HITS_PER_REQUEST / (HITS_PER_REQUEST + MISSES_PER_REQUEST)
    assert report["bytes_per_request"] == BYTES_PER_REQUEST
    assert report["ranker_delta"]["requests"] == report["sent"]


def test_open_loop_drops_arrivals_beyond_the_in_flight_cap(serve):
    server = serve(delay_s=0.35)
    # Bursts only: 5 arrivals at 0.25, 0.5 and 0.75 s; at most 2 in flight, each held 0.35 s by the server.
    loop = loadtest.OpenLoop(qps=0, burst_every_s=0.25, burst_size=5, max_in_flight=2)
    report, wall = _run(server, [OK], loop, batch=3, duration_s=1.0)
    assert report["arrivals"] == 15 and report["sent"] + report["dropped"] == 15
    assert 2 <= report["sent"] <= 6 and report["dropped"] >= 9
    assert server.max_in_flight <= 2 and report["max_in_flight_seen"] <= 2
    _check_counts_match_the_server(report, server)
    assert server.instances == 3 * report["sent"]
    assert report["instances_per_s"] == pytest.approx(3 * report["ok"] / report["elapsed_s"])
    assert wall < 1.0 + 0.35 + SLACK_S  # the last requests in flight are waited for, then it stops


def test_closed_loop_never_exceeds_its_concurrency(serve):
    server = serve(delay_s=0.02)
    report, wall = _run(server, [OK, FAIL_500], loadtest.ClosedLoop(3), batch=2, duration_s=0.8)
    assert server.max_in_flight == 3 and report["max_in_flight_seen"] == 3
    assert report["mode"] == "closed" and report["concurrency"] == 3 and report["dropped"] == 0
    _check_counts_match_the_server(report, server)
    assert report["sent"] >= 2 * 3  # back to back: each client sends again as soon as its answer is in
    assert report["errors"] == {"500": server.by_status[500]}  # every batch of 2 holds FAIL_500
    # "auto" builds no body ahead for a closed loop (it has no bound on its requests): each is built as it is sent
    assert report["bodies"]["prebuilt"] == 0 and report["bodies"]["built_in_run"] == report["sent"]
    assert report["ok"] == 0 and report["latency_ms"]["p50"] is None
    assert wall < 0.8 + SLACK_S


def test_timeouts_are_errors_and_bound_the_run(serve):
    server = serve(delay_s=1.5)
    report, wall = _run(server, [OK], loadtest.ClosedLoop(2), duration_s=0.3, timeout_s=0.4)
    assert report["errors"] == {"timeout": report["sent"]} and report["ok"] == 0 and report["sent"] == 2
    assert wall < 0.3 + 0.4 + SLACK_S


def test_cli_writes_the_report_and_prints_one_line(serve, tmp_path, capsys):
    server = serve(with_stats=False)
    out = tmp_path / "report.json"
    spec = json.dumps({"features": {"user": {"range": [0, 1000], "zipf": 1.1}}, "dense": {"name": "d", "width": 2}})
    report = loadtest.main(["--url", server.url, "--synthetic", spec, "--batch", "4", "--qps", "30",
                            "--duration", "0.5", "--timeout", "2", "--out", str(out)])
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and printed[0].startswith("open loop") and "cache hit rate -" in printed[0]
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["cache_hit_rate"] is None and report["bytes_per_request"] is None
    assert report["ranker_delta"] is None and report["sent"] == server.handled() > 0
    assert server.instances == 4 * report["sent"]


def test_open_loop_bounds_the_requests_it_can_send():
    assert loadtest.OpenLoop(qps=60).most_requests(1.0) == math.ceil(60 + 5 * math.sqrt(60)) + 1
    # bursts only: at most one per whole burst period of the run (at 0.25, 0.5 and 0.75 s, the bound counts 4)
    assert loadtest.OpenLoop(qps=0, burst_every_s=0.25, burst_size=5).most_requests(1.0) == 1 + 4 * 5
    assert loadtest.ClosedLoop(2).most_requests(1.0) is None


@pytest.mark.parametrize("prebuild", ["auto", 0, 3])
def test_bodies_are_the_sources_in_order_each_sent_once(serve, prebuild):
    # Built before the clock (all of them with "auto", none with 0, the first 3 with 3) or as they are sent: either
    # way the server sees the source's first `sent` instances, each once.
    server = serve(delay_s=0.0)
    source = loadtest.CycledInstances([{"x": i} for i in range(10_000)])
    loop = loadtest.OpenLoop(qps=40, max_in_flight=1000, seed=3)
    test = loadtest.LoadTest(server.url, source, loop, 1, 0.5, 2.0, prebuild=prebuild)
    report = test.run()
    _check_counts_match_the_server(report, server)
    assert report["sent"] >= 3
    assert sorted(server.xs) == list(range(report["sent"]))
    prebuilt = loop.most_requests(0.5) if prebuild == "auto" else prebuild
    bodies = report["bodies"]
    assert bodies["prebuilt"] == prebuilt and bodies["built_in_run"] == max(0, report["sent"] - prebuilt)
    assert bodies["prebuilt_bytes"] == sum(len(json.dumps({"instances": [{"x": i}]})) for i in range(prebuilt))
    if prebuild == "auto":
        assert bodies["built_in_run"] == 0


def test_bad_arguments_are_clear_errors(capsys):
    with pytest.raises(ValueError, match="--qps 0 without bursts"):
        loadtest.OpenLoop(qps=0)
    with pytest.raises(ValueError, match="go together"):
        loadtest.OpenLoop(qps=1, burst_every_s=1.0)
    with pytest.raises(ValueError, match="--max-in-flight"):
        loadtest.OpenLoop(qps=1, max_in_flight=0)
    with pytest.raises(ValueError, match="--concurrency"):
        loadtest.ClosedLoop(0)
    with pytest.raises(ValueError, match="--url must be http"):
        loadtest.LoadTest("ftp://x/v1/models/m", loadtest.CycledInstances([1]), loadtest.ClosedLoop(1), 1, 1.0)
    with pytest.raises(ValueError, match="--batch"):
        loadtest.LoadTest("http://x/v1/models/m", loadtest.CycledInstances([1]), loadtest.ClosedLoop(1), 0, 1.0)
    for bad in (-1, "all", 2.5, True):
        with pytest.raises(ValueError, match="--prebuild must be 'auto' or an int >= 0"):
            loadtest.LoadTest("http://x/v1/models/m", loadtest.CycledInstances([1]), loadtest.ClosedLoop(1), 1, 1.0,
                              prebuild=bad)
    with pytest.raises(SystemExit):
        loadtest.main(["--url", "http://127.0.0.1:1/v1/models/m", "--example-instances", "[1]", "--batch", "1",
                       "--duration", "1", "--qps", "5", "--prebuild", "many"])
    assert "expected 'auto' or an int >= 0, got 'many'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        loadtest.main(["--url", "http://127.0.0.1:1/v1/models/m", "--example-instances", "[1]", "--batch", "1",
                       "--duration", "1", "--closed-loop", "--qps", "5"])
    assert "--qps and bursts are for the open loop" in capsys.readouterr().err


def test_open_loop_starts_workers_as_arrivals_need_them(serve, monkeypatch):
    # A cap of 1000 with a few requests in flight at a time must not start 1000 threads (their start used to eat the
    # run's duration on a busy machine).
    started = []
    real_thread = loadtest.threading.Thread

    def counting_thread(*args, **kwargs):
        if str(kwargs.get("name")).startswith("loadtest-"):  # not the test server's handler threads
            started.append(kwargs["name"])
        return real_thread(*args, **kwargs)

    monkeypatch.setattr(loadtest.threading, "Thread", counting_thread)
    server = serve(delay_s=0.0)
    report, _ = _run(server, [OK], loadtest.OpenLoop(qps=40, max_in_flight=1000, seed=2), duration_s=0.5)
    _check_counts_match_the_server(report, server)
    assert report["dropped"] == 0 and report["sent"] >= 5
    assert 1 <= len(started) <= report["max_in_flight_seen"] + 1 < report["sent"]


# --- HTTPS -----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Two throwaway CAs (security.make_throwaway_pki: the documented openssl commands), each with a loopback
    certificate -> {"ca", "local", "other_ca", "other_local"}."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is not installed")
    paths = {}
    for prefix in ("", "other_"):
        made = security.make_throwaway_pki(str(tmp_path_factory.mktemp(f"{prefix}pki") / "pki"),
                                           {"local": "DNS:localhost,IP:127.0.0.1"})
        paths[prefix + "ca"], paths[prefix + "local"] = made["ca"], made["local"]
    return paths


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_https_with_the_ca_and_a_client_certificate(serve, pki, mutual, tmp_path, capsys):
    cert, key = pki["local"]
    server_tls = security.TLS.from_files(cert, key, pki["ca"], client_auth=mutual)
    server = serve(delay_s=0.0, ssl_context=server_tls.server_context())
    assert server.url.startswith("https://127.0.0.1:")
    # The client: the CA, and (mutual TLS) a certificate of it.
    flags = ["--tls-ca", pki["ca"]] + (["--tls-cert", cert, "--tls-key", key] if mutual else [])
    out = tmp_path / "report.json"
    report = loadtest.main(["--url", server.url, "--example-instances", json.dumps([OK, FAIL_500]), "--batch", "1",
                            "--qps", "30", "--duration", "0.5", "--timeout", "5", "--out", str(out), *flags])
    assert capsys.readouterr().out.startswith("open loop")
    _check_counts_match_the_server(report, server)
    assert report["ok"] > 0 and set(report["errors"]) <= {"500"}
    assert report["ranker_delta"]["requests"] == report["sent"]  # /stats was read over HTTPS too
    assert json.loads(out.read_text())["url"] == server.url


def test_https_that_cannot_verify_fails_as_tls_errors(serve, pki):
    cert, key = pki["local"]
    server = serve(ssl_context=security.TLS.from_files(cert, key).server_context())
    # A CA the server's certificate does not chain to: every request fails its handshake, none is handled.
    other = security.TLS.from_files(ca=pki["other_ca"])
    report = loadtest.LoadTest(server.url, loadtest.CycledInstances([OK]), loadtest.ClosedLoop(1), 1, 0.3, 2.0,
                               tls=other).run()
    assert report["ok"] == 0 and report["errors"] == {"tls": report["sent"]} and report["sent"] >= 1
    assert report["ranker_delta"] is None and server.handled() == 0
    # Without --tls-ca an https:// URL is verified against the system's CAs, which do not hold the throwaway one.
    report = loadtest.LoadTest(server.url, loadtest.CycledInstances([OK]), loadtest.ClosedLoop(1), 1, 0.3, 2.0).run()
    assert report["ok"] == 0 and set(report["errors"]) == {"tls"}
    # TLS settings with a plain http:// URL are a mistake, said at once.
    with pytest.raises(ValueError, match="--tls-ca/--tls-cert/--tls-key are for an https:// URL"):
        loadtest.LoadTest("http://127.0.0.1:1/v1/models/m", loadtest.CycledInstances([OK]), loadtest.ClosedLoop(1),
                          1, 1.0, tls=other)
    assert isinstance(loadtest.client_context(server.url, other), ssl.SSLContext)
    assert loadtest.client_context("http://127.0.0.1:1/v1/models/m", None) is None

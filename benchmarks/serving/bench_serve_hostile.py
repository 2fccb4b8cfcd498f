"""A well-formed client's latency with and without hostile clients beside it (issue 22's third serving target).

    .venv/bin/python benchmarks/serving/bench_serve_hostile.py --export EXPORT [--phases 4] [--duration 10] \
        [--ranker-flags "--no-pooling --cache-mb 0"] [--fuzz-qps 100] --out benchmarks/results/serve/hostile.json

Starts 2 embedding servers of EXPORT (an export of configs/criteo_serve.yaml, see benchmarks/serving/bench_serve_ab.py) and a
ranker on loopback, then alternates phases of --duration s: "quiet", where one well-formed client sends 64-instance
requests back to back (a closed loop, bodies built before the clock), and "hostile", where the same client runs while
64 connections are held open idle (reopened as the ranker closes them) and a fuzzer sends malformed requests at
--fuzz-qps (0: back to back; deep nesting, bad JSON, wrong types, ids out of range, oversized integer literals, wrong dense width, missing
features, empty bodies). Every fuzz answer must be a 4xx with an "error" naming the problem; any other answer is
counted. Before the first phase and after the last, one fixed request's scores are read: they must be equal.
Writes the phases' p50/p99 and the ratio of the hostile p99s to the quiet ones.

The hostile clients run in a process of their own, as they would on another host: as threads of the measuring process
(--hostile-in-process, the layout of the runs before 2026-11-27) their Python shares the well-formed client's
interpreter lock, so the client's latency includes waits for the fuzzer's own JSON work, not the ranker's.
"""

import argparse
import http.client
import json
import multiprocessing
import os
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tf_fusedrec import config as cfg  # noqa: E402
from tf_fusedrec.export import format as fmt  # noqa: E402
from serve_servers import start_embedding_servers  # noqa: E402
from tf_fusedrec.serve import bench, loadtest  # noqa: E402

IDLE_CONNECTIONS = 64
FUZZ_LIMIT = 20_000  # fuzz requests per phase at most


def malformed_bodies(valid):
    """(name, bytes) of malformed predict bodies, built from one valid 64-instance body (a dict)."""
    instance = valid["instances"][0]
    id_name = next(k for k, v in instance.items() if isinstance(v, int))
    list_name = next((k for k, v in instance.items() if isinstance(v, list) and v and isinstance(v[0], float)), None)

    def with_instance(**change):
        return json.dumps({"instances": [{**instance, **change}] + valid["instances"][1:]}).encode()

    bodies = [
        ("deep nesting", b'{"instances": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"),
        ("not json", b"this is not json"),
        ("truncated json", json.dumps(valid).encode()[:5000]),
        ("empty body", b""),
        ("no instances", b'{"instances": []}'),
        ("string id", with_instance(**{id_name: "abc"})),
        ("id above int64", with_instance(**{id_name: 2 ** 64})),
        ("negative id", with_instance(**{id_name: -5})),
        ("4400-digit integer", with_instance(**{id_name: 0}).replace(b'"' + id_name.encode() + b'": 0',
                                                                   b'"' + id_name.encode() + b'": ' + b"9" * 4400)),
        ("missing feature", json.dumps({"instances": [{k: v for k, v in instance.items() if k != id_name}]}).encode()),
        ("unknown feature", with_instance(nope=1)),
    ]
    if list_name is not None:
        bodies.append(("dense of the wrong width", with_instance(**{list_name: [0.5]})))
    return bodies


class Fuzzer(threading.Thread):
    def __init__(self, host, port, path, bodies, stop, qps):
        super().__init__(daemon=True, name="fuzzer")
        self.host, self.port, self.path, self.bodies, self.stop = host, port, path, bodies, stop
        self.qps = qps  # malformed requests per second; 0: back to back
        self.answers = {}  # status -> count
        self.bad = []  # (name, status, text) of answers that are not a 4xx naming the problem

    def run(self):
        conn = None
        i = 0
        began = time.monotonic()
        while not self.stop.is_set() and i < FUZZ_LIMIT:
            if self.qps:
                self.stop.wait(max(0.0, began + i / self.qps - time.monotonic()))
            name, body = self.bodies[i % len(self.bodies)]
            i += 1
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
                conn.request("POST", self.path, body=body, headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                text = response.read()
                status = response.status
                if response.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as e:
                status, text = f"connection ({type(e).__name__})", b""
                if conn is not None:
                    conn.close()
                conn = None
            self.answers[str(status)] = self.answers.get(str(status), 0) + 1
            ok = isinstance(status, int) and 400 <= status < 500
            if ok:
                try:
                    ok = bool(json.loads(text).get("error"))
                except ValueError:
                    ok = False
            if not ok and len(self.bad) < 20:
                self.bad.append((name, status, text[:200].decode(errors="replace")))
        if conn is not None:
            conn.close()


class IdleHolder(threading.Thread):
    """Holds a connection open without sending anything; reopens it (after 20 ms) when the ranker closes it."""

    def __init__(self, host, port, stop):
        super().__init__(daemon=True, name="idle")
        self.host, self.port, self.stop = host, port, stop
        self.opened = 0

    def run(self):
        while not self.stop.is_set():
            try:
                with socket.create_connection((self.host, self.port), timeout=5) as s:
                    self.opened += 1
                    s.settimeout(0.2)
                    while not self.stop.is_set():
                        try:
                            if not s.recv(4096):
                                break  # closed by the ranker (evicted, or its idle timeout)
                        except socket.timeout:
                            continue
            except OSError:
                pass
            self.stop.wait(0.02)


def scores(url, body):
    endpoint = loadtest._Endpoint(url)  # noqa: SLF001  (the load test's parse of a model URL)
    request = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=10)
    try:
        request.request("POST", endpoint.predict_path, body=body, headers={"Content-Type": "application/json"})
        response = request.getresponse()
        return response.status, json.loads(response.read())
    finally:
        request.close()


def start_hostile(host, port, path, bodies, qps, stop):
    """The 64 idle holders and the fuzzer, started as threads of this process; -> them (the fuzzer last)."""
    helpers = [IdleHolder(host, port, stop) for _ in range(IDLE_CONNECTIONS)]
    helpers.append(Fuzzer(host, port, path, bodies, stop, qps))
    for h in helpers:
        h.start()
    return helpers


def hostile_report(helpers):
    fuzzer = helpers[-1]
    return {"fuzz_answers": fuzzer.answers, "fuzz_not_4xx_naming_the_problem": fuzzer.bad,
            "idle_connections_opened": sum(h.opened for h in helpers[:-1])}


def hostile_process(host, port, path, bodies, qps, started, finish, reports):
    """The hostile clients in a process of their own (multiprocessing's target): they run from `started` until
    `finish` is set, then their report goes to the queue `reports`."""
    stop = threading.Event()
    helpers = start_hostile(host, port, path, bodies, qps, stop)
    started.set()
    finish.wait()
    stop.set()
    for h in helpers:
        h.join(15)
    reports.put(hostile_report(helpers))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--export", required=True)
    p.add_argument("--config", default="configs/criteo_serve.yaml")
    p.add_argument("--phases", type=int, default=4)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--ranker-flags", default="--no-pooling --cache-mb 0")
    p.add_argument("--fuzz-qps", type=float, default=100.0, help="malformed requests per second (0: back to back)")
    p.add_argument("--hostile-in-process", action="store_true",
                   help="run the hostile clients as threads of the measuring process (see the module docstring)")
    p.add_argument("--work-dir", default="/tmp/bench_serve_hostile")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    spec = bench.synthetic_spec(cfg.load_config(args.config), fmt.read_manifest(args.export))
    result = {"command": "python benchmarks/serving/bench_serve_hostile.py " + " ".join(sys.argv[1:]), "fuzz_qps": args.fuzz_qps,
              "hostile_clients": "threads of the measuring process" if args.hostile_in_process else "own process",
              "machine": {"cpus": os.cpu_count(), "load_average_start": list(os.getloadavg())},
              "idle_connections": IDLE_CONNECTIONS, "phases": []}
    services = []
    try:
        addresses = start_embedding_servers(args.export, args.work_dir, services)
        port = bench.free_port()
        services.append(bench.Service("ranker", "tf_fusedrec.serve.ranker",
                                      ["--export", args.export, "--port", str(port), "--name", "bench",
                                       "--servers", addresses,
                                       *args.ranker_flags.split()],
                                      os.path.join(args.work_dir, "ranker.log")))
        services[-1].start(120)
        url = f"http://127.0.0.1:{port}/v1/models/bench"
        valid = {"instances": loadtest.SyntheticInstances(spec, seed=4242).next_batch(64)}
        fixed = json.dumps(valid).encode()
        before = scores(url, fixed)
        loadtest.LoadTest(url, loadtest.SyntheticInstances(spec, seed=999), loadtest.ClosedLoop(1), 64, 2.0).run()
        bodies = malformed_bodies(valid)
        for phase in range(args.phases):
            hostile = phase % 2 == 1
            test = loadtest.LoadTest(url, loadtest.SyntheticInstances(spec, seed=phase), loadtest.ClosedLoop(1), 64,
                                     args.duration, 10.0, prebuild=int(args.duration * 200))
            test.prepare()  # the client's bodies, before the hostile clients start
            hostile_args = ("127.0.0.1", port, "/v1/models/bench:predict", bodies, args.fuzz_qps)
            stop, helpers, child = threading.Event(), [], None
            if hostile and args.hostile_in_process:
                helpers = start_hostile(*hostile_args, stop)
            elif hostile:
                spawn = multiprocessing.get_context("spawn")
                started, finish, reports = spawn.Event(), spawn.Event(), spawn.Queue()
                child = spawn.Process(target=hostile_process, args=(*hostile_args, started, finish, reports),
                                      daemon=True)
                child.start()
                if not started.wait(120):
                    raise RuntimeError("the hostile clients' process did not start within 120 s")
            if hostile:
                time.sleep(1.0)  # the idle connections are open before the client starts
            report = test.run()
            record = {"phase": phase, "kind": "hostile" if hostile else "quiet", "ok": report["ok"],
                      "errors": report["errors"], "requests_per_s": report["requests_per_s"],
                      "p50_ms": report["latency_ms"]["p50"], "p99_ms": report["latency_ms"]["p99"],
                      "max_ms": report["latency_ms"]["max"]}
            stop.set()
            for h in helpers:
                h.join(15)
            if helpers:
                record.update(hostile_report(helpers))
            if child is not None:
                finish.set()
                record.update(reports.get(timeout=60))
                child.join(30)
            result["phases"].append(record)
            print(json.dumps(record), flush=True)
            time.sleep(1.0)
        after = scores(url, fixed)
        result["fixed_request_before_after_equal"] = before == after and before[0] == 200
        stats = loadtest.fetch_stats(f"{url}/stats", 10.0) or {}
        result["ranker_counters"] = {k: v for k, v in stats.items() if k.startswith("errors_") or k in (
            "requests", "idle_closed")}
    finally:
        for s in reversed(services):
            s.stop()
    quiet = [r["p99_ms"] for r in result["phases"] if r["kind"] == "quiet"]
    hostile = [r["p99_ms"] for r in result["phases"] if r["kind"] == "hostile"]
    result["p99_ratio_hostile_to_quiet"] = [h / q for h, q in zip(hostile, quiet)]
    result["machine"]["load_average_end"] = list(os.getloadavg())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("p99_ratio_hostile_to_quiet", "fixed_request_before_after_equal",
                                             "ranker_counters")}))


if __name__ == "__main__":
    main()

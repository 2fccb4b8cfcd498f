"""python -m tf_fusedrec.serve.bench: the ranker's latency, throughput and network bytes with pooling on the embedding
servers on or off and the row cache on or off, at a low and a high load; and one setup's saturation curve.

    python -m tf_fusedrec.serve.bench [--config configs/criteo_serve.yaml] [--export EXPORT] [--out benchmarks/results/serve]
        [--duration 10] [--low-qps 5] [--high-qps 45] [--batch 64] [--cache-mb 64]
        [--curve-qps 10,20,40,60,80,120,160] [--curve-pooling on] [--curve-cache on] [--tls [--tls-client-auth]]

1. The export: --export, or a short training of --config in one process (python -m tf_fusedrec.train --steps
   --train-batch-size, no horovodrun) exported with python -m tf_fusedrec.export, in a temporary directory.
2. Two embedding servers (even ranges 0 and 1 of 2), started once for every run.
3. For each ranker configuration, pooling {on, off} x cache {--cache-mb, off}: a ranker is started, warmed up with a
   few requests, load tested in an open loop (serve/loadtest.py) at --low-qps and then at --high-qps with bursts
   (--burst-size requests at once every --burst-every seconds), and stopped. The requests are synthetic instances
   drawn like the config's data (each feature's vocab, zipf exponent and hotness, the export's dense width; the hot
   ids are the low ones), the same for every configuration (--seed), so the cache sees the configured Zipf skew (not the same hot ids as
   training, whose frequent ids are scattered over the range: many rows served are initializer rows).
4. The saturation curve: the ranker of one setup (--curve-pooling, --curve-cache; pooling and cache on by default),
   right after its low and high runs, serves one open-loop run of --duration seconds per rate of --curve-qps (Poisson
   arrivals, no bursts), in ascending order, each started once the ranker's queue is empty; --curve-qps '' skips it.
   Per point: offered and achieved requests/s, p50/p99 latency, errors, drops, and the CPU seconds per second of the
   ranker, the embedding servers and this process (the load generator), read from /proc.
5. The results: OUT/serve_bench.json (every run's report, the machine's load average, the exact command) and
   OUT/serve_bench.md (one table row per run, then the curve's table), printed too; OUT/serve_curve.json (the curve's
   points, its load averages, the command) and OUT/serve_curve.png (achieved against offered beside y = x, and p50/p99
   against offered). Progress lines go to stderr.

TLS (--tls): every hop over TLS, with certificates of a throwaway CA made in the work directory (the openssl commands of
docs/guide/serving-security.md, security.make_throwaway_pki): the embedding servers serve gRPC over TLS, the ranker
verifies them and serves HTTPS, the load generator verifies the ranker; with --tls-client-auth, mutual TLS on every hop
(the servers and the ranker take only clients presenting a certificate of that CA, which the ranker and the load
generator do). Without --tls everything is plain text on loopback, as before.

Bounds: every run lasts --duration plus at most --timeout for the requests in flight; every process started has a
start timeout (--start-timeout) and is stopped (SIGTERM, then SIGKILL) in a finally, also on Ctrl-C or SIGTERM. The
high load is meant to be near or beyond what the ranker serves: arrivals beyond --max-in-flight requests in flight
are dropped (counted), so the latencies there measure the queue, not just the service time. The defaults fit a
2-core machine that also runs the load generator. The high load (45/s plus 8 every 2 s: 49/s offered) was at
saturation there before the ranker turned Nagle's algorithm off; since, the pooling + cache ranker served about
100 requests/s at its plateau (benchmarks/results/serve/serve_bench.md), so the high load sits at about half of it. The curve's
default rates run from 10 requests/s to 160, past that plateau, so its top points show it.
"""

import argparse
import dataclasses
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tf_fusedrec.serve import security

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = "configs/criteo_serve.yaml"
# Set by horovodrun for its workers; a child seeing them would take itself for a Horovod worker.
_WORKER_ENV = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
               "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK")
NUM_SERVERS = 2
DEFAULT_CURVE_QPS = "10,20,40,60,80,120,160"


def log(message):
    print(f"[serve.bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- processes -------------------------------------------------------------------------------------------------------


def child_env():
    env = {k: v for k, v in os.environ.items() if k not in _WORKER_ENV}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["TF_FUSEDREC_EXIT_WITH_PARENT"] = "1"  # the servers and rankers die with the bench (serve/lifetime.py)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def free_port():
    """A free loopback port, held for the child that binds it seconds later (after its TensorFlow import): closed by
    the accepting side first, it waits in TIME_WAIT, in which Linux gives it to no other socket's bind(0), while the
    child's server (gRPC, socketserver: SO_REUSEADDR) may bind it. A port only bound and closed is anyone's."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)):
            accepted, _ = listener.accept()
            accepted.close()
    return port


def _tail(path, n=3000):
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return text if len(text) <= n else "...\n" + text[-n:]


def _end_group(proc, grace_s=15.0):
    """SIGTERM to the process group, SIGKILL after grace_s; waits for the process."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


class Service:
    """A child process (python -m MODULE ARGS) that prints "ready" on stdout once it serves.

    It runs in its own session (a Ctrl-C at the terminal reaches the bench, which stops it), with stderr in log_path.
    """

    def __init__(self, name, module, args, log_path):
        self.name, self.module, self.args, self.log_path = name, module, list(args), log_path
        self.proc = None

    def start(self, timeout_s):
        with open(self.log_path, "w") as stderr:
            self.proc = subprocess.Popen([sys.executable, "-m", self.module, *self.args], cwd=ROOT, env=child_env(),
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                         start_new_session=True)
        ready = threading.Event()

        def read_stdout():
            for line in self.proc.stdout:  # drained to the end, so a chatty child never blocks on a full pipe
                if line.strip() == "ready":
                    ready.set()

        threading.Thread(target=read_stdout, daemon=True, name=f"{self.name}-stdout").start()
        deadline = time.monotonic() + timeout_s
        while not ready.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                why = f"exited with {self.proc.returncode}" if self.proc.poll() is not None else \
                    f"was not ready within {timeout_s:g} s"
                self.stop()
                raise RuntimeError(f"{self.name} ({self.module} {shlex.join(self.args)}) {why}:\n"
                                   f"{_tail(self.log_path)}")
        return self

    def stop(self):
        if self.proc is not None:
            _end_group(self.proc)


def run_step(name, module, args, log_path, timeout_s):
    """Runs python -m MODULE ARGS to completion (output in log_path); RuntimeError naming it on failure/timeout."""
    with open(log_path, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, env=child_env(),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _end_group(proc, grace_s=5.0)  # a no-op once it exited; on a timeout or Ctrl-C it ends the group
    if code != 0:
        why = f"did not finish within {timeout_s:g} s" if code is None else f"exited with {code}"
        raise RuntimeError(f"{name} ({module} {shlex.join(args)}) {why}:\n{_tail(log_path)}")


def train_and_export(config_path, work_dir, steps, batch_size, timeout_s):
    """A short single-process training of the config, exported; -> the export directory."""
    model_dir, export_dir = os.path.join(work_dir, "model"), os.path.join(work_dir, "export")
    log(f"training {config_path} for {steps} steps of {batch_size} in one process -> {model_dir}")
    run_step("training", "tf_fusedrec.train",
             ["--config", str(config_path), "--steps", str(steps), "--batch-size", str(batch_size), "--model-dir",
              model_dir, "--no-progress"], os.path.join(work_dir, "train.log"), timeout_s)
    log(f"exporting -> {export_dir}")
    run_step("export", "tf_fusedrec.export", ["--config", str(config_path), "--model-dir", model_dir, "--out",
                                              export_dir], os.path.join(work_dir, "export.log"), timeout_s)
    return export_dir


# --- how the processes talk ------------------------------------------------------------------------------------------

# Transport.label -> the results' words for it.
TRANSPORT_WORDS = {"plain": "in plain text", "TLS": "over TLS (certificates of a throwaway CA)",
                   "mutual TLS": "over mutual TLS (certificates of a throwaway CA)"}


@dataclasses.dataclass(frozen=True)
class Transport:
    """Plain text on loopback, or TLS on every hop (see the module docstring); Transport.make builds one.

    Attributes:
      pki: make_throwaway_pki's paths ({"ca", "local": (cert, key)}), or None for plain text.
      client_auth: mutual TLS (the servers and the ranker require client certificates).
    """

    pki: dict = None
    client_auth: bool = False

    @classmethod
    def make(cls, tls, client_auth, work_dir):
        """Plain (tls false), or TLS with a throwaway CA and a loopback certificate made in work_dir/pki."""
        if not tls:
            return cls()
        pki = security.make_throwaway_pki(os.path.join(work_dir, "pki"), {"local": "DNS:localhost,IP:127.0.0.1"})
        return cls(pki, bool(client_auth))

    @property
    def label(self):
        return "plain" if self.pki is None else "mutual TLS" if self.client_auth else "TLS"

    @property
    def scheme(self):
        return "http" if self.pki is None else "https"

    def _own(self):
        cert, key = self.pki["local"]
        return ["--tls-cert", cert, "--tls-key", key]

    def server_flags(self):
        """An embedding server's flags: its certificate (and, for mutual TLS, the CA its clients must chain to)."""
        if self.pki is None:
            return []
        return self._own() + (["--tls-ca", self.pki["ca"], "--tls-client-auth"] if self.client_auth else [])

    def ranker_flags(self):
        """The ranker's flags: HTTPS with its certificate, TLS to the servers verified against the CA (presenting
        the certificate under mutual TLS), and, for mutual TLS, client certificates required."""
        if self.pki is None:
            return []
        return self._own() + ["--tls-ca", self.pki["ca"]] + (["--tls-client-auth"] if self.client_auth else [])

    def client_tls(self):
        """The load generator's security.TLS: the CA (and, for mutual TLS, the certificate), or None."""
        if self.pki is None:
            return None
        cert, key = self.pki["local"] if self.client_auth else (None, None)
        return security.TLS.from_files(cert, key, self.pki["ca"])

    def url(self, port, name):
        return f"{self.scheme}://127.0.0.1:{port}/v1/models/{name}"


# --- what is measured ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RankerSetup:
    """One ranker configuration."""

    pooling: bool
    cache_mb: float

    @property
    def label(self):
        cache = f"{self.cache_mb:g} MiB" if self.cache_mb else "off"
        return f"pooling {'on' if self.pooling else 'off'}, cache {cache}"

    def flags(self):
        return (["--no-pooling"] if not self.pooling else []) + ["--cache-mb", f"{self.cache_mb:g}"]


def ranker_setups(cache_mb):
    return [RankerSetup(pooling, cache) for pooling in (True, False) for cache in (cache_mb, 0.0)]


def synthetic_spec(config, manifest):
    """The loadtest's synthetic spec of a config's features (vocab, zipf, hotness) and the export's dense input.

    ValueError when the export does not take the config's features (an --export of another config)."""
    exported = {f["name"] for f in manifest["features"]}
    configured = {f.name for f in config.features}
    if exported != configured:
        differ = sorted(exported ^ configured)
        raise ValueError(f"the export's features are not the config's ({config.name}): '{differ[0]}' is in only one")
    features = {}
    for f in config.features:
        entry = {"range": [0, f.vocab], "zipf": f.zipf}
        if f.hotness != 1:
            entry["length"] = list(f.hotness) if isinstance(f.hotness, (list, tuple)) else f.hotness
        features[f.name] = entry
    spec = {"features": features}
    dense = manifest["dense"]["inputs"]
    if len(dense) > 1:
        raise ValueError(f"the export takes {len(dense)} dense inputs ({sorted(dense)}); the synthetic requests "
                         "give one")
    for name, input_spec in dense.items():
        spec["dense"] = {"name": name, "width": int(input_spec["shape"][-1])}
    return spec


def _stats(url, timeout_s, tls=None):
    from tf_fusedrec.serve import loadtest  # noqa: PLC0415

    return loadtest.fetch_stats(f"{url}/stats", timeout_s, tls) or {}


def _delta(before, after, key):
    a, b = before.get(key), after.get(key)
    return b - a if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None


def load_run(url, spec, load, qps, args, seed, bursts=False, pids=None, tls=None):
    """One open-loop load test of the ranker at url, with --burst-size bursts if `bursts`; -> the run's record
    (report included). pids ({"ranker": [pid], "servers": [pid, ...]}) adds their CPU seconds per second, and this
    process's (the load generator) as "load_generator". tls: the load generator's security.TLS (an https:// url)."""
    from tf_fusedrec.serve import loadtest  # noqa: PLC0415

    bursts = bursts and args.burst_size > 0
    loop = loadtest.OpenLoop(qps, args.burst_every if bursts else None, args.burst_size if bursts else 0,
                             args.max_in_flight, seed=seed)
    test = loadtest.LoadTest(url, loadtest.SyntheticInstances(spec, seed=seed), loop, args.batch, args.duration,
                             args.timeout, tls=tls)
    test.prepare()  # the bodies the run sends, built before its clock and its CPU readings start
    before = _stats(url, args.timeout, tls)
    cpu_before, start = _cpu_seconds(pids), time.monotonic()
    report = test.run()
    cpu_after, elapsed = _cpu_seconds(pids), time.monotonic() - start
    after = _stats(url, args.timeout, tls)
    requests = _delta(before, after, "requests")
    to_servers = _delta(before, after, "bytes_to_servers")
    servers = after.get("servers", {})
    lat = report["latency_ms"]
    return {
        "load": load,
        "offered_qps": qps + (args.burst_size / args.burst_every if bursts else 0.0),
        "poisson_qps": qps,
        "arrivals": report["arrivals"],
        "burst_every_s": args.burst_every if bursts else None,
        "burst_size": args.burst_size if bursts else 0,
        "sent": report["sent"],
        "ok": report["ok"],
        "requests_per_s": report["requests_per_s"],
        "instances_per_s": report["instances_per_s"],
        "p50_ms": lat["p50"],
        "p90_ms": lat["p90"],
        "p99_ms": lat["p99"],
        "max_ms": lat["max"],
        "errors": report["error_count"],
        "errors_by_kind": report["errors"],
        "dropped": report["dropped"],
        "cache_hit_rate": report["cache_hit_rate"],
        "bytes_from_servers_per_request": report["bytes_per_request"],
        "bytes_to_servers_per_request": to_servers / requests if to_servers is not None and requests else None,
        "ranker_mean_batch": (_delta(before, after, "batched_instances") / _delta(before, after, "batches")
                              if _delta(before, after, "batches") else None),
        "server_max_queue_depth_since_start": {a: s.get("max_queue_depth") for a, s in servers.items()},
        "load_average_after": list(os.getloadavg()),
        **({"cpu_s_per_s": {k: (cpu_after[k] - cpu_before[k]) / elapsed
                            if cpu_after[k] is not None and cpu_before[k] is not None else None
                            for k in cpu_before}} if pids is not None else {}),
        "report": report,
    }


def _process_cpu_seconds(pid):
    """User + system CPU seconds of process pid (all its threads) from /proc; None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15
    except (OSError, ValueError, IndexError):
        return None


def _cpu_seconds(pids):
    """{name: CPU seconds summed over its pids (None if any is unreadable)} plus "load_generator": this process's."""
    if pids is None:
        return None
    seconds = {}
    for name, group in pids.items():
        each = [_process_cpu_seconds(pid) for pid in group]
        seconds[name] = None if None in each else sum(each)
    times = os.times()
    seconds["load_generator"] = times.user + times.system
    return seconds


def settle(url, timeout_s, tls=None):
    """Waits (at most timeout_s) until the ranker's queue is empty: a curve point then does not start with the last
    point's backlog."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _stats(url, timeout_s, tls).get("queue_depth", 0) == 0:
            return True
        time.sleep(0.1)
    return False


def run_curve(url, spec, args, pids, tls=None):
    """The saturation curve of the ranker at url: one open-loop run per rate of args.curve_qps; -> the points."""
    points = []
    for i, qps in enumerate(args.curve_qps):
        if not settle(url, args.timeout, tls):
            log(f"  the ranker's queue was not empty within {args.timeout:g} s; the next point starts anyway")
        point = load_run(url, spec, "curve", qps, args, seed=args.seed + 10 + i, pids=pids, tls=tls)
        points.append(point)
        log(f"  curve {i + 1}/{len(args.curve_qps)}: {summary(point)}")
    return points


def saturation(points):
    """What the curve says: the most requests/s served, and the highest offered rate whose every arrival was answered
    (2xx; none dropped, none failed). Achieved is not compared with offered: a run's Poisson arrivals stray from the
    nominal rate by about 1/sqrt(arrivals)."""
    best = max(points, key=lambda p: p["requests_per_s"])
    all_served = [p["offered_qps"] for p in points if p["arrivals"] and p["ok"] == p["arrivals"]]
    return {"max_requests_per_s": best["requests_per_s"], "max_at_offered_qps": best["offered_qps"],
            "max_instances_per_s": best["instances_per_s"],
            "highest_offered_qps_all_served": max(all_served, default=None)}


def warm_up(url, spec, args, tls=None):
    """A second of closed-loop requests (own seed): the first calls of a fresh ranker (connections, the dense
    SavedModel's first run) are not measured."""
    from tf_fusedrec.serve import loadtest  # noqa: PLC0415

    source = loadtest.SyntheticInstances(spec, seed=args.seed + 1000)
    report = loadtest.LoadTest(url, source, loadtest.ClosedLoop(1), args.batch, args.warmup, args.timeout,
                               tls=tls).run()
    if report["ok"] == 0:
        raise RuntimeError(f"the ranker at {url} answered no warm-up request: {report['errors']}")
    return report["ok"]


def run_bench(args, work_dir):
    """Everything of one bench; -> (the result dict, the curve dict or None)."""
    from tf_fusedrec import config as cfg  # noqa: PLC0415
    from tf_fusedrec.export import format as fmt  # noqa: PLC0415

    config = cfg.load_config(args.config)
    export_dir = args.export or train_and_export(args.config, work_dir, args.steps, args.train_batch_size,
                                                 args.step_timeout)
    spec = synthetic_spec(config, fmt.read_manifest(export_dir))
    transport = Transport.make(args.tls, args.tls_client_auth, work_dir)
    client_tls = transport.client_tls()
    result = {
        "command": "python -m tf_fusedrec.serve.bench" + (" " + shlex.join(args.argv) if args.argv else ""),
        "config": str(args.config),
        "export": export_dir if args.export else f"(trained for this run: {args.steps} steps of "
                                                 f"{args.train_batch_size}, one process)",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "niceness": os.nice(0), "load_average_start": list(os.getloadavg())},
        "settings": {k: getattr(args, k) for k in ("duration", "low_qps", "high_qps", "burst_every", "burst_size",
                                                   "batch", "cache_mb", "max_in_flight", "timeout", "warmup",
                                                   "seed")},
        "transport": transport.label,
        "servers": NUM_SERVERS,
        "synthetic_spec": spec,
        "runs": [],
    }
    curve_setup = RankerSetup(args.curve_pooling == "on", args.cache_mb if args.curve_cache == "on" else 0.0)
    curve = None
    services = []
    try:
        ports = [free_port() for _ in range(NUM_SERVERS)]
        for shard, port in enumerate(ports):
            server = Service(f"embedding server {shard}", "tf_fusedrec.serve.embedding_server",
                             ["--export", export_dir, "--shard", str(shard), "--num-shards", str(NUM_SERVERS),
                              "--port", str(port), *transport.server_flags()],
                             os.path.join(work_dir, f"server{shard}.log"))
            services.append(server)
            server.start(args.start_timeout)
        addresses = ",".join(f"127.0.0.1:{p}" for p in ports)
        log(f"{NUM_SERVERS} embedding servers ready on {addresses} ({transport.label})")
        for i, setup in enumerate(ranker_setups(args.cache_mb)):
            port = free_port()
            ranker = Service(f"ranker ({setup.label})", "tf_fusedrec.serve.ranker",
                             ["--export", export_dir, "--servers", addresses, "--port", str(port), "--name", "bench",
                              "--timeout-s", str(args.timeout), *setup.flags(), *transport.ranker_flags()],
                             os.path.join(work_dir, f"ranker{i}.log"))
            services.append(ranker)
            try:
                ranker.start(args.start_timeout)
                url = transport.url(port, "bench")
                warm = warm_up(url, spec, args, client_tls)
                log(f"ranker {i + 1}/4 ready ({setup.label}; {warm} warm-up requests)")
                for load, qps in (("low", args.low_qps), ("high", args.high_qps)):
                    run = {"pooling": setup.pooling, "cache_mb": setup.cache_mb,
                           **load_run(url, spec, load, qps, args, seed=args.seed + (load == "high"),
                                      bursts=load == "high", tls=client_tls)}
                    result["runs"].append(run)
                    log(f"  {load} load: {summary(run)}")
                if setup == curve_setup and args.curve_qps:
                    log(f"saturation curve ({setup.label}): {len(args.curve_qps)} points of {args.duration:g} s")
                    pids = {"ranker": [ranker.proc.pid], "servers": [s.proc.pid for s in services[:NUM_SERVERS]]}
                    curve = {"load_average_start": list(os.getloadavg())}
                    curve["points"] = run_curve(url, spec, args, pids, client_tls)
                    curve["load_average_end"] = list(os.getloadavg())
            finally:
                ranker.stop()
                services.remove(ranker)
    finally:
        for service in reversed(services):
            service.stop()
    result["machine"]["load_average_end"] = list(os.getloadavg())
    if curve is not None:
        curve = {
            "command": result["command"],
            "config": result["config"],
            "export": result["export"],
            "machine": {**{k: v for k, v in result["machine"].items() if not k.startswith("load_average")},
                        "load_average_start": curve["load_average_start"],
                        "load_average_end": curve["load_average_end"]},
            "setup": {"pooling": curve_setup.pooling, "cache_mb": curve_setup.cache_mb, "label": curve_setup.label},
            "settings": {k: getattr(args, k) for k in ("curve_qps", "duration", "batch", "max_in_flight", "timeout",
                                                       "seed")},
            "servers": NUM_SERVERS,
            "transport": result["transport"],
            "saturation": saturation(curve["points"]),
            "points": curve["points"],
        }
    return result, curve


# --- results ---------------------------------------------------------------------------------------------------------


def _num(x, fmt_spec, none="-"):
    return none if x is None else format(x, fmt_spec)


def _kb(x):
    return _num(None if x is None else x / 1e3, ".1f")


def summary(run):
    return (f"offered {run['offered_qps']:g} q/s, achieved {run['requests_per_s']:.1f} req/s "
            f"({run['instances_per_s']:.0f} inst/s), p50 {_num(run['p50_ms'], '.1f')} ms, p99 "
            f"{_num(run['p99_ms'], '.1f')} ms, errors {run['errors']}, dropped {run['dropped']}, hit rate "
            f"{_num(run['cache_hit_rate'], '.3f')}, {_num(run['bytes_from_servers_per_request'], ',.0f')} B "
            "from servers/request")


def markdown_table(runs):
    header = ("| pooling | cache | load | offered q/s | achieved req/s | p50 ms | p99 ms | errors | dropped "
              "| cache hit rate | KB from servers / req | KB to servers / req | mean batch |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for run in runs:
        from_servers, to_servers = run["bytes_from_servers_per_request"], run["bytes_to_servers_per_request"]
        cache = f"{run['cache_mb']:g} MiB" if run["cache_mb"] else "off"
        lines.append(
            f"| {'on' if run['pooling'] else 'off'} | {cache} "
            f"| {run['load']} | {run['offered_qps']:g} | {run['requests_per_s']:.1f} | {_num(run['p50_ms'], '.1f')} "
            f"| {_num(run['p99_ms'], '.1f')} | {run['errors']} | {run['dropped']} "
            f"| {_num(run['cache_hit_rate'], '.3f')} | {_kb(from_servers)} | {_kb(to_servers)} "
            f"| {_num(run['ranker_mean_batch'], '.0f')} |")
    return "\n".join(lines)


def _cpu(point, name):
    return _num((point.get("cpu_s_per_s") or {}).get(name), ".2f")


def curve_table(points):
    header = ("| offered q/s | achieved req/s | achieved inst/s | p50 ms | p99 ms | errors | dropped | cache hit rate "
              "| mean batch | CPU s/s ranker | CPU s/s servers | CPU s/s load generator |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for p in points:
        lines.append(
            f"| {p['offered_qps']:g} | {p['requests_per_s']:.1f} | {p['instances_per_s']:,.0f} "
            f"| {_num(p['p50_ms'], '.1f')} | {_num(p['p99_ms'], '.1f')} | {p['errors']} | {p['dropped']} "
            f"| {_num(p['cache_hit_rate'], '.3f')} | {_num(p['ranker_mean_batch'], '.0f')} | {_cpu(p, 'ranker')} "
            f"| {_cpu(p, 'servers')} | {_cpu(p, 'load_generator')} |")
    return "\n".join(lines)


def _loads(machine):
    return (f"load average (1, 5, 15 min) {', '.join(f'{x:.2f}' for x in machine['load_average_start'])} at the "
            f"start and {', '.join(f'{x:.2f}' for x in machine['load_average_end'])} at the end")


def curve_markdown(curve):
    sat, s = curve["saturation"], curve["settings"]
    served = sat["highest_offered_qps_all_served"]
    return "\n".join([
        f"## Saturation curve: {curve['setup']['label']}",
        "",
        f"One open-loop run of {s['duration']:g} s per offered rate (Poisson, no bursts; {s['batch']} instances a "
        f"request, at most {s['max_in_flight']} in flight), in ascending order on the ranker above, after its low and "
        f"high runs; {_loads(curve['machine'])}. CPU s/s: CPU seconds per second of wall time of the ranker, the "
        f"{curve['servers']} embedding servers together and the load generator (this process), out of "
        f"{curve['machine']['cpus']} cores. Plot: serve_curve.png.",
        "",
        f"Most served: {sat['max_requests_per_s']:.1f} requests/s ({sat['max_instances_per_s']:,.0f} instances/s) at "
        f"{sat['max_at_offered_qps']:g} offered; the highest offered rate with every request answered (none dropped, "
        "none failed): "
        + (f"{served:g} q/s." if served is not None else "none."),
        "",
        curve_table(curve["points"]),
        "",
    ])


def plot_curve(curve, path):
    """serve_curve.png: achieved against offered requests/s beside y = x, and p50/p99 latency against offered."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    points = curve["points"]
    offered = [p["offered_qps"] for p in points]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    top = max(offered + [p["requests_per_s"] for p in points])
    axes[0].plot([0, top], [0, top], "--", color="gray", label="y = x (every request served)")
    axes[0].plot(offered, [p["requests_per_s"] for p in points], "o-", label="achieved")
    dropped = [(o, p["requests_per_s"]) for o, p in zip(offered, points) if p["dropped"] or p["errors"]]
    if dropped:
        axes[0].plot(*zip(*dropped), "x", color="red", markersize=10, label="with drops or errors")
    axes[0].set_xlabel("offered requests/s")
    axes[0].set_ylabel(f"achieved requests/s ({curve['settings']['batch']} instances each)")
    axes[0].set_title(f"{curve['config']}: {curve['setup']['label']}", fontsize=10)
    axes[0].legend(fontsize=8)
    for name, style in (("p50_ms", "o-"), ("p99_ms", "s-")):
        axes[1].plot(offered, [p[name] for p in points], style, label=name.split("_")[0])
    axes[1].set_yscale("log")
    axes[1].set_xlabel("offered requests/s")
    axes[1].set_ylabel("latency ms (from arrival)")
    start = curve["machine"]["load_average_start"][0]
    axes[1].set_title(f"{curve['machine']['cpus']} CPUs shared by servers, ranker and load generator; load "
                      f"{start:.1f} at the start", fontsize=10)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(result, curve=None):
    s = result["settings"]
    start, end = result["machine"]["load_average_start"], result["machine"]["load_average_end"]
    return "\n".join([
        "# Serving benchmark: pooling on the embedding servers x the ranker's row cache",
        "",
        f"`{result['command']}`",
        "",
        f"Config `{result['config']}`, export {result['export']}; {result['servers']} embedding servers and one ranker "
        f"on {result['machine']['cpus']} CPUs ({result['machine']['platform']}, niceness "
        f"{result['machine']['niceness']}), load average (1, 5, 15 min) "
        f"{', '.join(f'{x:.2f}' for x in start)} at the start and {', '.join(f'{x:.2f}' for x in end)} at the end.",
        f"Every hop (load generator to ranker, ranker to servers) {TRANSPORT_WORDS[result['transport']]}.",
        f"Open loop, {s['batch']} instances a request, {s['duration']:g} s a run, at most {s['max_in_flight']} "
        f"requests in flight (arrivals beyond are dropped), {s['timeout']:g} s timeout; low load Poisson "
        f"{s['low_qps']:g} q/s, high load Poisson {s['high_qps']:g} q/s plus {s['burst_size']} requests at once every "
        f"{s['burst_every']:g} s. Offered q/s is the nominal rate (the arrivals drawn are in the JSON). Each ranker "
        f"serves the low load, then the high load, its cache ({s['cache_mb']:g} MiB LRU) warm from the low one. "
        "Bytes are the ranker's lookup traffic from and to the embedding servers per HTTP request; mean batch is "
        "the instances per dense-model call after the ranker merged the requests waiting.",
        "",
        markdown_table(result["runs"]),
        "",
    ] + ([curve_markdown(curve)] if curve is not None else []))


# --- command line ----------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m tf_fusedrec.serve.bench",
                                description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--config", default=DEFAULT_CONFIG, help=f"the model's config (default {DEFAULT_CONFIG})")
    p.add_argument("--export", help="an existing export of --config (default: train and export one here)")
    p.add_argument("--out", default="benchmarks/results/serve", help="where serve_bench.json and serve_bench.md go")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of requests per run (default 10)")
    p.add_argument("--low-qps", type=float, default=5.0, help="the low load, requests/s (default 5)")
    p.add_argument("--high-qps", type=float, default=45.0, help="the high load's Poisson rate (default 45)")
    p.add_argument("--burst-every", type=float, default=2.0, help="high load: a burst every T s (default 2)")
    p.add_argument("--burst-size", type=int, default=8, help="high load: requests per burst (default 8; 0: none)")
    p.add_argument("--batch", type=int, default=64, help="instances per request (default 64)")
    p.add_argument("--cache-mb", type=float, default=64.0, help="the cache's budget when on (default 64)")
    p.add_argument("--max-in-flight", type=int, default=64, help="requests in flight at most (default 64)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per request and per lookup (default 5)")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of warm-up requests per ranker (default 1)")
    p.add_argument("--seed", type=int, default=0, help="of the requests and arrivals (default 0)")
    p.add_argument("--steps", type=int, default=30, help="training steps without --export (default 30)")
    p.add_argument("--train-batch-size", type=int, default=512, help="training batch without --export (default 512)")
    p.add_argument("--start-timeout", type=float, default=120.0, help="seconds a server or ranker may take to start")
    p.add_argument("--step-timeout", type=float, default=300.0, help="seconds the training or the export may take")
    p.add_argument("--curve-qps", default=DEFAULT_CURVE_QPS, type=_rates, metavar="Q1,Q2,...",
                   help=f"the saturation curve's offered rates, requests/s (default {DEFAULT_CURVE_QPS}; '': no curve)")
    p.add_argument("--curve-pooling", choices=("on", "off"), default="on", help="the curve's ranker (default on)")
    p.add_argument("--curve-cache", choices=("on", "off"), default="on",
                   help="the curve's ranker: cache of --cache-mb or none (default on)")
    p.add_argument("--work-dir", help="keep the training, export and logs here (default: a temporary directory)")
    p.add_argument("--tls", action="store_true",
                   help="every hop over TLS, with certificates of a throwaway CA made in the work directory (openssl)")
    p.add_argument("--tls-client-auth", action="store_true",
                   help="with --tls: mutual TLS on every hop (the servers and the ranker require client certificates)")
    args = p.parse_args(argv)
    if args.tls_client_auth and not args.tls:
        p.error("--tls-client-auth goes with --tls")
    for name in ("duration", "batch", "timeout", "warmup", "burst_every", "max_in_flight", "steps",
                 "train_batch_size", "start_timeout", "step_timeout"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if not args.low_qps > 0 or not args.high_qps > 0 or not args.cache_mb > 0 or args.burst_size < 0:
        p.error("--low-qps, --high-qps and --cache-mb must be > 0, --burst-size >= 0")
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def _rates(text):
    """'10,20,40' -> [10.0, 20.0, 40.0], sorted; '' -> []."""
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated requests/s, got {text!r}") from None
    if not all(r > 0 for r in rates) or len(set(rates)) != len(rates):
        raise argparse.ArgumentTypeError(f"the rates must be distinct and > 0, got {text!r}")
    return sorted(rates)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None):
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # a SIGTERM stops the children too (the finally blocks)
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="serve_bench_")
    os.makedirs(work_dir, exist_ok=True)
    try:
        result, curve = run_bench(args, work_dir)
    except KeyboardInterrupt:
        log("interrupted; every process started was stopped")
        return 130
    except (RuntimeError, ValueError, OSError) as e:
        log(f"error: {e}")
        return 1
    finally:
        if not args.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "serve_bench.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    with open(os.path.join(args.out, "serve_bench.md"), "w") as f:
        f.write(markdown(result, curve))
    print(markdown_table(result["runs"]), flush=True)
    written = "serve_bench.md"
    if curve is not None:
        with open(os.path.join(args.out, "serve_curve.json"), "w") as f:
            json.dump(curve, f, indent=1)
            f.write("\n")
        plot_curve(curve, os.path.join(args.out, "serve_curve.png"))
        print("\n" + curve_table(curve["points"]), flush=True)
        written += ", serve_curve.json and serve_curve.png"
    log(f"wrote {os.path.join(args.out, 'serve_bench.json')}, {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A load test for a ranker's REST endpoint (TensorFlow Serving's shape: POST {url}:predict {"instances": [...]}).

    python -m tf_fusedrec.serve.loadtest --url http[s]://127.0.0.1:8501/v1/models/NAME \\
        (--requests-from FILE | --example-instances JSON | --synthetic SPEC) --batch B --duration S \\
        (--qps Q [--burst-every T --burst-size K] [--max-in-flight N] | --closed-loop --concurrency C) \\
        [--timeout S] [--seed N] [--prebuild N|auto] [--tls-ca PEM [--tls-cert PEM --tls-key PEM]] [--out REPORT.json]

HTTPS. An https:// URL verifies the ranker's certificate (and its host name or IP) against --tls-ca (without it, the
system's CAs); --tls-cert/--tls-key present a client certificate to a ranker started with --tls-client-auth (the flags
of tf_fusedrec/serve/security.py). Each connection makes its handshake once and is kept alive.

Instances. Each request carries --batch instances, taken from one of:
  --requests-from FILE      a JSON list of instances, a JSON object {"instances": [...]}, or JSON Lines (one
                            instance a line); cycled in order.
  --example-instances JSON  the same inline: a JSON list of instances (or one instance); cycled in order.
  --synthetic SPEC          instances drawn at random (--seed), SPEC a JSON file or inline JSON:
                              {"features": {"user_id": {"range": [0, 1000000], "zipf": 1.05},
                                            "tags": {"range": [0, 5000], "zipf": 1.2, "length": 4}},
                               "dense": {"name": "dense", "width": 13}}
                            Each feature's ids lie in range [lo, hi) with P(lo + k) ~ (k + 1)^-zipf (a continuous
                            power law, floored; zipf 0 is uniform; the hot ids are the low ones). "length": L gives a
                            list of L ids, [a, b] a list of a..b ids, none a single id. "dense" (optional) adds a list
                            of `width` standard normal floats under `name`.

Load. Open loop (the default): requests arrive as a Poisson process at --qps, plus --burst-size requests at once every
--burst-every seconds (at T, 2T, ...; --qps 0 leaves only the bursts); at most --max-in-flight requests are in flight,
each on its own worker thread, and an arrival beyond that cap is dropped and counted, never queued. Its latency runs
from its arrival time, so a server that falls behind shows in the latencies instead of slowing the arrivals.
Closed loop (--closed-loop): --concurrency clients, each sending its next request as soon as its last answer came.

Bodies. The request bodies (JSON) are built in the source's order before the clock starts, as many as the open loop
can send (the Poisson count's mean + 5 standard deviations, and every burst; --prebuild N sets the count, 0 builds
none), so the generator's CPU does not compete with the server during the run; requests beyond them build theirs as
they are sent. No body is sent twice. The report's "bodies" says how many were built before and during the run.

Bounds. No request starts after --duration; requests in flight then are waited for up to --timeout (each request's own
limit), so the run ends by duration + timeout at worst. The threads are workers started as arrivals need them, at
most --max-in-flight (open loop), or --concurrency clients (closed loop), at most MAX_THREADS.

Report. Latency percentiles (nearest rank) and max over the successful (2xx) requests; achieved requests/s and
instances/s (successful, over the run's wall time); errors by HTTP status ("timeout", "connection" and "tls", a failed
handshake, for requests that got none); dropped arrivals. Before and after, GET {url}/stats (the ranker's counters:
"requests", "bytes_from_servers", "cache": {"hits", "misses"}) gives the cache hit rate and the bytes moved from the
embedding servers per request over the test; without that endpoint those are null. One line goes to stdout, the full
report (JSON) to --out. Standard library only (and tf_fusedrec/serve/security.py, which is).
"""

import argparse
import collections
import dataclasses
import http.client
import json
import math
import os
import queue
import random
import socket
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from tf_fusedrec.serve import security

MAX_THREADS = 1024
MAX_PREBUILT_BYTES = 512 << 20  # request bodies built before a run, at most


# --- statistics ------------------------------------------------------------------------------------------------------


def percentile(values, q):
    """The q-th percentile by nearest rank: the smallest value with at least q% of the values at or below it (a value
    some request really had, unlike interpolation).

    Args:
      values: numbers (any order).
      q: in [0, 100]; 0 gives the minimum, 100 the maximum.

    Returns:
      The value, or None when values is empty.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile: q must be in [0, 100], got {q!r}")
    ordered = sorted(values)
    if not ordered:
        return None
    # q * n first: 0.9 * 100 is 90.00000000000001 in floating point, 90 * 100 / 100 is 90 exactly.
    rank = math.ceil(q * len(ordered) / 100 - 1e-9)
    return ordered[max(rank, 1) - 1]


def latency_summary(latencies_s):
    """{"count", "p50", "p90", "p99", "max", "mean"} in milliseconds (None when there are no latencies)."""
    ms = sorted(1e3 * x for x in latencies_s)
    summary = {"count": len(ms)}
    for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100)):
        summary[name] = percentile(ms, q)
    summary["mean"] = sum(ms) / len(ms) if ms else None
    return summary


# --- instances -------------------------------------------------------------------------------------------------------


class CycledInstances:
    """Batches taken in order from a list of instances, wrapping around (thread-safe).

    Args:
      instances: a non-empty list of JSON-serialisable instances.
    """

    def __init__(self, instances):
        if not isinstance(instances, list) or not instances:
            raise ValueError(f"the instances must be a non-empty JSON list, got {type(instances).__name__} "
                             f"of length {len(instances) if isinstance(instances, list) else '-'}")
        self._instances = instances
        self._next = 0
        self._lock = threading.Lock()

    def next_batch(self, size):
        with self._lock:
            start, self._next = self._next, (self._next + size) % len(self._instances)
        return [self._instances[(start + i) % len(self._instances)] for i in range(size)]


class SyntheticInstances:
    """Random instances from a spec (see the module docstring), reproducible from the seed (thread-safe).

    Args:
      spec: the spec dict.
      seed: int.
    """

    def __init__(self, spec, seed=0):
        if not isinstance(spec, dict) or not isinstance(spec.get("features"), dict) or not spec["features"]:
            raise ValueError('synthetic spec: needs "features": {name: {"range": [lo, hi], "zipf": s}, ...}')
        self._features = [(name, *_parse_feature(name, f)) for name, f in spec["features"].items()]
        dense = spec.get("dense")
        if dense is not None:
            if (not isinstance(dense, dict) or not isinstance(dense.get("name"), str)
                    or not isinstance(dense.get("width"), int) or dense["width"] < 1):
                raise ValueError(f'synthetic spec: "dense" must be {{"name": str, "width": int >= 1}}, got {dense!r}')
            dense = (dense["name"], dense["width"])
        self._dense = dense
        self._rng = random.Random(seed)
        self._draws = None  # per feature: (name, draw(), length), made on the first batch
        self._lock = threading.Lock()

    def _drawer(self, lo, hi, s):
        """A function drawing one id of [lo, hi) with zipf s: one self._rng.random() a draw, the same values a call of
        the inverse CDF below gives (its constants computed once per feature, not per id)."""
        n = hi - lo
        last = lo + n - 1
        rand = self._rng.random
        if s == 0:
            return lambda: min(lo + int(1 + rand() * n) - 1, last)
        if s == 1:
            base = n + 1
            return lambda: min(lo + int(base ** rand()) - 1, last)
        # Inverse CDF of the density ~ x^-s on [1, n + 1).
        span, power = (n + 1) ** (1 - s) - 1, 1 / (1 - s)
        return lambda: min(lo + int((1 + rand() * span) ** power) - 1, last)

    def next_batch(self, size):
        with self._lock:
            if self._draws is None:
                self._draws = [(name, self._drawer(lo, hi, s), length) for name, lo, hi, s, length in self._features]
            randint, gauss = self._rng.randint, self._rng.gauss
            batch = []
            for _ in range(size):
                instance = {}
                for name, draw, length in self._draws:
                    if length is None:
                        instance[name] = draw()
                    else:
                        instance[name] = [draw() for _ in range(randint(*length))]
                if self._dense is not None:
                    name, width = self._dense
                    instance[name] = [round(gauss(0.0, 1.0), 4) for _ in range(width)]
                batch.append(instance)
            return batch


def _parse_feature(name, feature):
    """(lo, hi, zipf, length (None or (a, b))) of one synthetic feature; ValueError naming it."""
    if not isinstance(feature, dict):
        raise ValueError(f"synthetic spec: feature {name!r} must be an object, got {feature!r}")
    id_range = feature.get("range")
    if (not isinstance(id_range, list) or len(id_range) != 2 or not all(isinstance(x, int) for x in id_range)
            or not 0 <= id_range[0] < id_range[1]):
        raise ValueError(f'synthetic spec: feature {name!r}: "range" must be [lo, hi] with 0 <= lo < hi, '
                         f"got {id_range!r}")
    zipf = feature.get("zipf", 0.0)
    if not isinstance(zipf, (int, float)) or zipf < 0:
        raise ValueError(f'synthetic spec: feature {name!r}: "zipf" must be a number >= 0, got {zipf!r}')
    length = feature.get("length")
    if isinstance(length, int) and length >= 1:
        length = (length, length)
    elif isinstance(length, list) and len(length) == 2 and all(isinstance(x, int) for x in length) \
            and 0 <= length[0] <= length[1]:
        length = tuple(length)
    elif length is not None:
        raise ValueError(f'synthetic spec: feature {name!r}: "length" must be an int >= 1 or [a, b] with '
                         f"0 <= a <= b, got {length!r}")
    return id_range[0], id_range[1], float(zipf), length


def load_instances(path):
    """The instances of a file: a JSON list, {"instances": [...]}, or JSON Lines."""
    with open(path) as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        try:
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: neither JSON nor JSON Lines: {e}") from None
    if isinstance(data, dict) and "instances" in data:
        data = data["instances"]
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path}: expected a non-empty list of instances (or {{\"instances\": [...]}})")
    return data


def _json_arg(text, what):
    """Inline JSON, or the JSON in the file `text` names."""
    if not text.lstrip().startswith(("{", "[")) and os.path.isfile(text):
        with open(text) as f:
            text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what}: neither valid JSON nor a file: {e}") from None


# --- HTTP ------------------------------------------------------------------------------------------------------------


def client_context(url, tls):
    """The ssl.SSLContext of an https:// url (tls: a security.TLS, or None for the system's CAs), None for http://;
    ValueError for any other URL, or TLS settings with an http:// one."""
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme == "http":
        if tls is not None:
            raise ValueError(f"--tls-ca/--tls-cert/--tls-key are for an https:// URL, got {url!r}")
        return None
    if scheme != "https":
        raise ValueError(f"--url must be http[s]://HOST:PORT/v1/models/NAME, got {url!r}")
    return (tls or security.TLS()).client_context()


class _Endpoint:
    """Where the model lives: host, port, the paths of :predict and /stats, and the TLS context (None: plain HTTP)."""

    def __init__(self, url, tls=None):
        parsed = urllib.parse.urlsplit(url)
        self.context = client_context(url, tls)
        if not parsed.hostname:
            raise ValueError(f"--url must be http[s]://HOST:PORT/v1/models/NAME, got {url!r}")
        self.url = url.rstrip("/")
        self.host, self.port = parsed.hostname, parsed.port or (443 if self.context is not None else 80)
        path = parsed.path.rstrip("/")
        self.predict_path = f"{path}:predict"
        self.stats_url = f"{self.url}/stats"


class _Connection:
    """One keep-alive HTTP(S) connection, owned by one thread."""

    def __init__(self, endpoint, timeout_s):
        self._endpoint = endpoint
        if endpoint.context is None:
            self._conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeout_s)
        else:
            self._conn = http.client.HTTPSConnection(endpoint.host, endpoint.port, timeout=timeout_s,
                                                     context=endpoint.context)

    def predict(self, body):
        """-> "ok" for a 2xx answer, else the HTTP status as a string, "timeout" or "connection"."""
        try:
            self._conn.request("POST", self._endpoint.predict_path, body=body,
                               headers={"Content-Type": "application/json"})
            response = self._conn.getresponse()
            response.read()  # the whole answer: its latency counts, and the connection can be reused
        except (TimeoutError, socket.timeout):
            self._conn.close()  # the late answer must not be read as the next request's
            return "timeout"
        except ssl.SSLError:  # the handshake failed (a certificate not verified, ...): OSError's subclass, told apart
            self._conn.close()
            return "tls"
        except (OSError, http.client.HTTPException):
            self._conn.close()
            return "connection"
        return "ok" if 200 <= response.status < 300 else str(response.status)

    def close(self):
        self._conn.close()


def fetch_stats(stats_url, timeout_s, tls=None):
    """The ranker's stats (a JSON object), or None when the endpoint is absent, fails or answers something else (tls:
    a security.TLS for an https:// URL, see client_context)."""
    try:
        with urllib.request.urlopen(stats_url, timeout=timeout_s, context=client_context(stats_url, tls)) as response:
            stats = json.loads(response.read())
    except (OSError, urllib.error.URLError, http.client.HTTPException, json.JSONDecodeError, ValueError):
        return None
    return stats if isinstance(stats, dict) else None


def stats_delta(before, after):
    """(cache hit rate, bytes from the servers per request, the deltas) between two stats answers; None where a
    counter is missing or did not move."""

    def number(stats, *path):
        for key in path:
            stats = stats.get(key) if isinstance(stats, dict) else None
        return stats if isinstance(stats, (int, float)) and not isinstance(stats, bool) else None

    delta = {}
    for name, path in (("requests", ("requests",)), ("bytes_from_servers", ("bytes_from_servers",)),
                       ("cache_hits", ("cache", "hits")), ("cache_misses", ("cache", "misses"))):
        a, b = number(before, *path), number(after, *path)
        delta[name] = b - a if a is not None and b is not None else None
    hits, misses = delta["cache_hits"], delta["cache_misses"]
    hit_rate = hits / (hits + misses) if hits is not None and misses is not None and hits + misses > 0 else None
    requests, moved = delta["requests"], delta["bytes_from_servers"]
    per_request = moved / requests if moved is not None and requests else None
    return hit_rate, per_request, delta


# --- the run ---------------------------------------------------------------------------------------------------------


class _Recorder:
    """The run's counters, shared by the threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self.latencies = []
        self.outcomes = {}  # "ok" / status / "timeout" / "connection" -> count
        self.sent = self.dropped = self.in_flight = self.max_in_flight = self.ok_instances = 0

    def admit(self, cap):
        """Counts an arrival: True when it may be sent (fewer than cap in flight), False when dropped."""
        with self._lock:
            if self.in_flight >= cap:
                self.dropped += 1
                return False
            self._start()
            return True

    def start(self):
        with self._lock:
            self._start()

    def _start(self):
        self.sent += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def snapshot(self):
        """A consistent copy of the counters (a thread given up on at the end may still be writing)."""
        with self._lock:
            return {"outcomes": dict(self.outcomes), "latencies": list(self.latencies), "sent": self.sent,
                    "dropped": self.dropped, "in_flight": self.in_flight, "max_in_flight": self.max_in_flight,
                    "ok_instances": self.ok_instances}

    def done(self, outcome, latency_s, instances):
        with self._lock:
            self.in_flight -= 1
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            if outcome == "ok":
                self.latencies.append(latency_s)
                self.ok_instances += instances


def _body(source, batch):
    return json.dumps({"instances": source.next_batch(batch)}).encode()


class _Bodies:
    """The run's request bodies, in the source's order: those built before the clock started, then one built per
    request as it is sent once they are used up (none is sent twice)."""

    def __init__(self, source, batch, count, max_bytes):
        self._source, self._batch = source, batch
        self._ready = collections.deque()
        began, size = time.perf_counter(), 0
        while len(self._ready) < count and size < max_bytes:
            self._ready.append(_body(source, batch))
            size += len(self._ready[-1])
        self.prebuilt, self.prebuilt_bytes = len(self._ready), size
        self.prebuild_s = time.perf_counter() - began
        self._lock = threading.Lock()
        self.built_in_run = 0

    def next(self):
        try:
            return self._ready.popleft()
        except IndexError:
            with self._lock:
                self.built_in_run += 1
            return _body(self._source, self._batch)


def _send(connection, bodies, batch, recorder, arrival):
    outcome = connection.predict(bodies.next())
    recorder.done(outcome, time.perf_counter() - arrival, batch)


class OpenLoop:
    """Poisson arrivals at qps plus bursts, at most max_in_flight in flight (the rest dropped).

    Args:
      qps: mean arrivals per second (0: bursts only).
      burst_every_s / burst_size: burst_size arrivals at once every burst_every_s seconds (None / 0: no bursts).
      max_in_flight: the cap on requests in flight, and on the worker threads (started as arrivals need them).
      seed: of the arrival times.
    """

    name = "open"

    def __init__(self, qps, burst_every_s=None, burst_size=0, max_in_flight=64, seed=0):
        if qps is None or qps < 0:
            raise ValueError(f"open loop: --qps must be >= 0, got {qps!r}")
        if (burst_every_s is None) != (not burst_size):
            raise ValueError("open loop: --burst-every and --burst-size go together")
        if burst_every_s is not None and (burst_every_s <= 0 or burst_size < 1):
            raise ValueError(f"open loop: need --burst-every > 0 and --burst-size >= 1, got {burst_every_s!r} and "
                             f"{burst_size!r}")
        if qps == 0 and burst_every_s is None:
            raise ValueError("open loop: --qps 0 without bursts sends nothing")
        if not 1 <= max_in_flight <= MAX_THREADS:
            raise ValueError(f"open loop: --max-in-flight must be in [1, {MAX_THREADS}], got {max_in_flight!r}")
        self.qps, self.burst_every_s, self.burst_size = qps, burst_every_s, burst_size
        self.max_in_flight, self.seed = max_in_flight, seed

    def describe(self):
        return {"qps": self.qps, "burst_every_s": self.burst_every_s, "burst_size": self.burst_size,
                "max_in_flight": self.max_in_flight}

    def most_requests(self, duration_s):
        """A bound on the requests a run of duration_s sends (the Poisson count's mean + 5 standard deviations, and
        every burst), for the bodies built before it starts."""
        mean = self.qps * duration_s
        bursts = math.floor(duration_s / self.burst_every_s) * self.burst_size if self.burst_every_s else 0
        return math.ceil(mean + 5 * math.sqrt(mean)) + 1 + bursts

    def run(self, endpoint, bodies, batch, timeout_s, recorder, start, deadline):
        # Worker threads start on demand, one when an admitted arrival finds none idle, up to max_in_flight: a large
        # cap costs nothing until that many requests are in flight (starting 1000 threads up front took seconds of
        # the run's duration on a busy machine, so the first arrivals were sent late).
        arrivals = queue.Queue()
        lock = threading.Lock()
        idle = [0]  # workers waiting on arrivals and not yet claimed by one
        workers = []

        def worker():
            connection = _Connection(endpoint, timeout_s)
            try:
                while (arrival := arrivals.get()) is not None:
                    _send(connection, bodies, batch, recorder, arrival)
                    with lock:
                        idle[0] += 1
            finally:
                connection.close()

        def dispatch(arrival):
            with lock:
                claimed = idle[0] > 0
                if claimed:
                    idle[0] -= 1
            if not claimed and len(workers) < self.max_in_flight:
                workers.append(threading.Thread(target=worker, daemon=True, name=f"loadtest-{len(workers)}"))
                workers[-1].start()
            # Without an idle worker and at the thread cap (a worker between its answer and its next wait), the
            # arrival waits in the queue for the first one free.
            arrivals.put(arrival)

        rng = random.Random(self.seed)
        next_poisson = start + rng.expovariate(self.qps) if self.qps > 0 else math.inf
        next_burst = start + self.burst_every_s if self.burst_every_s else math.inf
        while (t := min(next_poisson, next_burst)) < deadline:
            time.sleep(max(0.0, t - time.perf_counter()))
            if t == next_poisson:
                count, next_poisson = 1, next_poisson + rng.expovariate(self.qps)
            else:
                count, next_burst = self.burst_size, next_burst + self.burst_every_s
            for _ in range(count):
                if recorder.admit(self.max_in_flight):
                    dispatch(t)
        for _ in workers:
            arrivals.put(None)
        return workers


class ClosedLoop:
    """concurrency clients, each sending its next request when its last answer came.

    Args:
      concurrency: the number of clients (threads).
    """

    name = "closed"

    def __init__(self, concurrency):
        if not 1 <= concurrency <= MAX_THREADS:
            raise ValueError(f"closed loop: --concurrency must be in [1, {MAX_THREADS}], got {concurrency!r}")
        self.concurrency = concurrency

    def describe(self):
        return {"concurrency": self.concurrency}

    def most_requests(self, duration_s):  # noqa: ARG002  (as many as the server answers: no bound)
        return None

    def run(self, endpoint, bodies, batch, timeout_s, recorder, start, deadline):
        def client():
            connection = _Connection(endpoint, timeout_s)
            try:
                while (now := time.perf_counter()) < deadline:
                    recorder.start()
                    _send(connection, bodies, batch, recorder, now)
            finally:
                connection.close()

        clients = [threading.Thread(target=client, daemon=True, name=f"loadtest-{i}")
                   for i in range(self.concurrency)]
        for t in clients:
            t.start()
        return clients


@dataclasses.dataclass
class LoadTest:
    """One load test.

    Args:
      url: http[s]://HOST:PORT/v1/models/NAME.
      source: CycledInstances or SyntheticInstances (anything with next_batch(size) -> list).
      loop: OpenLoop or ClosedLoop.
      batch: instances per request.
      duration_s: no request starts later than this after the start.
      timeout_s: each request's limit, and how long in-flight requests are waited for at the end.
      prebuild: request bodies built before the clock starts ("auto": as many as the open loop can send, see
        OpenLoop.most_requests; none for the closed loop), at most MAX_PREBUILT_BYTES of them; the requests beyond
        build theirs as they are sent. The bodies are the same either way (the source's order, none sent twice):
        building them first keeps the generator's CPU (a few ms per 64 synthetic instances) out of the measured run,
        where it competes with the server on a shared machine.
      tls: a security.TLS for an https:// url (its CA verifies the ranker; its certificate, if any, is presented), or
        None (an https:// url is verified against the system's CAs).
    """

    url: str
    source: object
    loop: object
    batch: int
    duration_s: float
    timeout_s: float = 10.0
    prebuild: object = "auto"
    tls: object = None

    def __post_init__(self):
        if not isinstance(self.batch, int) or self.batch < 1:
            raise ValueError(f"--batch must be an int >= 1, got {self.batch!r}")
        if not self.duration_s > 0:
            raise ValueError(f"--duration must be > 0, got {self.duration_s!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"--timeout must be > 0, got {self.timeout_s!r}")
        if self.prebuild != "auto" and (not isinstance(self.prebuild, int) or isinstance(self.prebuild, bool)
                                        or self.prebuild < 0):
            raise ValueError(f"--prebuild must be 'auto' or an int >= 0, got {self.prebuild!r}")
        self._endpoint = _Endpoint(self.url, self.tls)
        self._bodies = None

    def prepare(self):
        """Builds the bodies sent first (see prebuild); run() calls it when not called before. -> seconds it took."""
        count = self.prebuild
        if count == "auto":
            count = self.loop.most_requests(self.duration_s) or 0
        self._bodies = _Bodies(self.source, self.batch, count, MAX_PREBUILT_BYTES)
        return self._bodies.prebuild_s

    def run(self):
        """Runs the test; -> the report (a JSON-serialisable dict, see the module docstring)."""
        if self._bodies is None:
            self.prepare()
        bodies, self._bodies = self._bodies, None  # a second run() builds its own
        stats_before = fetch_stats(self._endpoint.stats_url, self.timeout_s, self.tls)
        recorder = _Recorder()
        start = time.perf_counter()
        deadline = start + self.duration_s
        threads = self.loop.run(self._endpoint, bodies, self.batch, self.timeout_s, recorder, start, deadline)
        # Requests started before the deadline finish or time out within timeout_s (+ a little for the threads).
        give_up = max(deadline, time.perf_counter()) + self.timeout_s + 1.0
        for t in threads:
            t.join(max(0.0, give_up - time.perf_counter()))
        elapsed = time.perf_counter() - start
        stats_after = fetch_stats(self._endpoint.stats_url, self.timeout_s, self.tls)
        return self._report(recorder, elapsed, stats_before, stats_after, bodies)

    def _report(self, recorder, elapsed, stats_before, stats_after, bodies):
        counts = recorder.snapshot()
        outcomes = counts["outcomes"]
        ok = outcomes.pop("ok", 0)
        sent, dropped = counts["sent"], counts["dropped"]
        hit_rate, per_request, delta = stats_delta(stats_before or {}, stats_after or {})
        return {
            "url": self.url,
            "mode": self.loop.name,
            **self.loop.describe(),
            "batch": self.batch,
            "duration_s": self.duration_s,
            "elapsed_s": elapsed,
            "arrivals": sent + dropped,
            "sent": sent,
            "ok": ok,
            "errors": dict(sorted(outcomes.items())),
            "error_count": sum(outcomes.values()),
            "dropped": dropped,
            "unfinished": counts["in_flight"],
            "max_in_flight_seen": counts["max_in_flight"],
            "latency_ms": latency_summary(counts["latencies"]),
            "requests_per_s": ok / elapsed,
            "instances_per_s": counts["ok_instances"] / elapsed,
            "cache_hit_rate": hit_rate,
            "bytes_per_request": per_request,
            "ranker_delta": delta if stats_before is not None and stats_after is not None else None,
            "bodies": {"prebuilt": bodies.prebuilt, "prebuilt_bytes": bodies.prebuilt_bytes,
                       "prebuild_s": bodies.prebuild_s, "built_in_run": bodies.built_in_run},
        }


def summary_line(report):
    """The report in one line."""

    def ms(x):
        return "-" if x is None else f"{x:.1f}"

    lat = report["latency_ms"]
    errors = " ".join(f"{k}:{v}" for k, v in report["errors"].items()) or "none"
    hit = "-" if report["cache_hit_rate"] is None else f"{report['cache_hit_rate']:.3f}"
    per_request = "-" if report["bytes_per_request"] is None else f"{report['bytes_per_request']:.0f}"
    return (f"{report['mode']} loop {report['elapsed_s']:.1f}s: sent {report['sent']} ok {report['ok']} "
            f"errors {errors} dropped {report['dropped']} | {report['requests_per_s']:.1f} req/s "
            f"{report['instances_per_s']:.1f} inst/s | latency ms p50 {ms(lat['p50'])} p90 {ms(lat['p90'])} "
            f"p99 {ms(lat['p99'])} max {ms(lat['max'])} | cache hit rate {hit} | bytes/request {per_request}")


# --- command line ----------------------------------------------------------------------------------------------------


def _prebuild_arg(text):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an int >= 0, got {text!r}") from None


def _parser():
    p = argparse.ArgumentParser(prog="python -m tf_fusedrec.serve.loadtest",
                                description="Load test a ranker's REST endpoint (see the module docstring).")
    p.add_argument("--url", required=True, help="http[s]://HOST:PORT/v1/models/NAME")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--requests-from", metavar="FILE", help="instances: JSON list, {instances: [...]} or JSONL")
    source.add_argument("--example-instances", metavar="JSON", help="instances inline: a JSON list")
    source.add_argument("--synthetic", metavar="SPEC", help="a synthetic spec: JSON file or inline JSON")
    p.add_argument("--batch", type=int, required=True, help="instances per request")
    p.add_argument("--duration", type=float, required=True, help="seconds during which requests start")
    p.add_argument("--qps", type=float, help="open loop: Poisson arrivals per second")
    p.add_argument("--burst-every", type=float, metavar="T", help="open loop: a burst every T seconds")
    p.add_argument("--burst-size", type=int, default=0, metavar="K", help="open loop: K requests a burst")
    p.add_argument("--max-in-flight", type=int, default=64, help="open loop: cap on requests in flight (default 64)")
    p.add_argument("--closed-loop", action="store_true", help="closed loop instead of open")
    p.add_argument("--concurrency", type=int, default=1, help="closed loop: number of clients (default 1)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default 10)")
    p.add_argument("--seed", type=int, default=0, help="of arrivals and synthetic instances (default 0)")
    p.add_argument("--prebuild", type=_prebuild_arg, default="auto", metavar="N|auto",
                   help="request bodies built before the clock starts (default auto: as many as the open loop can "
                        "send; the rest are built as they are sent)")
    p.add_argument("--out", metavar="JSON", help="write the report here")
    security.add_tls_flags(p, server=False)
    return p


def main(argv=None):
    """Runs the command line; -> the report."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.requests_from:
            source = CycledInstances(load_instances(args.requests_from))
        elif args.example_instances:
            instances = _json_arg(args.example_instances, "--example-instances")
            source = CycledInstances(instances if isinstance(instances, list) else [instances])
        else:
            source = SyntheticInstances(_json_arg(args.synthetic, "--synthetic"), seed=args.seed)
        if args.closed_loop:
            if args.qps is not None or args.burst_every is not None:
                raise ValueError("--qps and bursts are for the open loop, not with --closed-loop")
            loop = ClosedLoop(args.concurrency)
        else:
            loop = OpenLoop(args.qps, args.burst_every, args.burst_size, args.max_in_flight, seed=args.seed)
        test = LoadTest(args.url, source, loop, args.batch, args.duration, args.timeout, args.prebuild,
                        tls=security.TLS.from_args(args))
    except (OSError, ValueError) as e:
        parser.error(str(e))
    report = test.run()
    print(summary_line(report), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main(sys.argv[1:])

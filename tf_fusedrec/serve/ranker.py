"""The ranker: predictions over HTTP in TensorFlow Serving's REST shape, the dense model here, rows from embedding
servers (FlexEMR's disaggregated serving, seed 002 §2.4, §3).

    python -m tf_fusedrec.serve.ranker --export EXPORT --servers 127.0.0.1:7001,127.0.0.1:7002 --port 8501
        [--publish-port 8601]

Endpoints (NAME: --name, default "model"):
  POST /v1/models/NAME:predict   {"instances": [{feature: id or [ids], "dense": [...]}, ...]} -> {"predictions": [..]}
                                 or {"inputs": {feature: [per instance], ...}} -> {"outputs": [...]}
  GET  /v1/models/NAME           the model's status (TF Serving's shape)
  GET  /v1/models/NAME/metadata  the inputs the model takes (features: layout, dim, combiner, key dtype)
  GET  /v1/models/NAME/stats     requests, batches, errors, bytes to and from the servers, cache, per-server queues

Versions: a predict answer carries "model_version", the version of the rows and dense weights it was computed from
(the export is 0); GET /v1/models/NAME and /metadata report the current one and its training step. With
--publish-port, a trainer (python -m tf_fusedrec.train --publish-to HOST:PORT) installs new versions there
(tf_fusedrec/serve/publish.py: the endpoint binds to --publish-host, 127.0.0.1 by default, apart from the predict port).

Connections wait in one asyncio event loop (tf_fusedrec/serve/http_server.py), not a thread each. A request's body
is parsed and checked in one of --handler-threads threads (unknown feature, wrong type, negative or out-of-range id,
malformed or too deeply nested JSON: HTTP 400 naming the field), then queued for the batcher, which merges the
requests waiting (up to --max-batch instances: those queued when the model comes free, and with --batch-wait-ms
those arriving within it) into one embedding lookup per group and one call of the dense SavedModel. A server that is
down or saturated answers HTTP 503 naming it; the ranker stays up and uses it again once it is back.

Bounds (each answered with a status naming the flag): the body (--max-body-mb, 413; no Content-Length: 411), the
instances and ids of a request (--max-instances, --max-ids: 413, counted while the body is parsed, so an oversized
request never becomes a large Python structure), queued requests (--max-queue, 503) and open connections
(--max-connections: at the cap the longest idle connection is closed for the new one, else 503). A connection idle
for --idle-timeout-s is closed; a request not received within --read-timeout-s of its first byte gets 408 and its
connection is closed, so slow or idle clients cannot hold the ranker's connections. A malformed request, and every
later request of a connection answered a 4xx, is parsed with Python's thread switch interval at --slow-path-switch-ms,
so that its parse cannot hold the interpreter's lock against the event loop and the others' requests for long
(_ShortSlices), and such requests are served at most --malformed-qps a second (beyond, they wait their turn: a client
sending malformed requests back to back cannot take the core from well-formed ones). Binds to 127.0.0.1 unless --host
says otherwise.

Security (tf_fusedrec/serve/security.py): --tls-cert/--tls-key serve HTTPS on both ports (--tls-client-auth: only to
clients whose certificate chains to --tls-ca); --tls-ca also makes the lookups to the embedding servers TLS, verified
against it (the same certificate presented to servers that require client certificates). --publish-token-file: the
publish port takes only requests carrying the token. A publish port beyond loopback without authentication refuses
to start unless --insecure; either port beyond loopback without TLS logs a warning.
"""

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import operator
import queue
import re
import sys
import threading
import time
from concurrent import futures

import numpy as np
import orjson

from tf_fusedrec.serve import http_server, lifetime, security
from tf_fusedrec.serve.model import FlatIds, InputError, RaggedIds

MB = 1 << 20
_PATH = re.compile(r"^/v1/models/([^/:]+)(?:/versions/\d+)?(:predict|/metadata|/stats)?/?$")
# int64's range: decimal literals of more digits are outside it whatever they hold.
_INT64_DIGITS = 19
# Error messages echo parts of the request; this keeps an answer small whatever the request held.
MAX_ERROR_CHARS = 1000
# Python's thread switch interval while a body the fast parser refused is parsed, and while a connection that was
# answered a 4xx is served (--slow-path-switch-ms).
DEFAULT_SLOW_PATH_SWITCH_S = 2e-5


class _ShortSlices:
    """While any thread is inside it, Python's thread switch interval is at most interval_s (sys.setswitchinterval;
    restored when the last one leaves). A thread that wants the interpreter lock waits for its holder to release it or
    for the interval to pass; the ranker's well-formed requests hand the lock between threads at every read, lookup
    and model call, so each waits behind whatever holds it. Around the reference parser's Python call per value
    (parse_request's path for requests the fast parser refuses: malformed ones) this keeps a client that sends those
    back to back from adding its parse to every hand-off of everyone else's requests; well-formed traffic keeps the
    default interval, as a shorter one throughout costs throughput at saturation."""

    def __init__(self, interval_s):
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._inside = 0
        self._saved = None

    def __enter__(self):
        with self._lock:
            if self._inside == 0:
                self._saved = sys.getswitchinterval()
                if 0 < self.interval_s < self._saved:
                    sys.setswitchinterval(self.interval_s)
            self._inside += 1

    def __exit__(self, *exc):
        with self._lock:
            self._inside -= 1
            if self._inside == 0:
                sys.setswitchinterval(self._saved)


class Overloaded(RuntimeError):
    """The ranker's request queue is full."""


class TooLarge(InputError):
    """A request beyond one of the ranker's size limits (HTTP 413); the message names the flag."""


class _OutOfInt64(float):
    """An integer literal outside int64, parsed as its float value: a dense input may take it, an id may not (ids must
    be ints), and the message that rejects it shows this repr, which says why."""

    def __new__(cls, text):
        self = super().__new__(cls, float(text))  # inf beyond float's range, never an error
        self.text = text
        return self

    def __repr__(self):
        digits = len(self.text.lstrip("-"))
        shown = self.text if digits <= 30 else f"an integer literal of {digits} digits"
        return f"{shown} (outside int64: ids must be in [0, 2**63))"


class _IdCounter:
    """json.loads' parse_int: counts the integer literals of a body, stopping the parse at the limit, and keeps those
    outside int64 from becoming (arbitrarily large) Python ints."""

    def __init__(self, max_ids):
        self.max_ids, self.count = max_ids, 0

    def __call__(self, text):
        self.count += 1
        if self.count > self.max_ids:
            raise TooLarge(f"the request holds more than {self.max_ids} ids (--max-ids)")
        digits = len(text) - (text[0] == "-")
        if digits < _INT64_DIGITS:
            return int(text)
        if digits == _INT64_DIGITS and -(1 << 63) <= int(text) < (1 << 63):
            return int(text)
        return _OutOfInt64(text)


def _check_value_count(body, max_instances, max_ids, values_per_instance):
    """The body as bytes; TooLarge when it holds more JSON values (counted by their separators) than the limits
    allow."""
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogatepass")
    values = body.count(b",") + body.count(b"[") + body.count(b"{")  # every JSON value but the first follows one
    allowed = max_ids + max_instances * values_per_instance + 64
    if values > allowed:
        raise TooLarge(f"the request holds about {values} JSON values, more than --max-ids ({max_ids} ids) and "
                       f"--max-instances ({max_instances} instances of up to {values_per_instance} other values) "
                       f"allow")
    return body


def parse_body(body, max_instances, max_ids=1 << 18, values_per_instance=64):
    """A predict request's JSON body (bytes) -> (columnar inputs {name: [value per instance]}, "instances" or "inputs").

    InputError naming what is wrong (TF Serving's two request shapes: row "instances" or columnar "inputs"); TooLarge
    (an InputError) naming the flag beyond --max-instances or --max-ids. Sizes are checked before and while the body is
    parsed: a body with more JSON values (counted by their separators, before parsing) than max_ids and max_instances
    instances of values_per_instance other values each allow is refused unparsed, and the parse stops at the
    (max_ids + 1)-th integer.
    """
    body = _check_value_count(body, max_instances, max_ids, values_per_instance)
    try:
        request = json.loads(body, parse_int=_IdCounter(max_ids))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise InputError("the request body nests JSON arrays or objects too deeply") from None
    if not isinstance(request, dict) or len({"instances", "inputs"} & set(request)) != 1:
        raise InputError('the request must be a JSON object with exactly one of "instances" or "inputs"')
    if "instances" in request:
        instances = request["instances"]
        if not isinstance(instances, list) or not instances:
            raise InputError('"instances" must be a non-empty list of objects (one per instance)')
        if len(instances) > max_instances:
            raise TooLarge(f'"instances" holds {len(instances)} instances, at most {max_instances} are accepted '
                           f'(--max-instances)')
        names = None
        for i, instance in enumerate(instances):
            if not isinstance(instance, dict):
                raise InputError(f"instance {i} must be an object of input name -> value, got {type(instance).__name__}")
            if names is None:
                names = set(instance)
            elif set(instance) != names:
                missing = sorted(names ^ set(instance))[0]
                raise InputError(f"instance {i}: feature '{missing}' is given in some instances but not all")
        return {name: [instance[name] for instance in instances] for name in names}, "instances"
    inputs = request["inputs"]
    if not isinstance(inputs, dict) or not inputs:
        raise InputError('"inputs" must be a non-empty object of input name -> values (one per instance)')
    for name, values in inputs.items():
        if not isinstance(values, list):
            raise InputError(f"input '{name}': must be a list with one value per instance")
        if len(values) > max_instances:
            raise TooLarge(f"input '{name}': {len(values)} instances, at most {max_instances} are accepted "
                           f"(--max-instances)")
    return inputs, "inputs"


def _id_column(values):
    """One id feature's values in a request (an id or a list of ids per instance) -> int64 [B] or RaggedIds (a bare id
    counts as a list of one, as model.flatten_ids reads it); None unless every id is an int in int64 and every value
    an id or a flat list of them."""
    types = set(map(type, values))
    try:
        if types == {int}:
            return np.array(values, np.int64)
        if not types <= {int, list}:
            return None
        rows = values if types == {list} else [v if type(v) is list else [v] for v in values]
        ids = list(itertools.chain.from_iterable(rows))
        if not set(map(type, ids)) <= {int}:
            return None
        return RaggedIds(np.array(ids, np.int64), np.fromiter(map(len, rows), np.int64, len(rows)))
    except OverflowError:  # an int outside int64
        return None


def _dense_ints(values):
    """How many integer literals one dense input's values (a flat list of numbers per instance) hold; None unless each
    value is such a list of ints in int64 and floats below 2**63 in magnitude (orjson reads an integer literal outside
    int64 as a float, which the reference parser counts as an id)."""
    if set(map(type, values)) != {list}:
        return None
    numbers = list(itertools.chain.from_iterable(values))
    types = set(map(type, numbers))
    if not types <= {float, int} or (numbers and max(map(abs, numbers)) >= 1 << 63):
        return None
    return sum(type(x) is int for x in numbers) if int in types else 0


def parse_arrays(body, id_names, dense_names, max_instances, max_ids):
    """A well-formed predict request's JSON body (bytes) -> (columnar inputs, "instances" or "inputs") as parse_body
    gives them, but each id feature's ids as NumPy arrays (int64 [B] or RaggedIds): orjson parses the body in C and
    the ids are checked and converted per feature, without a Python call per id.

    None when the body is anything else (not JSON orjson reads, another structure, names or value types, an id outside
    int64, more ids than max_ids or instances than max_instances): parse_body then finds, and names, what is wrong.
    Whenever this answers, parse_body answers the same columns (tests/serve/test_parse.py compares them).
    """
    try:
        request = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(request) is not dict or len(request) != 1:
        return None
    names = set(id_names) | set(dense_names)
    if "instances" in request:
        instances, shape = request["instances"], "instances"
        if type(instances) is not list or not 0 < len(instances) <= max_instances:
            return None
        for instance in instances:
            if type(instance) is not dict or instance.keys() != names:
                return None
        # The instances' values by name, transposed in C (itemgetter, zip) rather than a Python loop per value.
        order = sorted(names)
        if len(order) == 1:
            columns = {order[0]: [instance[order[0]] for instance in instances]}
        else:
            columns = dict(zip(order, map(list, zip(*map(operator.itemgetter(*order), instances)))))
    elif "inputs" in request:
        columns, shape = request["inputs"], "inputs"
        if type(columns) is not dict or columns.keys() != names:
            return None
        for values in columns.values():
            if type(values) is not list or not 0 < len(values) <= max_instances:
                return None
    else:
        return None
    count = 0
    for name in dense_names:
        ints = _dense_ints(columns[name])
        if ints is None:
            return None
        count += ints
    for name in id_names:
        ids = _id_column(columns[name])
        if ids is None:
            return None
        columns[name] = ids
        count += len(ids.values) if isinstance(ids, RaggedIds) else len(ids)
    if count > max_ids:
        return None
    return columns, shape


def parse_request(body, id_names, dense_names, max_instances, max_ids=1 << 18, values_per_instance=64,
                  slow_path=contextlib.nullcontext()):
    """A predict request's JSON body -> (columnar inputs, "instances" or "inputs"): a well-formed body through
    parse_arrays (ids as arrays), any other through parse_body, whose answer or error (InputError, TooLarge) is the
    reference, inside the context manager slow_path."""
    body = _check_value_count(body, max_instances, max_ids, values_per_instance)
    parsed = parse_arrays(body, id_names, dense_names, max_instances, max_ids)
    if parsed is not None:
        return parsed
    with slow_path:
        return parse_body(body, max_instances, max_ids, values_per_instance)


def _values_per_instance(model):
    """JSON values one instance of a well-formed request holds besides its ids: a key and a list per feature, and a
    key, its lists and its values per dense input (with room to spare: the bound only refuses absurd bodies)."""
    dense = 0
    for spec in model.dense_inputs.values():
        inner = [int(d) for d in spec["shape"][1:]]
        dense += 2 + math.prod(inner) + math.prod(inner[:-1])
    return 2 * (2 + 2 * len(model.features) + dense)


def merge(parts):
    """One batch of several requests' (flats, dense, batch) -> (flats, dense, batch)."""
    if len(parts) == 1:
        return parts[0]
    flats = {}
    for name in parts[0][0]:
        ids, rows_of, positions, lengths = [], [], [], []
        row_offset = position_offset = 0
        for part_flats, _, batch in parts:
            flat = part_flats[name]
            ids.append(flat.ids)
            rows_of.append(flat.rows_of + row_offset)
            positions.append(flat.positions + position_offset)
            lengths.append(flat.lengths)
            row_offset += batch
            position_offset += int(flat.lengths.sum())
        flats[name] = FlatIds(np.concatenate(ids), np.concatenate(rows_of), np.concatenate(positions), row_offset,
                              np.concatenate(lengths))
    dense = {name: np.concatenate([p[1][name] for p in parts]) for name in parts[0][1]}
    return flats, dense, sum(p[2] for p in parts)


class Ranker:
    """The dense model and its batcher over a backend of rows.

    Args:
      model: a serve.model.ServingModel.
      cache: the serve.cache.AdaptiveCache in front of the backend, or None (told each request's batch size).
      max_batch: most instances merged into one model call.
      batch_wait_s: how long the batcher waits for more requests once one is queued (0: none; it takes what is
        queued when the model is free, and requests that arrive while a batch runs form the next one).
      max_queue: most requests waiting for the batcher; beyond, Overloaded (HTTP 503).
      max_instances: most instances in one request (beyond: TooLarge, HTTP 413).
      max_ids: most ids (integer literals) in one request body, counted while it is parsed (beyond: TooLarge).
      answer_timeout_s: how long a request waits for the batcher's answer (beyond: HTTP 503).
      slow_path_switch_s: Python's thread switch interval while a body the fast parser refused is parsed (parse's
        reference path) and while the handler serves a connection that was answered a 4xx (0: Python's own; never
        longer than Python's own), see _ShortSlices.
    """

    def __init__(self, model, cache=None, max_batch=1024, batch_wait_s=0.0, max_queue=256, max_instances=4096,
                 max_ids=1 << 18, answer_timeout_s=30.0, slow_path_switch_s=DEFAULT_SLOW_PATH_SWITCH_S):
        self.model, self.cache = model, cache
        self.short_slices = _ShortSlices(slow_path_switch_s)
        self.max_batch, self.batch_wait_s, self.max_instances = max_batch, batch_wait_s, max_instances
        self.max_ids, self.answer_timeout_s = max_ids, answer_timeout_s
        self.values_per_instance = _values_per_instance(model)
        self._id_names, self._dense_names = list(model.features), list(model.dense_inputs)
        self._queue = queue.Queue(maxsize=max_queue)
        self._lock = threading.Lock()
        self._counts = {"requests": 0, "instances": 0, "batches": 0, "batched_instances": 0, "errors_400": 0,
                        "errors_408": 0, "errors_411": 0, "errors_413": 0, "errors_503": 0, "errors_500": 0,
                        "idle_closed": 0, "malformed_waits": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._batch_loop, name="ranker_batcher", daemon=True)
        self._thread.start()

    def count(self, key, n=1):
        with self._lock:
            self._counts[key] += n

    def parse(self, body):
        """A predict request's body (bytes) -> (columnar inputs, "instances" or "inputs"); InputError or TooLarge.

        A well-formed body is parsed straight into arrays (parse_arrays); any other goes through parse_body, whose
        answer and errors are the reference, in short thread slices (slow_path_switch_s)."""
        return parse_request(body, self._id_names, self._dense_names, self.max_instances, self.max_ids,
                             self.values_per_instance, slow_path=self.short_slices)

    def parse_fast(self, body):
        """parse's answer for a well-formed body (parse_arrays), None for any other (parse_slow names its problem);
        TooLarge for a body of more JSON values than the limits allow."""
        body = _check_value_count(body, self.max_instances, self.max_ids, self.values_per_instance)
        return parse_arrays(body, self._id_names, self._dense_names, self.max_instances, self.max_ids)

    def parse_slow(self, body):
        """parse's answer or error for a body parse_fast refused: parse_body's, in short thread slices."""
        with self.short_slices:
            return parse_body(body, self.max_instances, self.max_ids, self.values_per_instance)

    def prepare(self, inputs):
        """Checks a request's columnar inputs -> (flats, dense, batch); InputError naming the field."""
        flats, batch = self.model.flatten(inputs, allow_padding=False)
        dense = {name: self.model._dense_value(name, inputs[name], batch)  # noqa: SLF001
                 for name in self.model.dense_inputs}
        return flats, dense, batch

    def predict(self, inputs):
        """Scores (list of float) of a request's columnar inputs, through the batcher."""
        return self.submit(self.prepare(inputs))

    def submit(self, prepared):
        """Scores (list of float) of a prepared request (prepare's answer), through the batcher; Overloaded when the
        queue is full, TimeoutError when no answer came within answer_timeout_s."""
        return self.submit_versioned(prepared)[0]

    def submit_versioned(self, prepared):
        """(scores, version) of a prepared request: submit's scores and the model version they were computed at."""
        return self.enqueue(prepared).result(timeout=self.answer_timeout_s)

    def enqueue(self, prepared):
        """A prepared request queued for the batcher -> a concurrent.futures.Future of (scores, version); Overloaded
        when the queue is full. Cancelling the future (a client gone, a timeout) drops the answer, not the batch."""
        flats, dense, batch = prepared
        if self.cache is not None:
            self.cache.observe(batch)
        done = futures.Future()
        try:
            self._queue.put_nowait((flats, dense, batch, done))
        except queue.Full:
            raise Overloaded(f"the ranker is overloaded: {self._queue.maxsize} requests are already waiting "
                             f"(--max-queue)") from None
        self.count("requests")
        self.count("instances", batch)
        return done

    def _batch_loop(self):
        while not self._stop.is_set():
            try:
                first = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            taken, size = [first], first[2]
            deadline = time.monotonic() + self.batch_wait_s
            while size < self.max_batch:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                taken.append(item)
                size += item[2]
            self._run(taken)

    def _run(self, taken):
        try:
            flats, dense, batch = merge([t[:3] for t in taken])
            scores, version = self.model.predict_versioned(flats, dense, batch)
        except BaseException as e:  # noqa: BLE001  (every waiting request gets the error; the batcher goes on)
            for item in taken:
                with contextlib.suppress(futures.InvalidStateError):  # cancelled by its waiter
                    item[3].set_exception(e)
            return
        self.count("batches")
        self.count("batched_instances", batch)
        offset = 0
        for item in taken:
            with contextlib.suppress(futures.InvalidStateError):  # cancelled by its waiter
                item[3].set_result((scores[offset:offset + item[2]].tolist(), version))
            offset += item[2]

    def stats(self):
        with self._lock:
            counts = dict(self._counts)
        backend = self.model.stats()  # a CachedBackend's stats are its inner backend's plus "cache"
        servers = backend.get("servers", {})
        return {
            **counts,
            "mean_batch": counts["batched_instances"] / counts["batches"] if counts["batches"] else None,
            "queue_depth": self._queue.qsize(),
            "pooling": self.model.pooling,
            "bytes_to_servers": backend.get("bytes_sent"),
            "bytes_from_servers": backend.get("bytes_received"),
            "cache": backend.get("cache", {"hits": 0, "misses": 0, "hit_rate": None, "entries": 0, "bytes": 0,
                                          "capacity_bytes": 0}),
            "servers": {address: {k: s.get(k) for k in ("up", "requests", "errors", "inflight", "queue_depth",
                                                        "max_queue_depth", "credits", "bytes_sent", "bytes_received")}
                        for address, s in servers.items()},
        }

    def close(self):
        self._stop.set()
        self._thread.join(timeout=2.0)
        self.model.close()


class _RateGate:
    """At most `rate` admissions a second (a token bucket holding up to rate / 20 + 1), awaited in the event loop in
    the order asked; rate 0: no limit."""

    def __init__(self, rate):
        self.rate = rate
        self.burst = rate / 20 + 1
        self._tokens, self._last, self._lock = self.burst, None, None

    async def admit(self):
        """Waits for a turn -> whether it had to wait."""
        if self.rate <= 0:
            return False
        loop = asyncio.get_running_loop()
        if self._lock is None:
            self._lock, self._last = asyncio.Lock(), loop.time()
        async with self._lock:
            self._refill(loop.time())
            waited = self._tokens < 1
            if waited:
                await asyncio.sleep((1 - self._tokens) / self.rate)
                self._refill(loop.time())
            self._tokens = max(0.0, self._tokens - 1)
            return waited

    def _refill(self, now):
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now


class RankerApp:
    """The ranker's HTTP endpoints (the module's docstring), the application of an http_server.AsyncHTTPServer.

    The event loop reads requests and writes answers; a predict request's body is parsed and checked in one of
    `handler_threads` threads (so that a large or malformed body never holds the loop), its rows and scores come from
    the Ranker's batcher, whose answer the loop awaits. A connection that was answered a 4xx has its later requests
    parsed in short thread slices (Ranker.short_slices), as a body the fast parser refuses is.

    Malformed traffic is served at a bounded rate: the requests of a connection that was answered a 4xx, and a body
    the fast parser refuses (before the reference parser names its problem), pass a gate of `malformed_qps` a second
    (0: no gate) in the event loop; beyond it they wait their turn, holding no thread. So a client sending malformed
    requests back to back gets its 4xx answers at that rate, and cannot take the ranker's core (and its interpreter's
    lock) from the well-formed requests, which never pass the gate.
    """

    _COUNTED = ("errors_400", "errors_408", "errors_411", "errors_413", "errors_503", "errors_500", "idle_closed")

    def __init__(self, ranker, name, handler_threads=4, malformed_qps=100.0):
        self.ranker, self.name = ranker, name
        self._pool = futures.ThreadPoolExecutor(handler_threads, thread_name_prefix="ranker_parse")
        self._malformed_gate = _RateGate(malformed_qps)

    def event(self, name):
        # Every other error status (414, 417, 431, 501, 505: malformed requests) counts as a 400.
        self.ranker.count(name if name in self._COUNTED else "errors_400")

    def close(self):
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def handle(self, request):
        name = self.name
        match = _PATH.match(request.target.split("?", 1)[0])
        if match is None:
            return 404, {"error": f"no such endpoint: {request.target[:200]} (try /v1/models/{name}:predict)"}
        if match.group(1) != name:
            return 404, {"error": f"no model named '{match.group(1)[:200]}' (this ranker serves '{name}')"}
        what = match.group(2) or ""
        if request.method == "GET":
            return self._get(what)
        if what != ":predict":
            return 405, {"error": f"POST is for /v1/models/{name}:predict"}
        ranker, loop = self.ranker, asyncio.get_running_loop()
        try:
            if request.suspect:
                await self._pass_gate()
            prepared = await loop.run_in_executor(self._pool, self._prepare, request.body, request.suspect)
            if prepared is None:  # a clean connection's body the fast parser refused: named by the reference parser
                await self._pass_gate()
                prepared = await loop.run_in_executor(self._pool, self._prepare_refused, request.body)
            prepared, shape = prepared
            scores, version = await asyncio.wait_for(asyncio.wrap_future(ranker.enqueue(prepared)),
                                                     ranker.answer_timeout_s)
        except TooLarge as e:
            raise http_server.HTTPError(413, str(e)) from None
        except InputError as e:
            raise http_server.HTTPError(400, str(e)) from None
        except RecursionError:  # a check of deeply nested values (json.loads' own is an InputError)
            raise http_server.HTTPError(400, "the request nests JSON arrays or objects too deeply") from None
        except Overloaded as e:
            raise http_server.HTTPError(503, str(e)) from None
        except TimeoutError:
            raise http_server.HTTPError(
                503, f"the ranker is overloaded: no answer within {ranker.answer_timeout_s:g} s") from None
        except RuntimeError as e:  # an embedding server down or saturated (client.RemoteError names it)
            raise http_server.HTTPError(503, str(e)) from None
        except Exception as e:  # noqa: BLE001  (the ranker answers and stays up)
            raise http_server.HTTPError(500, f"{type(e).__name__}: {e}") from None
        return 200, {"predictions" if shape == "instances" else "outputs": scores, "model_version": str(version)}

    async def _pass_gate(self):
        if await self._malformed_gate.admit():
            self.ranker.count("malformed_waits")

    def _prepare(self, body, suspect):
        """(prepared request, its shape) from a predict body, in a handler thread; None when the fast parser refuses
        the body of a clean connection (_prepare_refused then names the problem). A suspect connection's request runs
        in short thread slices, through the reference parser if the fast one refuses it."""
        with self.ranker.short_slices if suspect else contextlib.nullcontext():
            parsed = self.ranker.parse_fast(body)
            if parsed is None:
                if not suspect:
                    return None
                parsed = self.ranker.parse_slow(body)
            del body
            inputs, shape = parsed
            return self.ranker.prepare(inputs), shape

    def _prepare_refused(self, body):
        inputs, shape = self.ranker.parse_slow(body)
        del body
        return self.ranker.prepare(inputs), shape

    def _get(self, what):
        ranker, name = self.ranker, self.name
        if what == ":predict":
            return 405, {"error": "predict takes POST"}
        if what == "/stats":
            return 200, ranker.stats()
        if what == "/metadata":
            features = {f["name"]: {k: f[k] for k in ("layout", "dim", "combiner", "key_dtype", "max_id_bits")}
                        for f in ranker.model.manifest["features"]}
            return 200, {"model_spec": {"name": name, "version": str(ranker.model.version), "step": ranker.model.step},
                         "features": features, "dense_inputs": ranker.model.dense_inputs}
        return 200, {"model_version_status": [{"version": str(ranker.model.version), "state": "AVAILABLE",
                                               "status": {"error_code": "OK", "error_message": ""}}]}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m tf_fusedrec.serve.ranker",
                                description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--export", required=True, help="the export (python -m tf_fusedrec.export)")
    p.add_argument("--servers", required=True,
                   help="embedding servers host:port,...: server i holds routing range i of n (even ranges); "
                        "'local' holds every row in this process instead")
    p.add_argument("--port", type=int, required=True, help="the port of the REST API (TensorFlow Serving's: 8501)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    p.add_argument("--name", default="model", help="the model's name in /v1/models/NAME")
    p.add_argument("--no-pooling", action="store_true", help="fetch multi-hot rows instead of pooling on the servers")
    p.add_argument("--cache-mb", type=float, default=64.0, help="the row cache's budget (0: no cache)")
    p.add_argument("--no-packed-signature", action="store_true",
                   help="call the dense SavedModel input by input, not through its packed signature (same scores)")
    p.add_argument("--cache-policy", choices=["lru", "lfu"], default="lru",
                   help="which cached rows go first when the cache is full or shrinks: least recently or least "
                        "frequently read")
    p.add_argument("--cache-high-load", type=float, default=256.0,
                   help="mean instances per request (over the last 64) above which the cache shrinks")
    p.add_argument("--cache-low-load", type=float, default=64.0,
                   help="mean instances per request (over the last 64) below which the cache grows back, up to "
                        "--cache-mb")
    p.add_argument("--max-batch", type=int, default=1024, help="most instances in one model call")
    p.add_argument("--batch-wait-ms", type=float, default=0.0,
                   help="how long a batch waits for more requests (default 0: it takes what is queued when the model "
                        "is free; requests arriving while a batch runs form the next; benchmarks/results/serve/batch_wait_ab.json)")
    p.add_argument("--max-queue", type=int, default=256, help="most requests waiting; beyond, HTTP 503")
    p.add_argument("--max-instances", type=int, default=4096, help="most instances in one request; beyond, HTTP 413")
    p.add_argument("--max-ids", type=int, default=1 << 18,
                   help="most ids (integers) in one request, counted while it is parsed; beyond, HTTP 413")
    p.add_argument("--max-body-mb", type=float, default=16.0, help="largest request body; beyond, HTTP 413")
    p.add_argument("--max-connections", type=int, default=64,
                   help="most open connections; beyond, the longest idle one is closed, else HTTP 503")
    p.add_argument("--idle-timeout-s", type=float, default=30.0,
                   help="a connection waiting longer for its next request is closed")
    p.add_argument("--read-timeout-s", type=float, default=30.0,
                   help="a request not received this long after its first byte gets HTTP 408 (and an answer not "
                        "taken within it drops the connection)")
    p.add_argument("--io-threads", type=int, default=8, help="threads sending lookups to the servers")
    p.add_argument("--handler-threads", type=int, default=4,
                   help="threads parsing and checking request bodies (connections wait in one event loop)")
    p.add_argument("--malformed-qps", type=float, default=100.0,
                   help="malformed requests served a second at most (bodies the fast parser refuses, and the requests "
                        "of connections answered a 4xx); beyond, they wait their turn (0: no limit)")
    p.add_argument("--slow-path-switch-ms", type=float, default=DEFAULT_SLOW_PATH_SWITCH_S * 1000,
                   help="Python's thread switch interval while a body the fast parser refuses (a malformed one) is "
                        "parsed and while a connection that was answered a 4xx is served, so that a client sending "
                        "those does not delay the others' requests (0: Python's own, 5 ms)")
    p.add_argument("--timeout-s", type=float, default=5.0, help="a lookup's deadline (credit wait included)")
    p.add_argument("--publish-port", type=int,
                   help="take published versions (rows on the servers, dense weights here) from a trainer on this "
                        "port (python -m tf_fusedrec.train --publish-to HOST:PORT); needs --servers other than local")
    p.add_argument("--publish-host", default="127.0.0.1",
                   help="interface of --publish-port (default: loopback only; beyond it the port needs "
                        "--publish-token-file or --tls-client-auth, or --insecure)")
    p.add_argument("--max-publish-mb", type=float, default=256.0, help="largest published dense body")
    p.add_argument("--catch-up", metavar="LOG",
                   help="a trainer's publish log (python -m tf_fusedrec.train --publish-log): start at its newest "
                        "version (the embedding servers must hold it: start them with --catch-up LOG too)")
    security.add_tls_flags(p)
    security.add_publish_auth_flags(p)
    args = p.parse_args(argv)
    if (args.publish_port is not None or args.catch_up) and args.servers == "local":
        p.error("--publish-port and --catch-up need embedding servers (--servers host:port,...): published rows go to "
                "them")
    for flag in ("max_batch", "max_queue", "max_instances", "max_ids", "io_threads", "handler_threads",
                 "max_connections"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1")
    for flag in ("max_body_mb", "timeout_s", "idle_timeout_s", "read_timeout_s"):
        if not getattr(args, flag) > 0:
            p.error(f"--{flag.replace('_', '-')} must be > 0")
    if args.cache_mb < 0 or args.batch_wait_ms < 0 or args.slow_path_switch_ms < 0 or args.malformed_qps < 0:
        p.error("--cache-mb, --batch-wait-ms, --slow-path-switch-ms, --malformed-qps must be >= 0")
    return args


def build(args):
    """(Ranker, name) from the parsed flags."""
    from tf_fusedrec.export import format as fmt  # noqa: PLC0415
    from tf_fusedrec.serve import cache as cache_lib  # noqa: PLC0415
    from tf_fusedrec.serve import publish  # noqa: PLC0415
    from tf_fusedrec.serve.backend import LocalBackend  # noqa: PLC0415
    from tf_fusedrec.serve.client import RemoteBackend  # noqa: PLC0415
    from tf_fusedrec.serve.model import ServingModel  # noqa: PLC0415

    manifest = fmt.read_manifest(args.export)
    pooling = not args.no_pooling
    if args.servers == "local":
        backend = LocalBackend(args.export, manifest)
    else:
        servers = [s.strip() for s in args.servers.split(",") if s.strip()]
        backend = RemoteBackend(manifest, servers, pooling=pooling, io_threads=args.io_threads,
                                timeout_s=args.timeout_s, tls=security.TLS.from_args(args))
    cache = None
    if args.cache_mb > 0:
        cache = cache_lib.AdaptiveCache(int(args.cache_mb * MB), policy=args.cache_policy,
                                        high_load=args.cache_high_load, low_load=args.cache_low_load)
        backend = cache_lib.CachedBackend(backend, cache)
    model = ServingModel(args.export, backend=backend, pooling=pooling, packed=not args.no_packed_signature)
    if getattr(args, "catch_up", None):
        newest = publish.log_dense(args.catch_up)
        if newest is not None:
            model.install_version(*newest)
    if args.servers != "local":
        # Lookups name the ranker's version: servers a trainer published to since would refuse every one.
        publisher = publish.Publisher(publish.routing_table(backend), timeout_s=args.timeout_s,
                                      tls=security.TLS.from_args(args))
        try:
            lacking = publisher.lacking(model.version)
        finally:
            publisher.close()
        if lacking:
            model.close()
            raise ValueError(f"the embedding servers {sorted(lacking)} do not hold version {model.version}, which this "
                             f"ranker starts at (they hold {sorted(set(v for h in lacking.values() for v in h))}): "
                             f"start it with --catch-up LOG (the trainer's --publish-log), or the servers anew")
    return Ranker(model, cache, max_batch=args.max_batch, batch_wait_s=args.batch_wait_ms / 1000,
                  max_queue=args.max_queue, max_instances=args.max_instances, max_ids=args.max_ids,
                  slow_path_switch_s=args.slow_path_switch_ms / 1000)


def make_server(ranker, args):
    """The HTTP server of a Ranker from the parsed flags (bound, not yet serving: serve_forever); HTTPS with
    --tls-cert."""
    tls = security.TLS.from_args(args)
    tls = tls if tls is not None and tls.serves else None
    security.refuse_unsafe_start("ranker", args.host, False, None, tls)
    app = RankerApp(ranker, args.name, handler_threads=args.handler_threads, malformed_qps=args.malformed_qps)
    return http_server.AsyncHTTPServer(
        (args.host, args.port), app,
        max_connections=args.max_connections, idle_timeout_s=args.idle_timeout_s, read_timeout_s=args.read_timeout_s,
        max_body_bytes=int(args.max_body_mb * MB), name="tf_fusedrec-ranker", max_error_chars=MAX_ERROR_CHARS,
        ssl_context=tls.server_context() if tls is not None else None)


def main(argv=None):
    import signal  # noqa: PLC0415

    args = parse_args(argv)
    lifetime.exit_with_parent()  # before TensorFlow builds the model: a SIGTERM until the handler below just ends it
    security.log_to_stderr()
    ranker = None
    try:
        tls = security.TLS.from_args(args)
        token = security.read_token(args.publish_token_file) if args.publish_token_file else None
        if args.publish_port is not None:  # a publish port that must not open says so before the model loads
            security.check_publish_exposure(
                "ranker publish endpoint", args.publish_host,
                security.PublishGuard(token, tls is not None and tls.serves and tls.client_auth, args.insecure))
        ranker = build(args)
        server = make_server(ranker, args)
    except (ValueError, OSError) as e:
        if ranker is not None:
            ranker.close()
        print(f"ranker: {e}", file=sys.stderr, flush=True)
        return 2
    publish_server = None
    if args.publish_port is not None:
        from tf_fusedrec.serve import publish  # noqa: PLC0415

        try:
            publish_server = publish.serve_publish(ranker.model, args.publish_host, args.publish_port,
                                                   args.max_publish_mb, tls=tls, token=token, insecure=args.insecure)
        except (OSError, ValueError) as e:
            print(f"ranker: --publish-port {args.publish_port}: {e}", file=sys.stderr, flush=True)
            return 2
        print(f"ranker: taking published versions on {'https' if tls is not None and tls.serves else 'http'}://"
              f"{args.publish_host}:"
              f"{publish_server.server_address[1]}/publish", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda signum, frame: threading.Thread(target=server.shutdown).start())
    try:  # whatever ends this (a print to a closed pipe too) closes the servers and the ranker's threads
        print(f"ranker: serving '{args.name}' of {args.export} on "
              f"{'https' if tls is not None and tls.serves else 'http'}://{args.host}:{server.server_address[1]} "
              f"(servers: {args.servers}; pooling {'on' if not args.no_pooling else 'off'}; cache "
              f"{f'{args.cache_mb:g} MiB {args.cache_policy}' if args.cache_mb else 'off'})", file=sys.stderr,
              flush=True)
        print("ready", flush=True)
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if publish_server is not None:
            publish_server.shutdown()
            publish_server.server_close()
        ranker.close()
    print("ranker: stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

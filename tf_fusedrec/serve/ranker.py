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

A request is checked in its own handler thread (unknown feature, wrong type, negative or out-of-range id, malformed
or too deeply nested JSON: HTTP 400 naming the field), then queued for the batcher, which merges the requests waiting
(up to --max-batch instances: those queued when the model comes free, and with --batch-wait-ms those arriving within
it) into one embedding lookup per group and one call of the dense SavedModel. A server that is down or saturated
answers HTTP 503 naming it; the ranker stays up and uses it again once it is back.

Bounds (each answered with a status naming the flag): the body (--max-body-mb, 413; no Content-Length: 411), the
instances and ids of a request (--max-instances, --max-ids: 413, counted while the body is parsed, so an oversized
request never becomes a large Python structure), queued requests (--max-queue, 503) and open connections
(--max-connections: at the cap the longest idle connection is closed for the new one, else 503). A connection idle
for --idle-timeout-s is closed; a request not received within --read-timeout-s of its first byte gets 408 and its
connection is closed, so slow or idle clients cannot hold the ranker's threads. A malformed request, and every later
request of a connection answered a 4xx, is served with Python's thread switch interval at --slow-path-switch-ms, so
that its parse cannot hold the interpreter's lock against the others' requests for long (_ShortSlices). Binds to
127.0.0.1 unless --host says otherwise.
"""

import argparse
import contextlib
import io
import itertools
import json
import math
import operator
import queue
import re
import socket
import sys
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import orjson

from tf_fusedrec.serve import lifetime
from tf_fusedrec.serve.model import FlatIds, InputError, RaggedIds

MB = 1 << 20
_PATH = re.compile(r"^/v1/models/([^/:]+)(?:/versions/\d+)?(:predict|/metadata|/stats)?/?$")
# int64's range: decimal literals of more digits are outside it whatever they hold.
_INT64_DIGITS = 19
# Error messages echo parts of the request; this keeps an answer small whatever the request held.
MAX_ERROR_CHARS = 1000
# How long a new connection at the --max-connections cap waits for the idle connection it closed to free its slot.
_EVICTION_WAIT_S = 1.0
# How long a connection refused before its body was read goes on reading (and dropping) what the client still sends:
# closing a socket with unread bytes resets the connection, and the client could lose the answer that says why.
_LINGER_S = 1.0
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
                        "idle_closed": 0}
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
        return done.result(timeout=self.answer_timeout_s)

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
                item[3].set_exception(e)
            return
        self.count("batches")
        self.count("batched_instances", batch)
        offset = 0
        for item in taken:
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


class _Late(Exception):  # noqa: N818  (not an error of the ranker's: a client's deadline passed)
    """A connection's deadline passed: idle too long (started False), or a request not received in time."""

    def __init__(self, started):
        super().__init__()
        self.started = started


class _ConnectionReader(io.RawIOBase):
    """A connection's bytes, every read bounded by the time left to the connection's deadline: idle_timeout_s from
    when the ranker waits for a request, read_timeout_s from the request's first byte. A socket timeout alone bounds
    one recv, so a client sending a byte at a time would hold its thread forever."""

    def __init__(self, sock):
        super().__init__()
        self._sock = sock
        self._lock = threading.Lock()
        self._deadline = math.inf
        self._read_timeout_s = math.inf
        self.idle_since = None  # monotonic time the connection began to wait for a request; None while one arrives
        self.evicted = False

    def readable(self):
        return True

    def await_request(self, idle_timeout_s, read_timeout_s):
        with self._lock:
            self.idle_since = time.monotonic()
            self._deadline = self.idle_since + idle_timeout_s
            self._read_timeout_s = read_timeout_s

    def readinto(self, buffer):
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise _Late(self.idle_since is None)
        self._sock.settimeout(remaining)
        try:
            n = self._sock.recv_into(buffer)
        except TimeoutError:
            raise _Late(self.idle_since is None) from None
        with self._lock:
            if self.evicted:
                return 0  # closed for another connection while this read waited
            if n and self.idle_since is not None:
                self.idle_since = None
                self._deadline = time.monotonic() + self._read_timeout_s
        return n

    def begin_request(self):
        """A request line was read (perhaps from bytes already buffered): the connection is busy, not idle."""
        with self._lock:
            if self.idle_since is not None:
                self.idle_since = None
                self._deadline = time.monotonic() + self._read_timeout_s

    def evict(self):
        """Closes the connection if it is idle (between requests); -> whether it was."""
        with self._lock:
            if self.idle_since is None or self.evicted:
                return False
            self.evicted = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes its thread's recv, which then sees the end of the stream
        except OSError:
            pass
        return True


class BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` at once, so a flood of connections cannot start threads
    without bound. At the cap a new connection takes the slot of the longest idle one (closed: idle keep-alive
    connections may be closed at any time in HTTP/1.1); when none is idle it is answered HTTP 503 and closed. The
    handler (make_handler's) registers each connection's _ConnectionReader here."""

    daemon_threads = True
    # The listen backlog (socketserver's default is 5): a burst of connections beyond it may be reset by the kernel
    # before the cap above can answer them.
    request_queue_size = 128

    def __init__(self, address, handler, max_connections=64):
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._readers = set()
        self._readers_lock = threading.Lock()
        self.max_connections = max_connections
        self.refused = self.evicted = 0

    def register(self, reader):
        with self._readers_lock:
            self._readers.add(reader)

    def unregister(self, reader):
        with self._readers_lock:
            self._readers.discard(reader)

    def _evict_idle(self):
        with self._readers_lock:
            idle = sorted((r for r in self._readers if r.idle_since is not None), key=lambda r: r.idle_since)
        for reader in idle:
            if reader.evict():
                self.evicted += 1
                return True
        return False

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False) and not (
                self._evict_idle() and self._slots.acquire(timeout=_EVICTION_WAIT_S)):
            self.refused += 1
            body = json.dumps({"error": f"the ranker is overloaded: {self.max_connections} connections are open "
                                        f"and busy (--max-connections)"}).encode()
            try:
                request.settimeout(1.0)
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], OSError):
            return  # the client went away (reset, broken pipe): nothing to report
        super().handle_error(request, client_address)


def _content_length(headers, max_body_bytes):
    """(the body's length, None) or (None, (status, message)) from a request's headers."""
    if "Transfer-Encoding" in headers:
        return None, (411, "a Content-Length header is required (Transfer-Encoding is not accepted)")
    given = headers.get_all("Content-Length") or []
    if not given:
        return None, (411, "a Content-Length header is required")
    if len(set(given)) > 1:
        return None, (400, f"the request has {len(given)} different Content-Length headers")
    text = given[0].strip()
    if not re.fullmatch(r"[0-9]+", text):
        return None, (400, f"the Content-Length header {text[:40]!r} is not a byte count")
    if len(text) > 15 or int(text) > max_body_bytes:
        return None, (413, f"the request body ({text[:40]} bytes) exceeds --max-body-mb ({max_body_bytes} bytes)")
    return int(text), None


def make_handler(ranker, name, max_body_bytes, idle_timeout_s=30.0, read_timeout_s=30.0):
    """The request handler class of a BoundedHTTPServer serving `ranker` as model `name`.

    Args:
      max_body_bytes: the largest request body (--max-body-mb).
      idle_timeout_s: a connection waiting longer than this for its next request is closed (--idle-timeout-s).
      read_timeout_s: a request not received within this of its first byte gets 408 and its connection is closed;
        also the time an answer may take to send (--read-timeout-s).
    """

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "tf_fusedrec-ranker"
        # An answer goes out as two writes (headers, body): with Nagle's algorithm the body waits for the client's
        # delayed ACK of the headers, 40 ms on Linux, on every keep-alive request.
        disable_nagle_algorithm = True

        def log_message(self, fmt, *args):  # noqa: A002  (no line per request on stderr)
            pass

        def setup(self):
            super().setup()
            self.rfile.close()  # the socket's own file; reads go through the reader, which keeps the deadlines
            self.reader = _ConnectionReader(self.connection)
            self.rfile = io.BufferedReader(self.reader, 1 << 16)
            self.server.register(self.reader)

        def finish(self):
            try:
                super().finish()
            finally:
                self.server.unregister(self.reader)
                if self.reader.evicted:
                    ranker.count("idle_closed")

        suspect = False  # whether this connection was answered a 4xx: its requests then run in short slices
        _in_short_slices = False

        def handle_one_request(self):
            self.reader.await_request(idle_timeout_s, read_timeout_s)
            # What an answer needs should the request line itself come too late (parse_request sets them otherwise).
            self.command, self.requestline, self.request_version = None, "", "HTTP/1.1"
            try:
                super().handle_one_request()
            except _Late as late:
                self.close_connection = True
                if late.started:
                    self._error(408, f"the request was not received within --read-timeout-s ({read_timeout_s:g} s)")
                else:
                    ranker.count("idle_closed")
            finally:
                if self._in_short_slices:
                    self._in_short_slices = False
                    ranker.short_slices.__exit__(None, None, None)

        def parse_request(self):
            self.reader.begin_request()
            if self.suspect:  # from its request line to its answer (not while it waits for the next request)
                ranker.short_slices.__enter__()
                self._in_short_slices = True
            if not super().parse_request():
                return False
            if self.request_version == "HTTP/0.9":  # its answers carry no status line: a client could not tell errors
                self.send_error(400, "HTTP/0.9 requests are not served")
                return False
            return True

        def _send(self, status, payload):
            body = json.dumps(payload).encode()
            self.connection.settimeout(read_timeout_s)  # a client that does not read its answer is dropped too
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status, message):
            ranker.count(f"errors_{status}" if status in (400, 408, 411, 413, 503, 500) else "errors_400")
            self.suspect = self.suspect or 400 <= status < 500
            if len(message) > MAX_ERROR_CHARS:
                message = message[:MAX_ERROR_CHARS] + " [...]"
            self._send(status, {"error": message})

        def _linger(self):
            """After an answer sent without reading the body: no more to send, and what the client still sends is
            read and dropped for up to _LINGER_S, so that the close does not reset the connection under the answer."""
            try:
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_WR)
                deadline = time.monotonic() + _LINGER_S
                while (remaining := deadline - time.monotonic()) > 0:
                    self.connection.settimeout(remaining)
                    if not self.connection.recv(1 << 16):
                        break
            except OSError:
                pass

        def send_error(self, code, message=None, explain=None):
            """The standard library's errors (malformed request line or headers, unknown method) as JSON too."""
            short, long = self.responses.get(code, ("error", ""))
            self.close_connection = True
            if self.request_version == "HTTP/0.9":  # the default until a request line is parsed
                self.request_version = "HTTP/1.0"  # so that the answer has a status line
            self._error(code, f"{message or short}: {explain or long}" if (explain or long) else (message or short))

        def _route(self):
            match = _PATH.match(self.path.split("?", 1)[0])
            if match is None:
                self._send(404, {"error": f"no such endpoint: {self.path[:200]} (try /v1/models/{name}:predict)"})
                return None
            if match.group(1) != name:
                self._send(404, {"error": f"no model named '{match.group(1)[:200]}' (this ranker serves '{name}')"})
                return None
            return match.group(2) or ""

        def do_GET(self):  # noqa: N802
            what = self._route()
            if what is None:
                return
            if what == ":predict":
                self._send(405, {"error": "predict takes POST"})
            elif what == "/stats":
                self._send(200, ranker.stats())
            elif what == "/metadata":
                features = {f["name"]: {k: f[k] for k in ("layout", "dim", "combiner", "key_dtype", "max_id_bits")}
                            for f in ranker.model.manifest["features"]}
                self._send(200, {"model_spec": {"name": name, "version": str(ranker.model.version),
                                                "step": ranker.model.step},
                                 "features": features, "dense_inputs": ranker.model.dense_inputs})
            else:
                self._send(200, {"model_version_status": [
                    {"version": str(ranker.model.version), "state": "AVAILABLE",
                     "status": {"error_code": "OK", "error_message": ""}}]})

        def do_POST(self):  # noqa: N802
            length, refusal = _content_length(self.headers, max_body_bytes)
            if refusal is not None:
                self.close_connection = True  # the body, if any, is not read: what follows it cannot be parsed
                self._error(*refusal)
                self._linger()
                return
            body = self.rfile.read(length)
            if len(body) < length:
                self.close_connection = True  # the client closed its end before sending the whole body
                return
            what = self._route()
            if what is None:
                return
            if what != ":predict":
                self._send(405, {"error": f"POST is for /v1/models/{name}:predict"})
                return
            try:
                inputs, shape = ranker.parse(body)
                del body
                prepared = ranker.prepare(inputs)
                del inputs  # the parsed JSON: only the prepared arrays wait for the batcher
                scores, version = ranker.submit_versioned(prepared)
            except TooLarge as e:
                self._error(413, str(e))
                return
            except InputError as e:
                self._error(400, str(e))
                return
            except RecursionError:  # a check of deeply nested values (json.loads' own is an InputError)
                self._error(400, "the request nests JSON arrays or objects too deeply")
                return
            except Overloaded as e:
                self._error(503, str(e))
                return
            except TimeoutError:
                self._error(503, f"the ranker is overloaded: no answer within {ranker.answer_timeout_s:g} s")
                return
            except RuntimeError as e:  # an embedding server down or saturated (client.RemoteError names it)
                self._error(503, str(e))
                return
            except Exception as e:  # noqa: BLE001  (the ranker answers and stays up)
                self._error(500, f"{type(e).__name__}: {e}")
                return
            self._send(200, {"predictions" if shape == "instances" else "outputs": scores,
                             "model_version": str(version)})

    return Handler


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m tf_fusedrec.serve.ranker", description=__doc__.splitlines()[0])
    p.add_argument("--export", required=True, help="the export (python -m tf_fusedrec.export)")
    p.add_argument("--servers", required=True,
                   help="embedding servers host:port,...: server i holds routing range i of n (even ranges); "
                        "'local' holds every row in this process instead")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    p.add_argument("--name", default="model", help="the model's name in /v1/models/NAME")
    p.add_argument("--no-pooling", action="store_true", help="fetch multi-hot rows instead of pooling on the servers")
    p.add_argument("--cache-mb", type=float, default=64.0, help="the row cache's budget (0: no cache)")
    p.add_argument("--no-packed-signature", action="store_true",
                   help="call the dense SavedModel input by input, not through its packed signature (same scores)")
    p.add_argument("--cache-policy", choices=["lru", "lfu"], default="lru")
    p.add_argument("--cache-high-load", type=float, default=256.0,
                   help="mean instances per request (over the last 64) above which the cache shrinks")
    p.add_argument("--cache-low-load", type=float, default=64.0, help="... below which it grows back")
    p.add_argument("--max-batch", type=int, default=1024, help="most instances in one model call")
    p.add_argument("--batch-wait-ms", type=float, default=0.0,
                   help="how long a batch waits for more requests (default 0: it takes what is queued when the model "
                        "is free; requests arriving while a batch runs form the next; docs/serve/batch_wait_ab.json)")
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
    p.add_argument("--slow-path-switch-ms", type=float, default=DEFAULT_SLOW_PATH_SWITCH_S * 1000,
                   help="Python's thread switch interval while a body the fast parser refuses (a malformed one) is "
                        "parsed and while a connection that was answered a 4xx is served, so that a client sending "
                        "those does not delay the others' requests (0: Python's own, 5 ms)")
    p.add_argument("--timeout-s", type=float, default=5.0, help="a lookup's deadline (credit wait included)")
    p.add_argument("--publish-port", type=int,
                   help="take published versions (rows on the servers, dense weights here) from a trainer on this "
                        "port (python -m tf_fusedrec.train --publish-to HOST:PORT); needs --servers other than local")
    p.add_argument("--publish-host", default="127.0.0.1", help="interface of --publish-port (default: loopback only)")
    p.add_argument("--max-publish-mb", type=float, default=256.0, help="largest published dense body")
    p.add_argument("--catch-up", metavar="LOG",
                   help="a trainer's publish log (python -m tf_fusedrec.train --publish-log): start at its newest "
                        "version (the embedding servers must hold it: start them with --catch-up LOG too)")
    args = p.parse_args(argv)
    if (args.publish_port is not None or args.catch_up) and args.servers == "local":
        p.error("--publish-port and --catch-up need embedding servers (--servers host:port,...): published rows go to "
                "them")
    for flag in ("max_batch", "max_queue", "max_instances", "max_ids", "io_threads", "max_connections"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1")
    for flag in ("max_body_mb", "timeout_s", "idle_timeout_s", "read_timeout_s"):
        if not getattr(args, flag) > 0:
            p.error(f"--{flag.replace('_', '-')} must be > 0")
    if args.cache_mb < 0 or args.batch_wait_ms < 0 or args.slow_path_switch_ms < 0:
        p.error("--cache-mb, --batch-wait-ms, --slow-path-switch-ms must be >= 0")
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
                                timeout_s=args.timeout_s)
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
        publisher = publish.Publisher(publish.routing_table(backend), timeout_s=args.timeout_s)
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
    """The HTTP server of a Ranker from the parsed flags (bound, not yet serving: serve_forever)."""
    handler = make_handler(ranker, args.name, int(args.max_body_mb * MB), idle_timeout_s=args.idle_timeout_s,
                           read_timeout_s=args.read_timeout_s)
    return BoundedHTTPServer((args.host, args.port), handler, max_connections=args.max_connections)


def main(argv=None):
    import signal  # noqa: PLC0415

    args = parse_args(argv)
    lifetime.exit_with_parent()  # before TensorFlow builds the model: a SIGTERM until the handler below just ends it
    try:
        ranker = build(args)
        server = make_server(ranker, args)
    except (ValueError, OSError) as e:
        print(f"ranker: {e}", file=sys.stderr, flush=True)
        return 2
    publish_server = None
    if args.publish_port is not None:
        from tf_fusedrec.serve import publish  # noqa: PLC0415

        try:
            publish_server = publish.serve_publish(ranker.model, args.publish_host, args.publish_port,
                                                   args.max_publish_mb)
        except OSError as e:
            print(f"ranker: --publish-port {args.publish_port}: {e}", file=sys.stderr, flush=True)
            return 2
        print(f"ranker: taking published versions on http://{args.publish_host}:"
              f"{publish_server.server_address[1]}/publish", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda signum, frame: threading.Thread(target=server.shutdown).start())
    try:  # whatever ends this (a print to a closed pipe too) closes the servers and the ranker's threads
        print(f"ranker: serving '{args.name}' of {args.export} on http://{args.host}:{server.server_address[1]} "
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

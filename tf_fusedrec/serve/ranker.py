"""The ranker: predictions over HTTP in TensorFlow Serving's REST shape, the dense model here, rows from embedding
servers (FlexEMR's disaggregated serving, seed 002 §2.4, §3).

    python -m tf_fusedrec.serve.ranker --export EXPORT --servers 127.0.0.1:7001,127.0.0.1:7002 --port 8501

Endpoints (NAME: --name, default "model"):
  POST /v1/models/NAME:predict   {"instances": [{feature: id or [ids], "dense": [...]}, ...]} -> {"predictions": [..]}
                                 or {"inputs": {feature: [per instance], ...}} -> {"outputs": [...]}
  GET  /v1/models/NAME           the model's status (TF Serving's shape)
  GET  /v1/models/NAME/metadata  the inputs the model takes (features: layout, dim, combiner, key dtype)
  GET  /v1/models/NAME/stats     requests, batches, errors, bytes to and from the servers, cache, per-server queues

A request is checked in its own handler thread (unknown feature, wrong type, negative id, malformed JSON: HTTP 400
naming the field), then queued for the batcher, which merges the requests waiting (up to --max-batch instances, or
what arrived within --batch-wait-ms) into one embedding lookup per group and one call of the dense SavedModel. A
server that is down or saturated answers HTTP 503 naming it; the ranker stays up and uses it again once it is back.
Binds to 127.0.0.1 unless --host says otherwise; request bodies, instances per request and queued requests are
bounded.
"""

import argparse
import json
import queue
import re
import sys
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from tf_fusedrec.serve.model import FlatIds, InputError

MB = 1 << 20
_PATH = re.compile(r"^/v1/models/([^/:]+)(?:/versions/\d+)?(:predict|/metadata|/stats)?/?$")


class Overloaded(RuntimeError):
    """The ranker's request queue is full."""


def parse_body(body, max_instances):
    """A predict request's JSON -> (columnar inputs {name: [value per instance]}, "instances" or "inputs").

    InputError naming what is wrong (TF Serving's two request shapes: row "instances" or columnar "inputs")."""
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"the request body is not valid JSON: {e}") from None
    if not isinstance(request, dict) or len({"instances", "inputs"} & set(request)) != 1:
        raise InputError('the request must be a JSON object with exactly one of "instances" or "inputs"')
    if "instances" in request:
        instances = request["instances"]
        if not isinstance(instances, list) or not instances:
            raise InputError('"instances" must be a non-empty list of objects (one per instance)')
        if len(instances) > max_instances:
            raise InputError(f'"instances" holds {len(instances)} instances, at most {max_instances} are accepted')
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
            raise InputError(f"input '{name}': {len(values)} instances, at most {max_instances} are accepted")
    return inputs, "inputs"


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
      batch_wait_s: how long the batcher waits for more requests once one is queued.
      max_queue: most requests waiting for the batcher; beyond, Overloaded (HTTP 503).
      max_instances: most instances in one request.
    """

    def __init__(self, model, cache=None, max_batch=1024, batch_wait_s=0.002, max_queue=256, max_instances=4096):
        self.model, self.cache = model, cache
        self.max_batch, self.batch_wait_s, self.max_instances = max_batch, batch_wait_s, max_instances
        self._queue = queue.Queue(maxsize=max_queue)
        self._lock = threading.Lock()
        self._counts = {"requests": 0, "instances": 0, "batches": 0, "batched_instances": 0, "errors_400": 0,
                        "errors_503": 0, "errors_500": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._batch_loop, name="ranker_batcher", daemon=True)
        self._thread.start()

    def count(self, key, n=1):
        with self._lock:
            self._counts[key] += n

    def prepare(self, inputs):
        """Checks a request's columnar inputs -> (flats, dense, batch); InputError naming the field."""
        flats, batch = self.model.flatten(inputs, allow_padding=False)
        dense = {name: self.model._dense_value(name, inputs[name], batch)  # noqa: SLF001
                 for name in self.model.dense_inputs}
        return flats, dense, batch

    def predict(self, inputs, timeout_s=30.0):
        """Scores (list of float) of a request's columnar inputs, through the batcher."""
        flats, dense, batch = self.prepare(inputs)
        if self.cache is not None:
            self.cache.observe(batch)
        done = futures.Future()
        try:
            self._queue.put_nowait((flats, dense, batch, done))
        except queue.Full:
            raise Overloaded(f"the ranker is overloaded: {self._queue.maxsize} requests are already waiting") from None
        self.count("requests")
        self.count("instances", batch)
        return done.result(timeout=timeout_s)

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
            scores = self.model.predict_flat(flats, dense, batch)
        except BaseException as e:  # noqa: BLE001  (every waiting request gets the error; the batcher goes on)
            for item in taken:
                item[3].set_exception(e)
            return
        self.count("batches")
        self.count("batched_instances", batch)
        offset = 0
        for item in taken:
            item[3].set_result(scores[offset:offset + item[2]].tolist())
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


class BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` at once: one more is answered HTTP 503 and closed, so a
    flood of connections cannot start threads without bound."""

    daemon_threads = True

    def __init__(self, address, handler, max_connections=64):
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_connections)
        self.max_connections = max_connections
        self.refused = 0

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            body = json.dumps({"error": f"the ranker is overloaded: {self.max_connections} connections are open "
                                        f"(--max-connections)"}).encode()
            try:
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


def make_handler(ranker, name, max_body_bytes):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "tf_fusedrec-ranker"

        def log_message(self, fmt, *args):  # noqa: A002  (no line per request on stderr)
            pass

        def _send(self, status, payload):
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _error(self, status, message):
            ranker.count(f"errors_{status}" if status in (400, 503, 500) else "errors_400")
            self._send(status, {"error": message})

        def _route(self):
            match = _PATH.match(self.path.split("?", 1)[0])
            if match is None:
                self._send(404, {"error": f"no such endpoint: {self.path} (try /v1/models/{name}:predict)"})
                return None
            if match.group(1) != name:
                self._send(404, {"error": f"no model named '{match.group(1)}' (this ranker serves '{name}')"})
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
                self._send(200, {"model_spec": {"name": name}, "features": features,
                                 "dense_inputs": ranker.model.dense_inputs})
            else:
                self._send(200, {"model_version_status": [
                    {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]})

        def do_POST(self):  # noqa: N802
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self.close_connection = True
                self._error(411, "a Content-Length header is required")
                return
            if length < 0 or length > max_body_bytes:
                self.close_connection = True
                self._error(413, f"the request body ({length} bytes) exceeds --max-body-mb ({max_body_bytes} bytes)")
                return
            body = self.rfile.read(length)
            what = self._route()
            if what is None:
                return
            if what != ":predict":
                self._send(405, {"error": f"POST is for /v1/models/{name}:predict"})
                return
            try:
                inputs, shape = parse_body(body, ranker.max_instances)
                scores = ranker.predict(inputs)
            except InputError as e:
                self._error(400, str(e))
                return
            except Overloaded as e:
                self._error(503, str(e))
                return
            except RuntimeError as e:  # an embedding server down or saturated (client.RemoteError names it)
                self._error(503, str(e))
                return
            except Exception as e:  # noqa: BLE001  (the ranker answers and stays up)
                self._error(500, f"{type(e).__name__}: {e}")
                return
            self._send(200, {"predictions" if shape == "instances" else "outputs": scores})

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
    p.add_argument("--cache-policy", choices=["lru", "lfu"], default="lru")
    p.add_argument("--cache-high-load", type=float, default=256.0,
                   help="mean instances per request (over the last 64) above which the cache shrinks")
    p.add_argument("--cache-low-load", type=float, default=64.0, help="... below which it grows back")
    p.add_argument("--max-batch", type=int, default=1024, help="most instances in one model call")
    p.add_argument("--batch-wait-ms", type=float, default=2.0, help="how long a batch waits for more requests")
    p.add_argument("--max-queue", type=int, default=256, help="most requests waiting; beyond, HTTP 503")
    p.add_argument("--max-instances", type=int, default=4096, help="most instances in one request")
    p.add_argument("--max-body-mb", type=float, default=16.0, help="largest request body")
    p.add_argument("--max-connections", type=int, default=64, help="most open connections; beyond, HTTP 503")
    p.add_argument("--io-threads", type=int, default=8, help="threads sending lookups to the servers")
    p.add_argument("--timeout-s", type=float, default=5.0, help="a lookup's deadline (credit wait included)")
    args = p.parse_args(argv)
    for flag in ("max_batch", "max_queue", "max_instances", "io_threads", "max_connections"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be >= 1")
    if args.cache_mb < 0 or args.max_body_mb <= 0 or args.timeout_s <= 0 or args.batch_wait_ms < 0:
        p.error("--cache-mb, --batch-wait-ms must be >= 0 and --max-body-mb, --timeout-s > 0")
    return args


def build(args):
    """(Ranker, name) from the parsed flags."""
    from tf_fusedrec.export import format as fmt  # noqa: PLC0415
    from tf_fusedrec.serve import cache as cache_lib  # noqa: PLC0415
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
    model = ServingModel(args.export, backend=backend, pooling=pooling)
    return Ranker(model, cache, max_batch=args.max_batch, batch_wait_s=args.batch_wait_ms / 1000,
                  max_queue=args.max_queue, max_instances=args.max_instances)


def main(argv=None):
    import signal  # noqa: PLC0415

    args = parse_args(argv)
    try:
        ranker = build(args)
        server = BoundedHTTPServer((args.host, args.port), make_handler(ranker, args.name, int(args.max_body_mb * MB)),
                                   max_connections=args.max_connections)
    except (ValueError, OSError) as e:
        print(f"ranker: {e}", file=sys.stderr, flush=True)
        return 2
    signal.signal(signal.SIGTERM, lambda signum, frame: threading.Thread(target=server.shutdown).start())
    print(f"ranker: serving '{args.name}' of {args.export} on http://{args.host}:{server.server_address[1]} "
          f"(servers: {args.servers}; pooling {'on' if not args.no_pooling else 'off'}; cache "
          f"{f'{args.cache_mb:g} MiB {args.cache_policy}' if args.cache_mb else 'off'})", file=sys.stderr, flush=True)
    print("ready", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    server.server_close()
    ranker.close()
    print("ranker: stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

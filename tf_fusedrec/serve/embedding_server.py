"""An embedding server: the rows of one routing range of an export, answered over gRPC (embedding.proto).

    python -m tf_fusedrec.serve.embedding_server --export EXPORT --shard i --num-shards n --port P
        [--host 127.0.0.1] [--start S --end E] [--max-inflight K] [--threads T] [--max-request-mb M]
        [--max-response-mb R] [--max-clients C] [--accept-publish [--max-staged-mb M]] [--catch-up LOG]
        [--tls-cert PEM --tls-key PEM [--tls-ca PEM --tls-client-auth]] [--publish-token-file FILE] [--insecure]

The server holds, for every group of the export, the rows whose route (format.route of the table key) lies in its
range [start, end): range i of n even ranges (format.even_ranges), or the explicit hex range --start/--end (how a
range is split to add a server: RangeTable.split in client.py). It answers

  Lookup   the rows of (id, category) pairs, or, when the request carries segments, the per-segment partial sums and
           counts of those rows: pooling on the embedding server, so that only one row per (segment, server) crosses
           the network and the ranker adds the partial sums (FlexEMR section 3.1.2, hierarchical pooling);
  Credits  its flow-control state: the credits it grants each client (--max-inflight divided among the clients that
           polled recently), its Lookups in flight and queued, the high-water mark (FlexEMR section 3.2, credit-based
           flow control; clients poll it on a connection of its own, so Lookup traffic never delays it);
  Info     the export's identity (the export directory's base name, never its absolute path), the range held, the
           groups, the versions held and the server's limits;
  Stage,   publishing (only with --accept-publish): a trainer stages the rows of a new version (any number of calls,
  Commit   from any number of workers), then commits it; the version loaded from the export is 0. A Lookup reads one
           committed version, the newest unless it names one, so a ranker that names the version it serves never
           mixes two versions' rows while a publish stages or commits beside it (tf_fusedrec/serve/publish.py).
           A server started after versions were published catches up from the trainer's publish log
           (--catch-up LOG: python -m tf_fusedrec.train --publish-log LOG): it serves the log's newest version,
           built from the newest full version and the deltas after it (the export gives the groups' specs).

Bounds: requests larger than --max-request-mb are refused by gRPC; more than --max-inflight Lookups at once get
RESOURCE_EXHAUSTED; at most --threads Lookups compute at once (the others wait in flight); a Lookup whose answer would
exceed --max-response-mb is refused before any row is gathered (its size is known from the decoded request, group by
group). Clients are told apart by their Credits client_id (at most MAX_CLIENT_ID_CHARS characters): at most
--max-clients are registered, each taking a share of --max-inflight; ids beyond that share one pool that counts as one
client, so a flood of made-up ids cannot shrink the registered clients' shares. A malformed request gets
INVALID_ARGUMENT naming the group and the field. Staged rows are bounded by --max-staged-mb (beyond: RESOURCE_EXHAUSTED
and the staged version is dropped); a version holds its own copy of the groups it changed (unchanged groups are
shared), so a server needs up to (versions held + 1) times its rows' memory while a publish commits. Requests are
decoded from protobuf and numpy buffers only; nothing from the wire is ever unpickled.

Security (tf_fusedrec/serve/security.py): with --tls-cert/--tls-key the server serves TLS only, with
--tls-client-auth only to clients whose certificate chains to --tls-ca. A Stage or Commit is authenticated before its
payload is read: with --publish-token-file the call's "authorization: Bearer TOKEN" metadata must hold the file's
token (compared in constant time), else under --tls-client-auth the client certificate suffices; a refused call gets
UNAUTHENTICATED, changes nothing and is logged with the peer's address. A server bound beyond loopback with
--accept-publish and no authentication refuses to start unless --insecure (then every commit is logged); one bound
beyond loopback without TLS logs a warning.

The CLI logs one line to stderr when the tables are loaded, prints "ready" to stdout when it serves, and stops
gracefully on SIGTERM or SIGINT. EmbeddingServer is the same server in-process (tests, a ranker's tests).
"""

import argparse
import collections
import hashlib
import json
import math
import os
import signal
import sys
import threading
import time
from concurrent import futures

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from tf_fusedrec import hashing
from tf_fusedrec.export import format as fmt
from tf_fusedrec.serve import embedding_pb2 as pb
from tf_fusedrec.serve import lifetime, security

SERVICE = pb.DESCRIPTOR.services_by_name["EmbeddingService"].full_name
LOOKUP_METHOD = f"/{SERVICE}/Lookup"
CREDITS_METHOD = f"/{SERVICE}/Credits"
INFO_METHOD = f"/{SERVICE}/Info"
# The methods that change what a server serves: authenticated (security.PublishGuard) before their payload is read.
PUBLISH_METHODS = ("Stage", "Commit")
# Trailing metadata of a RESOURCE_EXHAUSTED that means "too many lookups in flight, retry", as opposed to gRPC's own
# RESOURCE_EXHAUSTED for a message over the size limit, which a retry cannot cure.
BUSY_METADATA = ("tf-fusedrec-busy", "1")
# Threads beyond --max-inflight (each admitted Lookup may hold one while it waits to compute): they answer Credits,
# Info and the refusals of excess Lookups, so that a server full of Lookups still answers its clients' polls.
CONTROL_THREADS = 4
# A client that has not polled Credits for this long no longer takes a share of the in-flight limit.
CLIENT_TTL_S = 5.0
# The longest Credits client_id accepted (a RemoteBackend's is "<pid>-<12 hex digits>").
MAX_CLIENT_ID_CHARS = 128
# The most entries in one LookupRequest (RemoteBackend sends one per request; a group may repeat).
MAX_ENTRIES = 1024
# Bytes of a GroupResult beyond its arrays and group name, at most: field tags, length and int varints, and the
# result's own tag and length within the LookupResponse.
_RESULT_FRAMING_BYTES = 96
# The LookupResponse's version field, at most: its tag and a 64-bit varint.
_VERSION_FIELD_BYTES = 11
MB = 1 << 20
# How often main()'s thread wakes to run a signal handler that another thread received (see main()).
SIGNAL_POLL_S = 0.2
# The version loaded from the export at start; a publisher's first version is 1.
EXPORT_VERSION = 0


def export_fingerprint(manifest):
    """sha256 (hex) of an export's tables: each group's name, dim, encoding, features, row count and part checksums.

    Servers report it in Info and clients compute it from their manifest, so a client notices a server of another
    export (or of another version of it) before it mixes their rows.
    """
    identity = [[g["name"], g["dim"], g["encoding"], list(g["features"]), g["rows"],
                 [[p["path"], p["sha256"]] for p in g["parts"]]]
                for g in sorted(manifest["groups"], key=lambda g: g["name"])]
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def unique_pairs(ids, categories):
    """The distinct (id, category) pairs and where each pair went.

    Args:
      ids: int64 [n]; categories: int [n].

    Returns:
      (first int64 [u]: the index of each distinct pair's first occurrence, inverse int64 [n]: the distinct pair of
      each pair), so that pairs == distinct[inverse] with distinct = (ids[first], categories[first]).
    """
    ids = np.asarray(ids, np.int64)
    categories = np.asarray(categories, np.int64)
    if len(ids) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    # Pairs, not table keys: two pairs may share a hashed key yet differ in their initializer row.
    order = np.lexsort((categories, ids))
    sorted_ids, sorted_categories = ids[order], categories[order]
    new = np.ones(len(ids), bool)
    new[1:] = (sorted_ids[1:] != sorted_ids[:-1]) | (sorted_categories[1:] != sorted_categories[:-1])
    distinct_of_sorted = np.cumsum(new) - 1
    inverse = np.empty(len(ids), np.int64)
    inverse[order] = distinct_of_sorted
    return order[new], inverse


def parse_hash(text):
    """A position in the routing hash space from hex ("0x8000000000000000" or "8000000000000000"); 2**64 allowed."""
    try:
        value = int(text, 16)
    except ValueError:
        raise ValueError(f"{text!r} is not a hex number") from None
    if not 0 <= value <= fmt.HASH_SPACE:
        raise ValueError(f"{text} is outside the hash space [0, 2**64]")
    return value


class _Refused(Exception):
    """A well-formed request the server's state refuses (FAILED_PRECONDITION): publishing off, a version not held or
    not above the newest."""


class _Exhausted(Exception):
    """A request beyond one of the server's bounds (RESOURCE_EXHAUSTED)."""


class _Invalid(Exception):
    """A malformed Lookup entry; the message names the group and the field."""


def _without_absolute_paths(value):
    """A manifest's JSON value with every absolute path replaced by its base name (the server's file layout is none
    of its clients' business)."""
    if isinstance(value, dict):
        return {k: _without_absolute_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_absolute_paths(v) for v in value]
    if isinstance(value, str) and os.path.isabs(value):
        return os.path.basename(value.rstrip("/\\")) or "."
    return value


class EmbeddingServer:
    """The rows of one routing range of an export, served over gRPC.

    Args:
      export_dir: the export (its manifest and table parts are checked against their sha256).
      start, end: the routing range held, [start, end) within [0, 2**64).
      max_inflight: most Lookups admitted at once; beyond it RESOURCE_EXHAUSTED. Also the credits granted, divided
        among the clients that poll Credits.
      threads: most Lookups computing at once (the others admitted wait for a slot).
      max_request_mb / max_response_mb: the largest request accepted and response sent, in MiB.
      host: the interface to bind (127.0.0.1: only this machine; "0.0.0.0" or "[::]" to serve others).
      max_clients: most clients (Credits client_ids) registered at once; the others share one pool.
      accept_publish: take Stage and Commit (publishing new versions); False: refuse them (FAILED_PRECONDITION).
      max_staged_mb: most MiB of rows and keys staged for a version before it is committed.
      catch_up: a publish log directory (publish.replay_log), or None: its newest version, if any, is the version
        served (the only one held) instead of the export's rows.
      tls: a security.TLS with a certificate (serve TLS only; with client_auth, mutual TLS), or None (plain).
      publish_token: the shared publish token (bytes, security.read_token), or None.
      insecure: with accept_publish beyond loopback and neither a token nor client certificates, start anyway (and
        log every commit); otherwise such a server raises security.SecurityError.
    """

    def __init__(self, export_dir, start=0, end=fmt.HASH_SPACE, max_inflight=32, threads=4, max_request_mb=64,
                 max_response_mb=512, host="127.0.0.1", max_clients=64, accept_publish=False, max_staged_mb=1024,
                 catch_up=None, tls=None, publish_token=None, insecure=False):
        if not 0 <= start < end <= fmt.HASH_SPACE:
            raise ValueError(f"the range [{start:#x}, {end:#x}) must be non-empty and within [0, 2**64)")
        for name, value in (("max_inflight", max_inflight), ("threads", threads), ("max_request_mb", max_request_mb),
                            ("max_response_mb", max_response_mb), ("max_clients", max_clients),
                            ("max_staged_mb", max_staged_mb)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if tls is not None and not tls.serves:
            raise security.SecurityError("a server's TLS needs --tls-cert and --tls-key")
        self.tls = tls
        self.guard = security.PublishGuard(publish_token, client_certs=tls is not None and tls.client_auth,
                                           insecure=insecure)
        # Before the tables load: a server that must not start says so at once.
        security.refuse_unsafe_start("embedding server", host, bool(accept_publish), self.guard, tls)
        self.export_dir = os.path.abspath(export_dir)
        self.range_start, self.range_end = start, end
        self.max_inflight, self.threads, self.host, self.max_clients = max_inflight, threads, host, max_clients
        self.max_request_bytes, self.max_response_bytes = max_request_mb * MB, max_response_mb * MB
        self.manifest = fmt.read_manifest(self.export_dir)
        self.manifest_sha256 = fmt.sha256_of(os.path.join(self.export_dir, "manifest.json"))
        self.fingerprint = export_fingerprint(self.manifest)
        groups = {g["name"]: fmt.GroupRows(self.export_dir, self.manifest, g, start, end)
                  for g in self.manifest["groups"]}
        source_step = self.manifest.get("source", {}).get("step")
        # (version, step, {group: GroupRows}) of every version held, oldest first; never changed in place, so a
        # Lookup that took one reads it whole while a commit replaces the list.
        self._versions = [(EXPORT_VERSION, int(source_step) if isinstance(source_step, int) else -1, groups)]
        if catch_up is not None:
            from tf_fusedrec.serve import publish  # noqa: PLC0415  (publish imports this module)

            caught_up = publish.replay_log(catch_up, groups, start, end)
            if caught_up is not None:
                self._versions = [caught_up]
        self.accept_publish, self.max_staged_bytes = bool(accept_publish), max_staged_mb * MB
        self._publish_lock = threading.Lock()  # one Stage or Commit at a time
        self._staging = None  # the version being staged: {"version", "groups": {name: lists}, "rows", ...}
        self._last_commit = None  # (CommitRequest, CommitResponse) of the newest commit: a repeated commit's answer
        self._lock = threading.Lock()
        self._compute = threading.Semaphore(threads)
        self._inflight = self._queued = self._high_water = 0
        self._lookups = self._rejected = self._invalid = 0
        self._clients = {}  # client_id -> time of its last Credits poll (at most max_clients of them)
        self._pool_seen = -math.inf  # the last Credits poll of a client beyond max_clients
        self._server = None
        self._port = None

    # --- life cycle ----------------------------------------------------------------------------------------------

    @property
    def port(self):
        """The port served (None before start)."""
        return self._port

    @property
    def groups(self):
        """{group: GroupRows} of the newest version."""
        return self._versions[-1][2]

    @property
    def versions(self):
        """[(version, step)] held, oldest first."""
        return [(v, step) for v, step, _ in self._versions]

    @property
    def rows_held(self):
        return sum(len(g) for g in self.groups.values())

    @property
    def bytes_held(self):
        return sum(g.nbytes for g in self.groups.values())

    def start(self, port=0):
        """Starts serving on host:port (0: a free port); -> the port. RuntimeError naming the address if it is taken."""
        if self._server is not None:
            raise RuntimeError(f"the server already serves on port {self._port}")
        control = CONTROL_THREADS
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.max_inflight + control,
                                       thread_name_prefix="embedding_server"),
            # A backstop for floods only: the in-flight counter refuses Lookups beyond max_inflight itself, with the
            # busy metadata clients retry on; gRPC's own refusal beyond this bound carries none. The margin lets the
            # counter's quick refusals queue for a thread instead of reaching the backstop.
            maximum_concurrent_rpcs=4 * (self.max_inflight + control),
            options=[("grpc.max_receive_message_length", self.max_request_bytes),
                     ("grpc.max_send_message_length", self.max_response_bytes),
                     # Without this a second server could bind the same port and silently take half the traffic.
                     ("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((_Handlers(self, {
            # Raw bytes in and out: the handlers parse the request themselves, so that bytes that are no
            # LookupRequest get INVALID_ARGUMENT rather than gRPC's INTERNAL.
            "Lookup": grpc.unary_unary_rpc_method_handler(self._lookup),
            "Credits": grpc.unary_unary_rpc_method_handler(self._credits),
            "Info": grpc.unary_unary_rpc_method_handler(self._info),
            "Stage": grpc.unary_unary_rpc_method_handler(self._stage),
            "Commit": grpc.unary_unary_rpc_method_handler(self._commit),
        }),))
        address = f"{self.host}:{port}"
        try:
            if self.tls is not None:
                bound = server.add_secure_port(address, self.tls.server_credentials())
            else:
                bound = server.add_insecure_port(address)
        except RuntimeError as e:
            raise RuntimeError(f"embedding server: cannot bind {address}: {e}") from None
        if bound == 0:
            raise RuntimeError(f"embedding server: cannot bind {address} (in use?)")
        server.start()
        self._server, self._port = server, bound
        return bound

    def stop(self, grace=1.0):
        """Stops serving: in-flight RPCs get `grace` seconds to finish."""
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None

    def wait(self):
        """Blocks until the server stops."""
        if self._server is not None:
            self._server.wait_for_termination()

    def describe(self):
        """One line: range, groups, rows, bytes, port, limits."""
        groups = ", ".join(f"{name} ({len(g)} rows, dim {g.dim})" for name, g in self.groups.items())
        return (f"embedding server {self.export_dir}: range [{self.range_start:#018x}, {self.range_end:#x}) "
                f"groups {groups}; {self.rows_held} rows, {self.bytes_held} bytes; {self.host}:{self._port}; "
                f"max_inflight {self.max_inflight}, threads {self.threads}, "
                f"max request {self.max_request_bytes // MB} MiB; {self._security_summary()}")

    def _security_summary(self):
        transport = "mutual TLS" if self.guard.client_certs else "TLS" if self.tls is not None else "plain text"
        if not self.accept_publish:
            return transport
        by = ("token" if self.guard.token is not None else "client certificate" if self.guard.client_certs
              else "nothing (unauthenticated)")
        return f"{transport}; publishes authenticated by {by}"

    # --- state ---------------------------------------------------------------------------------------------------

    def credits_state(self, client_id=""):
        """The Credits answer as a message (also for in-process callers); polling with a client_id registers it.

        Up to max_clients ids are registered, each granted max_inflight divided by the number of clients; an id
        beyond them joins the pool, which counts as one client and whose members are granted one credit each (the
        server cannot tell how many they are). ValueError for a client_id longer than MAX_CLIENT_ID_CHARS."""
        if len(client_id) > MAX_CLIENT_ID_CHARS:
            raise ValueError(f"field client_id has {len(client_id)} characters, at most {MAX_CLIENT_ID_CHARS}")
        now = time.monotonic()
        with self._lock:
            for stale in [c for c, seen in self._clients.items() if now - seen > CLIENT_TTL_S]:
                del self._clients[stale]
            pooled = False
            if client_id:
                if client_id in self._clients or len(self._clients) < self.max_clients:
                    self._clients[client_id] = now
                else:
                    self._pool_seen, pooled = now, True
            clients = len(self._clients) + (now - self._pool_seen <= CLIENT_TTL_S)
            share = max(1, self.max_inflight // max(1, clients))
            return pb.CreditsResponse(
                credits=1 if pooled else share, max_inflight=self.max_inflight, inflight=self._inflight,
                queued=self._queued, high_water=self._high_water, clients=clients, lookups=self._lookups,
                rejected=self._rejected, invalid=self._invalid)

    def info(self):
        groups = [pb.GroupInfo(name=name, dim=g.dim, encoding=g.group["encoding"],
                               num_categories=len(g.group["features"]), rows_held=len(g), rows_total=g.group["rows"],
                               bytes_held=g.nbytes)
                  for name, g in self.groups.items()]
        source = _without_absolute_paths(self.manifest.get("source", {}))
        return pb.InfoResponse(
            export_dir=os.path.basename(self.export_dir), manifest_sha256=self.manifest_sha256,
            fingerprint=self.fingerprint, source_json=json.dumps(source, sort_keys=True),
            range_start=self.range_start, range_last=self.range_end - 1, groups=groups,
            max_inflight=self.max_inflight, threads=self.threads, max_request_bytes=self.max_request_bytes,
            max_response_bytes=self.max_response_bytes, versions=self._version_infos(),
            accepts_publish=self.accept_publish)

    def _version_infos(self):
        return [pb.VersionInfo(version=v, step=step, rows=sum(len(g) for g in groups.values()))
                for v, step, groups in self._versions]

    # --- publishing ----------------------------------------------------------------------------------------------

    def stage(self, request):
        """Stages a StageRequest's rows (also for in-process callers) -> StageResponse; _Invalid naming the field,
        _Refused when publishing is off or the version is stale, _Exhausted beyond max_staged_mb."""
        if not self.accept_publish:
            raise _Refused("this server does not take publishes (start it with --accept-publish)")
        where = f"stage of version {request.version}, group {request.group!r}"
        rows_of = self.groups.get(request.group)
        if rows_of is None:
            raise _Invalid(f"{where}: field group: no such group on this server (groups: {sorted(self.groups)})")
        keys = _array(where, "keys", request.keys, "<i8", "int64")
        removed = _array(where, "removed", request.removed, "<i8", "int64")
        dim = rows_of.dim
        if len(request.rows) != 4 * dim * len(keys):
            raise _Invalid(f"{where}: field rows has {len(request.rows)} bytes, expected {4 * dim * len(keys)} "
                           f"(float32 [{len(keys)} keys, dim {dim}])")
        rows = np.frombuffer(request.rows, "<f4").astype(np.float32).reshape(len(keys), dim)
        for field, values in (("keys", keys), ("removed", removed)):
            outside = ~fmt.in_range(fmt.route(values), self.range_start, self.range_end)
            if outside.any():
                raise _Invalid(f"{where}: field {field}: {int(outside.sum())} of {len(values)} keys route outside "
                               f"this server's range [{self.range_start:#x}, {self.range_end:#x}) (first: "
                               f"{int(values[outside][0])}); the publisher's routing table disagrees with the server's")
        with self._publish_lock:
            newest = self._versions[-1][0]
            if request.version <= newest:
                raise _Refused(f"{where}: version {request.version} is not above the newest version held ({newest})")
            staging = self._staging
            if staging is not None and staging["version"] > request.version:
                raise _Refused(f"{where}: version {staging['version']} is already being staged")
            attempt = (request.version, request.publish_id)
            if staging is None or staging["attempt"] != attempt:  # a lower version or another attempt: abandoned
                staging = self._staging = {"version": request.version, "attempt": attempt, "groups": {}, "rows": 0,
                                           "removed": 0, "bytes": 0}
            added = keys.nbytes + rows.nbytes + removed.nbytes
            if staging["bytes"] + added > self.max_staged_bytes:
                self._staging = None
                raise _Exhausted(f"{where}: the staged version would exceed {self.max_staged_bytes} bytes "
                                 f"(--max-staged-mb); it is dropped")
            parts = staging["groups"].setdefault(request.group, {"keys": [], "rows": [], "removed": []})
            parts["keys"].append(keys)
            parts["rows"].append(rows)
            parts["removed"].append(removed)
            staging["rows"] += len(keys)
            staging["removed"] += len(removed)
            staging["bytes"] += added
            return pb.StageResponse(staged_rows=staging["rows"], staged_removed=staging["removed"],
                                    staged_bytes=staging["bytes"])

    def commit(self, request):
        """Commits a CommitRequest's version (also for in-process callers) -> CommitResponse; _Refused when
        publishing is off or the version is not above the newest held."""
        if not self.accept_publish:
            raise _Refused("this server does not take publishes (start it with --accept-publish)")
        with self._publish_lock:
            newest = self._versions[-1][0]
            if self._last_commit is not None and request.version == newest:
                if self._last_commit[0] == request:
                    return self._last_commit[1]  # a retry whose first answer was lost
                raise _Refused(f"commit of version {request.version}: already committed with other fields")
            if request.version <= newest:
                raise _Refused(f"commit of version {request.version}: not above the newest version held ({newest})")
            staging = self._staging
            mine = staging is not None and staging["attempt"] == (request.version, request.publish_id)
            staged = staging["groups"] if mine else {}
            groups, changed, removed = {}, 0, 0
            empty = np.zeros(0, np.int64)
            for name, rows_of in self.groups.items():
                parts = staged.get(name)
                if parts is None and not request.full:
                    groups[name] = rows_of  # unchanged: shared with the previous version
                    continue
                keys = np.concatenate(parts["keys"]) if parts else empty
                rows = np.concatenate(parts["rows"]) if parts else np.zeros((0, rows_of.dim), np.float32)
                gone = np.concatenate(parts["removed"]) if parts else empty
                groups[name], n_changed, n_removed = rows_of.applied(gone, keys, rows, full=request.full)
                changed += n_changed
                removed += n_removed
            keep_from = request.keep_from or newest
            held = [v for v in self._versions if v[0] >= keep_from] + [(request.version, request.step, groups)]
            self._versions = held  # one assignment: a Lookup sees the old list or the new one
            self._staging = None
            response = pb.CommitResponse(version=request.version, rows_changed=changed, rows_removed=removed,
                                         versions=self._version_infos())
            self._last_commit = (request, response)
            return response

    # --- handlers ------------------------------------------------------------------------------------------------

    @staticmethod
    def _parse(message, payload, context):
        """The request `payload` as a `message` (a protobuf class); INVALID_ARGUMENT naming it when it is not one."""
        try:
            return message.FromString(payload)
        except DecodeError as e:
            article = "an" if message.__name__[0] in "AEIOU" else "a"
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not {article} {message.__name__}: {e}")

    def _credits(self, payload, context):
        request = self._parse(pb.CreditsRequest, payload, context)
        try:
            return self.credits_state(request.client_id).SerializeToString()
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    def _info(self, payload, context):
        self._parse(pb.InfoRequest, payload, context)
        return self.info().SerializeToString()

    def _stage(self, payload, context):
        return self._publish_call(self.stage, self._parse(pb.StageRequest, payload, context), context)

    def _commit(self, payload, context):
        request = self._parse(pb.CommitRequest, payload, context)
        if self.accept_publish and self.guard.insecure and not self.guard.authenticates:
            security.LOG.warning("embedding server %s:%s: unauthenticated commit of version %d from %s (--insecure)",
                                 self.host, self._port, request.version, context.peer())
        return self._publish_call(self.commit, request, context)

    def _refuse_publish(self, method, reason, context):
        """Answers a publish call that is not authenticated: UNAUTHENTICATED, logged with the peer's address; its
        payload is never read."""
        security.LOG.warning("embedding server %s:%s: refused %s from %s: %s", self.host, self._port, method,
                             context.peer(), reason)
        context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{method} refused: {reason}")

    @staticmethod
    def _publish_call(method, request, context):
        try:
            return method(request).SerializeToString()
        except _Invalid as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except _Refused as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except _Exhausted as e:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))

    def _lookup(self, payload, context):
        with self._lock:
            if self._inflight >= self.max_inflight:
                self._rejected += 1
                busy = True
            else:
                self._inflight += 1
                self._high_water = max(self._high_water, self._inflight)
                busy = False
        if busy:
            context.set_trailing_metadata((BUSY_METADATA,))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{self.max_inflight} lookups already in flight (--max-inflight); retry later")
        try:
            with self._lock:
                self._queued += 1
            with self._compute:
                with self._lock:
                    self._queued -= 1
                answer = self._answer(payload)
            with self._lock:
                self._lookups += 1
            return answer
        except _Invalid as e:
            with self._lock:
                self._invalid += 1
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except _Refused as e:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        finally:
            with self._lock:
                self._inflight -= 1

    def _answer(self, payload):
        try:
            request = pb.LookupRequest.FromString(payload)
        except DecodeError as e:
            raise _Invalid(f"the request is not a LookupRequest: {e}") from None
        if not request.groups:
            raise _Invalid("field groups: the request holds no entry")
        versions = self._versions  # the list of this moment: a commit beside this lookup replaces it, whole
        if request.HasField("version"):
            held = [v for v in versions if v[0] == request.version]
            if not held:
                raise _Refused(f"field version: version {request.version} is not held (held: "
                               f"{[v[0] for v in versions]})")
            version, _, groups = held[0]
        else:
            version, _, groups = versions[-1]
        if len(request.groups) > MAX_ENTRIES:
            raise _Invalid(f"field groups: {len(request.groups)} entries, at most {MAX_ENTRIES}")
        # Every entry is decoded and its answer's size added up before any row is gathered: a request whose answer
        # would exceed the limit costs its decoding only, and names the entry that crossed it.
        decoded, response_bytes = [], _VERSION_FIELD_BYTES
        for index, entry in enumerate(request.groups):
            part = self._decode(index, entry, groups)
            response_bytes += part.response_bytes
            if response_bytes > self.max_response_bytes:
                raise _Invalid(f"group {entry.group!r} (entry {index}): the response would exceed "
                               f"{self.max_response_bytes} bytes (--max-response-mb); send fewer ids per request")
            decoded.append(part)
        return pb.LookupResponse(groups=[self._answer_group(part) for part in decoded],
                                 version=version).SerializeToString()

    @staticmethod
    def _answer_group(part):
        rows_of, ids, categories, dim = part.rows_of, part.ids, part.categories, part.rows_of.dim
        if part.segments is None:
            rows, not_trained = rows_of.lookup(ids, categories)
            return pb.GroupResult(group=part.group, dim=dim, rows=rows.astype("<f4").tobytes(),
                                  not_trained=not_trained)
        # Each distinct pair once: bags repeat ids, and an untrained id's initializer row costs a hash per element.
        first, inverse = unique_pairs(ids, categories)
        distinct_rows, not_trained = rows_of.lookup(ids[first], categories[first])
        present, slot = part.present, part.slot
        sums = np.zeros((len(present), dim), np.float32)
        # In the order of the ids, as LocalBackend's pool (and training's unsorted_segment_sum) adds them.
        np.add.at(sums, slot, distinct_rows[inverse])
        counts = np.bincount(slot, minlength=len(present))
        return pb.GroupResult(group=part.group, dim=dim, segments=present.astype("<i4").tobytes(),
                              sums=sums.astype("<f4").tobytes(), counts=counts.astype("<i4").tobytes(),
                              not_trained=not_trained)

    def _decode(self, index, entry, groups=None):
        """A valid entry as a _Decoded (its arrays, and the size of its answer) over `groups` (a version's; None: the
        newest); _Invalid naming the group and the field otherwise."""
        where = f"group {entry.group!r} (entry {index})"
        groups = self.groups if groups is None else groups
        rows_of = groups.get(entry.group)
        if rows_of is None:
            raise _Invalid(f"{where}: field group: no such group on this server (groups: {sorted(groups)})")
        ids = _array(where, "ids", entry.ids, "<i8", "int64")
        categories = _array(where, "categories", entry.categories, "<i4", "int32")
        if len(categories) != len(ids):
            raise _Invalid(f"{where}: field categories has {len(categories)} values, field ids has {len(ids)}")
        if len(ids) and ids.min() < 0:
            raise _Invalid(f"{where}: field ids: {int((ids < 0).sum())} negative ids (first {int(ids[ids < 0][0])})")
        num_categories = len(rows_of.group["features"])
        if rows_of.group["encoding"] == "packed" and len(ids):
            # Larger ids would spill into the category bits of the key: another feature's row, silently.
            limit = 1 << (63 - hashing.packed_bits(num_categories))
            if ids.max() >= limit:
                raise _Invalid(f"{where}: field ids: {int((ids >= limit).sum())} ids do not fit the group's packed "
                               f"keys (ids must be < 2**{limit.bit_length() - 1}; first {int(ids[ids >= limit][0])})")
        bad = (categories < 0) | (categories >= num_categories)
        if bad.any():
            raise _Invalid(f"{where}: field categories: {int(categories[bad][0])} is out of range "
                           f"[0, {num_categories}) ({int(bad.sum())} such values)")
        categories = categories.astype(np.int64)
        segments = present = slot = None
        if entry.pool:
            segments = _array(where, "segments", entry.segments, "<i4", "int32")
            if len(segments) != len(ids):
                raise _Invalid(f"{where}: field segments has {len(segments)} values, field ids has {len(ids)}")
            if entry.num_segments < 0:
                raise _Invalid(f"{where}: field num_segments is {entry.num_segments}, must be >= 0")
            bad = (segments < 0) | (segments >= entry.num_segments)
            if bad.any():
                raise _Invalid(f"{where}: field segments: {int(segments[bad][0])} is out of range "
                               f"[0, num_segments={entry.num_segments}) ({int(bad.sum())} such values)")
            segments = segments.astype(np.int64)
            present, slot = np.unique(segments, return_inverse=True)
        elif entry.segments or entry.num_segments:
            raise _Invalid(f"{where}: fields segments / num_segments are given but field pool is false")
        routes = fmt.route(rows_of.keys_of(ids, categories))
        outside = ~fmt.in_range(routes, self.range_start, self.range_end)
        if outside.any():
            # A client whose routing table disagrees with the server's range would otherwise get initializer rows
            # for trained ids: a silent wrong answer.
            raise _Invalid(f"{where}: field ids: {int(outside.sum())} of {len(ids)} (id, category) pairs route "
                           f"outside this server's range [{self.range_start:#x}, {self.range_end:#x}) (first: id "
                           f"{int(ids[outside][0])}); the client's routing table disagrees with the server's")
        dim = rows_of.dim
        if segments is None:
            arrays = 4 * dim * len(ids)
        else:
            arrays = (4 * dim + 8) * len(present)  # sums, segments and counts of the segments present
        return _Decoded(entry.group, rows_of, ids, categories, segments, present, slot,
                        arrays + len(entry.group.encode()) + _RESULT_FRAMING_BYTES)


class _Handlers(grpc.GenericRpcHandler):
    """The server's method handlers, with publish calls authenticated from their metadata first: an unauthenticated
    Stage or Commit is answered by a handler that aborts without reading the request (a stream handler never asked
    for its messages), so none of its payload reaches the server's code."""

    def __init__(self, server, handlers):
        self._server, self._handlers = server, handlers

    def service(self, handler_call_details):
        service, _, method = handler_call_details.method.rpartition("/")
        handler = self._handlers.get(method) if service == f"/{SERVICE}" else None
        if handler is None or method not in PUBLISH_METHODS or not self._server.accept_publish:
            return handler
        presented = next((value for key, value in handler_call_details.invocation_metadata or ()
                          if key == security.TOKEN_METADATA), None)
        reason = self._server.guard.refusal(presented if isinstance(presented, str) else None)
        if reason is None:
            return handler
        return grpc.stream_unary_rpc_method_handler(
            lambda requests, context: self._server._refuse_publish(method, reason, context))  # noqa: SLF001


_Decoded = collections.namedtuple("_Decoded", ["group", "rows_of", "ids", "categories", "segments", "present", "slot",
                                               "response_bytes"])
_Decoded.__doc__ = """A valid Lookup entry: its group's name and GroupRows, ids, categories and (pooling) segments int64
[n], the segments present and the slot of each id among them (else None), and the bytes of its answer at most."""


def _array(where, field, data, dtype, name):
    size = np.dtype(dtype).itemsize
    if len(data) % size:
        raise _Invalid(f"{where}: field {field} has {len(data)} bytes, not a multiple of {size} ({name} "
                       f"little-endian)")
    return np.frombuffer(data, dtype).astype(np.int64)


# --- CLI ---------------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tf_fusedrec.serve.embedding_server",
                                     description="Serve one routing range of an export's embedding rows over gRPC.")
    parser.add_argument("--export", required=True, help="the export directory (fr.export)")
    parser.add_argument("--shard", type=int, default=0, help="serve even range SHARD of NUM_SHARDS (default 0)")
    parser.add_argument("--num-shards", type=int, default=1, help="number of even ranges (default 1: all)")
    parser.add_argument("--start", type=parse_hash, help="explicit range start (hex), with --end; overrides --shard")
    parser.add_argument("--end", type=parse_hash, help="explicit range end (hex, exclusive; 0x10000000000000000 "
                                                        "for the top of the space)")
    parser.add_argument("--port", type=int, required=True, help="port to serve (0: any free port, logged)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine)")
    parser.add_argument("--max-inflight", type=int, default=32, help="most lookups in flight (default 32)")
    parser.add_argument("--threads", type=int, default=4, help="most lookups computing at once (default 4)")
    parser.add_argument("--max-request-mb", type=int, default=64, help="largest request accepted (default 64)")
    parser.add_argument("--max-response-mb", type=int, default=512,
                        help="largest response sent; a lookup whose answer would be larger is refused before it is "
                             "computed (default 512)")
    parser.add_argument("--max-clients", type=int, default=64,
                        help="most clients registered for credits; the others share one pool (default 64)")
    parser.add_argument("--accept-publish", action="store_true",
                        help="take new versions of the rows from a trainer (Stage and Commit; python -m "
                             "tf_fusedrec.train --publish-to); beyond loopback it needs --publish-token-file or "
                             "--tls-client-auth (or --insecure)")
    parser.add_argument("--max-staged-mb", type=int, default=1024,
                        help="most MiB staged for one version before its commit (default 1024)")
    parser.add_argument("--catch-up", metavar="LOG",
                        help="a trainer's publish log (--publish-log): serve its newest version rather than the "
                             "export's rows")
    security.add_tls_flags(parser)
    security.add_publish_auth_flags(parser)
    args = parser.parse_args(argv)
    if (args.start is None) != (args.end is None):
        parser.error("--start and --end go together")
    if args.start is None:
        if not 0 <= args.shard < args.num_shards:
            parser.error(f"--shard {args.shard} must be in [0, --num-shards {args.num_shards})")
        args.start, args.end = fmt.even_ranges(args.num_shards)[args.shard]
    elif not args.start < args.end:
        parser.error(f"--start {args.start:#x} must be below --end {args.end:#x}")
    return args


def main(argv=None):
    args = parse_args(argv)
    stop = threading.Event()
    # The handler only has the event set, from a thread of its own: the main thread, not a signal handler, runs the
    # shutdown, and a handler that took the event's lock itself could interrupt the main thread while it holds that
    # lock inside stop.wait() (a second SIGTERM, say the parent's death signal after a test's) and wait for it forever.
    # The main thread waits in short slices (below): Linux may deliver a SIGTERM sent to the process to any of its
    # threads (gRPC's, say), and CPython then runs the handler only when the main thread next runs Python code, which
    # a main thread blocked in an untimed wait never does: such a server ignored its parent's death.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: threading.Thread(target=stop.set, daemon=True).start())
    lifetime.exit_with_parent()
    security.log_to_stderr()
    try:
        tls = security.TLS.from_args(args)
        token = security.read_token(args.publish_token_file) if args.publish_token_file else None
        server = EmbeddingServer(args.export, args.start, args.end, max_inflight=args.max_inflight,
                                 threads=args.threads, max_request_mb=args.max_request_mb,
                                 max_response_mb=args.max_response_mb, host=args.host, max_clients=args.max_clients,
                                 accept_publish=args.accept_publish, max_staged_mb=args.max_staged_mb,
                                 catch_up=args.catch_up, tls=tls, publish_token=token, insecure=args.insecure)
        server.start(args.port)
    except (fmt.ExportError, ValueError, RuntimeError, OSError) as e:
        print(f"embedding_server: {e}", file=sys.stderr, flush=True)
        return 2
    try:  # the gRPC threads keep the process alive: they stop whatever ends this (a print to a closed pipe too)
        print(server.describe(), file=sys.stderr, flush=True)
        print("ready", flush=True)
        while not stop.wait(SIGNAL_POLL_S):
            pass
    finally:
        server.stop(grace=2.0)
    print("embedding_server: stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

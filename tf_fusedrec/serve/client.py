"""RemoteBackend: a serving model's embedding rows from embedding servers over gRPC (embedding_server.py).

The three steps of a lookup, each a function or class below:

  route     table keys of the (id, category) pairs -> their route (format.route) -> the range holding it
            (RangeTable, FlexEMR's range-based routing table: one (start, end) -> servers entry per range, not one
            entry per id);
  send      one sub-request per range, in chunks the server accepts, all concurrently from a pool of I/O threads;
            each waits for a credit of its server first (_CreditGate: the server's Credits answer, polled in the
            background on a gRPC channel of its own, sizes it), so a burst queues on the client instead of
            overflowing the server (FlexEMR section 3.2, credit-based flow control);
  gather    rows are scattered back to the pairs asked; pooled lookups add the servers' partial sums per segment
            (FlexEMR section 3.1.2, hierarchical pooling: one row per (segment, server) crosses the network).

A server that is down fails fast (no waiting for it to come up: wait_for_ready=False) with ServerUnavailable naming
it and the group, or, where its range lists replicas, the lookup goes on to the next replica. gRPC channels reconnect
on their own (with a short backoff set here), so lookups succeed again once the server is back.

With `tls` (security.TLS with a CA) every channel is TLS: the server's certificate must chain to the CA and name the
address's host; the client presents its own certificate where it has one (servers with --tls-client-auth). A failed
handshake is a ServerUnavailable naming its cause (security.explain).
"""

import itertools
import os
import threading
import time
import uuid
from concurrent import futures

import grpc
import numpy as np

from tf_fusedrec.export import format as fmt
from tf_fusedrec.serve import embedding_pb2 as pb
from tf_fusedrec.serve import embedding_server, security
from tf_fusedrec.serve.backend import Backend, Lookup, pool

# Bytes of one id in a request: int64 id + int32 category + int32 segment.
_REQUEST_BYTES_PER_ID = 16
# Room for a request's protobuf framing and group name.
_REQUEST_OVERHEAD = 4096
# Pause between retries of a Lookup the server refused as busy (it had --max-inflight lookups in flight).
_BUSY_BACKOFF_S = 0.005


class RemoteError(RuntimeError):
    """A lookup failed on an embedding server; the message names the server and the group.

    Attributes:
      address: the server ("host:port"); group: the group looked up; code: the grpc.StatusCode, or None.
    """

    def __init__(self, message, address, group, code=None):
        super().__init__(message)
        self.address, self.group, self.code = address, group, code


class ServerUnavailable(RemoteError):
    """The server (and every replica of its range) is down or did not answer in time."""


class ServerBusy(RemoteError):
    """No credit of the server came free in time, or the server kept refusing the lookup as busy."""


# --- routing ---------------------------------------------------------------------------------------------------------


class RangeTable:
    """Which servers hold which routing range: [(start, end, (address, replica, ...))] covering [0, 2**64) once.

    A route r (format.route of a table key) goes to the entry with start <= r < end; its first address is the
    primary, the others are replicas tried in order when it is down.

    Args:
      entries: [(start, end, address or [address, replica, ...])]; ValueError unless the ranges cover the hash
        space with no gap and no overlap (format.check_ranges) and each has at least one address.
    """

    def __init__(self, entries):
        normalized = []
        for start, end, given in entries:
            addresses = (given,) if isinstance(given, str) else tuple(given)
            if not addresses or not all(isinstance(a, str) and a for a in addresses):
                raise ValueError(f"range ({start:#x}, {end:#x}): needs at least one 'host:port' address, got "
                                 f"{given!r}")
            normalized.append((int(start), int(end), addresses))
        fmt.check_ranges([(start, end) for start, end, _ in normalized])
        self.entries = tuple(sorted(normalized))
        self._starts = np.array([start for start, _, _ in self.entries], np.uint64)

    @classmethod
    def even(cls, servers):
        """Even ranges (format.even_ranges), range i served by servers[i]: an address or a list of replicas."""
        if isinstance(servers, str) or not servers:
            raise ValueError(f"servers must be a non-empty list of 'host:port' (or of replica lists), got "
                             f"{servers!r}")
        return cls([(start, end, s) for (start, end), s in zip(fmt.even_ranges(len(servers)), servers)])

    def __len__(self):
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def __eq__(self, other):
        return isinstance(other, RangeTable) and self.entries == other.entries

    def __hash__(self):
        return hash(self.entries)

    def __repr__(self):
        rows = ", ".join(f"[{start:#x}, {end:#x}) -> {list(addresses)}" for start, end, addresses in self.entries)
        return f"RangeTable({rows})"

    @property
    def ranges(self):
        return [(start, end) for start, end, _ in self.entries]

    @property
    def addresses(self):
        """Every address, primaries and replicas, each once, in table order."""
        return list(dict.fromkeys(a for _, _, addresses in self.entries for a in addresses))

    def index(self, routes):
        """int64 [n]: the entry of each route (uint64 [n])."""
        return np.searchsorted(self._starts, np.asarray(routes, np.uint64), side="right").astype(np.int64) - 1

    def split(self, address, new_address, at=None):
        """A new table where new_address serves the upper part of the range whose primary is `address`.

        Args:
          address: the primary of the range to split (it must be the primary of exactly one range).
          new_address: the server of [at, end).
          at: where to split (default: the middle of the range); start < at < end.

        Returns:
          RangeTable: `address` (and its replicas) keep [start, at), new_address gets [at, end).
        """
        matches = [i for i, (_, _, addresses) in enumerate(self.entries) if addresses[0] == address]
        if len(matches) != 1:
            raise ValueError(f"split: {address!r} is the primary of {len(matches)} ranges of {self!r}, not one")
        start, end, addresses = self.entries[matches[0]]
        at = (start + end) // 2 if at is None else int(at)
        if not start < at < end:
            raise ValueError(f"split: {at:#x} is not inside {address}'s range ({start:#x}, {end:#x})")
        entries = list(self.entries)
        entries[matches[0]:matches[0] + 1] = [(start, at, addresses), (at, end, (new_address,))]
        return RangeTable(entries)


# --- flow control ----------------------------------------------------------------------------------------------------


class _CreditGate:
    """A server's credits: at most `limit` lookups in flight; the limit follows the server's Credits answers.

    Not a Semaphore because the limit changes while lookups are in flight, and the queue depth (lookups waiting for
    a credit plus those in flight) is reported.
    """

    def __init__(self, limit):
        self._cond = threading.Condition()
        self.limit = max(1, int(limit))
        self.inflight = 0
        self.waiting = 0
        self.max_depth = 0

    def acquire(self, timeout):
        """Takes a credit; False if none came free within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self.waiting += 1
            self.max_depth = max(self.max_depth, self.waiting + self.inflight)
            try:
                while self.inflight >= self.limit:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._cond.wait(remaining)
                self.inflight += 1
                return True
            finally:
                self.waiting -= 1

    def release(self):
        with self._cond:
            self.inflight -= 1
            self._cond.notify()

    def set_limit(self, limit):
        with self._cond:
            self.limit = max(1, int(limit))
            self._cond.notify_all()

    @property
    def depth(self):
        return self.waiting + self.inflight


def _channel_options(max_message_bytes, reconnect_backoff_s):
    backoff_ms = max(1, int(reconnect_backoff_s * 1000))
    return [("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # Each channel its own TCP connection: channels with equal arguments would otherwise share one, and the
            # Credits polls would queue behind large Lookup responses (FlexEMR's head-of-line blocking).
            ("grpc.use_local_subchannel_pool", 1),
            # gRPC's default reconnect backoff grows to 120 s: a restarted server would stay unused that long.
            ("grpc.initial_reconnect_backoff_ms", min(100, backoff_ms)),
            ("grpc.min_reconnect_backoff_ms", min(100, backoff_ms)),
            ("grpc.max_reconnect_backoff_ms", backoff_ms)]


class _Server:
    """One embedding server as the client sees it: its lookup and control channels, credits and counters."""

    def __init__(self, address, options, initial_credits, tls=None):
        self.address = address
        self.lookup_channel = security.grpc_channel(address, tls, options)
        self.control_channel = security.grpc_channel(address, tls, options)
        # Raw bytes both ways: the client serializes and parses itself, so that it knows the bytes moved.
        self.lookup = self.lookup_channel.unary_unary(embedding_server.LOOKUP_METHOD)
        self.credits = self.control_channel.unary_unary(embedding_server.CREDITS_METHOD)
        self.info = self.control_channel.unary_unary(embedding_server.INFO_METHOD)
        self.gate = _CreditGate(initial_credits)
        self.lock = threading.Lock()
        self.verified = False
        self.limits = None  # (max_request_bytes, max_response_bytes) from Info
        self.up = None  # the last Credits poll answered (None: not polled yet)
        self.server_state = {}  # the last Credits answer
        self.requests = self.errors = self.busy_retries = self.failovers = 0
        self.bytes_sent = self.bytes_received = 0

    def add(self, **counts):
        with self.lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def close(self):
        self.lookup_channel.close()
        self.control_channel.close()


# --- the backend -----------------------------------------------------------------------------------------------------


class RemoteBackend(Backend):
    """Embedding rows from embedding servers over gRPC (the Backend interface of backend.py).

    Args:
      manifest: the export's manifest dict, or the export directory (its manifest is read).
      servers: a RangeTable, or a list of "host:port" (or of replica lists ["host:port", ...]): even ranges, range i
        served by servers[i].
      pooling: pooled() sums on the servers (partial sums per segment, added here); False: pooled() fetches the
        rows and sums here (to compare the bytes moved).
      io_threads: threads sending sub-requests concurrently.
      timeout_s: a lookup's deadline, credit wait included.
      credits_poll_s: how often the servers' Credits are read.
      connect_timeout_s: deadline of the Info and Credits calls (checking a server, polling it).
      max_ids_per_request: most ids in one sub-request (fewer where a server's --max-request-mb or
        --max-response-mb needs it).
      max_message_mb: largest response accepted.
      reconnect_backoff_s: longest pause between attempts to reconnect to a server that is down.
      initial_credits: credits of a server before its first Credits answer.
      tls: a security.TLS with a CA: TLS to every server (its certificate presented under mutual TLS); None: plain.

    Raises:
      ValueError naming the server when a server that answers holds another export or does not hold the range the
      table gives it; ServerUnavailable is raised by lookups, not here (a server may come up later).
    """

    def __init__(self, manifest, servers, pooling=True, io_threads=8, timeout_s=5.0, credits_poll_s=0.05,
                 connect_timeout_s=2.0, max_ids_per_request=1 << 16, max_message_mb=1024, reconnect_backoff_s=0.5,
                 initial_credits=1, tls=None):
        if isinstance(manifest, (str, os.PathLike)):
            manifest = fmt.read_manifest(manifest)
        self.manifest = manifest
        self.table = servers if isinstance(servers, RangeTable) else RangeTable.even(servers)
        self.pooling = pooling
        self.timeout_s, self.credits_poll_s, self.connect_timeout_s = timeout_s, credits_poll_s, connect_timeout_s
        self.max_ids_per_request = int(max_ids_per_request)
        if self.max_ids_per_request < 1:
            raise ValueError(f"max_ids_per_request must be >= 1, got {max_ids_per_request}")
        self.groups = {g["name"]: g for g in manifest["groups"]}
        self.fingerprint = embedding_server.export_fingerprint(manifest)
        self.client_id = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        options = _channel_options(max_message_mb * embedding_server.MB, reconnect_backoff_s)
        self.tls = tls
        self._servers = {a: _Server(a, options, initial_credits, tls) for a in self.table.addresses}
        self._pool = futures.ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="remote_backend_io")
        self._lock = threading.Lock()
        self._looked_up = self._not_trained = 0
        self._closed = threading.Event()
        # Check every server that answers now; the others are checked before their first lookup.
        self._poll_credits()
        try:
            for server in self._servers.values():
                if server.up:
                    try:
                        self._verify(server)
                    except ServerUnavailable:
                        pass  # it answered Credits but not Info: checked again before its first lookup
        except ValueError:
            self._pool.shutdown(wait=False)
            for server in self._servers.values():
                server.close()
            raise
        self._poller = threading.Thread(target=self._poll_loop, name="remote_backend_credits", daemon=True)
        self._poller.start()

    # --- the Backend interface -------------------------------------------------------------------------------------

    versioned = True

    def rows(self, group, ids, categories, version=None):
        """float32 [n, dim]: the row of each (id, category) pair; each distinct pair is asked once.

        Args:
          group: the group's name; ids: int64 [n] (>= 0); categories: int [n], the category of each id.
          version: the committed version to read (None: each server's newest); RemoteError (FAILED_PRECONDITION)
            from a server that does not hold it.
        """
        return self.lookup_many([Lookup(group, ids, categories)], version=version)[0]

    def pooled(self, group, ids, categories, segments, num_segments, version=None):
        """(float32 [S, dim] sums, int64 [S] counts) of the rows per segment; the servers sum their part.

        Args:
          group / ids / categories / version: as rows(); segments: int [n], the segment of each id, in
            [0, num_segments).
        """
        return self.lookup_many([Lookup(group, ids, categories, segments, num_segments)], version=version)[0]

    def lookup_many(self, lookups, version=None):
        """rows() and pooled() answers of several Lookups (backend.py), in order: the entries bound for one server
        travel in one request (as many as its limits allow), and every server's requests are in flight together, so
        a batch's groups cost one round trip, not one per group and kind."""
        # One part per lookup: what to ask the servers; and for rows, (inverse of the distinct pairs, (segments,
        # num_segments) when they are pooled here) to assemble the answer; None for bags the servers pool.
        parts, assembly = [], []
        for q in lookups:
            spec, ids, categories = self._check(q.group, q.ids, q.categories)
            segments = num_segments = None
            if q.segments is not None:
                segments, num_segments = self._check_segments(q.group, ids, q.segments, q.num_segments)
            if segments is not None and self.pooling:
                parts.append((q.group, spec, ids, categories, segments, num_segments))
                assembly.append(None)
                continue
            # Rows: each distinct pair once (pooling off: the rows are summed here, as Backend.pooled does).
            first, inverse = embedding_server.unique_pairs(ids, categories)
            parts.append((q.group, spec, ids[first], categories[first], None, None))
            assembly.append((inverse, None if segments is None else (segments, num_segments)))
        out = []
        for (group, spec, ids, _, _, num_segments), jobs, rows_plan in zip(parts, self._submit(parts, version),
                                                                             assembly):
            not_trained = 0
            if rows_plan is not None:
                inverse, pool_here = rows_plan
                distinct = np.empty((len(ids), spec["dim"]), np.float32)
                for chunk, job, k in jobs:
                    address, results = job.result()
                    distinct[chunk] = _decode(results[k].rows, "<f4", (len(chunk), spec["dim"]), address, group,
                                              "rows")
                    not_trained += results[k].not_trained
                rows = distinct[inverse]
                looked_up = len(inverse)
                out.append(rows if pool_here is None else pool(rows, *pool_here))
            else:
                sums = np.zeros((num_segments, spec["dim"]), np.float32)
                counts = np.zeros(num_segments, np.int64)
                for _, job, k in jobs:
                    address, results = job.result()
                    result = results[k]
                    present = _decode(result.segments, "<i4", None, address, group, "segments")
                    if len(present) and (present.min() < 0 or present.max() >= num_segments):
                        raise RemoteError(f"server {address}, group {group!r}: answered segments outside "
                                          f"[0, {num_segments})", address, group)
                    # The servers' partial sums: each segment appears once per answer, so += adds them all.
                    sums[present] += _decode(result.sums, "<f4", (len(present), spec["dim"]), address, group, "sums")
                    counts[present] += _decode(result.counts, "<i4", (len(present),), address, group, "counts")
                    not_trained += result.not_trained
                looked_up = len(ids)
                out.append((sums, counts))
            with self._lock:
                self._looked_up += looked_up
                self._not_trained += not_trained
        return out

    def stats(self):
        """Counters: totals, and per server (address): requests, errors, bytes sent and received, credits, in flight,
        queue depth (waiting for a credit + in flight) and its high-water mark, retries after a busy answer,
        failovers to a replica, whether it answered its last Credits poll, and its own last Credits answer."""
        per_server = {}
        for address, s in self._servers.items():
            with s.lock:
                per_server[address] = {
                    "requests": s.requests, "errors": s.errors, "bytes_sent": s.bytes_sent,
                    "bytes_received": s.bytes_received, "busy_retries": s.busy_retries, "failovers": s.failovers,
                    "credits": s.gate.limit, "inflight": s.gate.inflight, "queue_depth": s.gate.depth,
                    "max_queue_depth": s.gate.max_depth, "up": s.up, "server": dict(s.server_state)}
        with self._lock:
            totals = {"rows_looked_up": self._looked_up, "rows_not_trained": self._not_trained}
        for name in ("requests", "errors", "bytes_sent", "bytes_received"):
            totals[name] = sum(s[name] for s in per_server.values())
        return {**totals, "servers": per_server}

    def close(self):
        """Stops the Credits poller, the I/O threads and the channels."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._poller.join(timeout=self.connect_timeout_s + 1.0)
        self._pool.shutdown(wait=True)
        for server in self._servers.values():
            server.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- route and send --------------------------------------------------------------------------------------------

    def _submit(self, parts, version=None):
        """Routes each part's pairs to their ranges and sends every range's server its pairs of all parts, packed into
        as few requests as its limits allow, from the I/O threads; -> per part [(chunk: positions in the part's ids,
        future of (address, [GroupResult]), the chunk's entry in that answer)].

        Args:
          parts: [(group, spec, ids, categories, segments or None, num_segments)] (segments: pooled on the server).
          version: the committed version every server is asked for (None: its newest).
        """
        by_range, limits = {}, {}  # range -> [(part, chunk)] in the order of the parts; range -> its servers' limits
        for p, (_, spec, ids, categories, _, _) in enumerate(parts):
            entry = self.table.index(fmt.route(fmt.table_keys(ids, categories, len(spec["features"]),
                                                              spec["encoding"])))
            for r in np.unique(entry).tolist():
                if r not in limits:
                    limits[r] = self._limits(r)
                # Kept in the order asked: a pooling server adds its rows in the order of the ids, as training does.
                for chunk in self._chunks(limits[r], np.flatnonzero(entry == r), spec["dim"]):
                    by_range.setdefault(r, []).append((p, chunk))
        jobs = [[] for _ in parts]

        def send(r, packed):
            entries = []
            for p, chunk in packed:
                group, _, ids, categories, segments, num_segments = parts[p]
                pooling = {} if segments is None else {
                    "pool": True, "segments": segments[chunk].astype("<i4").tobytes(), "num_segments": num_segments}
                entries.append(pb.GroupLookup(group=group, ids=ids[chunk].astype("<i8").tobytes(),
                                              categories=categories[chunk].astype("<i4").tobytes(), **pooling))
            request = pb.LookupRequest(groups=entries, **({} if version is None else {"version": version}))
            job = self._pool.submit(self._send, r, [parts[p][0] for p, _ in packed], request)
            for k, (p, chunk) in enumerate(packed):
                jobs[p].append((chunk, job, k))

        for r, items in by_range.items():
            max_request, max_response = limits[r]
            packed, used = [], (0, 0, 0)
            for p, chunk in items:
                n, dim = len(chunk), parts[p][1]["dim"]
                cost = (n, n * _REQUEST_BYTES_PER_ID + _REQUEST_OVERHEAD, n * (4 * dim + 8) + _REQUEST_OVERHEAD)
                total = tuple(u + c for u, c in zip(used, cost))
                if packed and (len(packed) >= embedding_server.MAX_ENTRIES or total[0] > self.max_ids_per_request
                               or total[1] > max_request or total[2] > max_response):
                    send(r, packed)
                    packed, total = [], cost
                packed.append((p, chunk))
                used = total
            send(r, packed)
        return jobs

    def _check_segments(self, group, ids, segments, num_segments):
        segments = np.asarray(segments, np.int64).reshape(-1)
        num_segments = int(num_segments)
        if len(segments) != len(ids):
            raise ValueError(f"group {group!r}: segments has {len(segments)} values, ids has {len(ids)}")
        if len(segments) and (segments.min() < 0 or segments.max() >= num_segments):
            raise ValueError(f"group {group!r}: segments must lie in [0, num_segments={num_segments})")
        return segments, num_segments

    def _check(self, group, ids, categories):
        spec = self.groups.get(group)
        if spec is None:
            raise fmt.ExportError(f"the export has no group {group!r} (groups: {sorted(self.groups)})")
        ids = np.asarray(ids, np.int64).reshape(-1)
        categories = np.asarray(categories, np.int64).reshape(-1)
        if len(categories) != len(ids):
            raise ValueError(f"group {group!r}: categories has {len(categories)} values, ids has {len(ids)}")
        if len(ids) and ids.min() < 0:
            raise ValueError(f"group {group!r}: ids must be >= 0, got {ids.min()}")
        num_categories = len(spec["features"])
        if len(categories) and (categories.min() < 0 or categories.max() >= num_categories):
            raise ValueError(f"group {group!r}: categories must lie in [0, {num_categories})")
        return spec, ids, categories

    def _limits(self, r):
        """(request bytes, response bytes) that every server of range r accepts (unknown before its Info: no limit)."""
        max_request = max_response = float("inf")
        for address in self.table.entries[r][2]:
            limits = self._servers[address].limits
            if limits is not None:
                max_request, max_response = min(max_request, limits[0]), min(max_response, limits[1])
        return max_request, max_response

    def _chunks(self, limits, members, dim):
        """members split so that each request and its response fit `limits` (_limits() of their range)."""
        max_request, max_response = limits
        limit = self.max_ids_per_request
        if max_request < float("inf"):
            limit = min(limit, int((max_request - _REQUEST_OVERHEAD) // _REQUEST_BYTES_PER_ID))
        if max_response < float("inf"):
            limit = min(limit, int((max_response - _REQUEST_OVERHEAD) // (4 * dim + 8)))
        limit = max(1, limit)
        return [members[i:i + limit] for i in range(0, len(members), limit)]

    def _send(self, r, groups, request):
        """(address, [GroupResult] in the order of the request's entries) of a request to range r: its primary, else
        its replicas in order. groups: the entries' group names."""
        deadline = time.monotonic() + self.timeout_s
        payload = request.SerializeToString()
        version = request.version if request.HasField("version") else None
        addresses = self.table.entries[r][2]
        named = ", ".join(dict.fromkeys(groups))  # the groups asked, each once, for messages
        failures = []
        for address in addresses:
            server = self._servers[address]
            try:
                return address, self._attempt(server, groups, named, payload, deadline, version)
            except ServerUnavailable as e:
                failures.append(e)
                if address != addresses[-1]:
                    server.add(failovers=1)
        if len(addresses) == 1:
            raise failures[0]
        raise ServerUnavailable(f"group {named!r}: every replica of range {self.table.entries[r][0]:#x}.."
                                f"{self.table.entries[r][1]:#x} failed: " + "; ".join(map(str, failures)),
                                addresses[0], named)

    def _attempt(self, server, groups, group, payload, deadline, version=None):
        """[GroupResult] of one server's answer to a request for `groups` (group: their names for messages)."""
        address = server.address
        if not server.verified:
            self._verify(server, group)
        if not server.gate.acquire(max(0.0, deadline - time.monotonic())):
            server.add(errors=1)
            raise ServerBusy(f"server {address}, group {group!r}: no credit came free within {self.timeout_s} s "
                             f"({server.gate.limit} credits, {server.gate.inflight} lookups in flight)",
                             address, group)
        try:
            for attempt in itertools.count():
                remaining = deadline - time.monotonic()
                try:
                    server.add(requests=1, bytes_sent=len(payload))
                    answer = server.lookup(payload, timeout=max(0.001, remaining), wait_for_ready=False)
                    server.add(bytes_received=len(answer))
                    break
                except grpc.RpcError as e:
                    code = e.code()
                    busy = code == grpc.StatusCode.RESOURCE_EXHAUSTED and embedding_server.BUSY_METADATA in (
                        e.trailing_metadata() or ())
                    if busy and deadline - time.monotonic() > _BUSY_BACKOFF_S:
                        # Another client took the server's capacity (credits are shares, refreshed every poll).
                        server.add(busy_retries=1)
                        time.sleep(_BUSY_BACKOFF_S * min(attempt + 1, 20))
                        continue
                    server.add(errors=1)
                    message = (f"server {address}, group {group!r}: {code.name}: {e.details()}"
                               f"{security.explain(e.details(), self.tls)}")
                    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                        # Whatever answers at this address next may be another server: check it again first.
                        server.verified = False
                        raise ServerUnavailable(message, address, group, code) from None
                    if busy:
                        raise ServerBusy(message, address, group, code) from None
                    raise RemoteError(message, address, group, code) from None
        finally:
            server.gate.release()
        response = pb.LookupResponse.FromString(answer)
        if version is not None and response.version != version:
            raise RemoteError(f"server {address}, group {group!r}: answered version {response.version} to a lookup "
                              f"of version {version}", address, group)
        answered = [g.group for g in response.groups]
        if answered != list(groups):
            raise RemoteError(f"server {address}, group {group!r}: answered {len(answered)} results ({answered}) to "
                              f"a request for {list(groups)}", address, group)
        return list(response.groups)

    # --- checking servers and polling credits ----------------------------------------------------------------------

    def _verify(self, server, group=None):
        """Checks that a server holds this export and the ranges the table gives it (once per server)."""
        address = server.address
        try:
            info = pb.InfoResponse.FromString(
                server.info(b"", timeout=self.connect_timeout_s, wait_for_ready=False))
        except grpc.RpcError as e:
            server.add(errors=1)
            raise ServerUnavailable(f"server {address}" + (f", group {group!r}" if group else "") +
                                    f": {e.code().name}: {e.details()}{security.explain(e.details(), self.tls)}",
                                    address, group, e.code()) from None
        if info.fingerprint != self.fingerprint:
            raise ValueError(f"server {address} serves another export ({info.export_dir}, tables "
                             f"{info.fingerprint[:12]}), not this manifest's (tables {self.fingerprint[:12]})")
        held_start, held_end = info.range_start, info.range_last + 1
        for start, end, addresses in self.table:
            if address in addresses and not held_start <= start < end <= held_end:
                raise ValueError(f"server {address} holds the range [{held_start:#x}, {held_end:#x}), the routing "
                                 f"table gives it [{start:#x}, {end:#x})")
        with server.lock:
            server.limits = (info.max_request_bytes, info.max_response_bytes)
            server.verified = True

    def _poll_credits(self):
        """Reads every server's Credits at once (futures), and sizes its credits from the answer."""
        request = pb.CreditsRequest(client_id=self.client_id).SerializeToString()
        calls = {a: s.credits.future(request, timeout=self.connect_timeout_s, wait_for_ready=False)
                 for a, s in self._servers.items()}
        for address, call in calls.items():
            server = self._servers[address]
            try:
                answer = pb.CreditsResponse.FromString(call.result())
            except grpc.RpcError:
                with server.lock:
                    server.up = False
                    # Whatever answers at this address next may be another server: check it again first.
                    server.verified = False
                continue
            server.gate.set_limit(answer.credits)
            with server.lock:
                server.up = True
                server.server_state = {f.name: getattr(answer, f.name) for f in answer.DESCRIPTOR.fields}

    def _poll_loop(self):
        while not self._closed.wait(self.credits_poll_s):
            self._poll_credits()


def _decode(data, dtype, shape, address, group, field):
    """A numpy array from an answer's bytes; RemoteError naming the server, group and field if the size is wrong."""
    size = np.dtype(dtype).itemsize
    expected = size * int(np.prod(shape)) if shape is not None else None
    if len(data) % size or (expected is not None and len(data) != expected):
        raise RemoteError(f"server {address}, group {group!r}: field {field} has {len(data)} bytes, expected "
                          f"{expected if expected is not None else f'a multiple of {size}'}", address, group)
    array = np.frombuffer(data, dtype)
    return array.reshape(shape) if shape is not None else array

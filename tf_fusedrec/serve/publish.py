"""Publishing a training model to running servers: versions of the rows and the dense weights, swapped in atomically.

A version v goes out in three steps, each a part of this module (the trainer's side is train/publishing.py):

  stage    every worker sends the rows it owns that changed since the last published version (and the keys it
           removed) to the embedding servers whose routing ranges hold them (Publisher.stage: StageRequests, chunked
           under the servers' request limit, to every replica of a range); nothing is served from staged rows;
  commit   once every worker staged, one worker commits v on every server (Publisher.commit): each server makes v
           its newest version, keeping the version the rankers serve;
  install  that worker then sends the dense weights of v to each ranker's publish endpoint (push_dense); the ranker
           checks that every embedding server holds v, puts the weights into its spare copy of the dense SavedModel
           and makes v current between two batches (ServingModel.install_version).

A ranker answers each batch from one version, rows and dense weights together (its lookups name the version). A
publish that fails before the commit leaves every server and ranker on the previous version; one that fails during
the commit or the install leaves the rankers on the previous version, which every server still holds (a commit keeps
the versions from the one the rankers serve); the next publish carries every row changed since the last version that
reached the rankers, so it repairs what the failed one left.

The ranker's publish endpoint (serve_publish; `python -m tf_fusedrec.serve.ranker --publish-port P`) listens on a
port of its own, on 127.0.0.1 unless told otherwise:

  GET  /publish/targets                      the ranker's embedding servers (routing ranges and addresses), its
                                             version and step, and its dense weights (name, shape, dtype)
  POST /publish/dense?version=V&step=S       body: an .npz of the dense weights w0..wN (no pickles); 200 once V is
                                             current, 409 when a server does not hold V or V is not above the
                                             ranker's version, 400 naming a weight that does not fit, 413 beyond
                                             --max-publish-mb

Security (tf_fusedrec/serve/security.py): the endpoint serves HTTPS with the ranker's --tls-cert/--tls-key (mutual
TLS with --tls-client-auth); with --publish-token-file every request must carry "Authorization: Bearer TOKEN",
checked before any byte of a body is read (401 otherwise, logged with the peer's address, the connection closed).
The trainer's side (Publisher, ranker_targets, push_dense) takes the same settings: `tls` (a security.TLS with a CA:
HTTPS and gRPC over TLS) and `token` (sent with every Stage, Commit and endpoint request).
"""

import http.client
import io
import json
import os
import shutil
import ssl
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import numpy as np

from tf_fusedrec.export import format as fmt
from tf_fusedrec.serve import embedding_pb2 as pb
from tf_fusedrec.serve import embedding_server, security
from tf_fusedrec.serve.client import RangeTable

STAGE_METHOD = f"/{embedding_server.SERVICE}/Stage"
COMMIT_METHOD = f"/{embedding_server.SERVICE}/Commit"
# Bytes of one staged row's request beyond its float32 values: the key.
_KEY_BYTES = 8
# Room for a StageRequest's framing and group name.
_STAGE_OVERHEAD = 4096
# The largest StageRequest sent (smaller messages keep memory spikes small); less to a server that accepts less
# (its InfoResponse.max_request_bytes, --max-request-mb).
MAX_STAGE_BYTES = 16 << 20
MB = 1 << 20


class PublishError(RuntimeError):
    """A publish step failed; the message names the server or ranker and what it answered."""


def _rpc_error(address, what, e, tls=None):
    return PublishError(f"server {address}: {what}: {e.code().name}: {e.details()}{security.explain(e.details(), tls)}")


class Publisher:
    """Stages and commits versions on the embedding servers of a RangeTable (every replica of each range).

    Args:
      table: a RangeTable, or [(start, end, [addresses])] as a ranker's /publish/targets gives it.
      timeout_s: deadline of each call.
      tls: a security.TLS with a CA (TLS to the servers; its certificate presented under mutual TLS), or None.
      token: the publish token (bytes, security.read_token) sent with every Stage and Commit, or None.
    """

    def __init__(self, table, timeout_s=60.0, tls=None, token=None):
        self.table = table if isinstance(table, RangeTable) else RangeTable(table)
        self.timeout_s, self.tls = timeout_s, tls
        # The token's metadata on Stage and Commit (none without a token).
        self._auth = {"metadata": ((security.TOKEN_METADATA, security.bearer(token)),)} if token is not None else {}
        options = [("grpc.max_send_message_length", 2 * MAX_STAGE_BYTES),
                   ("grpc.max_receive_message_length", 64 * MB)]
        self._channels = {a: security.grpc_channel(a, tls, options) for a in self.table.addresses}
        self._calls = {a: {name: channel.unary_unary(method) for name, method in (
            ("stage", STAGE_METHOD), ("commit", COMMIT_METHOD), ("info", embedding_server.INFO_METHOD))}
            for a, channel in self._channels.items()}
        self._lock = threading.Lock()
        self._max_request = {}  # address: the largest request it accepts, from its Info
        self.bytes_sent = 0

    def close(self):
        for channel in self._channels.values():
            channel.close()

    def info(self, address):
        """The InfoResponse of one server; PublishError when it does not answer."""
        try:
            info = pb.InfoResponse.FromString(self._calls[address]["info"](
                pb.InfoRequest().SerializeToString(), timeout=self.timeout_s))
        except grpc.RpcError as e:
            raise _rpc_error(address, "Info", e, self.tls) from None
        if info.max_request_bytes > 0:
            self._max_request[address] = info.max_request_bytes
        return info

    def stage_bytes(self, addresses):
        """The largest StageRequest to send to all of `addresses`: MAX_STAGE_BYTES, or less where a server accepts
        less (asked once per server)."""
        limit = MAX_STAGE_BYTES
        for address in addresses:
            if address not in self._max_request:
                self.info(address)
            limit = min(limit, self._max_request.get(address, MAX_STAGE_BYTES))
        return limit

    def newest_versions(self):
        """{address: newest version held}; PublishError naming a server that does not answer or takes no publish."""
        newest = {}
        for address in self.table.addresses:
            info = self.info(address)
            if not info.accepts_publish:
                raise PublishError(f"server {address} does not take publishes (start it with --accept-publish)")
            newest[address] = info.versions[-1].version if info.versions else embedding_server.EXPORT_VERSION
        return newest

    def stage(self, version, group, dim, keys, rows, removed, publish_id=0):
        """Sends a version's rows of one group (keys int64 [n], rows float32 [n, dim]) and removed keys (int64 [m])
        to the servers whose ranges hold them, in chunks; -> bytes sent. PublishError naming the first server that
        refused or did not answer. publish_id: the attempt (commit() takes the same); a server drops rows staged for
        the version by another attempt."""
        keys = np.asarray(keys, np.int64)
        rows = np.asarray(rows, np.float32).reshape(len(keys), dim)
        removed = np.asarray(removed, np.int64)
        entry_of_key = self.table.index(fmt.route(keys))
        entry_of_removed = self.table.index(fmt.route(removed))
        per_row = 4 * dim + _KEY_BYTES
        sent = 0
        for r, (_, _, addresses) in enumerate(self.table.entries):
            mine = np.flatnonzero(entry_of_key == r)
            gone = removed[entry_of_removed == r]
            if not len(mine) and not len(gone):
                continue
            room = max(_KEY_BYTES, self.stage_bytes(addresses) - _STAGE_OVERHEAD)
            chunk = max(1, room // per_row)
            # A server applies a version's removals before its rows, whatever the order they arrive in.
            requests = [pb.StageRequest(version=version, group=group, keys=keys[part].astype("<i8").tobytes(),
                                        rows=rows[part].astype("<f4").tobytes(), publish_id=publish_id)
                        for part in (mine[i:i + chunk] for i in range(0, len(mine), chunk))]
            removed_chunk = room // _KEY_BYTES
            requests += [pb.StageRequest(version=version, group=group, publish_id=publish_id,
                                         removed=gone[i:i + removed_chunk].astype("<i8").tobytes())
                         for i in range(0, len(gone), removed_chunk)]
            for request in requests:
                payload = request.SerializeToString()
                for address in addresses:
                    try:
                        self._calls[address]["stage"](payload, timeout=self.timeout_s, **self._auth)
                    except grpc.RpcError as e:
                        raise _rpc_error(address, f"Stage of version {version}, group {group!r}", e,
                                         self.tls) from None
                    sent += len(payload)
        with self._lock:
            self.bytes_sent += sent
        return sent

    def commit(self, version, step, full, keep_from, publish_id=0):
        """Commits `version` (the rows staged with publish_id) on every server -> {address: CommitResponse};
        PublishError naming every server that failed (the others have committed: they still hold keep_from, which
        the rankers serve)."""
        payload = pb.CommitRequest(version=version, full=full, step=step, keep_from=keep_from,
                                   publish_id=publish_id).SerializeToString()
        calls = {a: c["commit"].future(payload, timeout=self.timeout_s, **self._auth)
                 for a, c in self._calls.items()}
        answers, failures = {}, []
        for address, call in calls.items():
            try:
                answers[address] = pb.CommitResponse.FromString(call.result())
            except grpc.RpcError as e:
                failures.append(str(_rpc_error(address, f"Commit of version {version}", e, self.tls)))
        if failures:
            raise PublishError("; ".join(failures))
        return answers

    def versions_held(self):
        """{address: [versions held], or None for a server that does not answer}."""
        held = {}
        for address in self.table.addresses:
            try:
                held[address] = [v.version for v in self.info(address).versions]
            except PublishError:
                held[address] = None
        return held

    def lacking(self, version):
        """{address: [versions held]} of the servers that answer and do not hold `version` (a server that does not
        answer is left out: it may come up later)."""
        return {a: held for a, held in self.versions_held().items() if held is not None and version not in held}

    def holds(self, version):
        """[addresses of the servers that do not hold `version`] (those that do not answer included)."""
        return [a for a, held in self.versions_held().items() if held is None or version not in held]


# --- the publish log: catching up later -----------------------------------------------------------------------------
#
# DIR/v{version}/rank-{r}-of-{N}.npz   what rank r staged for the version: per group i, "{i}.keys", "{i}.rows",
#                                      "{i}.removed", and "groups" (the group names, JSON as uint8)
# DIR/v{version}/dense.npz             the dense weights w0..wN
# DIR/v{version}/manifest.json         {"version", "step", "full", "ranks"}: written last, by rank 0, once the
#                                      version reached the rankers; a directory without it is not a version
# A version is written into DIR/.tmp-v{version}/ and renamed into place whole. A full version makes the older ones
# useless: they are removed. Files are .npz without pickles.

LOG_MANIFEST = "manifest.json"


def _log_name(version):
    return f"v{int(version):010d}"


def _save_npz(path, arrays):
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_log_rank(log_dir, version, rank, size, groups):
    """Writes what one rank staged for `version` ({group: (keys, rows, removed)}) into the version's staging
    directory."""
    staging = os.path.join(log_dir, f".tmp-{_log_name(version)}")
    os.makedirs(staging, exist_ok=True)
    names = sorted(groups)
    arrays = {"groups": np.frombuffer(json.dumps(names).encode(), np.uint8)}
    for i, name in enumerate(names):
        keys, rows, removed = groups[name]
        arrays.update({f"{i}.keys": np.asarray(keys, np.int64), f"{i}.rows": np.asarray(rows, np.float32),
                       f"{i}.removed": np.asarray(removed, np.int64)})
    _save_npz(os.path.join(staging, f"rank-{rank}-of-{size}.npz"), arrays)


def write_log_version(log_dir, version, step, full, size, weights):
    """Rank 0, once `version` reached the rankers: its dense weights and manifest, then the rename into place; a full
    version removes the older ones."""
    staging = os.path.join(log_dir, f".tmp-{_log_name(version)}")
    _save_npz(os.path.join(staging, "dense.npz"), {f"w{i}": np.asarray(w) for i, w in enumerate(weights)})
    with open(os.path.join(staging, LOG_MANIFEST), "w") as f:
        json.dump({"version": int(version), "step": int(step), "full": bool(full), "ranks": int(size)}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(staging, os.path.join(log_dir, _log_name(version)))
    for name in os.listdir(log_dir):
        older = name.startswith(".tmp-v") and name < f".tmp-{_log_name(version)}"
        older |= full and name.startswith("v") and name < _log_name(version)
        if older:
            shutil.rmtree(os.path.join(log_dir, name), ignore_errors=True)


def drop_log_version(log_dir, version):
    """Removes what a failed publish of `version` wrote."""
    shutil.rmtree(os.path.join(log_dir, f".tmp-{_log_name(version)}"), ignore_errors=True)


def read_log(log_dir):
    """[manifest dict] of the versions in the log, oldest first, from the newest full one on; [] for an empty log.
    ValueError naming the directory when the versions do not start with a full one."""
    if not os.path.isdir(log_dir):
        raise ValueError(f"--catch-up {log_dir}: no such directory")
    manifests = []
    for name in sorted(os.listdir(log_dir)):
        path = os.path.join(log_dir, name, LOG_MANIFEST)
        if name.startswith("v") and os.path.exists(path):
            with open(path) as f:
                manifests.append({**json.load(f), "directory": os.path.join(log_dir, name)})
    fulls = [i for i, m in enumerate(manifests) if m["full"]]
    if manifests and not fulls:
        raise ValueError(f"--catch-up {log_dir}: the log holds no full version (versions "
                         f"{[m['version'] for m in manifests]})")
    return manifests[fulls[-1]:] if manifests else []


def replay_log(log_dir, groups, start=0, end=fmt.HASH_SPACE):
    """The newest version of a publish log for the routing range [start, end): (version, step, {group: GroupRows})
    built from `groups` ({name: GroupRows}, the export's: their specs; a full version starts empty) by applying each
    version's rows; None for an empty log."""
    manifests = read_log(log_dir)
    if not manifests:
        return None
    for manifest in manifests:
        staged = {name: ([], [], []) for name in groups}
        for r in range(manifest["ranks"]):
            path = os.path.join(manifest["directory"], f"rank-{r}-of-{manifest['ranks']}.npz")
            with np.load(path, allow_pickle=False) as z:
                names = json.loads(z["groups"].tobytes().decode())
                for i, name in enumerate(names):
                    if name not in groups:
                        raise ValueError(f"{path}: group {name!r} is not one of the export's {sorted(groups)}")
                    keys, rows, removed = z[f"{i}.keys"], z[f"{i}.rows"], z[f"{i}.removed"]
                    mine = fmt.in_range(fmt.route(keys), start, end)
                    staged[name][0].append(keys[mine])
                    staged[name][1].append(rows[mine])
                    staged[name][2].append(removed[fmt.in_range(fmt.route(removed), start, end)])
        updated = {}
        for name, rows_of in groups.items():
            keys, rows, removed = staged[name]
            dim = rows_of.dim
            updated[name] = rows_of.applied(
                np.concatenate(removed) if removed else np.zeros(0, np.int64),
                np.concatenate(keys) if keys else np.zeros(0, np.int64),
                np.concatenate(rows).reshape(-1, dim) if rows else np.zeros((0, dim), np.float32),
                full=manifest["full"])[0]
        groups = updated
    return manifests[-1]["version"], manifests[-1]["step"], groups


def log_dense(log_dir):
    """(version, step, [dense weights]) of the newest version of a publish log; None for an empty log."""
    manifests = read_log(log_dir)
    if not manifests:
        return None
    with open(os.path.join(manifests[-1]["directory"], "dense.npz"), "rb") as f:
        weights = decode_weights(f.read())
    return manifests[-1]["version"], manifests[-1]["step"], weights


# --- the ranker's side ---------------------------------------------------------------------------------------------


def routing_table(backend):
    """The RangeTable of a model's backend (a RemoteBackend, or a CachedBackend over one); None without one."""
    while backend is not None:
        table = getattr(backend, "table", None)
        if isinstance(table, RangeTable):
            return table
        backend = getattr(backend, "inner", None)
    return None


def targets_of(model):
    """What GET /publish/targets answers for a ServingModel."""
    table = routing_table(model.backend)
    return {"servers": [{"start": f"{start:#x}", "end": f"{end:#x}", "addresses": list(addresses)}
                        for start, end, addresses in (table or [])],
            "version": model.version, "step": model.step,
            "dense": [{"name": n, "shape": s, "dtype": d} for n, s, d in model.dense_variables()]}


def encode_weights(arrays):
    """The body of POST /publish/dense: an .npz of arrays w0..wN."""
    out = io.BytesIO()
    np.savez(out, **{f"w{i}": np.asarray(a) for i, a in enumerate(arrays)})
    return out.getvalue()


def decode_weights(body):
    """[arrays] of an .npz body (w0..wN, no pickles); ValueError naming what is wrong."""
    try:
        with np.load(io.BytesIO(body), allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
    except Exception as e:  # noqa: BLE001  (whatever a malformed archive raises, pickles refused: a clear answer)
        raise ValueError(f"the body is not an .npz of arrays w0..wN: {type(e).__name__}: {e}") from None
    expected = [f"w{i}" for i in range(len(arrays))]
    if sorted(arrays) != sorted(expected):
        raise ValueError(f"the .npz must hold arrays w0..w{len(arrays) - 1}, holds {sorted(arrays)[:10]}")
    return [arrays[name] for name in expected]


def install(model, version, step, body, timeout_s=10.0, tls=None):
    """POST /publish/dense: checks that every embedding server holds `version` (over TLS with `tls`, the ranker's),
    then installs the dense weights. -> (HTTP status, answer dict)."""
    try:
        weights = decode_weights(body)
    except ValueError as e:
        return 400, {"error": str(e)}
    table = routing_table(model.backend)
    if table is None:
        return 409, {"error": "this ranker reads no embedding servers (--servers): it takes no published versions"}
    if version <= model.version:
        return 409, {"error": f"version {version} is not above the ranker's version {model.version}"}
    publisher = Publisher(table, timeout_s=timeout_s, tls=tls)
    try:
        missing = publisher.holds(version)
    finally:
        publisher.close()
    if missing:
        return 409, {"error": f"version {version} is not committed on every embedding server (missing on "
                              f"{missing}); the ranker stays at version {model.version}"}
    try:
        model.install_version(version, step, weights)
    except ValueError as e:
        return 400, {"error": str(e)}
    return 200, {"version": model.version, "step": model.step}


class _HTTPSServer(ThreadingHTTPServer):
    """ThreadingHTTPServer over TLS, the handshake done in the request's own thread (a client that stalls in it
    holds that thread, not the accepting one) within the handler's timeout; a failed handshake is logged with the
    peer's address."""

    def __init__(self, address, handler, context):
        self.context = context
        super().__init__(address, handler)

    def get_request(self):
        sock, address = self.socket.accept()
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), address

    def process_request_thread(self, request, client_address):
        try:
            request.settimeout(self.RequestHandlerClass.timeout)
            request.do_handshake()
        except (ssl.SSLError, OSError) as e:
            security.LOG.warning("ranker publish endpoint: TLS handshake with %s:%s failed: %s", *client_address[:2],
                                 e)
            self.shutdown_request(request)
            return
        super().process_request_thread(request, client_address)


def serve_publish(model, host="127.0.0.1", port=0, max_body_mb=256, tls=None, token=None, insecure=False):
    """Starts the publish endpoint of a ranker's ServingModel on a thread -> the ThreadingHTTPServer (its
    server_address[1] is the port; shutdown() stops it).

    Args:
      model: the ServingModel.
      host, port: where it listens.
      max_body_mb: the largest dense body taken.
      tls: the ranker's security.TLS: HTTPS with its certificate (mutual TLS with client_auth); its CA verifies the
        embedding servers when a publish checks them. None: plain HTTP.
      token: the publish token (bytes) every request must carry, or None.
      insecure: beyond loopback without authentication, start anyway (every publish is logged); otherwise such an
        endpoint raises security.SecurityError.
    """
    max_body = int(max_body_mb * MB)
    tls_serving = tls if tls is not None and tls.serves else None  # a ranker with a CA only verifies its servers
    guard = security.PublishGuard(token, client_certs=tls_serving is not None and tls_serving.client_auth,
                                  insecure=insecure)
    security.refuse_unsafe_start("ranker publish endpoint", host, True, guard, tls_serving)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "tf_fusedrec-ranker-publish"
        timeout = 60.0  # seconds a connection may sit silent (a stalled client does not hold a thread for good)

        def log_message(self, fmt, *args):  # noqa: A002
            pass

        def _send(self, status, payload):
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _refused(self):
            """Whether the request is not authenticated (then answered 401, before its body is read, and logged)."""
            reason = guard.refusal(self.headers.get(security.TOKEN_HEADER))
            if reason is None:
                return False
            security.LOG.warning("ranker publish endpoint: refused %s %s from %s:%s: %s", self.command,
                                 urllib.parse.urlsplit(self.path).path, *self.client_address[:2], reason)
            self.close_connection = True
            self._send(401, {"error": f"refused: {reason}"})
            return True

        def do_GET(self):  # noqa: N802
            if self._refused():
                return
            if urllib.parse.urlsplit(self.path).path != "/publish/targets":
                self._send(404, {"error": "no such endpoint (GET /publish/targets, POST /publish/dense)"})
                return
            self._send(200, targets_of(model))

        def do_POST(self):  # noqa: N802
            if self._refused():
                return
            url = urllib.parse.urlsplit(self.path)
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self.close_connection = True
                self._send(411, {"error": "a Content-Length header is needed"})
                return
            if length < 0 or length > max_body:
                self.close_connection = True
                self._send(413, {"error": f"the body has {length} bytes, at most {max_body} (--max-publish-mb)"})
                return
            body = self.rfile.read(length)
            if url.path != "/publish/dense":
                self._send(404, {"error": "no such endpoint (POST /publish/dense?version=V&step=S)"})
                return
            query = urllib.parse.parse_qs(url.query)
            try:
                version = int(query["version"][0])
                step = int(query.get("step", ["-1"])[0])
                if version < 1:
                    raise ValueError
            except (KeyError, ValueError):
                self._send(400, {"error": "query field version: an int >= 1 is needed (and step: an int)"})
                return
            if guard.insecure and not guard.authenticates:
                security.LOG.warning("ranker publish endpoint: unauthenticated publish of version %d from %s:%s "
                                     "(--insecure)", version, *self.client_address[:2])
            self._send(*install(model, version, step, body, tls=tls))

    if tls_serving is not None:
        server = _HTTPSServer((host, port), Handler, tls_serving.server_context())
    else:
        server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="ranker_publish", daemon=True).start()
    return server


# --- the trainer's side of the ranker's endpoint ---------------------------------------------------------------------


def _request(address, method, path, body=None, timeout_s=60.0, tls=None, token=None):
    host, _, port = address.rpartition(":")
    if tls is not None and tls.verifies:
        connection = http.client.HTTPSConnection(host.strip("[]"), int(port), timeout=timeout_s,
                                                 context=tls.client_context())
    else:
        connection = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout_s)
    try:
        headers = {"Content-Type": "application/octet-stream"} if body is not None else {}
        if token is not None:
            headers[security.TOKEN_HEADER] = security.bearer(token)
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        text = response.read()
    except (OSError, http.client.HTTPException) as e:
        hint = ""
        if isinstance(e, (ConnectionResetError, http.client.RemoteDisconnected)):
            hint = security.explain("Connection reset", tls)
        raise PublishError(f"ranker {address}: {method} {path.split('?')[0]}: {e}{hint}") from None
    finally:
        connection.close()
    try:
        answer = json.loads(text)
    except ValueError:
        answer = {"error": text[:200].decode(errors="replace")}
    if response.status != 200:
        raise PublishError(f"ranker {address}: {method} {path.split('?')[0]}: HTTP {response.status}: "
                           f"{answer.get('error', answer)}")
    return answer


def ranker_targets(address, timeout_s=60.0, tls=None, token=None):
    """GET /publish/targets of the ranker at host:port -> its answer (servers, version, step, dense)."""
    return _request(address, "GET", "/publish/targets", timeout_s=timeout_s, tls=tls, token=token)


def table_of_targets(targets):
    """The RangeTable of a /publish/targets answer."""
    return RangeTable([(int(s["start"], 16), int(s["end"], 16), s["addresses"]) for s in targets["servers"]])


def push_dense(address, version, step, arrays, timeout_s=60.0, tls=None, token=None):
    """POST /publish/dense: the ranker at host:port installs `version` -> its answer; PublishError otherwise."""
    return _request(address, "POST", f"/publish/dense?version={int(version)}&step={int(step)}",
                    body=encode_weights(arrays), timeout_s=timeout_s, tls=tls, token=token)

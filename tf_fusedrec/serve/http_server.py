"""An HTTP/1.1 server on one asyncio event loop: the ranker's (tf_fusedrec/serve/ranker.py).

A connection costs a small object and a file descriptor, not a thread: idle keep-alive connections, slow clients and
half-sent bodies wait in the event loop, and the application's work (the ranker's parse and its batcher) runs in
threads of its own. asyncio's loop is the server; the request head is read by the few lines of `parse_head` below
(a request line, at most MAX_HEADERS `name: value` lines), so every limit and every error answer is ours:

* at most `max_connections` open connections: at the cap a new one takes the slot of the longest idle one (closed:
  HTTP/1.1 lets a server close an idle keep-alive connection at any time), else it is answered 503 and closed;
* a connection waiting longer than `idle_timeout_s` for its next request is closed; a request not received whole
  within `read_timeout_s` of its first byte is answered 408 and its connection closed; an answer the client does not
  take within `read_timeout_s` drops the connection;
* a body needs one Content-Length no larger than `max_body_bytes` (else 411, 400 or 413 before any of it is read;
  Transfer-Encoding is refused, so a body's end is never in doubt); `Expect: 100-continue` is answered once the
  head is accepted;
* every error is a JSON object {"error": message naming the problem}; a connection answered an error it cannot read
  past (a bad head, a refused body) is shut for writing and what the client still sends is read and dropped for up
  to LINGER_S before it closes, so that the close does not reset the connection under the answer (at most
  max_connections such connections at once; beyond, one closes at once);
* a client that does not take its answers (pipelining requests without reading) has no more requests read or served
  until it does, and is dropped after `read_timeout_s`.

The application is an object with `async handle(request) -> (status, payload)` (payload: JSON-serialisable; an
HTTPError it raises is answered as the server's own errors are), `event(name)` (told "errors_<status>" for every error
answer and "idle_closed" for every idle connection closed) and `close()` (server_close calls it).
"""

import asyncio
import email.utils
import http
import re
import socket
import threading
import time
from typing import NamedTuple

import orjson

MAX_HEADERS = 100  # as http.client's parse_headers
MAX_LINE_BYTES = 65536  # a request line or header line; as http.server's
MAX_HEAD_BYTES = 1 << 18  # the whole head (request line and headers)
LINGER_S = 1.0  # how long a connection closed after an error goes on dropping what the client sends
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VERSION = re.compile(r"HTTP/(\d+)\.(\d+)")
_HEAD_END = re.compile(rb"\r?\n\r?\n")


class Request(NamedTuple):
    method: str  # "GET" or "POST"
    target: str  # the request target as sent (path and query)
    headers: dict  # lower-case name -> list of values (str, latin-1)
    body: bytes
    suspect: bool  # whether this connection was answered a 4xx before


class HTTPError(Exception):
    """An error answer: status and the message that names the problem."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status, self.message = status, message


def parse_head(head):
    """A request head (bytes, without the blank line) -> (method, target, version (major, minor), headers).

    HTTPError for what is not served: a malformed request line (400), HTTP/0.9 (400), a version from 2.0 (505), a
    method other than GET and POST (501), a line beyond MAX_LINE_BYTES (414 for the request line, 431 for a header),
    more than MAX_HEADERS headers (431), a header line that is not `name: value` or folds onto the next (400).
    """
    lines = head.split(b"\n")
    line = lines[0].rstrip(b"\r")
    if len(line) > MAX_LINE_BYTES:
        raise HTTPError(414, f"the request line is longer than {MAX_LINE_BYTES} bytes")
    text = line.decode("latin-1")
    words = text.split()
    if len(words) == 2 and words[0] == "GET":
        raise HTTPError(400, "HTTP/0.9 requests are not served")
    if len(words) != 3:
        raise HTTPError(400, f"Bad request syntax ({text[:200]!r})")
    method, target, version = words
    match = _VERSION.fullmatch(version)
    if match is None:
        raise HTTPError(400, f"Bad request version ({version[:40]!r})")
    major, minor = int(match.group(1)[:4]), int(match.group(2)[:4])
    if major >= 2:
        raise HTTPError(505, f"Invalid HTTP version ({version[:40]})")
    if major != 1:
        raise HTTPError(400, f"Bad request version ({version[:40]!r})")
    if method not in ("GET", "POST"):
        raise HTTPError(501, f"Unsupported method ({method[:40]!r})")
    if len(lines) - 1 > MAX_HEADERS:
        raise HTTPError(431, f"Too many headers: more than {MAX_HEADERS}")
    headers = {}
    for raw in lines[1:]:
        raw = raw.rstrip(b"\r")
        if len(raw) > MAX_LINE_BYTES:
            raise HTTPError(431, f"Line too long: a header line is longer than {MAX_LINE_BYTES} bytes")
        if raw[:1] in (b" ", b"\t"):
            raise HTTPError(400, "a header line folded onto the next (obsolete line folding) is not accepted")
        name, sep, value = raw.partition(b":")
        if not sep or _TOKEN.fullmatch(name) is None:
            raise HTTPError(400, f"Bad header line {raw[:100].decode('latin-1')!r}")
        headers.setdefault(name.decode("ascii").lower(), []).append(value.strip(b" \t").decode("latin-1"))
    return method, target, (major, minor), headers


def content_length(method, headers, max_body_bytes):
    """The body's length from a request's headers (0 for a GET without one); HTTPError when it is refused."""
    if "transfer-encoding" in headers:
        raise HTTPError(411, "a Content-Length header is required (Transfer-Encoding is not accepted)")
    given = headers.get("content-length", [])
    if not given:
        if method == "GET":
            return 0
        raise HTTPError(411, "a Content-Length header is required")
    if len(set(given)) > 1:
        raise HTTPError(400, f"the request has {len(given)} different Content-Length headers")
    text = given[0]
    if not re.fullmatch(r"[0-9]+", text):
        raise HTTPError(400, f"the Content-Length header {text[:40]!r} is not a byte count")
    if len(text) > 15 or int(text) > max_body_bytes:
        raise HTTPError(413, f"the request body ({text[:40]} bytes) exceeds --max-body-mb ({max_body_bytes} bytes)")
    return int(text)


def _keep_alive(version, headers):
    tokens = {t.strip().lower() for v in headers.get("connection", []) for t in v.split(",")}
    if version >= (1, 1):
        return "close" not in tokens
    return "keep-alive" in tokens


class _Date:
    """The Date header's value, formatted once a second."""

    def __init__(self):
        self._second, self._text = None, ""

    def __call__(self):
        now = int(time.time())
        if now != self._second:
            self._second, self._text = now, email.utils.formatdate(now, usegmt=True)
        return self._text


class _Connection(asyncio.Protocol):
    """One client connection: reads requests one at a time, hands each to the application, writes its answer."""

    def __init__(self, server):
        self.server = server
        self.transport = None
        self.buffer = bytearray()
        self.state = "idle"  # idle -> head -> body -> busy -> idle ...; closing: answered, dropping input
        self.idle_since = None  # loop time the connection began to wait for a request; None while one is under way
        self.suspect = False
        self._timer = None  # the idle or the read deadline
        self._write_timer = None
        self._head = None  # (method, target, version, headers, body length, keep_alive) of the request being read
        self._task = None
        self._closed = False
        self._keep_alive_after = True  # False once the client shut its end of the connection
        self._writing_paused = False  # the client is not taking its answers as fast as they are written
        self._lingering = False
        self._scanned = 0  # how far the buffer was searched for the head's end

    # --- asyncio callbacks ---

    def connection_made(self, transport):
        self.transport = transport
        if not self.server._admit(self):  # noqa: SLF001
            return
        self._await_request()

    def data_received(self, data):
        if self.state == "closing":
            return  # an answer that ends the connection is out: what follows is dropped
        self.buffer += data
        if self.state in ("busy", "draining"):
            if len(self.buffer) > self.server.max_body_bytes + MAX_HEAD_BYTES:
                self.transport.pause_reading()  # a client sending its next requests ahead: it waits for the answer
            return
        self._advance()

    def eof_received(self):
        if self.state in ("busy", "draining"):
            self._keep_alive_after = False  # the client sent its request and shut its end: answered, then closed
            return True
        if self.state in ("head", "body") or (self.state == "idle" and self.buffer):
            self._end()  # a request cut short: there is nobody to answer
        return False  # the transport closes once what is written went out

    def pause_writing(self):
        # Answers pile up unread (a client pipelining requests without reading): no more requests are read or
        # served until they drain, and a client that does not take them within read_timeout_s is dropped.
        self._writing_paused = True
        self.transport.pause_reading()
        if self._write_timer is None:
            self._write_timer = self.server.loop.call_later(self.server.read_timeout_s, self._abort)

    def resume_writing(self):
        self._writing_paused = False
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        if self.state == "draining" and not self._closed:
            self.transport.resume_reading()
            self._await_request()

    def connection_lost(self, exc):
        self._closed = True
        self._cancel_timer()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        if self._lingering:
            self._lingering = False
            self.server.lingering -= 1
        if self._task is not None:
            self._task.cancel()
        self.server._forget(self)  # noqa: SLF001

    # --- the request cycle ---

    def _await_request(self):
        if not self._keep_alive_after:  # the client shut its end: nothing more will come
            self._end()
            return
        self.state, self._head = "idle", None
        self.idle_since = self.server.loop.time()
        self._set_timer(self.server.idle_timeout_s, self._idle_timeout)
        if self.buffer:
            self._advance()

    def _advance(self):
        if self.state == "idle":
            # Empty lines before a request line are ignored (RFC 9112 2.2).
            while self.buffer[:2] == b"\r\n" or self.buffer[:1] == b"\n":
                del self.buffer[:2 if self.buffer[:2] == b"\r\n" else 1]
            if not self.buffer:
                return
            self.state, self.idle_since = "head", None
            self._set_timer(self.server.read_timeout_s, self._read_timeout)
        if self.state == "head":
            # Searched from where the last search ended (less the 3 bytes a split "\r\n\r\n" can have left), so a
            # client sending a byte at a time costs a search of a few bytes each, not of the whole buffer.
            match = _HEAD_END.search(self.buffer, max(0, self._scanned - 3), MAX_HEAD_BYTES + 4)
            if match is None:
                self._scanned = len(self.buffer)
                if len(self.buffer) > MAX_LINE_BYTES + 2 and self.buffer.find(b"\n", 0, MAX_LINE_BYTES + 2) < 0:
                    self._fail(HTTPError(414, f"the request line is longer than {MAX_LINE_BYTES} bytes"))
                elif len(self.buffer) > MAX_HEAD_BYTES + 4:
                    self._fail(HTTPError(431, f"the request head is longer than {MAX_HEAD_BYTES} bytes"))
                return
            self._scanned = 0
            try:
                method, target, version, headers = parse_head(bytes(self.buffer[:match.start()]))
                length = content_length(method, headers, self.server.max_body_bytes)
                expect = headers.get("expect")
                if expect is not None and (len(expect) > 1 or expect[0].lower() != "100-continue"):
                    raise HTTPError(417, f"Expect: {expect[0][:40]} is not supported (only 100-continue)")
            except HTTPError as e:
                self._fail(e)
                return
            del self.buffer[:match.end()]
            self._head = (method, target, headers, length, _keep_alive(version, headers))
            self.state = "body"
            if expect is not None and version >= (1, 1) and len(self.buffer) < length:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if self.state == "body":
            method, target, headers, length, keep_alive = self._head
            if len(self.buffer) < length:
                return
            body = bytes(self.buffer[:length])
            del self.buffer[:length]
            self.state = "busy"
            self._cancel_timer()
            request = Request(method, target, headers, body, self.suspect)
            self._task = self.server.loop.create_task(self._serve(request, keep_alive))

    async def _serve(self, request, keep_alive):
        try:
            status, payload = await self.server.app.handle(request)
        except HTTPError as e:
            status, payload = e.status, self._error_payload(e)
        except asyncio.CancelledError:
            return  # the connection was lost
        except Exception as e:  # noqa: BLE001  (the server answers and stays up)
            status, payload = 500, self._error_payload(HTTPError(500, f"{type(e).__name__}: {e}"))
        self._task = None
        if self._closed:
            return
        if 400 <= status < 500:
            self.suspect = True
        keep_alive = keep_alive and self._keep_alive_after
        self._answer(status, payload, close=not keep_alive)
        if not keep_alive:
            self._end()
            return
        if self._writing_paused:
            self.state = "draining"  # resume_writing goes on once the client has taken its answers
            return
        self.transport.resume_reading()
        self._await_request()

    # --- answers, timeouts, the end ---

    def _error_payload(self, error):
        self.server.app.event(f"errors_{error.status}")
        message = error.message
        if len(message) > self.server.max_error_chars:
            message = message[:self.server.max_error_chars] + " [...]"
        return {"error": message}

    def _answer(self, status, payload, close):
        try:
            body = orjson.dumps(payload, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)
        except TypeError as e:
            status, body = 500, orjson.dumps({"error": f"the answer could not be written as JSON: {e}"})
        try:
            reason = http.HTTPStatus(status).phrase
        except ValueError:
            reason = "Status"
        connection = "Connection: close\r\n" if close else ""
        head = (f"HTTP/1.1 {status} {reason}\r\nServer: {self.server.name}\r\nDate: {self.server.date()}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{connection}\r\n").encode("latin-1")
        self.transport.write(head + body)

    def _fail(self, error):
        """An error answer after which the connection cannot go on (the request's end is unknown): answered, shut
        for writing, the client's further bytes dropped for up to LINGER_S, closed."""
        self._answer(error.status, self._error_payload(error), close=True)
        if 400 <= error.status < 500:
            self.suspect = True
        self._end()

    def _end(self):
        self._cancel_timer()
        self.state, self.idle_since = "closing", None
        self.buffer.clear()
        self.server._forget(self)  # noqa: SLF001  (its slot is free from now)
        if self._closed:
            return
        # Lingering connections are bounded too (max_connections of them): beyond, one closes at once.
        if self.transport.can_write_eof() and self.server.lingering < self.server.max_connections:
            self.server.lingering += 1
            self._lingering = True
            self.transport.write_eof()
            self._set_timer(LINGER_S, self.transport.close)
        else:
            self.transport.close()

    def _abort(self):
        self._write_timer = None
        if not self._closed:
            self.transport.abort()

    def _idle_timeout(self):
        self._timer = None
        if self.state == "idle":
            self.server.app.event("idle_closed")
            self._end()

    def _read_timeout(self):
        self._timer = None
        if self.state in ("head", "body"):
            self._fail(HTTPError(408, f"the request was not received within --read-timeout-s "
                                      f"({self.server.read_timeout_s:g} s)"))

    def evict(self):
        """Closes the connection for a new one: it is idle between requests."""
        self.server.app.event("idle_closed")
        self._end()

    def _set_timer(self, delay, callback):
        self._cancel_timer()
        self._timer = self.server.loop.call_later(delay, callback)

    def _cancel_timer(self):
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class AsyncHTTPServer:
    """HTTP/1.1 on one asyncio event loop (the module's docstring says what it bounds and how).

    Bound on construction (server_address holds the port, also for port 0); serve_forever() runs the loop in the
    calling thread until shutdown() (from another thread, or a signal handler's thread) returns.

    Args:
      address: (host, port) to bind.
      app: handle(request) (async) -> (status, payload) and event(name), see the module's docstring.
      max_connections, idle_timeout_s, read_timeout_s, max_body_bytes: the limits (module docstring).
      name: the Server header's value.
      max_error_chars: error messages are cut to this many characters (they may echo parts of a request).
      ssl_context: an ssl.SSLContext (security.TLS.server_context): HTTPS, the handshake bounded by read_timeout_s;
        None: plain HTTP.

    Attributes: refused (connections answered 503 at the cap), evicted (idle connections closed for a new one).
    """

    def __init__(self, address, app, max_connections=64, idle_timeout_s=30.0, read_timeout_s=30.0,
                 max_body_bytes=16 << 20, name="tf_fusedrec", max_error_chars=1000, ssl_context=None):
        self.app, self.name, self.ssl_context = app, name, ssl_context
        self.max_connections, self.max_body_bytes = max_connections, max_body_bytes
        self.idle_timeout_s, self.read_timeout_s, self.max_error_chars = idle_timeout_s, read_timeout_s, \
            max_error_chars
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        # The listen backlog: a burst of connections beyond it may be reset by the kernel before the cap can answer.
        self.socket = socket.create_server(address, family=family, backlog=128)
        self.server_address = self.socket.getsockname()
        self.refused = self.evicted = 0
        self.lingering = 0  # connections closed for writing, dropping what the client still sends (LINGER_S)
        self.date = _Date()
        self.loop = None
        self._connections = {}  # the open connections (insertion order), each counted against max_connections
        self._lock = threading.Lock()  # guards _connections against readers in other threads (open/idle counts)
        self._stopped = None
        self._done = threading.Event()
        self._shutdown_requested = False

    def _admit(self, connection):
        if len(self._connections) >= self.max_connections:
            idle = [c for c in self._connections if c.idle_since is not None]
            if idle:
                self.evicted += 1
                min(idle, key=lambda c: c.idle_since).evict()
            else:
                self.refused += 1
                connection._fail(HTTPError(  # noqa: SLF001
                    503, f"the ranker is overloaded: {self.max_connections} connections are open and busy "
                         f"(--max-connections)"))
                return False
        with self._lock:
            self._connections[connection] = None
        return True

    def _forget(self, connection):
        with self._lock:
            self._connections.pop(connection, None)

    def open_count(self):
        """Open connections (counted against max_connections); safe from any thread."""
        with self._lock:
            return len(self._connections)

    def idle_count(self):
        """Open connections waiting for a request; safe from any thread."""
        with self._lock:
            return sum(c.idle_since is not None for c in self._connections)

    def serve_forever(self, poll_interval=0.5):
        """Serves until shutdown(); then closes every connection.

        The loop wakes at least every poll_interval seconds (None: only for its work): Linux may deliver a signal to
        any thread, and CPython runs its Python handler (main()'s SIGTERM one) only once the main thread runs Python
        code, which a loop waiting with nothing to do would not (tests/serve/test_lifetime.py)."""
        self.loop = asyncio.new_event_loop()
        try:
            self._stopped = asyncio.Event()
            if self._shutdown_requested:
                return
            if poll_interval:
                def tick():
                    self.loop.call_later(poll_interval, tick)

                tick()
            tls = {"ssl": self.ssl_context, "ssl_handshake_timeout": self.read_timeout_s} if self.ssl_context else {}
            server = self.loop.run_until_complete(
                self.loop.create_server(lambda: _Connection(self), sock=self.socket, **tls))
            try:
                self.loop.run_until_complete(self._stopped.wait())
            finally:
                server.close()
                with self._lock:
                    connections = list(self._connections)
                for connection in connections:
                    if connection.transport is not None:
                        connection.transport.abort()
                self.loop.run_until_complete(asyncio.sleep(0))  # lets the aborted transports report their loss
                tasks = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
                for task in tasks:
                    task.cancel()
                if tasks:
                    self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        finally:
            self.loop.close()
            self._done.set()

    def shutdown(self):
        """Stops serve_forever and waits for it to return (call it from another thread than the loop's)."""
        self._shutdown_requested = True
        loop, stopped = self.loop, self._stopped
        if loop is None or stopped is None:
            return
        try:
            loop.call_soon_threadsafe(stopped.set)
        except RuntimeError:  # the loop is closed already
            return
        self._done.wait()

    def server_close(self):
        """Closes the listening socket and the application (app.close())."""
        self.socket.close()
        self.app.close()

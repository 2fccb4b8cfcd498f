"""The ranker's HTTP server (tf_fusedrec/serve/http_server.py) with a toy application: framing, keep-alive,
pipelining, Expect, malformed heads, the limits and timeouts, errors from the application, shutdown. The ranker's own
endpoints over it are tests/serve/test_ranker.py's and test_fuzz.py's."""

import asyncio
import json
import socket
import threading
import time

import pytest

from tf_fusedrec.serve import http_server

WAIT_S = 30.0


class ToyApp:
    """Echoes a request's method, target and body length; /slow waits for `release`; /boom raises; /refuse raises an
    HTTPError of 409 with a long message."""

    def __init__(self):
        self.events = []
        self.release = None  # an asyncio.Event, made on the loop
        self.closed = False
        self.slow_started = threading.Event()
        self.handled = 0

    def event(self, name):
        self.events.append(name)

    def close(self):
        self.closed = True

    async def handle(self, request):
        self.handled += 1
        if request.target == "/slow":
            self.release = self.release or asyncio.Event()
            self.slow_started.set()
            await self.release.wait()
        if request.target == "/boom":
            raise ValueError("the toy broke")
        if request.target == "/refuse":
            raise http_server.HTTPError(409, "x" * 5000)
        return 200, {"method": request.method, "target": request.target, "length": len(request.body),
                     "suspect": request.suspect}


class Served:
    def __init__(self, **limits):
        self.app = ToyApp()
        self.server = http_server.AsyncHTTPServer(("127.0.0.1", 0), self.app, max_error_chars=100, **limits)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(WAIT_S)

    def connect(self):
        return socket.create_connection(("127.0.0.1", self.port), timeout=WAIT_S)


@pytest.fixture
def served():
    s = Served(max_connections=4, idle_timeout_s=1.0, read_timeout_s=1.0, max_body_bytes=1000)
    yield s
    s.close()


def read_answers(sock, count):
    """count answers from sock -> [(status, headers (lower-case name -> value), decoded JSON body)]."""
    data, answers = b"", []
    while len(answers) < count:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if sep:
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
            if status == 100:  # an interim answer: no body
                answers.append((100, headers, None))
                data = rest
                continue
            length = int(headers["content-length"])
            if len(rest) >= length:
                answers.append((status, headers, json.loads(rest[:length])))
                data = rest[length:]
                continue
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed after {len(answers)} answers; left: {data[:200]!r}")
        data += chunk
    return answers


def closed(sock):
    """Whether the server closed the connection (reads to its end, dropping what comes)."""
    try:
        while sock.recv(65536):
            pass
        return True
    except socket.timeout:
        return False
    except ConnectionResetError:
        return True


def post(target, body, extra=""):
    return (f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def test_keep_alive_and_pipelined_requests(served):
    with served.connect() as sock:
        sock.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        [(status, headers, answer)] = read_answers(sock, 1)
        assert status == 200 and answer == {"method": "GET", "target": "/a", "length": 0, "suspect": False}
        assert headers["content-type"] == "application/json" and "connection" not in headers
        # Three requests in one send (the body of the second holds what looks like a request): answered in order.
        sock.sendall(b"\r\n" + post("/b", b"GET /x HTTP/1.1\r\n\r\n") + post("/c", b"")
                     + b"GET /d?q=1 HTTP/1.1\r\n\r\n")
        answers = read_answers(sock, 3)
        assert [(a[0], a[2]["target"], a[2]["length"]) for a in answers] == [(200, "/b", 19), (200, "/c", 0),
                                                                           (200, "/d?q=1", 0)]
        sock.sendall(b"GET /e HTTP/1.1\r\nConnection: close\r\n\r\n")
        [(status, headers, _)] = read_answers(sock, 1)
        assert status == 200 and headers["connection"] == "close" and closed(sock)
    with served.connect() as sock:  # HTTP/1.0 closes unless asked to keep the connection
        sock.sendall(b"GET /f HTTP/1.0\r\n\r\n")
        assert read_answers(sock, 1)[0][0] == 200 and closed(sock)
    with served.connect() as sock:
        sock.sendall(b"GET /g HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        assert read_answers(sock, 1)[0][0] == 200 and not closed_within(sock, 0.3)


def closed_within(sock, seconds):
    sock.settimeout(seconds)
    try:
        return closed(sock)
    finally:
        sock.settimeout(WAIT_S)


def test_a_body_sent_a_byte_at_a_time_and_after_expect(served):
    with served.connect() as sock:
        for byte in post("/slowly", b'{"a": 1}'):
            sock.sendall(bytes([byte]))
        assert read_answers(sock, 1)[0][2]["length"] == 8
        sock.sendall(post("/e", b"", "Expect: 100-continue\r\n").replace(b"Content-Length: 0", b"Content-Length: 5"))
        [(status, _, _)] = read_answers(sock, 1)
        assert status == 100
        sock.sendall(b"hello")
        assert read_answers(sock, 1)[0][2] == {"method": "POST", "target": "/e", "length": 5, "suspect": False}
    with served.connect() as sock:
        sock.sendall(post("/e", b"", "Expect: something-else\r\n"))
        status, _, answer = read_answers(sock, 1)[0]
        assert status == 417 and "only 100-continue" in answer["error"] and closed(sock)


def test_a_client_that_shuts_its_end_after_the_request_gets_the_answer(served):
    with served.connect() as sock:
        sock.sendall(post("/h", b"12"))
        sock.shutdown(socket.SHUT_WR)
        [(status, _, answer)] = read_answers(sock, 1)
        assert status == 200 and answer["length"] == 2 and closed(sock)


@pytest.mark.parametrize("request_bytes,status,message", [
    (b"GET /x HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n", 431, "Too many headers"),
    (b"GET /x HTTP/1.1\r\nX: " + b"y" * 70000 + b"\r\n\r\n", 431, "Line too long"),
    (b"GET /x HTTP/1.1\r\n" + b"X: " + b"y" * 60000 + b"\r\n" + b"Y: " + b"y" * 60000 + b"\r\n" + b"Z: " +
     b"y" * 60000 + b"\r\n" + b"W: " + b"y" * 60000 + b"\r\n" + b"V: " + b"y" * 60000 + b"\r\n", 431,
     "the request head is longer than"),
    (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", 414, "request line is longer than 65536 bytes"),
    (b"GET /x HTTP/1.1\r\nX: y\r\n  folded\r\n\r\n", 400, "obsolete line folding"),
    (b"GET /x HTTP/1.1\r\nno colon here\r\n\r\n", 400, "Bad header line 'no colon here'"),
    (b"GET /x HTTP/1.1\r\nBad Name: y\r\n\r\n", 400, "Bad header line"),
    (b"GET /x y HTTP/1.1\r\n\r\n", 400, "Bad request syntax"),
    (b"GET /x\r\n\r\n", 400, "HTTP/0.9 requests are not served"),
    (b"GET /x HTTP/2.0\r\n\r\n", 505, "Invalid HTTP version (HTTP/2.0)"),
    (b"GET /x HTTP/0.8\r\n\r\n", 400, "Bad request version"),
    (b"GET /x HTTQ/1.1\r\n\r\n", 400, "Bad request version"),
    (b"PUT /x HTTP/1.1\r\n\r\n", 501, "Unsupported method ('PUT')"),
    (b"POST /x HTTP/1.1\r\n\r\n", 411, "Content-Length header is required"),
    (b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411, "Transfer-Encoding is not accepted"),
    (b"GET /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411, "Transfer-Encoding is not accepted"),
    (b"POST /x HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", 413, "exceeds --max-body-mb (1000 bytes)"),
    (b"POST /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "is not a byte count"),
    (b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400, "2 different Content-Length"),
])
def test_malformed_heads_get_an_error_naming_the_problem_and_the_connection_closes(served, request_bytes, status,
                                                                                   message):
    with served.connect() as sock:
        sock.sendall(request_bytes)
        [(answer_status, headers, answer)] = read_answers(sock, 1)
        assert answer_status == status and message in answer["error"], (answer_status, answer)
        assert headers["connection"] == "close" and closed(sock)
    assert served.app.events == [f"errors_{status}"]
    assert served.server.open_count() == 0


def test_application_errors(served):
    with served.connect() as sock:
        sock.sendall(b"GET /refuse HTTP/1.1\r\n\r\nGET /boom HTTP/1.1\r\n\r\nGET /after HTTP/1.1\r\n\r\n")
        (s1, _, a1), (s2, _, a2), (s3, _, a3) = read_answers(sock, 3)
    assert s1 == 409 and a1["error"] == "x" * 100 + " [...]"  # cut at max_error_chars
    assert s2 == 500 and a2["error"] == "ValueError: the toy broke"
    assert s3 == 200 and a3["suspect"] is True  # the connection was answered a 4xx
    assert served.app.events == ["errors_409", "errors_500"]


def test_idle_and_read_timeouts(served):
    idle, slow_head, slow_body = served.connect(), served.connect(), served.connect()
    try:
        began = time.monotonic()
        slow_head.sendall(b"GET /x HTTP/1.1\r\n")
        slow_body.sendall(post("/y", b"")[:-2].replace(b"Content-Length: 0", b"Content-Length: 10") + b"\r\n12345")
        assert closed(idle)
        for sock in (slow_head, slow_body):
            status, _, answer = read_answers(sock, 1)[0]
            assert status == 408 and "--read-timeout-s (1 s)" in answer["error"] and closed(sock)
        assert time.monotonic() - began < 1.0 + 10.0
    finally:
        for sock in (idle, slow_head, slow_body):
            sock.close()
    assert sorted(served.app.events) == ["errors_408", "errors_408", "idle_closed"]


def wait_for(condition, what):
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_the_connection_cap_evicts_the_longest_idle_then_refuses():
    served = Served(max_connections=4, idle_timeout_s=WAIT_S, read_timeout_s=WAIT_S)
    socks = [served.connect() for _ in range(4)]
    try:
        wait_for(lambda: served.server.idle_count() == 4, "4 idle connections")
        for sock in socks[1:]:
            sock.sendall(b"GET /slow HTTP/1.1\r\n\r\n")
        wait_for(lambda: served.server.idle_count() == 1, "3 requests under way")
        with served.connect() as fifth:  # takes the slot of the idle one
            assert closed(socks[0]) and served.server.evicted == 1
            fifth.sendall(b"GET /slow HTTP/1.1\r\n\r\n")
            wait_for(lambda: served.server.idle_count() == 0 and served.server.open_count() == 4, "4 busy")
            with served.connect() as sixth:
                status, _, answer = read_answers(sixth, 1)[0]
                assert status == 503 and "4 connections are open and busy (--max-connections)" in answer["error"]
                assert closed(sixth) and served.server.refused == 1
            served.server.loop.call_soon_threadsafe(served.app.release.set)
            for sock in [*socks[1:], fifth]:
                assert read_answers(sock, 1)[0][0] == 200
    finally:
        for sock in socks:
            sock.close()
        served.close()
    assert served.app.events.count("idle_closed") == 1 and "errors_503" in served.app.events


def test_many_idle_connections_take_no_thread_and_shutdown_closes_them():
    served = Served(max_connections=500, idle_timeout_s=60.0, read_timeout_s=60.0)
    threads = threading.active_count()
    socks = [served.connect() for _ in range(300)]
    try:
        wait_for(lambda: served.server.idle_count() == 300, "300 idle connections")
        assert threading.active_count() == threads
        socks[0].sendall(b"GET /slow HTTP/1.1\r\n\r\n")
        assert served.app.slow_started.wait(WAIT_S)
        with served.connect() as other:  # served while one request waits and 299 connections are idle
            other.sendall(b"GET /quick HTTP/1.1\r\n\r\n")
            assert read_answers(other, 1)[0][2]["target"] == "/quick"
        served.close()
        assert not served.thread.is_alive() and served.app.closed
        assert all(closed(sock) for sock in socks)
        with pytest.raises(OSError):
            served.connect()
    finally:
        for sock in socks:
            sock.close()


def test_parse_head_reads_what_is_sent():
    method, target, version, headers = http_server.parse_head(
        b"POST /v1/models/m:predict?x=1 HTTP/1.1\r\nHost: a\r\nX-Two: 1\r\nx-two:  2 \r\nEmpty:")
    assert (method, target, version) == ("POST", "/v1/models/m:predict?x=1", (1, 1))
    assert headers == {"host": ["a"], "x-two": ["1", "2"], "empty": [""]}
    assert http_server.content_length("POST", {"content-length": ["12", "12"]}, 100) == 12
    assert http_server.content_length("GET", {}, 100) == 0


def test_a_client_that_does_not_read_its_answers_is_dropped(served):
    """Requests pipelined without reading the answers: once the answers back up the server reads and serves no more,
    and drops the connection read_timeout_s (1 s) later, instead of buffering answers without bound. Answers of 60 KB:
    the kernel's socket buffers (a few MB on loopback) hold a few hundred of them; a server that went on serving would
    answer thousands in that second."""
    with served.connect() as sock:
        sock.settimeout(5.0)
        request = b"GET /" + b"a" * 60_000 + b" HTTP/1.1\r\n\r\n"
        try:
            for _ in range(100_000):
                sock.sendall(request)
        except OSError:  # the server stopped reading (the send timed out) or dropped the connection (reset)
            pass
        wait_for(lambda: served.server.open_count() == 0, "the connection dropped")
    assert served.app.handled < 1000, f"{served.app.handled} requests served whose answers were not taken"

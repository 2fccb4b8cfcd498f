"""The ranker over HTTP, with 2 embedding servers (subprocesses started and stopped here, on loopback).

* Predictions through POST /v1/models/NAME:predict ("instances" and "inputs" shapes) equal the in-process model's
  (fr.export.load_model) to 1e-6, with pooling on the servers and the cache, and without either.
* Concurrent requests are batched into shared model calls and each gets its own answer.
* Bad requests (unknown or missing feature, wrong type, negative or out-of-int64 id, oversized integer literal, deeply
  nested JSON, malformed JSON, wrong model) get HTTP 400/404 naming the field or the problem; the ranker keeps serving.
* A SIGKILLed embedding server gives HTTP 503 naming it, fast; restarted on its port, the ranker uses it again.
* Limits, against a ranker built from its flags in this process (rows in-process: --servers local) with small limits:
  411 without Content-Length, 413 beyond --max-body-mb, --max-instances and --max-ids, 503 beyond --max-queue; idle
  connections are closed (--idle-timeout-s, or at once for a new client at --max-connections), slow requests get 408
  (--read-timeout-s), and a well-formed client is served throughout.
* Malformed requests, and the later requests of a connection answered a 4xx, run in short thread slices
  (--slow-path-switch-ms); a clean connection's requests do not, and the interval comes back.
"""

import json
import signal
import socket
import sys
import threading
import time

import numpy as np
import pytest

from tests.serve import serve_fixtures
from tests.serve.serve_fixtures import get, instances_of, post, raw_http, start, stop

import tf_fusedrec as fr  # noqa: E402
from tf_fusedrec.serve import ranker as ranker_lib  # noqa: E402

sc = serve_fixtures.scenario()

# Waits whose end fails the test: far beyond what they take, so that only a real hang reaches them on a busy machine.
WAIT_S = 30


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The trained scenario model's export and its in-process model."""
    export_dir = serve_fixtures.trained_export(tmp_path_factory)
    return export_dir, fr.export.load_model(export_dir)


@pytest.fixture(scope="module")
def cluster(trained):
    """2 embedding servers and 2 rankers (pooling + cache; neither) of the trained export, as subprocesses."""
    export_dir, local = trained
    ports = [serve_fixtures.reserved_port(), serve_fixtures.reserved_port()]
    servers = [start(["tf_fusedrec.serve.embedding_server", "--export", export_dir, "--shard", str(i), "--num-shards",
                      "2", "--port", str(p)]) for i, p in enumerate(ports)]
    addresses = ",".join(f"127.0.0.1:{p}" for p in ports)
    rankers, urls = [], {}
    for label, flags in (("pooled_cached", ["--cache-mb", "1"]), ("plain", ["--no-pooling", "--cache-mb", "0"])):
        port = serve_fixtures.reserved_port()
        rankers.append(start(["tf_fusedrec.serve.ranker", "--export", export_dir, "--servers", addresses, "--port",
                              str(port), "--name", "dlrm", "--timeout-s", "2", *flags]))
        urls[label] = f"http://127.0.0.1:{port}/v1/models/dlrm"
    state = {"export": export_dir, "local": local, "ports": ports, "servers": servers, "urls": urls}
    yield state
    for proc in rankers + state["servers"]:
        stop(proc)


def expected(local, instances):
    inputs = {name: [inst[name] for inst in instances] for name in instances[0]}
    return local.predict(inputs, allow_padding=False)


@pytest.mark.parametrize("label", ["pooled_cached", "plain"])
def test_served_predictions_equal_the_in_process_model(cluster, label):
    url = cluster["urls"][label]
    for step in (1000, 1001, 1000):  # the repeat hits the cache
        instances = instances_of(sc.make_batch(step))
        want = expected(cluster["local"], instances)
        status, answer = post(f"{url}:predict", {"instances": instances})
        assert status == 200, answer
        np.testing.assert_allclose(answer["predictions"], want, rtol=1e-6, atol=1e-7)
        columns = {name: [inst[name] for inst in instances] for name in instances[0]}
        status, answer = post(f"{url}:predict", {"inputs": columns})
        assert status == 200, answer
        np.testing.assert_allclose(answer["outputs"], want, rtol=1e-6, atol=1e-7)
    stats = get(f"{url}/stats")
    assert stats["requests"] == 6 and stats["bytes_from_servers"] > 0, stats
    assert set(stats["servers"]) == {f"127.0.0.1:{p}" for p in cluster["ports"]}
    if label == "pooled_cached":
        assert stats["pooling"] and stats["cache"]["hits"] > 0, stats


def test_concurrent_requests_are_batched(cluster):
    url = cluster["urls"]["pooled_cached"]
    before = get(f"{url}/stats")
    batches = [instances_of(sc.make_batch(2000 + i))[:3] for i in range(16)]
    answers = [None] * len(batches)
    together = threading.Barrier(len(batches))

    def ask(i):
        together.wait(WAIT_S)  # every thread sends at once, not as it happens to be started
        answers[i] = post(f"{url}:predict", {"instances": batches[i]})

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for i, (status, answer) in enumerate(answers):
        assert status == 200, answer
        np.testing.assert_allclose(answer["predictions"], expected(cluster["local"], batches[i]), rtol=1e-6,
                                   atol=1e-7)
    after = get(f"{url}/stats")
    assert after["requests"] - before["requests"] == 16
    assert after["batches"] - before["batches"] < 16, "no two concurrent requests shared a model call"


@pytest.mark.parametrize("payload, message", [
    (b"{not json", "not valid JSON"),
    ({"instances": []}, "non-empty list"),
    ({"signature_name": "x"}, 'exactly one of "instances" or "inputs"'),
    ("colour", "unknown feature 'colour'"),
    ("missing", "feature 'tags' is missing"),
    ("string_id", "feature 'user_id': ids must be integers, got 'seven'"),
    ("float_id", "feature 'genres': ids must be integers, got 1.5"),
    ("negative", "feature 'item_id': ids must be >= 0; found -1"),
    ("too_large", "feature 'user_id': id 4096 is too large"),
    ("one_id", "feature 'country': takes one id per instance"),
    ("dense", "input 'dense': values must be float32 of shape [2, 3]"),
    ("uneven", "feature 'tags' is given in some instances but not all"),
    ("id_2_63", "feature 'user_id': ids must be integers, got 9223372036854775808 (outside int64"),
    ("id_2_64_in_lists", "feature 'tags': ids must be integers, got 18446744073709551616 (outside int64"),
    ("id_below_int64", "feature 'item_id': ids must be integers, got -9223372036854775809 (outside int64"),
    ("negative_in_lists", "feature 'genres': ids must be >= 0; found -2"),
    ("literal_5000_digits", "feature 'history': ids must be integers, got an integer literal of 5000 digits"),
    ("dense_5000_digits", "input 'dense': values must be finite"),
    ("nested_body", "the request body nests JSON arrays or objects too deeply"),
    ("nested_ids", "the request body nests JSON arrays or objects too deeply"),
    ("nested_200", "feature 'tags': ids must be integers, got [[["),
])
def test_bad_requests_get_400_naming_the_field(cluster, payload, message):
    url = cluster["urls"]["pooled_cached"]
    big = "9" * 5000  # beyond Python's 4300-digit limit on int(str): once a 500
    raw = {  # a feature's value as JSON text
        "literal_5000_digits": ("history", f"[{big}]"),
        "dense_5000_digits": ("dense", f"[{big}, 1.0, 2.0]"),
        "nested_ids": ("tags", "[" * 5000 + "]" * 5000),
        "nested_200": ("tags", "[" + "[" * 200 + "]" * 200 + "]"),
    }
    if payload == "nested_body":
        payload = ("[" * 5000 + "]" * 5000).encode()
    elif isinstance(payload, str) and payload in raw:
        feature, text = raw[payload]
        instances = instances_of(sc.make_batch(1000))[:2]
        instances[0][feature] = "PLACEHOLDER"
        payload = json.dumps({"instances": instances}).replace('"PLACEHOLDER"', text).encode()
    elif isinstance(payload, str):
        instances = instances_of(sc.make_batch(1000))[:2]
        change = {
            "colour": lambda i: i[0].update(colour=1) or i[1].update(colour=2),
            "missing": lambda i: [x.pop("tags") for x in i],
            "string_id": lambda i: i[1].update(user_id="seven"),
            "float_id": lambda i: i[0].update(genres=[1.5]),
            "negative": lambda i: i[0].update(item_id=-1),
            "too_large": lambda i: i[0].update(user_id=4096),
            "one_id": lambda i: i[0].update(country=[1, 2]),
            "dense": lambda i: i[0].update(dense=[1.0]),
            "uneven": lambda i: i[1].pop("tags"),
            "id_2_63": lambda i: i[1].update(user_id=2**63),
            "id_2_64_in_lists": lambda i: i[0].update(tags=[1, 2**64]),
            "id_below_int64": lambda i: i[0].update(item_id=-(2**63) - 1),
            "negative_in_lists": lambda i: i[1].update(genres=[3, -2]),
        }[payload]
        change(instances)
        payload = {"instances": instances}
    status, answer = post(f"{url}:predict", payload)
    assert status == 400 and message in answer["error"], (status, answer)
    assert len(answer["error"]) <= ranker_lib.MAX_ERROR_CHARS + 10
    status, _ = post(f"{url}:predict", {"instances": instances_of(sc.make_batch(1000))[:2]})
    assert status == 200


def test_endpoints(cluster):
    url = cluster["urls"]["plain"]
    assert get(url)["model_version_status"][0]["state"] == "AVAILABLE"
    meta = get(f"{url}/metadata")
    assert meta["features"]["history"]["layout"] == "sequence" and "dense" in meta["dense_inputs"]
    status, answer = post(url.replace("/dlrm", "/other") + ":predict", {"instances": [{}]})
    assert status == 404 and "no model named 'other'" in answer["error"]


def test_a_killed_server_gives_503_naming_it_and_recovers(cluster):
    url = cluster["urls"]["plain"]
    instances = instances_of(sc.make_batch(3000))
    victim, port = cluster["servers"][1], cluster["ports"][1]
    stop(victim, signal.SIGKILL)
    t0 = time.monotonic()
    status, answer = post(f"{url}:predict", {"instances": instances})
    assert status == 503 and f"127.0.0.1:{port}" in answer["error"], (status, answer)
    # Fast: the refused connection, or at worst the 2 s --timeout-s, not the ranker's 30 s answer timeout.
    assert time.monotonic() - t0 < 10
    assert get(f"{url}/stats")["errors_503"] >= 1
    cluster["servers"][1] = start(["tf_fusedrec.serve.embedding_server", "--export", cluster["export"], "--shard",
                                   "1", "--num-shards", "2", "--port", str(port)])
    deadline = time.monotonic() + WAIT_S
    while True:
        status, answer = post(f"{url}:predict", {"instances": instances})
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert status == 200, answer
    np.testing.assert_allclose(answer["predictions"], expected(cluster["local"], instances), rtol=1e-6, atol=1e-7)


# --- limits, against the ranker built from its flags in this process --------------------------------------------

# The idle and read timeouts are the windows a test's next step must land in (all connections idle, all busy), and
# every request of these tests must arrive within the read timeout of its first byte: 2 s, not less, on a busy machine.
TIGHT = {"max_connections": 3, "idle_timeout_s": 2.0, "read_timeout_s": 2.0, "max_instances": 8, "max_ids": 100,
         "max_body_bytes": 30_000, "max_queue": 1}


@pytest.fixture(scope="module")
def tight(trained):
    """The ranker with small limits (TIGHT), its rows in this process (--servers local), serving from a thread."""
    export_dir, _ = trained
    served = serve_fixtures.RankerThread([
        "--export", export_dir, "--servers", "local", "--cache-mb", "0", "--name", "tight",
        "--max-connections", str(TIGHT["max_connections"]), "--idle-timeout-s", str(TIGHT["idle_timeout_s"]),
        "--read-timeout-s", str(TIGHT["read_timeout_s"]), "--max-instances", str(TIGHT["max_instances"]),
        "--max-ids", str(TIGHT["max_ids"]), "--max-body-mb", str(TIGHT["max_body_bytes"] / ranker_lib.MB),
        "--max-queue", str(TIGHT["max_queue"])])
    yield served
    served.close()


def settle(tight):
    """Waits until the ranker is done with the connections of the requests before: on a busy machine its event loop
    can lag behind the client, and they would still hold slots of the 3 (--max-connections) when the next request
    comes, which is then refused with 503 if none of them is idle."""
    wait_for(lambda: tight.server.open_count() == 0, "the connections of the requests before closed")


def tight_stats(tight):
    settle(tight)
    return get(f"{tight.url}/stats")


def well_formed(tight, local, step=1000):
    """A well-formed request of 3 instances is answered 200 with the in-process model's scores."""
    instances = instances_of(sc.make_batch(step))[:3]
    settle(tight)
    status, answer = post(f"{tight.url}:predict", {"instances": instances}, timeout=WAIT_S)
    assert status == 200, answer
    np.testing.assert_allclose(answer["predictions"], expected(local, instances), rtol=1e-6, atol=1e-7)


def wait_for(condition, what, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.01)


def test_request_size_limits(tight, trained):
    path = "/v1/models/tight:predict"
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    cases = [  # raw requests: no Content-Length, a chunked body, a body too large (its bytes never sent), no number
        (head + "\r\n", 411, "Content-Length header is required"),
        (head + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 411, "Transfer-Encoding"),
        (head + "Content-Length: 10000000\r\n\r\n", 413, f"exceeds --max-body-mb ({TIGHT['max_body_bytes']} bytes)"),
        (head + "Content-Length: 9" + "9" * 5000 + "\r\n\r\n", 413, "--max-body-mb"),
        (head + "Content-Length: 12abc\r\n\r\n", 400, "Content-Length header '12abc' is not a byte count"),
        (head + "Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400, "2 different Content-Length headers"),
        ("GET / HTTP/1.1\r\nHost: x\r\n" + "X: y\r\n" * 200 + "\r\n", 431, "Too many headers"),
        ("BREW /pot HTTP/1.1\r\nHost: x\r\n\r\n", 501, "Unsupported method ('BREW')"),
        ("POST /x HTTP/9.9\r\n\r\n", 505, "Invalid HTTP version"),
    ]
    for request, status, message in cases:
        settle(tight)
        answer_status, answer = raw_http(tight.port, request.encode())
        assert answer_status == status and message in answer["error"], (request[:80], answer_status, answer)

    instances = instances_of(sc.make_batch(1000))
    nine = (instances * 2)[:TIGHT["max_instances"] + 1]
    many_ids = [dict(instances[i], tags=list(range(40))) for i in range(3)]  # 120 ids > --max-ids 100
    bodies = [
        ({"instances": nine}, "holds 9 instances, at most 8 are accepted (--max-instances)"),
        ({"inputs": {name: [inst[name] for inst in nine] for name in nine[0]}},
         "9 instances, at most 8 are accepted (--max-instances)"),
        ({"instances": many_ids}, "more than 100 ids (--max-ids)"),
        (b'{"instances": [' + b",".join([b"[]"] * 5000) + b"]}", "JSON values, more than --max-ids (100 ids)"),
        (b"[" + b"1," * 200 + b"1]", "more than 100 ids (--max-ids)"),  # stops the parse at id 101
        (b" " * (TIGHT["max_body_bytes"] + 1), "--max-body-mb"),  # sent whole: the answer must reach the client
    ]
    for payload, message in bodies:
        settle(tight)
        status, answer = post(f"{tight.url}:predict", payload, timeout=WAIT_S)
        assert status == 413 and message in answer["error"], (status, answer)
    stats = tight_stats(tight)
    assert stats["errors_413"] >= len(bodies) + 2 and stats["errors_411"] >= 2 and stats["errors_500"] == 0, stats
    well_formed(tight, trained[1])


def test_idle_connections_are_dropped_and_a_client_is_served(tight, trained):
    """Idle sockets at the connection cap: a new client takes the slot of the longest idle one at once, and every idle
    one is closed within --idle-timeout-s (the test this replaces showed 64 idle sockets locking everyone out)."""
    before, refused = tight_stats(tight)["idle_closed"], tight.server.refused
    # The request and its expected scores are made first: from the first connection, the window for the new client to
    # find them all idle is --idle-timeout-s.
    instances = instances_of(sc.make_batch(1000))[:3]
    want = expected(trained[1], instances)
    idle = [socket.create_connection(("127.0.0.1", tight.port), timeout=WAIT_S)
            for _ in range(TIGHT["max_connections"])]
    try:
        wait_for(lambda: tight.server.idle_count() == len(idle), "the idle connections accepted")
        began = time.monotonic()
        status, answer = post(f"{tight.url}:predict", {"instances": instances}, timeout=WAIT_S)  # at the cap, all idle
        assert status == 200, answer
        np.testing.assert_allclose(answer["predictions"], want, rtol=1e-6, atol=1e-7)
        assert tight.server.evicted >= 1 and tight.server.refused == refused
        for sock in idle:
            assert sock.recv(1) == b"", "an idle connection was answered instead of closed"
        # Closed by --idle-timeout-s (the socket timeout, WAIT_S, would raise instead); the slack is the machine's.
        assert time.monotonic() - began < TIGHT["idle_timeout_s"] + 5.0
    finally:
        for sock in idle:
            sock.close()
    wait_for(lambda: tight_stats(tight)["idle_closed"] - before >= len(idle), "every idle connection counted")
    well_formed(tight, trained[1], step=1001)


def test_slow_clients_get_408_and_busy_connections_beyond_the_cap_get_503(tight, trained):
    """Connections that are sending a request are not idle: beyond the cap a new one gets 503 naming
    --max-connections; each slow request gets 408 naming --read-timeout-s (a body sent half, headers a byte at a time),
    which frees the slots, and a well-formed client is served again."""
    head = b"POST /v1/models/tight:predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n"
    settle(tight)
    slow = [socket.create_connection(("127.0.0.1", tight.port), timeout=WAIT_S)
            for _ in range(TIGHT["max_connections"])]
    answers = [b""] * len(slow)
    sent = [0] * len(slow)  # header bytes a trickle has sent
    sent_before_answer = [None] * len(slow)
    stop = threading.Event()

    def trickle(sock, i):  # the headers one byte every 0.1 s: 8 s at least, far beyond --read-timeout-s
        for byte in head:
            if stop.is_set():
                return
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                return
            sent[i] += 1
            time.sleep(0.1)

    def read(sock, i):
        try:
            while chunk := sock.recv(65536):
                if sent_before_answer[i] is None:
                    sent_before_answer[i] = sent[i]
                answers[i] += chunk
        except OSError:
            pass

    slow[0].sendall(head + b'{"instances": ')  # a body sent in part
    threads = [threading.Thread(target=trickle, args=(sock, i), daemon=True) for i, sock in enumerate(slow[1:], 1)]
    threads += [threading.Thread(target=read, args=(sock, i), daemon=True) for i, sock in enumerate(slow)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: tight.server.open_count() == len(slow) and tight.server.idle_count() == 0,
                 "the slow requests under way")
        status, answer = raw_http(tight.port, b"GET /v1/models/tight HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 503 and "--max-connections" in answer["error"], (status, answer)
        for t in threads[len(slow) - 1:]:
            t.join(WAIT_S)
    finally:
        stop.set()
        for sock in slow:
            sock.close()
    limit = f"--read-timeout-s ({TIGHT['read_timeout_s']:g} s)".encode()
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 408 ") and limit in answer, answer
    # The limit runs from a request's first byte, not per read: the trickles were answered while their headers were
    # still arriving (a clock of their own, whatever the machine's load; at 0.1 s a byte, about 20 of 80 were sent).
    for i in range(1, len(slow)):
        assert sent_before_answer[i] < len(head), (i, sent_before_answer[i], len(head))
    assert tight_stats(tight)["errors_408"] >= len(slow)
    well_formed(tight, trained[1])


class _WatchedLock:
    """A lock that records when someone starts waiting for it (the batcher, once it has gathered its batch)."""

    def __init__(self):
        self.inner, self.waiting = threading.Lock(), threading.Event()

    def __enter__(self):
        self.waiting.set()
        self.inner.acquire()

    def __exit__(self, *exc):
        self.inner.release()


def test_queue_overflow_gets_503(tight, trained):
    """With the model busy (its lock held here), one request waits in the batcher and --max-queue (1) more in the
    queue; the next is answered 503 naming --max-queue at once, and the waiting two are answered once the model is
    free. The second request is sent only once the batcher waits for the model's lock: before, a batcher slow to be
    scheduled could still take it into the first batch (its 2 ms gathering window started, not yet ended)."""
    local = trained[1]
    batches = [instances_of(sc.make_batch(4000 + i))[:2] for i in range(3)]
    answers = [None] * 3

    def ask(i):
        answers[i] = post(f"{tight.url}:predict", {"instances": batches[i]}, timeout=WAIT_S)

    ranker = tight.ranker
    settle(tight)  # the 3 requests below take every connection slot
    threads = [threading.Thread(target=ask, args=(i,), daemon=True) for i in range(2)]
    model_lock, watched = ranker.model._lock, _WatchedLock()  # noqa: SLF001  (the dense model's lock)
    ranker.model._lock = watched  # noqa: SLF001
    try:
        with watched.inner:
            threads[0].start()
            assert watched.waiting.wait(WAIT_S), f"the first request reached the model within {WAIT_S} s"
            assert ranker.stats()["queue_depth"] == 0
            threads[1].start()
            wait_for(lambda: ranker.stats()["queue_depth"] == 1, "the second request queued")
            ask(2)
            status, answer = answers[2]
            assert status == 503 and "1 requests are already waiting (--max-queue)" in answer["error"], answers[2]
        for t in threads:
            t.join(WAIT_S)
    finally:
        ranker.model._lock = model_lock  # noqa: SLF001
    for i in range(2):
        status, answer = answers[i]
        assert status == 200, answer
        np.testing.assert_allclose(answer["predictions"], expected(local, batches[i]), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("flag", ["--max-ids", "--idle-timeout-s", "--read-timeout-s", "--max-connections"])
def test_limit_flags_are_checked(flag, capsys):
    with pytest.raises(SystemExit):
        ranker_lib.parse_args(["--export", "e", "--servers", "local", "--port", "0", flag, "0"])
    assert flag in capsys.readouterr().err


def test_slow_path_switch_flag_is_checked(capsys):
    assert ranker_lib.parse_args(["--export", "e", "--servers", "local", "--port", "0"]).slow_path_switch_ms == 0.02
    with pytest.raises(SystemExit):
        ranker_lib.parse_args(["--export", "e", "--servers", "local", "--port", "0", "--slow-path-switch-ms", "-1"])
    assert "--slow-path-switch-ms" in capsys.readouterr().err


def test_short_slices_nest_and_restore_the_switch_interval():
    before = sys.getswitchinterval()
    slices = ranker_lib._ShortSlices(1e-5)  # noqa: SLF001
    with slices:
        assert sys.getswitchinterval() == pytest.approx(1e-5)
        with slices:
            assert sys.getswitchinterval() == pytest.approx(1e-5)
        assert sys.getswitchinterval() == pytest.approx(1e-5)  # another thread is still inside
    assert sys.getswitchinterval() == before
    with ranker_lib._ShortSlices(0):  # noqa: SLF001  (0: Python's own interval)
        assert sys.getswitchinterval() == before
    with ranker_lib._ShortSlices(1.0):  # noqa: SLF001  (never lengthened)
        assert sys.getswitchinterval() == before


class _RecordedSlices:
    """A Ranker's short_slices, recording the switch interval each entry set."""

    def __init__(self, inner):
        self.inner, self.intervals = inner, []

    def __enter__(self):
        self.inner.__enter__()
        self.intervals.append(sys.getswitchinterval())

    def __exit__(self, *exc):
        self.inner.__exit__(*exc)


def test_malformed_requests_and_their_connections_run_in_short_slices(tight, trained):
    """A request the fast parser refuses is parsed in short thread slices, and so is every later request of a
    connection that was answered a 4xx; a well-formed request of a clean connection is not, and the interval is
    Python's own again once they are answered. Scores stay exact on the suspect connection."""
    import http.client  # noqa: PLC0415

    local = trained[1]
    good = instances_of(sc.make_batch(5000))[:3]
    bad = [{**good[0], "user_id": "abc"}] + good[1:]
    ranker, before = tight.ranker, sys.getswitchinterval()
    recorded = _RecordedSlices(ranker.short_slices)
    ranker.short_slices = recorded

    def ask(conn, instances):
        conn.request("POST", "/v1/models/tight:predict", body=json.dumps({"instances": instances}),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())

    settle(tight)
    conn = http.client.HTTPConnection("127.0.0.1", tight.port, timeout=WAIT_S)
    try:
        status, answer = ask(conn, good)
        assert status == 200 and recorded.intervals == [], (answer, recorded.intervals)
        status, answer = ask(conn, bad)
        assert status == 400 and "user_id" in answer["error"], answer
        assert len(recorded.intervals) == 1, recorded.intervals  # the reference parser's path
        status, answer = ask(conn, good)
        assert status == 200, answer
        np.testing.assert_allclose(answer["predictions"], expected(local, good), rtol=1e-6, atol=1e-7)
        assert len(recorded.intervals) == 2, recorded.intervals  # the suspect connection's request
    finally:
        conn.close()
        ranker.short_slices = recorded.inner
    assert recorded.intervals == [pytest.approx(ranker_lib.DEFAULT_SLOW_PATH_SWITCH_S)] * 2
    status, answer = post(f"{tight.url}:predict", {"instances": good}, timeout=WAIT_S)  # a new connection: clean
    assert status == 200 and len(recorded.intervals) == 2
    wait_for(lambda: sys.getswitchinterval() == before, "the switch interval restored")


def test_rate_gate_admits_at_its_rate_in_order():
    """_RateGate(10): a burst of 1.5 tokens, then one admission every 0.1 s, in the order asked; rate 0 never waits."""
    import asyncio  # noqa: PLC0415

    async def run(rate, n):
        gate, order = ranker_lib._RateGate(rate), []  # noqa: SLF001
        loop = asyncio.get_running_loop()
        began = loop.time()

        async def one(i):
            waited = await gate.admit()
            order.append((i, waited))

        await asyncio.gather(*(one(i) for i in range(n)))
        return order, loop.time() - began

    order, elapsed = asyncio.run(run(10.0, 5))
    assert order == [(0, False), (1, True), (2, True), (3, True), (4, True)]
    assert elapsed >= 0.35  # 4 admissions beyond the first token at 0.1 s each, less the half token of the burst
    order, _ = asyncio.run(run(0.0, 5))
    assert order == [(i, False) for i in range(5)]


def test_malformed_requests_wait_for_the_malformed_qps(trained):
    """--malformed-qps 2: a connection sending malformed bodies back to back gets every one answered 400 naming the
    feature, but after the first they wait for the gate (counted in /stats); a well-formed request of another
    connection, sent while they wait, passes no gate and gets the model's scores."""
    import http.client  # noqa: PLC0415

    export_dir, local = trained
    served = serve_fixtures.RankerThread(["--export", export_dir, "--servers", "local", "--cache-mb", "0",
                                          "--name", "gated", "--malformed-qps", "2"])
    good = instances_of(sc.make_batch(6000))[:3]
    bad = json.dumps({"instances": [{**good[0], "user_id": "abc"}] + good[1:]})
    statuses = []

    def send_bad():
        conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=WAIT_S)
        try:
            for _ in range(5):
                conn.request("POST", "/v1/models/gated:predict", body=bad, headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                statuses.append((response.status, json.loads(response.read())["error"]))
        finally:
            conn.close()

    try:
        sender = threading.Thread(target=send_bad, daemon=True)
        sender.start()
        wait_for(lambda: served.ranker.stats()["malformed_waits"] >= 1, "a malformed request waiting")
        status, answer = post(f"{served.url}:predict", {"instances": good}, timeout=WAIT_S)
        assert status == 200, answer
        np.testing.assert_allclose(answer["predictions"], expected(local, good), rtol=1e-6, atol=1e-7)
        sender.join(WAIT_S)
        assert [s for s, _ in statuses] == [400] * 5 and all("user_id" in e for _, e in statuses), statuses
        stats = served.ranker.stats()
        assert stats["malformed_waits"] >= 3 and stats["errors_400"] == 5, stats
    finally:
        served.close()

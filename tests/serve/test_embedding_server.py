"""Embedding servers (serve/embedding_server.py) and RemoteBackend (serve/client.py) against LocalBackend.

Servers run in this process (EmbeddingServer) where the test only needs the protocol, and as subprocesses (the CLI)
where it needs the command line, SIGKILL or SIGTERM. The subprocesses are started when the module starts, so their
TensorFlow import overlaps the in-process tests; every wait is bounded. Hardening: the response cap is checked before
any row is gathered, the Credits client table is bounded (length and count; the others share one pool), Info names no
absolute path, and malformed requests of every kind get INVALID_ARGUMENT naming the field.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest

from tests.serve import serve_fixtures
from tests.subprocess_runner import ROOT, child_env, tail
from tf_fusedrec.export import format as fmt
from tf_fusedrec.serve import embedding_pb2 as pb
from tf_fusedrec.serve import embedding_server
from tf_fusedrec.serve.backend import LocalBackend, Lookup
from tf_fusedrec.serve.client import RangeTable, RemoteBackend, ServerBusy, ServerUnavailable

GROUPS = ("packed", "hashed")
TABLES = serve_fixtures.fake_tables()
READY_TIMEOUT_S = 120  # a subprocess imports TensorFlow before it serves; the machine is shared
# A lookup's deadline where a test checks what is answered, not how fast: a burst of lookups queued behind one
# computing thread must not run into RemoteBackend's default 5 s on a busy machine.
LOOKUP_TIMEOUT_S = 60


def query(rng, group, trained=400, untrained=150, repeats=100):
    """Random (ids, categories) of a group: trained pairs, never-trained ids (initializer rows) and repeats."""
    spec, ids, categories, _, _ = TABLES[group]
    pick = rng.integers(0, len(ids), trained)
    new_ids = rng.integers(serve_fixtures.ID_SPACE, 2 * serve_fixtures.ID_SPACE, untrained)
    new_categories = rng.integers(0, len(spec["features"]), untrained)
    q_ids = np.concatenate([ids[pick], new_ids])
    q_categories = np.concatenate([categories[pick], new_categories])
    again = rng.integers(0, len(q_ids), repeats)
    order = rng.permutation(len(q_ids) + repeats)
    return np.concatenate([q_ids, q_ids[again]])[order], np.concatenate([q_categories, q_categories[again]])[order]


def distinct_untrained(group, ids, categories):
    _, trained_ids, trained_categories, _, _ = TABLES[group]
    trained = set(zip(trained_ids.tolist(), trained_categories.tolist()))
    return len(set(zip(ids.tolist(), categories.tolist())) - trained)


def raw_lookup(address, entries, timeout=10.0):
    """A Lookup sent through a bare channel (no RemoteBackend): -> LookupResponse; grpc.RpcError as raised."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(embedding_server.LOOKUP_METHOD)
        payload = entries if isinstance(entries, bytes) else pb.LookupRequest(groups=entries).SerializeToString()
        return pb.LookupResponse.FromString(call(payload, timeout=timeout))


def entry(group, ids, categories, **fields):
    return pb.GroupLookup(group=group, ids=np.asarray(ids, "<i8").tobytes(),
                          categories=np.asarray(categories, "<i4").tobytes(), **fields)


class ServerProcess:
    """`python -m tf_fusedrec.serve.embedding_server` in its own process group, its output collected by threads."""

    def __init__(self, export, port, *args):
        self.port, self.address = port, f"127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tf_fusedrec.serve.embedding_server", "--export", export, "--port", str(port),
             *args], cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        self.stdout, self.stderr = [], []
        self._ready = threading.Event()
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.stdout), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr), daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, lines):
        for line in stream:
            lines.append(line)
            if line.strip() == "ready":
                self._ready.set()
        self._ready.set()  # the process ended: wake wait_ready, which then reports it

    def output(self):
        return tail("".join(self.stdout) + "".join(self.stderr))

    def wait_ready(self):
        if not self._ready.wait(READY_TIMEOUT_S) or self.proc.poll() is not None:
            self.send(signal.SIGKILL)
            pytest.fail(f"embedding server on {self.address} not ready within {READY_TIMEOUT_S} s:\n{self.output()}")
        return self

    def send(self, signum):
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass

    def stop(self, signum=signal.SIGTERM, timeout=20):
        """Sends signum; -> the exit status (SIGKILL after `timeout` seconds)."""
        self.send(signum)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.send(signal.SIGKILL)
            rc = self.proc.wait(10)
        for reader in self._readers:
            reader.join(5)
        return rc


# --- fixtures ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return serve_fixtures.write_fake_export(str(tmp_path_factory.mktemp("serve") / "export"))


@pytest.fixture(scope="module")
def local(export):
    return LocalBackend(export)


@pytest.fixture(scope="module")
def processes(export):
    """Subprocess servers, started at once (waited for by the tests that use them): "split" holds the upper half of
    even range 1 of 2 (explicit --start/--end), "victim" holds everything and is killed and restarted."""
    start, end = fmt.even_ranges(2)[1]
    middle = (start + end) // 2
    procs = {"split": ServerProcess(export, serve_fixtures.reserved_port(), "--start", hex(middle), "--end", hex(end)),
             "victim": ServerProcess(export, serve_fixtures.reserved_port(), "--shard", "0", "--num-shards", "1")}
    procs["split_range"] = (middle, end)
    yield procs
    for name in ("split", "victim"):
        procs[name].stop(signal.SIGKILL)


@pytest.fixture(scope="module", autouse=True)
def start_processes_early(processes):
    """Makes every test of the module start the subprocesses first, so their start-up overlaps the other tests."""


@pytest.fixture(scope="module")
def clusters(export):
    """In-process servers of even ranges: {n: [EmbeddingServer] * n} for n = 1, 2, 3."""
    servers = {n: [embedding_server.EmbeddingServer(export, start, end) for start, end in fmt.even_ranges(n)]
               for n in (1, 2, 3)}
    for group in servers.values():
        for server in group:
            server.start(0)
    yield servers
    for group in servers.values():
        for server in group:
            server.stop(grace=0)


def addresses(servers):
    return [f"127.0.0.1:{s.port}" for s in servers]


# --- rows and pooling --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3])
def test_rows_equal_local(export, local, clusters, n):
    rng = np.random.default_rng(n)
    with RemoteBackend(export, addresses(clusters[n])) as remote:
        for group in GROUPS:
            ids, categories = query(rng, group)
            before = remote.stats()["rows_not_trained"]
            rows = remote.rows(group, ids, categories)
            assert rows.dtype == np.float32
            assert np.array_equal(rows, local.rows(group, ids, categories)), group
            # The servers' not_trained counts reach the client: one per distinct untrained pair.
            assert remote.stats()["rows_not_trained"] - before == distinct_untrained(group, ids, categories)
        assert remote.rows("hashed", np.zeros(0, np.int64), np.zeros(0, np.int64)).shape == (0, 8)
        stats = remote.stats()
        for address, server in stats["servers"].items():
            assert server["requests"] > 0 and server["errors"] == 0, (address, server)
        assert stats["bytes_received"] > 0


@pytest.mark.parametrize("n", [1, 3])
def test_rows_many_equals_rows_per_group(export, local, clusters, n):
    # Every group's requests in flight together (and a group twice, and an empty lookup): each answer is the group's
    # own rows, in the order asked, and the counters add up as for separate calls.
    rng = np.random.default_rng(20 + n)
    lookups = [(group, *query(rng, group)) for group in GROUPS + GROUPS[:1]]
    lookups.append(("hashed", np.zeros(0, np.int64), np.zeros(0, np.int64)))
    with RemoteBackend(export, addresses(clusters[n])) as remote:
        answers = remote.rows_many(lookups)
        assert len(answers) == len(lookups)
        for (group, ids, categories), rows in zip(lookups, answers):
            assert rows.dtype == np.float32 and rows.shape == (len(ids), local.groups[group].dim), group
            assert np.array_equal(rows, local.rows(group, ids, categories)), group
        assert remote.stats()["rows_looked_up"] == sum(len(ids) for _, ids, _ in lookups)
    # the interface's default (LocalBackend): one rows() call per lookup
    for (group, ids, categories), rows in zip(lookups, local.rows_many(lookups)):
        assert np.array_equal(rows, local.rows(group, ids, categories)), group


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("pooling", [True, False], ids=["pooling", "no_pooling"])
@pytest.mark.parametrize("max_ids", [None, 97], ids=["packed", "split"])
def test_lookup_many_sends_one_request_per_server_and_equals_each_call(export, local, clusters, n, pooling, max_ids):
    # Rows and pooled bags of every group (a group twice, an empty lookup) in one lookup_many call: each answer is the
    # LocalBackend's, in the order asked; with room, each server gets one request for all of them (one round trip);
    # with max_ids_per_request small, the entries are split over more requests and the answers do not change.
    rng = np.random.default_rng(30 + n)
    lookups = []
    for group in GROUPS + GROUPS[:1]:
        ids, categories = query(rng, group)
        lookups.append(Lookup(group, ids, categories))
        ids, categories = query(rng, group, trained=300, untrained=80, repeats=120)
        lookups.append(Lookup(group, ids, categories, rng.integers(0, 90, len(ids)), 100))
    lookups.append(Lookup("hashed", np.zeros(0, np.int64), np.zeros(0, np.int64)))
    lookups.append(Lookup("packed", np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), 5))
    kwargs = {} if max_ids is None else {"max_ids_per_request": max_ids}
    with RemoteBackend(export, addresses(clusters[n]), pooling=pooling, timeout_s=LOOKUP_TIMEOUT_S, **kwargs) as remote:
        before = {a: s["requests"] for a, s in remote.stats()["servers"].items()}
        answers = remote.lookup_many(lookups)
        after = {a: s["requests"] for a, s in remote.stats()["servers"].items()}
        assert len(answers) == len(lookups)
        for q, answer in zip(lookups, answers):
            if q.segments is None:
                assert answer.dtype == np.float32 and answer.shape == (len(q.ids), local.groups[q.group].dim)
                assert np.array_equal(answer, local.rows(q.group, q.ids, q.categories)), q.group
            else:
                want_sums, want_counts = local.pooled(q.group, q.ids, q.categories, q.segments, q.num_segments)
                sums, counts = answer
                np.testing.assert_allclose(sums, want_sums, rtol=1e-6, atol=1e-6, err_msg=q.group)
                assert np.array_equal(counts, want_counts) and counts.dtype == np.int64, q.group
        sent = sum(after[a] - before[a] for a in after)
        if max_ids is None:
            assert sent == n, f"{sent} requests to {n} servers"
        else:
            assert sent > n
        assert remote.stats()["rows_looked_up"] == sum(len(q.ids) for q in lookups)
    # the interface's default (LocalBackend): one rows() or pooled() call per lookup
    for q, answer in zip(lookups, local.lookup_many(lookups)):
        if q.segments is None:
            assert np.array_equal(answer, local.rows(q.group, q.ids, q.categories))


@pytest.mark.parametrize("n", [1, 3])
def test_pooled_equal_local_and_moves_fewer_bytes(export, local, clusters, n):
    rng = np.random.default_rng(10 + n)
    num_segments = 300
    with RemoteBackend(export, addresses(clusters[n])) as pooled, \
            RemoteBackend(export, addresses(clusters[n]), pooling=False) as unpooled:
        for group in GROUPS:
            ids, categories = query(rng, group, trained=3000, untrained=1000, repeats=500)
            # Multi-hot bags of ~15 ids; the last 20 segments stay empty.
            segments = rng.integers(0, num_segments - 20, len(ids))
            want_sums, want_counts = local.pooled(group, ids, categories, segments, num_segments)
            received = [b.stats()["bytes_received"] for b in (pooled, unpooled)]
            sums, counts = pooled.pooled(group, ids, categories, segments, num_segments)
            assert sums.shape == want_sums.shape and sums.dtype == np.float32
            np.testing.assert_allclose(sums, want_sums, rtol=1e-6, atol=1e-6)
            assert np.array_equal(counts, want_counts) and counts.dtype == np.int64
            assert not sums[-20:].any()
            sums_unpooled, counts_unpooled = unpooled.pooled(group, ids, categories, segments, num_segments)
            assert np.array_equal(sums_unpooled, want_sums) and np.array_equal(counts_unpooled, want_counts)
            moved_pooled = pooled.stats()["bytes_received"] - received[0]
            moved_unpooled = unpooled.stats()["bytes_received"] - received[1]
            assert moved_pooled < moved_unpooled, (group, moved_pooled, moved_unpooled)


# --- routing -----------------------------------------------------------------------------------------------------


def test_range_table():
    table = RangeTable.even(["a:1", ["b:1", "b:2"], "c:1"])
    fmt.check_ranges(table.ranges)
    assert table.addresses == ["a:1", "b:1", "b:2", "c:1"]
    assert [addresses for _, _, addresses in table] == [("a:1",), ("b:1", "b:2"), ("c:1",)]
    # Every boundary route lands in the range that holds it.
    edges = np.array([p for start, end in table.ranges for p in (start, end - 1)], np.uint64)
    assert table.index(edges).tolist() == [0, 0, 1, 1, 2, 2]
    routes = np.random.default_rng(0).integers(0, 2**63, 1000, dtype=np.int64).view(np.uint64) * np.uint64(2)
    index = table.index(routes)
    for i, (start, end) in enumerate(table.ranges):
        assert np.array_equal(index == i, fmt.in_range(routes, start, end))

    split = table.split("b:1", "d:1")
    fmt.check_ranges(split.ranges)
    (b_start, b_end), = [(s, e) for s, e, a in table if a[0] == "b:1"]
    middle = (b_start + b_end) // 2
    assert [(s, e, a) for s, e, a in split if s >= b_start and e <= b_end] == [
        (b_start, middle, ("b:1", "b:2")), (middle, b_end, ("d:1",))]
    assert len(table) == 3 and len(split) == 4  # split returns a new table
    assert table.split("a:1", "e:1", at=5).entries[:2] == ((0, 5, ("a:1",)), (5, table.ranges[0][1], ("e:1",)))

    with pytest.raises(ValueError, match="overlap"):
        RangeTable([(0, 2**63 + 1, "a:1"), (2**63, 2**64, "b:1")])
    with pytest.raises(ValueError, match="gap"):
        RangeTable([(0, 2**62, "a:1"), (2**63, 2**64, "b:1")])
    with pytest.raises(ValueError, match="at least one"):
        RangeTable([(0, 2**64, [])])
    with pytest.raises(ValueError, match="'x:1' is the primary of 0 ranges"):
        table.split("x:1", "d:1")
    with pytest.raises(ValueError, match="not inside"):
        table.split("a:1", "d:1", at=table.ranges[0][1])
    with pytest.raises(ValueError, match="non-empty list"):
        RangeTable.even([])


def test_serving_through_a_split_table(export, local, clusters, processes):
    two = clusters[2]
    split_server = processes["split"].wait_ready()
    info = pb.InfoResponse.FromString(
        grpc.insecure_channel(split_server.address).unary_unary(embedding_server.INFO_METHOD)(b"", timeout=10))
    middle, end = processes["split_range"]
    assert (info.range_start, info.range_last) == (middle, end - 1)
    assert info.fingerprint == embedding_server.export_fingerprint(local.manifest)

    old, new = addresses(two)[1], split_server.address
    table = RangeTable.even(addresses(two)).split(old, new)
    assert table.entries[2] == (middle, end, (new,))
    rng = np.random.default_rng(7)
    with RemoteBackend(export, table) as remote:
        for group in GROUPS:
            ids, categories = query(rng, group)
            assert np.array_equal(remote.rows(group, ids, categories), local.rows(group, ids, categories)), group
        per_server = remote.stats()["servers"]
        assert all(per_server[a]["requests"] > 0 for a in table.addresses), per_server
    # A table that gives the new server more than it holds is refused, naming the server.
    with pytest.raises(ValueError, match=f"server {new} holds the range"):
        RemoteBackend(export, [addresses(two)[0], new])


def test_info_and_export_identity(export, local, clusters):
    manifest = local.manifest
    manifest_sha = fmt.sha256_of(os.path.join(export, "manifest.json"))
    held = {g: 0 for g in GROUPS}
    for address in addresses(clusters[3]):
        with grpc.insecure_channel(address) as channel:
            info = pb.InfoResponse.FromString(channel.unary_unary(embedding_server.INFO_METHOD)(b"", timeout=10))
        assert info.manifest_sha256 == manifest_sha
        assert info.fingerprint == embedding_server.export_fingerprint(manifest)
        for g in info.groups:
            assert g.rows_total == fmt.group_of(manifest, g.name)["rows"]
            held[g.name] += g.rows_held
    # The three ranges partition every group's rows.
    assert held == {g: fmt.group_of(manifest, g)["rows"] for g in GROUPS}
    # A manifest of other tables (one part rewritten) is refused by name of the server.
    other = {**manifest, "groups": [dict(g) for g in manifest["groups"]]}
    other["groups"][0]["parts"] = [{**p, "sha256": "0" * 64} for p in other["groups"][0]["parts"]]
    address = addresses(clusters[1])[0]
    with pytest.raises(ValueError, match=f"server {address} serves another export"):
        RemoteBackend(other, [address])


# --- flow control ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def narrow_server(export):
    """A server that admits 2 lookups at once and computes 1 at a time."""
    server = embedding_server.EmbeddingServer(export, max_inflight=2, threads=1)
    server.start(0)
    yield server
    server.stop(grace=0)


def burst(calls):
    """Runs the calls from one thread each, released together; -> their results or exceptions, in order."""
    results = [None] * len(calls)
    barrier = threading.Barrier(len(calls))

    def run(i):
        barrier.wait()
        try:
            results[i] = calls[i]()
        except Exception as e:  # noqa: BLE001 (returned to the test, which checks it)
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


def big_query(seed, n=20000):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2 * serve_fixtures.ID_SPACE, n), rng.integers(0, 3, n)


def test_credits_bound_inflight(export, local, narrow_server):
    address = f"127.0.0.1:{narrow_server.port}"
    base = narrow_server.credits_state()
    with RemoteBackend(export, [address], timeout_s=LOOKUP_TIMEOUT_S) as remote:
        assert remote.stats()["servers"][address]["credits"] == 2
        queries = [big_query(seed) for seed in range(20)]
        results = burst([lambda q=q: remote.rows("hashed", *q) for q in queries])
        for q, rows in zip(queries, results):
            assert isinstance(rows, np.ndarray), rows
            assert np.array_equal(rows, local.rows("hashed", *q))
        state = narrow_server.credits_state()
        client = remote.stats()["servers"][address]
    # The server's own high-water mark: never more than its 2 credits in flight, and the burst did reach 2.
    assert state.high_water == 2, state
    assert state.rejected == base.rejected, "the client's credits kept it within the server's limit"
    assert state.lookups - base.lookups == 20
    assert client["max_queue_depth"] > 2 and client["queue_depth"] == 0 and client["inflight"] == 0, client
    assert client["requests"] == 20 and client["busy_retries"] == 0


def test_credits_are_shared_among_clients(export, local, narrow_server):
    address = f"127.0.0.1:{narrow_server.port}"
    base = narrow_server.credits_state()
    with RemoteBackend(export, [address], timeout_s=LOOKUP_TIMEOUT_S) as a, \
            RemoteBackend(export, [address], timeout_s=LOOKUP_TIMEOUT_S) as b:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(x.stats()["servers"][address]["credits"] != 1 for x in (a, b)):
            time.sleep(0.02)
        assert [x.stats()["servers"][address]["credits"] for x in (a, b)] == [1, 1]
        queries = [big_query(100 + seed, 5000) for seed in range(12)]
        results = burst([lambda q=q, x=(a, b)[i % 2]: x.rows("packed", q[0], q[1] % 2) for i, q in enumerate(queries)])
        for q, rows in zip(queries, results):
            assert np.array_equal(rows, local.rows("packed", q[0], q[1] % 2))
    state = narrow_server.credits_state()
    assert state.rejected == base.rejected and state.high_water <= 2


def test_server_refuses_beyond_max_inflight(export, local, narrow_server):
    """Without credits (a bare channel, or a client with stale credits) the server itself keeps the limit."""
    address = f"127.0.0.1:{narrow_server.port}"
    base = narrow_server.credits_state()
    ids, categories = big_query(0, 60000)
    request = [entry("hashed", ids, categories)]
    results = burst([lambda: raw_lookup(address, request)] * 12)
    refused = [r for r in results if isinstance(r, grpc.RpcError)]
    answered = [r for r in results if isinstance(r, pb.LookupResponse)]
    assert len(refused) + len(answered) == 12, results
    assert refused, "12 concurrent lookups of 60000 ids against --max-inflight 2 were all admitted"
    for e in refused:
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-inflight" in e.details()
        assert embedding_server.BUSY_METADATA in e.trailing_metadata()
    state = narrow_server.credits_state()
    assert state.high_water <= 2 and state.rejected - base.rejected == len(refused)

    # A client whose credits are stale (more than the server grants) retries the refused lookups.
    with RemoteBackend(export, [address], credits_poll_s=3600, timeout_s=LOOKUP_TIMEOUT_S) as remote:
        remote._servers[address].gate.set_limit(12)
        queries = [big_query(seed, 30000) for seed in range(12)]
        results = burst([lambda q=q: remote.rows("hashed", *q) for q in queries])
        for q, rows in zip(queries, results):
            assert np.array_equal(rows, local.rows("hashed", *q))
        assert remote.stats()["servers"][address]["busy_retries"] > 0
    assert narrow_server.credits_state().high_water <= 2


def test_credits_travel_on_their_own_connection(export):
    """Credits polls must not queue behind Lookup responses: the client reads them over a TCP connection of their
    own (the server sees two peers)."""
    server = embedding_server.EmbeddingServer(export)
    peers = {"lookup": set(), "credits": set()}
    lookup, credits = server._lookup, server._credits

    def record(kind, handler):
        def handle(payload, context):
            peers[kind].add(context.peer())
            return handler(payload, context)
        return handle

    server._lookup, server._credits = record("lookup", lookup), record("credits", credits)
    server.start(0)
    try:
        with RemoteBackend(export, [f"127.0.0.1:{server.port}"], credits_poll_s=0.01) as remote:
            remote.rows("packed", [1, 2, 3], [0, 1, 0])
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and len(peers["credits"]) == 0:
                time.sleep(0.01)
    finally:
        server.stop(grace=0)
    assert len(peers["lookup"]) == 1 and len(peers["credits"]) == 1, peers
    assert peers["lookup"].isdisjoint(peers["credits"]), peers


def test_no_credit_in_time_names_the_server(export, narrow_server):
    address = f"127.0.0.1:{narrow_server.port}"
    with RemoteBackend(export, [address], credits_poll_s=3600, timeout_s=0.3) as remote:
        gate = remote._servers[address].gate
        gate.set_limit(1)
        assert gate.acquire(1.0)  # holds the only credit
        began = time.monotonic()
        with pytest.raises(ServerBusy, match=f"server {address}, group 'packed': no credit"):
            remote.rows("packed", [1, 2], [0, 1])
        assert time.monotonic() - began < 4.0  # its 0.3 s, not the default 5 s
        gate.release()
        # The lookup that follows opens the lookup channel: more than 0.3 s on a busy machine.
        remote.timeout_s = LOOKUP_TIMEOUT_S
        assert remote.rows("packed", [1, 2], [0, 1]).shape == (2, 4)


# --- bad requests ------------------------------------------------------------------------------------------------


def test_malformed_requests_get_invalid_argument(clusters):
    address = addresses(clusters[1])[0]
    server = clusters[1][0]
    ok_ids, ok_categories = [1, 2, 3], [0, 1, 0]
    cases = [
        ([entry("nope", ok_ids, ok_categories)], ["'nope'", "field group"]),
        ([pb.GroupLookup(group="packed", ids=b"\0" * 13, categories=b"\0" * 4)], ["'packed'", "field ids", "13 bytes"]),
        ([pb.GroupLookup(group="packed", ids=b"\0" * 8, categories=b"\0" * 5)], ["'packed'", "field categories"]),
        ([entry("packed", ok_ids, [0, 1])], ["'packed'", "field categories has 2 values, field ids has 3"]),
        ([entry("packed", ok_ids, [0, 2, 0])], ["'packed'", "field categories: 2 is out of range [0, 2)"]),
        ([entry("hashed", [1, -5, 3], [0, 1, 2])], ["'hashed'", "field ids: 1 negative ids"]),
        ([entry("hashed", ok_ids, ok_categories, pool=True, segments=np.array([0, 4, 1], "<i4").tobytes(),
                num_segments=4)], ["'hashed'", "field segments: 4 is out of range"]),
        ([entry("hashed", ok_ids, ok_categories, pool=True, segments=np.array([0, 1], "<i4").tobytes(),
                num_segments=4)], ["'hashed'", "field segments has 2 values"]),
        ([entry("hashed", ok_ids, ok_categories, pool=True, segments=b"", num_segments=-1)],
         ["'hashed'", "field segments has 0 values"]),
        ([entry("hashed", [], [], pool=True, num_segments=-1)], ["'hashed'", "field num_segments is -1"]),
        ([entry("hashed", ok_ids, ok_categories, segments=np.array([0, 0, 0], "<i4").tobytes())],
         ["'hashed'", "field pool is false"]),
        # The second entry is the bad one: the message says which.
        ([entry("packed", ok_ids, ok_categories), entry("hashed", ok_ids, [0, 0, 9])], ["'hashed' (entry 1)"]),
        (b"\xff\xff\xff", ["not a LookupRequest"]),
        (b"", ["field groups: the request holds no entry"]),
        ([entry("packed", [1, 2**62, 3], [0, 1, 0])],
         ["'packed'", "field ids: 1 ids do not fit the group's packed keys", "ids must be < 2**62"]),
        ([entry("packed", [], [])] * (embedding_server.MAX_ENTRIES + 1),
         [f"field groups: {embedding_server.MAX_ENTRIES + 1} entries, at most {embedding_server.MAX_ENTRIES}"]),
    ]
    base = server.credits_state().invalid
    for request, expected in cases:
        with pytest.raises(grpc.RpcError) as raised:
            raw_lookup(address, request)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (expected, raised.value)
        for text in expected:
            assert text in raised.value.details(), (text, raised.value.details())
    assert server.credits_state().invalid - base == len(cases)
    # The server keeps answering.
    answer = raw_lookup(address, [entry("packed", ok_ids, ok_categories)])
    assert len(answer.groups) == 1 and len(answer.groups[0].rows) == 3 * 4 * 4


def test_misrouted_ids_are_refused(clusters):
    """Ids the server's range does not hold would silently get initializer rows: the server refuses them."""
    (start, end), address = fmt.even_ranges(2)[0], addresses(clusters[2])[0]
    ids = np.arange(200)
    routes = fmt.route(fmt.table_keys(ids, np.zeros(200), 3, "hashed"))
    outside = ids[~fmt.in_range(routes, start, end)]
    with pytest.raises(grpc.RpcError) as raised:
        raw_lookup(address, [entry("hashed", outside[:5], [0] * 5)])
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'hashed'" in raised.value.details() and "route outside this server's range" in raised.value.details()


def test_request_size_is_bounded_and_the_client_chunks(export, local):
    server = embedding_server.EmbeddingServer(export, max_request_mb=1)
    server.start(0)
    address = f"127.0.0.1:{server.port}"
    try:
        ids, categories = big_query(3, 150000)  # 1.8 MB of ids and categories
        with pytest.raises(grpc.RpcError) as raised:
            raw_lookup(address, [entry("hashed", ids, categories)])
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with RemoteBackend(export, [address]) as remote:
            assert np.array_equal(remote.rows("hashed", ids, categories), local.rows("hashed", ids, categories))
            # At most 1 MiB per request: 150000 distinct-ish pairs at 16 bytes each need at least 3 requests.
            assert remote.stats()["servers"][address]["requests"] >= 3
    finally:
        server.stop(grace=0)


def counting_lookups(server):
    """Wraps every group's GroupRows.lookup of an in-process server; -> {group: number of calls}."""
    calls = {name: 0 for name in server.groups}
    for name, rows_of in server.groups.items():
        def counted(ids, categories, name=name, lookup=rows_of.lookup):
            calls[name] += 1
            return lookup(ids, categories)
        rows_of.lookup = counted
    return calls


def test_response_cap_is_checked_before_any_row_is_gathered(export, local):
    """--max-response-mb 1: a Lookup whose answer would pass 1 MiB is refused naming the entry that crosses it, before
    any row is gathered (the size is known from the request), group by group; one just below is answered, and
    RemoteBackend splits its lookups to fit."""
    server = embedding_server.EmbeddingServer(export, max_response_mb=1)
    server.start(0)
    address = f"127.0.0.1:{server.port}"
    calls = counting_lookups(server)
    rng = np.random.default_rng(4)
    try:
        fits = 32000  # 32000 rows of dim 8: 1,024,000 bytes and framing, below 1 MiB
        ids, categories = rng.integers(0, 2 * serve_fixtures.ID_SPACE, 40000), rng.integers(0, 3, 40000)
        oversized = [
            [entry("hashed", ids[:33000], categories[:33000])],  # 1,056,000 bytes of rows alone
            [entry("packed", ids[:3000], categories[:3000] % 2), entry("hashed", ids[:fits], categories[:fits])],
            [entry("hashed", ids, categories, pool=True, segments=np.arange(40000, dtype="<i4").tobytes(),
                   num_segments=40000)],  # 40000 segments present: 1.6 MB of sums, segments and counts
        ]
        for request in oversized:
            with pytest.raises(grpc.RpcError) as raised:
                raw_lookup(address, request)
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            last = len(request) - 1
            assert f"'hashed' (entry {last}): the response would exceed 1048576 bytes (--max-response-mb)" in \
                raised.value.details(), raised.value.details()
        assert calls == {"packed": 0, "hashed": 0}, "rows were gathered for a refused lookup"

        segments = np.arange(40000, dtype=np.int64) % 10
        answered = [[entry("hashed", ids[:fits], categories[:fits])],
                    [entry("hashed", ids, categories, pool=True, segments=segments.astype("<i4").tobytes(),
                           num_segments=10)]]
        for request in answered:
            payload = pb.LookupRequest(groups=request).SerializeToString()
            with grpc.insecure_channel(address) as channel:
                answer = channel.unary_unary(embedding_server.LOOKUP_METHOD)(payload, timeout=30)
            # The bound the server checks is never below the answer's true size.
            assert len(answer) <= server._decode(0, request[0]).response_bytes <= server.max_response_bytes
        result = pb.LookupResponse.FromString(answer).groups[0]
        want_sums, want_counts = local.pooled("hashed", ids, categories, segments, 10)
        np.testing.assert_allclose(np.frombuffer(result.sums, "<f4").reshape(10, 8), want_sums, rtol=1e-6, atol=1e-6)
        assert np.array_equal(np.frombuffer(result.counts, "<i4"), want_counts)

        with RemoteBackend(export, [address]) as remote:
            assert np.array_equal(remote.rows("hashed", ids, categories), local.rows("hashed", ids, categories))
            assert remote.stats()["servers"][address]["requests"] >= 2
    finally:
        server.stop(grace=0)


def test_credits_client_table_is_bounded(export):
    """At most --max-clients client ids are registered; a flood of made-up ids joins one pool that counts as one
    client (credit 1 each), so registered clients keep max_inflight // (registered + 1); an id longer than
    MAX_CLIENT_ID_CHARS, or bytes that are no CreditsRequest, get INVALID_ARGUMENT naming the field."""
    server = embedding_server.EmbeddingServer(export, max_inflight=12, max_clients=2)
    server.start(0)
    try:
        assert server.credits_state("ranker-a").credits == 12
        answer = server.credits_state("ranker-b")
        assert (answer.credits, answer.clients) == (6, 2)
        for i in range(500):
            flood = server.credits_state(f"made-up-{i}")
        assert (flood.credits, flood.clients) == (1, 3)
        answer = server.credits_state("ranker-a")
        assert (answer.credits, answer.clients) == (4, 3)  # 12 // 3, not 12 // 502
        assert set(server._clients) == {"ranker-a", "ranker-b"}
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            credits = channel.unary_unary(embedding_server.CREDITS_METHOD)
            limit = embedding_server.MAX_CLIENT_ID_CHARS
            cases = [(pb.CreditsRequest(client_id="x" * (limit + 1)).SerializeToString(),
                      f"field client_id has {limit + 1} characters, at most {limit}"),
                     (b"\xff\xff", "not a CreditsRequest")]
            for payload, message in cases:
                with pytest.raises(grpc.RpcError) as raised:
                    credits(payload, timeout=10)
                assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in raised.value.details()
            answer = pb.CreditsResponse.FromString(
                credits(pb.CreditsRequest(client_id="x" * limit).SerializeToString(), timeout=10))
            assert answer.credits == 1 and len(server._clients) == 2
    finally:
        server.stop(grace=0)


def test_info_names_no_absolute_path(tmp_path):
    """Info carries the export directory's base name, and the manifest's source with every absolute path cut to its
    base name: the server's file layout stays on the server."""
    source = {"model_dir": str(tmp_path / "runs" / "demo-1"), "parts": ["/data/ckpt-3/", "relative/x"], "step": 3}
    export_dir = serve_fixtures.write_fake_export(str(tmp_path / "the-export"), keys_per_feature=20, source=source)
    server = embedding_server.EmbeddingServer(export_dir)
    server.start(0)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            info_call = channel.unary_unary(embedding_server.INFO_METHOD)
            info = pb.InfoResponse.FromString(info_call(b"", timeout=10))
            with pytest.raises(grpc.RpcError) as raised:
                info_call(b"\xff\xff", timeout=10)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not an InfoRequest" in raised.value.details()
    finally:
        server.stop(grace=0)
    assert info.export_dir == "the-export"
    assert json.loads(info.source_json) == {"model_dir": "demo-1", "parts": ["ckpt-3", "relative/x"], "step": 3}
    assert str(tmp_path) not in str(info) and "/data" not in info.source_json


def test_unknown_group_and_bad_arguments_client_side(export, clusters):
    with RemoteBackend(export, addresses(clusters[1])) as remote, \
            RemoteBackend(export, addresses(clusters[1]), pooling=False) as unpooled:
        with pytest.raises(fmt.ExportError, match="no group 'nope'"):
            remote.rows("nope", [1], [0])
        with pytest.raises(ValueError, match="group 'packed': categories has 1 values, ids has 2"):
            remote.rows("packed", [1, 2], [0])
        with pytest.raises(ValueError, match="group 'packed': ids must be >= 0"):
            remote.rows("packed", [1, -2], [0, 0])
        with pytest.raises(ValueError, match=r"group 'packed': categories must lie in \[0, 2\)"):
            remote.rows("packed", [1, 2], [0, 2])
        for backend in (remote, unpooled):
            with pytest.raises(ValueError, match=r"group 'packed': segments must lie in \[0, num_segments=2\)"):
                backend.pooled("packed", [1, 2], [0, 0], [0, 2], 2)


# --- failures ----------------------------------------------------------------------------------------------------


def test_replica_failover(export, local, clusters):
    live = addresses(clusters[1])[0]
    # Nobody listens on a reserved port, and no other process is given it meanwhile.
    dead, dead_too = (f"127.0.0.1:{serve_fixtures.reserved_port()}" for _ in range(2))
    ids, categories = query(np.random.default_rng(5), "hashed")
    with RemoteBackend(export, RangeTable([(0, fmt.HASH_SPACE, [dead, live])]), timeout_s=5) as remote:
        assert np.array_equal(remote.rows("hashed", ids, categories), local.rows("hashed", ids, categories))
        per_server = remote.stats()["servers"]
        assert per_server[dead]["failovers"] >= 1 and per_server[live]["requests"] >= 1
    with RemoteBackend(export, RangeTable([(0, fmt.HASH_SPACE, [dead, dead_too])]), timeout_s=5) as remote:
        with pytest.raises(ServerUnavailable, match="every replica") as raised:
            remote.rows("hashed", ids, categories)
        assert dead in str(raised.value) and dead_too in str(raised.value)


def test_another_server_at_a_known_address_is_refused(export, tmp_path):
    """After a server went away, whatever answers at its address is checked again before it serves lookups."""
    other_export = serve_fixtures.write_fake_export(str(tmp_path / "other"), seed=1)
    first = embedding_server.EmbeddingServer(export)
    port = first.start(0)
    address = f"127.0.0.1:{port}"
    # No Credits polls after the first: the lookups alone must notice.
    with RemoteBackend(export, [address], credits_poll_s=3600) as remote:
        assert remote.rows("packed", [1, 2], [0, 1]).shape == (2, 4)
        first.stop(grace=0)
        with pytest.raises(ServerUnavailable, match=f"server {address}, group 'packed'"):
            remote.rows("packed", [1, 2], [0, 1])
        second = embedding_server.EmbeddingServer(other_export)
        second.start(port)
        try:
            with pytest.raises(ValueError, match=f"server {address} serves another export"):
                remote.rows("packed", [1, 2], [0, 1])
        finally:
            second.stop(grace=0)


def test_killed_server_fails_fast_and_recovers(export, local, processes):
    victim = processes["victim"].wait_ready()
    ids, categories = query(np.random.default_rng(9), "packed")
    want = local.rows("packed", ids, categories)
    with RemoteBackend(export, [victim.address], timeout_s=10, reconnect_backoff_s=0.3) as remote:
        assert np.array_equal(remote.rows("packed", ids, categories), want)
        assert victim.stop(signal.SIGKILL) == -signal.SIGKILL
        for _ in range(2):  # the first call finds the connection broken, the second finds nobody listening
            began = time.monotonic()
            with pytest.raises(ServerUnavailable, match=f"server {victim.address}, group 'packed'"):
                remote.rows("packed", ids, categories)
            assert time.monotonic() - began < 8.0  # failed, not waited for the 10 s deadline
        deadline = time.monotonic() + 30
        while remote.stats()["servers"][victim.address]["up"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert remote.stats()["servers"][victim.address]["up"] is False

        restarted = processes["victim"] = ServerProcess(export, victim.port, "--shard", "0", "--num-shards", "1")
        restarted.wait_ready()
        deadline, answer = time.monotonic() + 60, None
        while answer is None and time.monotonic() < deadline:
            try:
                answer = remote.rows("packed", ids, categories)
            except ServerUnavailable:
                time.sleep(0.1)
        assert answer is not None, "no lookup succeeded within 60 s of the server's restart"
        assert np.array_equal(answer, want)

    # SIGTERM: a graceful stop, after the start-up line and "ready".
    assert restarted.stop(signal.SIGTERM) == 0, restarted.output()
    assert restarted.stdout[-1].strip() == "ready"
    log = "".join(restarted.stderr)
    assert "range [0x0000000000000000, 0x10000000000000000)" in log and f"127.0.0.1:{victim.port}" in log, log
    assert "stopped" in log


# --- the command line and the generated code -----------------------------------------------------------------------


def test_command_line_arguments(capsys):
    args = embedding_server.parse_args(["--export", "e", "--port", "1", "--shard", "1", "--num-shards", "4"])
    assert (args.start, args.end) == fmt.even_ranges(4)[1]
    assert args.max_clients == 64
    assert embedding_server.parse_args(["--export", "e", "--port", "1", "--max-clients", "3"]).max_clients == 3
    args = embedding_server.parse_args(["--export", "e", "--port", "1", "--start", "0x10", "--end",
                                        "10000000000000000"])
    assert (args.start, args.end) == (16, 2**64)
    for bad in (["--start", "0x10"], ["--shard", "4", "--num-shards", "4"], ["--start", "20", "--end", "10"],
                ["--start", "zz", "--end", "10"], ["--start", "0", "--end", "0x10000000000000001"]):
        with pytest.raises(SystemExit):
            embedding_server.parse_args(["--export", "e", "--port", "1", *bad])
    assert embedding_server.main(["--export", "/nonexistent/export", "--port", "0"]) == 2
    assert "/nonexistent/export/manifest.json: no such file" in capsys.readouterr().err


def test_generated_code_matches_the_proto():
    """embedding_pb2.py is what the .proto generates (grpcio-tools comes with requirements.txt)."""
    import grpc_tools.protoc  # noqa: F401,PLC0415  (ImportError, not a skip, when the install lacks it)

    done = subprocess.run(["bash", str(ROOT / "scripts" / "gen_proto.sh"), "--check"], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr

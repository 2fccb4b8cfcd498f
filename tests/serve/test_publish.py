"""Publishing versions to embedding servers (serve/publish.py, the servers' Stage and Commit), against a NumPy
reference: the rows a version holds are the previous version's (none for a full one) without its removed keys, with
its staged rows; a Lookup naming a version reads exactly that version; a publish that stops half-way changes nothing
served, and the next one succeeds. The trainer's side and the ranker's: tests/serve/test_publish_training.py."""

import json
import os
import shutil

import grpc
import numpy as np
import pytest

from tests.serve import serve_fixtures
from tf_fusedrec.export import format as fmt
from tf_fusedrec.serve import embedding_pb2 as pb
from tf_fusedrec.serve import embedding_server, publish
from tf_fusedrec.serve.client import RangeTable, RemoteBackend, RemoteError
from tf_fusedrec.train.publishing import row_changes

TABLES = serve_fixtures.fake_tables(keys_per_feature=200)
GROUP = "hashed"


@pytest.fixture
def export(tmp_path):
    return serve_fixtures.write_fake_export(str(tmp_path / "export"), keys_per_feature=200,
                                            source={"step": 7})


@pytest.fixture
def servers(export):
    """Two servers (even ranges) that take publishes, and their RangeTable."""
    started = [embedding_server.EmbeddingServer(export, start, end, accept_publish=True)
               for start, end in fmt.even_ranges(2)]
    ports = [s.start() for s in started]
    yield started, RangeTable.even([f"127.0.0.1:{p}" for p in ports])
    for s in started:
        s.stop(grace=0)


def reference(keys_rows):
    """{key: row} of (keys, rows)."""
    keys, rows = keys_rows
    return {int(k): r for k, r in zip(keys, rows)}


def served_rows(backend, ids, categories, version):
    return backend.rows(GROUP, ids, categories, version=version)


def expected_rows(table, spec, ids, categories):
    """Rows of (id, category) pairs from {key: row}, the initializer's row for keys absent."""
    keys = fmt.table_keys(ids, categories, len(spec["features"]), spec["encoding"])
    out = fmt.initial_rows(spec["initializer"], spec["salts"], ids, categories, spec["dim"])
    for i, k in enumerate(keys):
        if int(k) in table:
            out[i] = table[int(k)]
    return out


def new_version(rng, spec, ids, categories, keys):
    """A delta on the fixture's group: 50 trained keys changed, 30 removed, 40 new ids -> (keys, rows, removed,
    the ids and categories to query)."""
    order = rng.permutation(len(keys))
    changed, removed = order[:50], order[50:80]
    new_ids = rng.integers(serve_fixtures.ID_SPACE, 2 * serve_fixtures.ID_SPACE, 40)
    new_categories = rng.integers(0, len(spec["features"]), 40)
    new_keys = fmt.table_keys(new_ids, new_categories, len(spec["features"]), spec["encoding"])
    staged_keys = np.concatenate([keys[changed], new_keys])
    staged_rows = rng.normal(0, 0.1, (len(staged_keys), spec["dim"])).astype(np.float32)
    query_ids = np.concatenate([ids, new_ids])
    query_categories = np.concatenate([categories, new_categories])
    return staged_keys, staged_rows, keys[removed], query_ids, query_categories


def test_versions_are_staged_committed_and_read_by_version(export, servers):
    started, table = servers
    spec, ids, categories, keys, rows = TABLES[GROUP]
    rng = np.random.default_rng(1)
    staged_keys, staged_rows, removed, q_ids, q_cats = new_version(rng, spec, ids, categories, keys)
    v0 = reference((keys, rows))
    v1 = {k: r for k, r in v0.items() if k not in set(removed.tolist())}
    v1.update(reference((staged_keys, staged_rows)))
    publisher = publish.Publisher(table)
    backend = RemoteBackend(export, table)
    try:
        assert publisher.newest_versions() == {a: 0 for a in table.addresses}
        assert started[0].versions == [(0, 7)]  # the export's source step
        publisher.stage(1, GROUP, spec["dim"], staged_keys, staged_rows, removed)
        # Staged rows are not served.
        np.testing.assert_array_equal(served_rows(backend, q_ids, q_cats, None),
                                      expected_rows(v0, spec, q_ids, q_cats))
        answers = publisher.commit(1, step=20, full=False, keep_from=0)
        assert sum(a.rows_changed for a in answers.values()) == len(staged_keys)
        assert sum(a.rows_removed for a in answers.values()) == len(removed)
        for version, want in ((0, v0), (1, v1), (None, v1)):
            np.testing.assert_array_equal(served_rows(backend, q_ids, q_cats, version),
                                          expected_rows(want, spec, q_ids, q_cats), err_msg=f"version {version}")
        # The other group was not staged: unchanged in version 1.
        other_spec, o_ids, o_cats, o_keys, o_rows = TABLES["packed"]
        np.testing.assert_array_equal(backend.rows("packed", o_ids, o_cats, version=1), o_rows)
        assert [v for v, _ in started[1].versions] == [0, 1]
        # A second delta with keep_from=1 drops version 0; reading it is refused by name.
        publisher.stage(2, GROUP, spec["dim"], staged_keys[:5], staged_rows[:5] + 1, np.zeros(0, np.int64))
        publisher.commit(2, step=30, full=False, keep_from=1)
        assert [v for v, _ in started[0].versions] == [1, 2]
        with pytest.raises(RemoteError, match="version 0 is not held"):
            served_rows(backend, q_ids, q_cats, 0)
        v2 = dict(v1)
        v2.update(reference((staged_keys[:5], staged_rows[:5] + 1)))
        np.testing.assert_array_equal(served_rows(backend, q_ids, q_cats, 2), expected_rows(v2, spec, q_ids, q_cats))
        # Pooled lookups read the version asked too.
        segments = np.arange(len(q_ids)) % 7
        sums, counts = backend.pooled(GROUP, q_ids, q_cats, segments, 7, version=1)
        want = expected_rows(v1, spec, q_ids, q_cats)
        np.testing.assert_allclose(sums, np.stack([want[segments == s].sum(0) for s in range(7)]), rtol=1e-6, atol=1e-6)
        assert counts.tolist() == np.bincount(segments, minlength=7).tolist()
    finally:
        backend.close()
        publisher.close()


def test_a_full_version_replaces_every_row(export, servers):
    started, table = servers
    spec, ids, categories, keys, rows = TABLES[GROUP]
    publisher = publish.Publisher(table)
    backend = RemoteBackend(export, table)
    try:
        publisher.stage(1, GROUP, spec["dim"], keys[:10], rows[:10] * 2, np.zeros(0, np.int64))
        publisher.commit(1, step=1, full=True, keep_from=0)
        want = expected_rows(reference((keys[:10], rows[:10] * 2)), spec, ids, categories)
        np.testing.assert_array_equal(served_rows(backend, ids, categories, 1), want)
        # A full version holds only what was staged: the other group is empty (initializer rows) too.
        _, o_ids, o_cats, _, o_rows = TABLES["packed"]
        assert not np.array_equal(backend.rows("packed", o_ids, o_cats, version=1), o_rows)
        assert sum(s.info().versions[-1].rows for s in started) == 10
    finally:
        backend.close()
        publisher.close()


def test_a_publish_stopped_half_way_changes_nothing_served(export, servers):
    """Staged on one server and never committed (the publisher died): both serve version 0; the next publish, a
    higher version, drops the abandoned rows and succeeds."""
    started, table = servers
    spec, ids, categories, keys, rows = TABLES[GROUP]
    rng = np.random.default_rng(2)
    staged_keys, staged_rows, removed, q_ids, q_cats = new_version(rng, spec, ids, categories, keys)
    publisher = publish.Publisher(table)
    backend = RemoteBackend(export, table)
    try:
        first = table.index(fmt.route(staged_keys)) == 0
        publisher.stage(1, GROUP, spec["dim"], staged_keys[first], staged_rows[first], np.zeros(0, np.int64))
        assert [s.versions for s in started] == [[(0, 7)], [(0, 7)]]
        v0 = reference((keys, rows))
        np.testing.assert_array_equal(served_rows(backend, q_ids, q_cats, None), expected_rows(v0, spec, q_ids, q_cats))
        # The next publisher picks version 2 (above every version held or staged) and publishes only its own rows.
        publisher.stage(2, GROUP, spec["dim"], staged_keys[:3], staged_rows[:3], removed)
        publisher.commit(2, step=5, full=False, keep_from=0)
        v2 = {k: r for k, r in v0.items() if k not in set(removed.tolist())}
        v2.update(reference((staged_keys[:3], staged_rows[:3])))
        np.testing.assert_array_equal(served_rows(backend, q_ids, q_cats, 2), expected_rows(v2, spec, q_ids, q_cats))
    finally:
        backend.close()
        publisher.close()


def test_a_commit_that_fails_on_one_server_leaves_the_previous_version_everywhere(export, servers):
    started, table = servers
    spec, ids, categories, keys, rows = TABLES[GROUP]
    publisher = publish.Publisher(table, timeout_s=2.0)
    backend = RemoteBackend(export, table)
    try:
        publisher.stage(1, GROUP, spec["dim"], keys[:20], rows[:20] + 1, np.zeros(0, np.int64))
        started[1].stop(grace=0)
        with pytest.raises(publish.PublishError, match=f"server {table.addresses[1]}: Commit of version 1"):
            publisher.commit(1, step=3, full=False, keep_from=0)
        # The server that committed still holds version 0, which the ranker reads.
        assert [v for v, _ in started[0].versions] == [0, 1]
        assert publisher.holds(1) == [table.addresses[1]]
    finally:
        backend.close()
        publisher.close()


def raw_call(address, method, request):
    with grpc.insecure_channel(address) as channel:
        payload = request if isinstance(request, bytes) else request.SerializeToString()
        return channel.unary_unary(method)(payload, timeout=10)


def test_bad_publishes_get_an_error_naming_the_field(export, tmp_path):
    server = embedding_server.EmbeddingServer(export, accept_publish=True, max_staged_mb=1)
    closed = embedding_server.EmbeddingServer(export)
    address, closed_address = f"127.0.0.1:{server.start()}", f"127.0.0.1:{closed.start()}"
    spec = TABLES[GROUP][0]
    key = TABLES[GROUP][3][:1]

    def stage(**fields):
        fields.setdefault("version", 1)
        fields.setdefault("group", GROUP)
        return raw_call(address, publish.STAGE_METHOD, pb.StageRequest(**fields))

    def refused(code, match, call):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == code and match in e.value.details(), e.value.details()

    try:
        refused(grpc.StatusCode.FAILED_PRECONDITION, "--accept-publish", lambda: raw_call(
            closed_address, publish.STAGE_METHOD, pb.StageRequest(version=1, group=GROUP)))
        refused(grpc.StatusCode.FAILED_PRECONDITION, "--accept-publish", lambda: raw_call(
            closed_address, publish.COMMIT_METHOD, pb.CommitRequest(version=1)))
        refused(grpc.StatusCode.INVALID_ARGUMENT, "field group", lambda: stage(group="nope"))
        refused(grpc.StatusCode.INVALID_ARGUMENT, "field keys", lambda: stage(keys=b"123"))
        refused(grpc.StatusCode.INVALID_ARGUMENT, "field rows", lambda: stage(
            keys=key.astype("<i8").tobytes(), rows=b"\0" * 4))
        refused(grpc.StatusCode.FAILED_PRECONDITION, "not above the newest", lambda: stage(version=0))
        refused(grpc.StatusCode.INVALID_ARGUMENT, "not a StageRequest", lambda: raw_call(
            address, publish.STAGE_METHOD, b"\xff\xff\xff\xff"))
        big = np.arange(1 << 16, dtype=np.int64)
        rows = np.zeros((len(big), spec["dim"]), np.float32)
        stage(keys=big.astype("<i8").tobytes(), rows=rows.tobytes())  # 2.5 MB: over 1 MiB
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-staged-mb" in e.details(), e.details()
    else:
        pytest.fail("a stage beyond --max-staged-mb was taken")
    finally:
        server.stop(grace=0)
        closed.stop(grace=0)
    assert server.versions == [(0, 7)]  # nothing was committed


def test_a_key_outside_the_range_is_refused(export):
    start, end = fmt.even_ranges(2)[0]
    server = embedding_server.EmbeddingServer(export, start, end, accept_publish=True)
    address = f"127.0.0.1:{server.start()}"
    keys = TABLES[GROUP][3]
    outside = keys[~fmt.in_range(fmt.route(keys), start, end)][:3]
    try:
        with pytest.raises(grpc.RpcError) as e:
            raw_call(address, publish.STAGE_METHOD, pb.StageRequest(
                version=1, group=GROUP, removed=outside.astype("<i8").tobytes()))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "route outside" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            raw_call(address, embedding_server.LOOKUP_METHOD, pb.LookupRequest(
                groups=[pb.GroupLookup(group=GROUP, ids=b"", categories=b"")], version=9))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "version 9 is not held" in e.value.details()
    finally:
        server.stop(grace=0)


def test_a_repeated_commit_answers_as_the_first(export):
    server = embedding_server.EmbeddingServer(export, accept_publish=True)
    try:
        first = server.commit(pb.CommitRequest(version=1, step=4))
        assert server.commit(pb.CommitRequest(version=1, step=4)) == first
        with pytest.raises(embedding_server._Refused, match="already committed"):  # noqa: SLF001
            server.commit(pb.CommitRequest(version=1, step=5))
        assert server.versions == [(0, 7), (1, 4)]
    finally:
        server.stop(grace=0)


def test_row_changes_against_numpy():
    rng = np.random.default_rng(3)
    old_keys = rng.permutation(1000)[:300].astype(np.int64)
    old_rows = rng.normal(size=(300, 4)).astype(np.float32)
    keys = np.concatenate([old_keys[:200], rng.permutation(np.arange(1000, 1100))[:50]]).astype(np.int64)
    rows = np.concatenate([old_rows[:200], rng.normal(size=(50, 4)).astype(np.float32)])
    rows[:10] += 1.0
    rows[10, 0] = -0.0 if old_rows[10, 0] == 0 else np.nextafter(old_rows[10, 0], np.float32(np.inf))
    perm = rng.permutation(len(keys))
    changed, removed = row_changes((old_keys, old_rows), keys[perm], rows[perm])
    old = dict(zip(old_keys.tolist(), old_rows))
    want = [k not in old or not np.array_equal(old[k].view(np.uint32), r.view(np.uint32))
            for k, r in zip(keys[perm].tolist(), rows[perm])]
    assert changed.tolist() == want and changed.sum() == 11 + 50
    assert sorted(removed.tolist()) == sorted(old_keys[200:].tolist())
    changed, removed = row_changes(None, keys, rows)
    assert changed.all() and len(removed) == 0


@pytest.mark.parametrize("dim", [1, 7, 16])
def test_row_changes_is_bitwise_in_any_order(dim):
    """Previous rows sorted by key or not, current rows in any order: the same answer as a dict of bit patterns; NaN
    equals the same NaN, -0.0 differs from 0.0; an empty previous removes nothing and marks everything new."""
    rng = np.random.default_rng(dim)
    old_keys = rng.choice(10_000, 2_000, replace=False).astype(np.int64)
    old_rows = rng.normal(size=(2_000, dim)).astype(np.float32)
    old_rows[:5, 0] = np.nan
    old_rows[5:10, 0] = 0.0
    keep = rng.permutation(2_000)[:1_500]
    keys = np.concatenate([old_keys[keep], np.arange(20_000, 20_300, dtype=np.int64)])
    rows = np.concatenate([old_rows[keep], rng.normal(size=(300, dim)).astype(np.float32)])
    rows[rng.permutation(len(keys))[:400], -1] += 0.5
    zeros = np.flatnonzero(np.isin(keys, old_keys[5:10]))
    rows[zeros[:2], 0] = -0.0  # a sign flip only: changed
    old = {k: r.view(np.uint32).tobytes() for k, r in zip(old_keys.tolist(), old_rows)}
    want = np.array([old.get(k) != r.view(np.uint32).tobytes() for k, r in zip(keys.tolist(), rows)])
    want_removed = sorted(set(old_keys.tolist()) - set(keys.tolist()))
    order = np.argsort(old_keys)
    for previous in [(old_keys, old_rows), (old_keys[order], old_rows[order])]:
        changed, removed = row_changes(previous, keys, rows)
        assert changed.tolist() == want.tolist()
        assert sorted(removed.tolist()) == want_removed
    changed, removed = row_changes((np.zeros(0, np.int64), np.zeros((0, dim), np.float32)), keys, rows)
    assert changed.all() and len(removed) == 0


def test_the_publish_log_replays_to_the_newest_version(export, tmp_path):
    """Two ranks' logged versions (1 full, 2 a delta with removals), replayed for a half range, equal the NumPy
    reference; a full version 3 removes the older ones; a log without a full version is refused by name."""
    log_dir = str(tmp_path / "log")
    spec, ids, categories, keys, rows = TABLES[GROUP]
    rng = np.random.default_rng(4)
    half = rng.permutation(len(keys))
    rank_keys = [keys[half[:len(keys) // 2]], keys[half[len(keys) // 2:]]]
    rank_rows = [rows[half[:len(keys) // 2]], rows[half[len(keys) // 2:]]]
    none = np.zeros(0, np.int64)
    empty = (none, np.zeros((0, 4), np.float32), none)
    for r in range(2):
        publish.write_log_rank(log_dir, 1, r, 2, {GROUP: (rank_keys[r], rank_rows[r], none), "packed": empty})
    publish.write_log_version(log_dir, 1, 10, True, 2, [np.ones(3, np.float32)])
    changed = rng.normal(size=(20, spec["dim"])).astype(np.float32)
    publish.write_log_rank(log_dir, 2, 0, 2, {GROUP: (rank_keys[0][:20], changed, rank_keys[0][20:30])})
    publish.write_log_rank(log_dir, 2, 1, 2, {GROUP: (none, np.zeros((0, spec["dim"]), np.float32),
                                                      rank_keys[1][:5])})
    publish.write_log_version(log_dir, 2, 20, False, 2, [np.full(3, 2.0, np.float32)])
    want = reference((keys, rows))
    want.update(reference((rank_keys[0][:20], changed)))
    for k in np.concatenate([rank_keys[0][20:30], rank_keys[1][:5]]).tolist():
        del want[k]
    start, end = fmt.even_ranges(2)[1]
    server = embedding_server.EmbeddingServer(export, start, end, catch_up=log_dir)
    assert server.versions == [(2, 20)]
    held = server.groups[GROUP]
    mine = {k: r for k, r in want.items() if fmt.in_range(fmt.route(np.array([k])), start, end)[0]}
    assert sorted(held.keys.tolist()) == sorted(mine)
    for k, r in zip(held.keys.tolist(), held.rows):
        np.testing.assert_array_equal(r, mine[k])
    assert len(server.groups["packed"]) == 0  # version 1 was full and staged nothing for it
    version, step, weights = publish.log_dense(log_dir)
    assert (version, step) == (2, 20) and np.array_equal(weights[0], np.full(3, 2.0, np.float32))
    # A full version 3: versions 1 and 2 are removed; a failed version 4 leaves no trace.
    publish.write_log_rank(log_dir, 3, 0, 1, {GROUP: (keys[:3], rows[:3], none)})
    publish.write_log_version(log_dir, 3, 30, True, 1, [np.zeros(3, np.float32)])
    publish.write_log_rank(log_dir, 4, 0, 1, {GROUP: (keys[:3], rows[:3], none)})
    publish.drop_log_version(log_dir, 4)
    assert sorted(os.listdir(log_dir)) == ["v0000000003"]
    assert [m["version"] for m in publish.read_log(log_dir)] == [3]
    shutil.rmtree(os.path.join(log_dir, "v0000000003"))
    publish.write_log_rank(log_dir, 5, 0, 1, {GROUP: (keys[:3], rows[:3], none)})
    publish.write_log_version(log_dir, 5, 50, False, 1, [np.zeros(3, np.float32)])
    with pytest.raises(ValueError, match="holds no full version"):
        publish.read_log(log_dir)
    with pytest.raises(ValueError, match="no such directory"):
        publish.read_log(str(tmp_path / "nothing"))


def test_a_new_attempt_at_a_version_drops_the_rows_of_the_last(export, servers):
    """A publisher that failed at version 1 (or died) and tries version 1 again with another publish_id: only the new
    attempt's rows are committed."""
    started, table = servers
    spec, ids, categories, keys, rows = TABLES[GROUP]
    publisher = publish.Publisher(table)
    backend = RemoteBackend(export, table)
    try:
        publisher.stage(1, GROUP, spec["dim"], keys[:30], rows[:30] + 5, keys[30:40], publish_id=11)
        publisher.stage(1, GROUP, spec["dim"], keys[:3], rows[:3] + 1, np.zeros(0, np.int64), publish_id=12)
        publisher.commit(1, step=2, full=False, keep_from=0, publish_id=12)
        want = reference((keys, rows))
        want.update(reference((keys[:3], rows[:3] + 1)))
        np.testing.assert_array_equal(served_rows(backend, ids, categories, 1),
                                      expected_rows(want, spec, ids, categories))
    finally:
        backend.close()
        publisher.close()


class _FakeModel:
    """What the publish endpoint reads of a ServingModel: its backend's routing table, version, step, dense weights."""

    def __init__(self, table):
        self.backend = type("Backend", (), {"table": table})()
        self.version, self.step, self.installed = 0, -1, []

    def dense_variables(self):
        return [("kernel", [2, 3], "float32")]

    def install_version(self, version, step, weights):
        if [list(w.shape) for w in weights] != [[2, 3]]:
            raise ValueError("dense weight 0 (kernel) does not fit")
        self.installed.append((version, step))
        self.version, self.step = version, step


def test_the_ranker_publish_endpoint_answers_bad_requests_by_name(export, servers):
    import http.client  # noqa: PLC0415

    _, table = servers
    model = _FakeModel(table)
    endpoint = publish.serve_publish(model, "127.0.0.1", 0, max_body_mb=0.01)
    address = f"127.0.0.1:{endpoint.server_address[1]}"

    def call(method, path, body=None):
        connection = http.client.HTTPConnection("127.0.0.1", endpoint.server_address[1], timeout=10)
        try:
            connection.request(method, path, body=body)
            response = connection.getresponse()
            return response.status, json.loads(response.read())
        finally:
            connection.close()

    try:
        targets = publish.ranker_targets(address)
        assert publish.table_of_targets(targets) == table and targets["version"] == 0
        assert targets["dense"] == [{"name": "kernel", "shape": [2, 3], "dtype": "float32"}]
        good = publish.encode_weights([np.zeros((2, 3), np.float32)])
        assert call("GET", "/nothing")[0] == 404
        assert call("POST", "/publish/dense?version=x", good)[0] == 400
        assert call("POST", "/publish/dense?version=1", b"not an npz")[1]["error"].startswith("the body is not")
        assert call("POST", "/publish/dense?version=1", b"\0" * 20000)[0] == 413
        status, answer = call("POST", "/publish/dense?version=1&step=3", good)
        assert status == 409 and "not committed on every embedding server" in answer["error"], answer
        publisher = publish.Publisher(table)
        try:
            publisher.commit(1, step=3, full=False, keep_from=0)
        finally:
            publisher.close()
        bad = publish.encode_weights([np.zeros((3, 2), np.float32)])
        assert call("POST", "/publish/dense?version=1&step=3", bad)[0] == 400
        assert publish.push_dense(address, 1, 3, [np.zeros((2, 3), np.float32)]) == {"version": 1, "step": 3}
        assert model.installed == [(1, 3)]
        with pytest.raises(publish.PublishError, match="not above the ranker's version 1"):
            publish.push_dense(address, 1, 3, [np.zeros((2, 3), np.float32)])
    finally:
        endpoint.shutdown()
        endpoint.server_close()


def test_stage_requests_fit_the_servers_request_limit(export):
    """A server started with --max-request-mb 1 gets StageRequests of at most 1 MiB (the publisher reads the limit
    from its Info), so a version of about 1.5 MiB of rows per server publishes, in several requests, and is served."""
    started = [embedding_server.EmbeddingServer(export, start, end, accept_publish=True, max_request_mb=1)
               for start, end in fmt.even_ranges(2)]
    table = RangeTable.even([f"127.0.0.1:{s.start()}" for s in started])
    spec, ids, categories, keys, rows = TABLES[GROUP]
    n = 3 * publish.MB // (4 * spec["dim"] + 8)
    rng = np.random.default_rng(5)
    new_ids = rng.choice(np.arange(serve_fixtures.ID_SPACE, 50 * serve_fixtures.ID_SPACE), n, replace=False)
    new_categories = rng.integers(0, len(spec["features"]), n)
    new_keys = fmt.table_keys(new_ids, new_categories, len(spec["features"]), spec["encoding"])
    new_rows = rng.normal(0, 0.1, (n, spec["dim"])).astype(np.float32)
    publisher = publish.Publisher(table)
    sizes = []
    for address, calls in publisher._calls.items():  # noqa: SLF001  (a spy on what is sent)
        def spy(payload, timeout, stage=calls["stage"]):
            sizes.append(len(payload))
            return stage(payload, timeout=timeout)
        calls["stage"] = spy
    backend = RemoteBackend(export, table)
    try:
        assert publisher.stage_bytes(table.addresses) == publish.MB
        publisher.stage(1, GROUP, spec["dim"], new_keys, new_rows, np.zeros(0, np.int64))
        assert len(sizes) >= 4 and max(sizes) <= publish.MB, sizes
        publisher.commit(1, step=8, full=False, keep_from=0)
        want = reference((keys, rows))
        want.update(reference((new_keys, new_rows)))
        sample = rng.choice(n, 500, replace=False)
        q_ids, q_cats = np.concatenate([ids, new_ids[sample]]), np.concatenate([categories, new_categories[sample]])
        np.testing.assert_array_equal(served_rows(backend, q_ids, q_cats, 1), expected_rows(want, spec, q_ids, q_cats))
    finally:
        backend.close()
        publisher.close()
        for s in started:
            s.stop(grace=0)


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("sizes", [(0, 0, 0), (0, 30, 5), (500, 0, 0), (500, 0, 40), (500, 300, 0), (500, 300, 60)],
                         ids=lambda s: "held{}-staged{}-removed{}".format(*s))
def test_group_rows_applied_is_a_dict_update(sizes, full):
    """GroupRows.applied against a dict: the rows held (none if full), removals first, then the staged rows in
    order (a key staged twice keeps its last row). Staged and removed keys overlap the held ones, each other, and
    keys never held; the result stays sorted and distinct."""
    held_n, staged_n, removed_n = sizes
    rng = np.random.default_rng(sum(sizes) + full)
    space = rng.choice(2**40, 2 * (held_n + staged_n + removed_n) + 10, replace=False).astype(np.int64) - 2**39
    held_keys = np.sort(rng.choice(space, held_n, replace=False))
    held_rows = rng.normal(size=(held_n, 3)).astype(np.float32)
    keys = rng.choice(space, staged_n)  # repeats, held and new ones
    rows = rng.normal(size=(staged_n, 3)).astype(np.float32)
    removed = rng.choice(space, removed_n)
    group = {"name": "g", "dim": 3}
    got, changed, dropped = fmt.GroupRows.from_arrays(group, held_keys, held_rows).applied(removed, keys, rows, full)
    want = {} if full else {int(k): r for k, r in zip(held_keys, held_rows)}
    gone = sum(want.pop(int(k), None) is not None for k in set(removed.tolist()))
    for k, r in zip(keys, rows):
        want[int(k)] = r
    assert (changed, dropped) == (len(set(keys.tolist())), gone)
    np.testing.assert_array_equal(got.keys, sorted(want))
    np.testing.assert_array_equal(got.rows, np.array([want[k] for k in sorted(want)]).reshape(-1, 3))
    assert got.keys.dtype == np.int64 and got.rows.dtype == np.float32

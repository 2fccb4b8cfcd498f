"""Publishing from training to serving, end to end: `python -m tf_fusedrec.train` on 2 workers with --publish-to
feeds a ranker (in this process) and 2 embedding servers that started from an export of the untrained model. After
the run, the ranker serves the last version, and its predictions over HTTP equal the training model's at that step
(the run's final checkpoint restored here, called with training=False) within 1e-6; its first version was full, the
next ones deltas of the rows changed. With a version that fails half-way (repaired by the next), and with hot
replication (the hot rows come from rank 0's replicated copy). A server and a ranker started later catch up from the
publish log. Over TLS with a publish token, the train app's flags reach the servers and the ranker, and a wrong
token or a missing CA stops the run with an error naming the ranker and the reason."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.serve.serve_fixtures import HAS_OPENSSL, RankerThread, get, make_pki, post
from tests.subprocess_runner import execute, tail, worker_command

pytest.importorskip("horovod.tensorflow", reason="Horovod (horovod.tensorflow) is not importable")

import tensorflow as tf  # noqa: E402

import tf_fusedrec as fr  # noqa: E402
from tf_fusedrec.export import format as fmt  # noqa: E402
from tf_fusedrec.serve import embedding_server, publish, security  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "criteo_synthetic.yaml"
TIMEOUT_S = 600
STEPS, EVERY = 6, 2


def build_model(hot=False, backend="native"):
    from tf_fusedrec import config as cfg  # noqa: PLC0415
    from tf_fusedrec.train import experiment  # noqa: PLC0415

    tf.keras.backend.clear_session()
    conf = cfg.load_config(str(CONFIG))
    embedding = experiment.make_embedding("fused", conf.embedding_features(), conf, comm="single",
                                          replication=fr.HotReplication() if hot else None, table_backend=backend)
    model = experiment.make_model(conf, embedding)
    optimizer = fr.train.make_optimizer(model, default=conf.train.dense_optimizer)
    batch = next(iter(experiment.make_dataset(conf, 64, 0, 1, held_out=True).take(1)))[0]
    model(batch, training=False)
    return model, optimizer, embedding, batch


def columns(batch):
    """A batch dict -> the "inputs" (columnar) shape of a predict request."""
    out = {}
    for name, value in batch.items():
        out[name] = value.to_list() if isinstance(value, tf.RaggedTensor) else np.asarray(value).tolist()
    return out


@pytest.fixture
def serving(tmp_path):
    """An export of the untrained model, 2 embedding servers taking publishes, and a ranker with its publish
    endpoint; -> (ranker thread, publish address, servers)."""
    model, _, _, batch = build_model()
    export_dir = str(tmp_path / "export")
    fr.export.export_model(model, export_dir, example=batch)
    servers = [embedding_server.EmbeddingServer(export_dir, start, end, accept_publish=True)
               for start, end in fmt.even_ranges(2)]
    addresses = [f"127.0.0.1:{s.start()}" for s in servers]
    ranker = RankerThread(["--export", export_dir, "--servers", ",".join(addresses)])
    endpoint = publish.serve_publish(ranker.ranker.model, "127.0.0.1", 0)
    yield ranker, f"127.0.0.1:{endpoint.server_address[1]}", servers, export_dir
    endpoint.shutdown()
    endpoint.server_close()
    ranker.close()
    for s in servers:
        s.stop(grace=0)


# (--hot, the ranker refuses the second version, rows expire, table backend): plain training where version 2 fails
# after the servers committed it (TFRA tables: a delta is found by comparing exports), hot replication where every
# version goes through, and expiry (rows not read for 2 steps are removed every step, so every delta removes keys)
# with the failing second version (native tables, the default: they track their changes). One 2-worker run each (6
# steps, a publish every 2).
CASES = [("0", True, False, "tfra"), ("500", False, False, "native"), ("0", True, True, "native")]


@pytest.mark.parametrize("hot,fail_second,expire,backend", CASES,
                         ids=["plain-second_fails-tfra", "hot", "expiry-second_fails"])
def test_the_ranker_serves_the_training_model_of_the_last_version(tmp_path, serving, monkeypatch, hot, fail_second,
                                                                  expire, backend):
    """Versions at steps 2, 4 and 6. With fail_second, the ranker refuses version 2 after the servers committed it
    (an install that fails half-way): the ranker stays on version 1, training goes on, and version 3 carries every
    row changed since version 1 and removes every key removed since. Either way the servers then hold exactly the
    training model's rows of step 6, the ranker serves its predictions, and a server and a ranker started afterwards
    catch up from the publish log."""
    ranker, address, servers, export_dir = serving
    install, calls = publish.install, []

    def install_failing_second(model, version, step, body, timeout_s=10.0, tls=None):
        calls.append(version)
        if fail_second and len(calls) == 2:
            return 503, {"error": "injected failure"}
        return install(model, version, step, body, timeout_s, tls)

    monkeypatch.setattr(publish, "install", install_failing_second)
    model_dir, summary_path, log_dir = tmp_path / "model", tmp_path / "summary.json", tmp_path / "publish_log"
    cmd = worker_command(["-m", "tf_fusedrec.train", "--config", CONFIG, "--steps", STEPS, "--batch-size", 128,
                          "--model-dir", model_dir, "--no-progress", "--summary-json", summary_path, "--hot", hot,
                          "--publish-to", address, "--publish-every", EVERY, "--publish-log", log_dir,
                          "--table-backend", backend]
                         + (["--expiry-steps", 2, "--expiry-interval", 1] if expire else []), 2)
    rc, log, _ = execute(cmd, TIMEOUT_S, merge_stderr=True)
    assert rc == 0, f"exit status {rc}: {' '.join(map(str, cmd))}\n{tail(log)}"
    published = json.loads(summary_path.read_text())["published"]
    assert calls == [1, 2, 3]
    last = 3
    if fail_second:
        assert published["versions"] == [[1, 2, True], [3, 6, False]] and published["failures"] == 1, published
        assert "warning: publishing step 4 failed; the rankers stay at version 1" in log, tail(log)
        # 2 was committed on the servers; 1, which the ranker read, was kept.
        assert [[v for v, _ in s.versions] for s in servers] == [[1, 2, 3]] * 2
        logged = ["v0000000001", "v0000000003"]
    else:
        assert published["versions"] == [[1, 2, True], [2, 4, False], [3, 6, False]], published
        assert published["failures"] == 0
        assert [[v for v, _ in s.versions] for s in servers] == [[2, 3]] * 2  # the ranker's version and the new one
        logged = ["v0000000001", "v0000000002", "v0000000003"]
    assert published["served_version"] == last and all(s.versions[-1][1] == STEPS for s in servers)
    # A delta holds the rows changed since the last version the ranker took: fewer than the model's rows (with
    # expiry after 2 steps every row held was written since version 1).
    held = sum(s.info().versions[-1].rows for s in servers)
    assert published["rows_held_per_publish"][-1] == held
    assert 0 < published["rows_per_publish"][-1] <= held if expire else 0 < published["rows_per_publish"][-1] < held, (
        published, held)
    assert f"published version {last} (step 6, delta" in log, tail(log)
    assert get(ranker.url)["model_version_status"][0]["version"] == str(last)
    assert get(f"{ranker.url}/metadata")["model_spec"]["step"] == STEPS

    # The training model at step 6: the run's last checkpoint, restored into this process.
    from tf_fusedrec.train import checkpoint as ckpt  # noqa: PLC0415

    model, optimizer, embedding, batch = build_model(hot=hot != "0", backend=backend)
    restored = ckpt.Checkpointer(str(model_dir), model, optimizer, tf.Variable(0, dtype=tf.int64),
                                 embedding.comm).restore()
    assert restored["step"] == STEPS
    if expire:
        assert sum(json.loads(summary_path.read_text())["expiry"]["expired_per_worker"]) > 0
    # The servers hold the model's rows exactly: its sharded rows, the replicated hot copy where it has one.
    from tf_fusedrec.export import writer  # noqa: PLC0415

    for group, keys, rows, hot_keys, hot_rows in writer.group_parts(embedding):
        cold = ~np.isin(keys, hot_keys)
        keys, rows = np.concatenate([keys[cold], hot_keys]), np.concatenate([rows[cold], hot_rows])
        order = np.argsort(keys)
        served_keys = np.concatenate([s.groups[group["name"]].keys for s in servers])
        served_rows = np.concatenate([s.groups[group["name"]].rows for s in servers])
        served = np.argsort(served_keys)
        np.testing.assert_array_equal(served_keys[served], keys[order], err_msg=group["name"])
        np.testing.assert_array_equal(served_rows[served], rows[order], err_msg=group["name"])
    want = model(batch, training=False).numpy().reshape(-1)
    status, answer = post(f"{ranker.url}:predict", {"inputs": columns(batch)})
    assert status == 200 and answer["model_version"] == str(last), answer
    np.testing.assert_allclose(answer["outputs"], want, rtol=1e-6, atol=1e-7)

    # The log holds the versions that reached the ranker. A server started now, over the whole hash space (the log
    # is not tied to the running servers' ranges), replays them into the rows the servers hold (which, with
    # fail_second, built version 3 on version 2), and a ranker over it answers as the first.
    assert sorted(p.name for p in log_dir.iterdir()) == logged
    late = embedding_server.EmbeddingServer(export_dir, catch_up=str(log_dir))
    late_ranker = None
    try:
        assert late.versions == [(last, STEPS)]
        for name, rows_of in late.groups.items():
            keys = np.concatenate([s.groups[name].keys for s in servers])
            rows = np.concatenate([s.groups[name].rows for s in servers])
            order = np.argsort(keys)
            np.testing.assert_array_equal(rows_of.keys, keys[order], err_msg=name)
            np.testing.assert_array_equal(rows_of.rows, rows[order], err_msg=name)
        late_address = f"127.0.0.1:{late.start()}"
        # Without --catch-up a ranker would start at the export's version 0, which the server no longer holds.
        with pytest.raises(ValueError, match=f"do not hold version 0, .* \\(they hold \\[{last}\\]\\): start it with "
                                             f"--catch-up"):
            RankerThread(["--export", export_dir, "--servers", late_address])
        late_ranker = RankerThread(["--export", export_dir, "--servers", late_address, "--catch-up", str(log_dir)])
        status, answer = post(f"{late_ranker.url}:predict", {"inputs": columns(batch)})
        assert status == 200 and answer["model_version"] == str(last), answer
        np.testing.assert_allclose(answer["outputs"], want, rtol=1e-6, atol=1e-7)
    finally:
        if late_ranker is not None:
            late_ranker.close()
        late.stop(grace=0)


def test_each_version_keeps_the_stream_position_of_its_step(serving, monkeypatch):
    """In this process (one worker): the stream position the train app hands each publish (a followed directory's
    file and record after the step: which files the version learnt from) stays beside the version that reached the
    rankers, in the summary; a publish the ranker refused keeps none, and a step without a position gives None."""
    from tf_fusedrec.data.files import FilePosition  # noqa: PLC0415
    from tf_fusedrec.distributed import comm as comm_lib  # noqa: PLC0415
    from tf_fusedrec.train.publishing import TrainingPublisher  # noqa: PLC0415

    _, address, _, _ = serving
    install, calls = publish.install, []

    def install_failing_second(model, version, step, body, timeout_s=10.0, tls=None):
        calls.append(version)
        return (503, {"error": "injected failure"}) if len(calls) == 2 else \
            install(model, version, step, body, timeout_s, tls)

    monkeypatch.setattr(publish, "install", install_failing_second)
    model, *_ = build_model()
    publisher = TrainingPublisher(model, comm_lib.get_comm("single"), [address])
    try:
        assert publisher.publish(2, stream_position=FilePosition(0, 1, 128, 0, 77))
        assert not publisher.publish(4, stream_position=FilePosition(0, 2, 0, 0, 78))
        assert publisher.publish(6)
        summary = publisher.summary()
    finally:
        publisher.close()
    assert summary["versions"] == [[1, 2, True], [3, 6, False]], summary
    assert summary["stream_positions"] == [[0, 1, 128, 0, 77], None], summary


def test_publish_to_a_ranker_that_is_not_there_fails_clearly(tmp_path):
    from tests.serve.serve_fixtures import reserved_port  # noqa: PLC0415

    port = reserved_port()
    rc, log, _ = execute([sys.executable, "-m", "tf_fusedrec.train", "--config", str(CONFIG), "--steps", "2",
                          "--batch-size", "64", "--no-progress", "--publish-to", f"127.0.0.1:{port}"],
                         TIMEOUT_S, merge_stderr=True)
    assert rc == 2 and f"--publish-to: ranker 127.0.0.1:{port}: GET /publish/targets" in log, tail(log)


@pytest.mark.skipif(not HAS_OPENSSL, reason="the openssl CLI is not installed")
def test_publishing_over_tls_with_a_token(tmp_path):
    """The train app's --tls-ca and --publish-token-file (certificates made by the documented commands): TLS servers
    taking publishes with the token and a ranker serving HTTPS on its publish port. A run with the CA and the token
    publishes version 1 to every server and the ranker; one with a wrong token, or without the CA, stops at once with
    an error naming the ranker and the reason, and changes nothing."""
    pki = make_pki(str(tmp_path), 'cert local "DNS:localhost,IP:127.0.0.1"\n')
    cert, key, ca, token_file = (f"{pki}/local.pem", f"{pki}/local.key", f"{pki}/ca.pem", f"{pki}/publish.token")
    tls = security.TLS.from_files(cert, key, ca)
    token = security.read_token(token_file)
    model, _, _, batch = build_model()
    export_dir = str(tmp_path / "export")
    fr.export.export_model(model, export_dir, example=batch)
    servers = [embedding_server.EmbeddingServer(export_dir, start, end, accept_publish=True, tls=tls,
                                                publish_token=token) for start, end in fmt.even_ranges(2)]
    addresses = [f"127.0.0.1:{s.start()}" for s in servers]
    ranker = RankerThread(["--export", export_dir, "--servers", ",".join(addresses), "--tls-ca", ca])
    endpoint = publish.serve_publish(ranker.ranker.model, "127.0.0.1", 0, tls=tls, token=token)
    address = f"127.0.0.1:{endpoint.server_address[1]}"
    wrong = tmp_path / "wrong.token"
    wrong.write_text("f" * 64 + "\n")
    train = [sys.executable, "-m", "tf_fusedrec.train", "--config", str(CONFIG), "--steps", "2", "--batch-size", "64",
             "--no-progress", "--publish-to", address, "--publish-every", "2"]
    try:
        for flags, expected in (
                (["--tls-ca", ca, "--publish-token-file", str(wrong)],
                 f"--publish-to: ranker {address}: GET /publish/targets: HTTP 401: refused: wrong publish token"),
                (["--publish-token-file", token_file], "if the server serves TLS, give --tls-ca")):
            rc, log, _ = execute(train + flags, TIMEOUT_S, merge_stderr=True)
            assert rc == 2 and expected in log, tail(log)
        assert [[v for v, _ in s.versions] for s in servers] == [[0]] * 2 and ranker.ranker.model.version == 0
        summary = tmp_path / "summary.json"
        rc, log, _ = execute(train + ["--tls-ca", ca, "--publish-token-file", token_file, "--summary-json",
                                      str(summary)], TIMEOUT_S, merge_stderr=True)
        assert rc == 0, tail(log)
        assert json.loads(summary.read_text())["published"]["versions"] == [[1, 2, True]]
        assert [[v for v, _ in s.versions] for s in servers] == [[0, 1]] * 2
        assert ranker.ranker.model.version == 1
    finally:
        endpoint.shutdown()
        endpoint.server_close()
        ranker.close()
        for s in servers:
            s.stop(grace=0)

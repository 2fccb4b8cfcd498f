"""The ranker over HTTP, with 2 embedding servers (subprocesses started and stopped here, on loopback).

* Predictions through POST /v1/models/NAME:predict ("instances" and "inputs" shapes) equal the in-process model's
  (fr.export.load_model) to 1e-6, with pooling on the servers and the cache, and without either.
* Concurrent requests are batched into shared model calls and each gets its own answer.
* Bad requests (unknown or missing feature, wrong type, negative id, malformed JSON, wrong model) get HTTP 400/404
  naming the field; the ranker keeps serving.
* A SIGKILLed embedding server gives HTTP 503 naming it, fast; restarted on its port, the ranker uses it again.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.subprocess_runner import ROOT, child_env

import tensorflow as tf  # noqa: E402

import tf_fusedrec as fr  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export_scenario as sc  # noqa: E402

START_TIMEOUT_S = 90


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd):
    """A subprocess that prints "ready" when serving; -> Popen (killed on failure)."""
    proc = subprocess.Popen([sys.executable, "-m", *cmd], cwd=ROOT, env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    ready = threading.Event()
    threading.Thread(target=lambda: ready.set() if proc.stdout.readline().strip() == "ready" else None,
                     daemon=True).start()
    if not ready.wait(START_TIMEOUT_S):
        proc.kill()
        raise AssertionError(f"{' '.join(cmd)} did not get ready: {proc.stderr.read()[-2000:] if proc.poll() else ''}")
    return proc


def stop(proc, sig=signal.SIGTERM):
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def post(url, payload, timeout=30):
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def instances_of(batch):
    """A scenario batch (global, NumPy) -> TF Serving instances: one object per instance, padding dropped."""
    values, lengths = batch["tags"]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    out = []
    for i in range(len(lengths)):
        out.append({
            "dense": batch["dense"][i].tolist(),
            "user_id": int(batch["user_id"][i]), "item_id": int(batch["item_id"][i]),
            "country": int(batch["country"][i]),
            "tags": values[starts[i]:starts[i + 1]].tolist(),
            "genres": [int(x) for x in batch["genres"][i] if x >= 0],
            "history": [int(x) for x in batch["history"][i] if x >= 0],
        })
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """An export of a briefly trained model, 2 embedding servers and 2 rankers (pooling + cache; neither)."""
    where = tmp_path_factory.mktemp("serve")
    tf.keras.backend.clear_session()
    from tf_fusedrec.distributed import comm as comm_lib  # noqa: PLC0415

    model, opt, _, _ = sc.build("fused", comm_lib.get_comm("single"))
    for s in range(3):
        batch = sc.local_slice(sc.make_batch(s), 0, 1)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(sc.inputs_of(batch), training=True) - batch["label"]))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    export_dir = str(where / "export")
    fr.export.export_model(model, export_dir, example=sc.inputs_of(sc.local_slice(sc.make_batch(0), 0, 1)))
    local = fr.export.load_model(export_dir)
    ports = [free_port(), free_port()]
    servers = [start(["tf_fusedrec.serve.embedding_server", "--export", export_dir, "--shard", str(i), "--num-shards",
                      "2", "--port", str(p)]) for i, p in enumerate(ports)]
    addresses = ",".join(f"127.0.0.1:{p}" for p in ports)
    rankers, urls = [], {}
    for label, flags in (("pooled_cached", ["--cache-mb", "1"]), ("plain", ["--no-pooling", "--cache-mb", "0"])):
        port = free_port()
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

    def ask(i):
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
])
def test_bad_requests_get_400_naming_the_field(cluster, payload, message):
    url = cluster["urls"]["pooled_cached"]
    if isinstance(payload, str):
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
        }[payload]
        change(instances)
        payload = {"instances": instances}
    status, answer = post(f"{url}:predict", payload)
    assert status == 400 and message in answer["error"], (status, answer)
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
    assert time.monotonic() - t0 < 5
    assert get(f"{url}/stats")["errors_503"] >= 1
    cluster["servers"][1] = start(["tf_fusedrec.serve.embedding_server", "--export", cluster["export"], "--shard",
                                   "1", "--num-shards", "2", "--port", str(port)])
    deadline = time.monotonic() + 30
    while True:
        status, answer = post(f"{url}:predict", {"instances": instances})
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert status == 200, answer
    np.testing.assert_allclose(answer["predictions"], expected(cluster["local"], instances), rtol=1e-6, atol=1e-7)


def test_connections_beyond_the_cap_get_503():
    """BoundedHTTPServer: with 1 connection open (and idle), the next one is answered 503 and closed; once the first
    closes, connections are served again."""
    from http.server import BaseHTTPRequestHandler  # noqa: PLC0415

    from tf_fusedrec.serve.ranker import BoundedHTTPServer  # noqa: PLC0415

    class Hello(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

    server = BoundedHTTPServer(("127.0.0.1", 0), Hello, max_connections=1)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        holder = socket.create_connection(server.server_address, timeout=10)
        time.sleep(0.3)  # accepted: its thread waits for a request line
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=10)
        assert refused.value.code == 503 and b"--max-connections" in refused.value.read()
        assert server.refused == 1
        holder.close()
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    assert r.read() == b"ok"
                break
            except urllib.error.HTTPError:
                assert time.monotonic() < deadline, "the slot of the closed connection was not released"
                time.sleep(0.1)
    finally:
        server.shutdown()
        server.server_close()

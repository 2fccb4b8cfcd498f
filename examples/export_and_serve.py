"""Export a trained model and serve it: an embedding server and the ranker on loopback, one request with curl.

    .venv/bin/python examples/export_and_serve.py [EXPORT_DIR]

The export holds the dense part as a SavedModel and the tables as (key, row) files (docs/guide/serving.md). An
embedding server holds the rows (over gRPC); the ranker answers TensorFlow Serving's REST API with the dense model.
Both are stopped at the end; every wait is bounded.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import threading

import numpy as np

import tf_fusedrec as fr

comm = fr.init_workers()  # one worker: an export is written from one process
import tensorflow as tf  # noqa: E402  (after fr's first name, which loads TensorFlow quietly)

EXPORT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/tf_fusedrec_example_export"
FEATURES = [fr.Feature("user_id", dim=8), fr.Feature("item_id", dim=8)]


class Ranker(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.embedding = fr.FusedEmbedding(FEATURES)
        self.logit = tf.keras.layers.Dense(1)

    def call(self, inputs, training=None):
        rows = self.embedding(inputs, training=training)
        return self.logit(tf.concat([rows["user_id"], rows["item_id"]], axis=1))[:, 0]


# Train a few steps, then export (the example batch tells the export the model's inputs).
rng = np.random.default_rng(0)
batch = {f.name: tf.constant(rng.integers(0, 100, 32), tf.int64) for f in FEATURES}
labels = tf.constant(rng.integers(0, 2, 32).astype(np.float32))
model = Ranker()
model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
model.fit(tf.data.Dataset.from_tensors((batch, labels)).repeat(5), verbose=0)
shutil.rmtree(EXPORT, ignore_errors=True)
fr.export.export_model(model, EXPORT, example=batch)
request = {"instances": [{"user_id": 3, "item_id": 7}, {"user_id": 42, "item_id": 1}]}
expected = model({k: tf.constant([i[k] for i in request["instances"]], tf.int64) for k in ("user_id", "item_id")},
                 training=False).numpy()
print(f"exported to {EXPORT}: {sorted(os.listdir(EXPORT))}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(module, *args, timeout=120):
    """Starts `python -m module args` and waits (at most `timeout` s) for the "ready" line it prints when serving."""
    proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE, text=True)
    ready = threading.Event()
    threading.Thread(target=lambda: proc.stdout.readline().strip() == "ready" and ready.set(), daemon=True).start()
    if not ready.wait(timeout):
        proc.kill()
        raise SystemExit(f"{module} did not get ready within {timeout} s")
    return proc


server_port, ranker_port = free_port(), free_port()
servers = [start("tf_fusedrec.serve.embedding_server", "--export", EXPORT, "--port", str(server_port))]
try:
    servers.append(start("tf_fusedrec.serve.ranker", "--export", EXPORT, "--port", str(ranker_port),
                         "--servers", f"127.0.0.1:{server_port}"))
    url = f"http://127.0.0.1:{ranker_port}/v1/models/model:predict"
    print(f"curl -s -X POST {url} -d '{json.dumps(request)}'")
    answer = subprocess.run(["curl", "-s", "--max-time", "30", "-X", "POST", url, "-d", json.dumps(request)],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    print(f"answer: {answer.strip()}")
    predictions = json.loads(answer)["predictions"]
    print(f"{len(predictions)} predictions, equal to the model's own (training=False) to 1e-5: "
          f"{bool(np.allclose(predictions, expected, atol=1e-5))}")
finally:
    for proc in servers:  # stopped, whatever happened
        proc.terminate()
        proc.wait(timeout=30)

"""A small fake export written with NumPy only (format.write_group / write_manifest), for the serving tests.

Two groups, both with the Hashed initializer (so rows of ids never trained are reproducible and non-zero):
  "packed": features a, b (dim 4), packed table keys;
  "hashed": features c, d, e (dim 8), hashed table keys.
Each holds `keys_per_feature` trained random ids per feature with random rows, written as `parts` route-range parts.
The manifest's features and dense entries are placeholders: the embedding servers read only the groups.

Also, for the tests that serve a real model: trained_export (the scenario DLRM of export_scenario.py, trained briefly
and exported once per test process), RankerThread (the ranker built from its command-line flags, serving from a
thread of the test process on loopback), HTTP helpers (post, get, raw_http), reserved_port (a port for a server
started in a subprocess), start / stop (a server or ranker as a subprocess, ready when it prints "ready"), and
make_pki (certificates made by the openssl commands of docs/guide/serving-security.md).
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import numpy as np

from tests.subprocess_runner import ROOT, child_env
from tf_fusedrec import initializers
from tf_fusedrec.export import format as fmt
from tf_fusedrec.serve import bench as serve_bench

INITIALIZER = {"class_name": "Hashed", "config": {"seed": 0, "stddev": 0.05}}
GROUPS = (("packed", "packed", ("a", "b"), 4), ("hashed", "hashed", ("c", "d", "e"), 8))
# Trained ids lie in [0, ID_SPACE); tests draw untrained ids from above it.
ID_SPACE = 1 << 20
START_TIMEOUT_S = 120  # a subprocess imports TensorFlow before it serves; the machine is shared


def fake_tables(keys_per_feature=700, seed=0):
    """The fake export's tables: {group: (group dict without rows/parts, trained ids int64 [K], their categories
    int64 [K], table keys int64 [K], rows float32 [K, dim])}; the same for the same arguments."""
    rng = np.random.default_rng(seed)
    tables = {}
    for name, encoding, feature_names, dim in GROUPS:
        spec = {"name": name, "dim": dim, "encoding": encoding, "features": list(feature_names),
                "salts": [initializers.feature_salt(INITIALIZER["config"]["seed"], f) for f in feature_names],
                "initializer": INITIALIZER}
        ids = np.concatenate([rng.choice(ID_SPACE, keys_per_feature, replace=False) for _ in feature_names])
        categories = np.repeat(np.arange(len(feature_names), dtype=np.int64), keys_per_feature)
        keys = fmt.table_keys(ids, categories, len(feature_names), encoding)
        if len(np.unique(keys)) != len(keys):
            raise ValueError(f"group {name}: the fixture's random ids gave two equal table keys (change the seed)")
        rows = rng.normal(0.0, 0.05, (len(keys), dim)).astype(np.float32)  # the scale of trained rows
        tables[name] = (spec, ids.astype(np.int64), categories, keys, rows)
    return tables


def write_fake_export(export_dir, keys_per_feature=700, parts=3, seed=0, source=None):
    """Writes the fake export into export_dir (created); -> export_dir.

    Args:
      export_dir: where to write.
      keys_per_feature: trained ids per feature.
      parts: route-range parts per group.
      seed: of the random ids and rows (fake_tables(keys_per_feature, seed) gives the same tables).
      source: the manifest's "source" (default: this file and the seed).
    """
    os.makedirs(export_dir, exist_ok=True)
    groups, features = [], []
    for spec, _, _, keys, rows in fake_tables(keys_per_feature, seed).values():
        groups.append(fmt.write_group(export_dir, spec, keys, rows, parts))
        features += [{"name": f, "dim": spec["dim"], "combiner": "sum", "group": spec["name"], "category": c}
                     for c, f in enumerate(spec["features"])]
    source = source if source is not None else {"fixture": "tests/serve/serve_fixtures.py", "seed": seed}
    fmt.write_manifest(export_dir, {"features": features, "groups": groups, "dense": {}, "source": source})
    return export_dir


def reserved_port():
    """A free loopback port for a server a subprocess starts seconds later, held for it meanwhile (see
    tf_fusedrec.serve.bench.free_port: bind(0) hands it to no other socket while the child's SO_REUSEADDR server can
    bind it; a port only bound and closed is anyone's until the child binds it)."""
    return serve_bench.free_port()


# --- a trained export and the ranker in this process -------------------------------------------------------------

_TRAINED = {}


def trained_export(tmp_path_factory):
    """The export of the scenario DLRM of tests/serve/export_scenario.py trained for 3 steps on one worker; made once
    per test process (the modules that serve it share it), under pytest's session temporary directory."""
    if "export" not in _TRAINED:
        import tensorflow as tf  # noqa: PLC0415

        import tf_fusedrec as fr  # noqa: PLC0415
        from tf_fusedrec.distributed import comm as comm_lib  # noqa: PLC0415

        sc = scenario()
        tf.keras.backend.clear_session()
        model, opt, _, _ = sc.build("fused", comm_lib.get_comm("single"))  # native: the default tables
        for s in range(3):
            batch = sc.local_slice(sc.make_batch(s), 0, 1)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(sc.inputs_of(batch), training=True) - batch["label"]))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        export_dir = str(tmp_path_factory.mktemp("trained") / "export")
        fr.export.export_model(model, export_dir, example=sc.inputs_of(sc.local_slice(sc.make_batch(0), 0, 1)))
        _TRAINED["export"] = export_dir
    return _TRAINED["export"]


def scenario():
    """tests/serve/export_scenario.py (the model, its features and its batches), imported as the ranker tests do."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import export_scenario  # noqa: PLC0415

    return export_scenario


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


class RankerThread:
    """The ranker built from command-line flags (ranker.parse_args, build, make_server: what `python -m
    tf_fusedrec.serve.ranker` runs) serving on a free loopback port from a thread of this process.

    Attributes: ranker (the Ranker), server (its http_server.AsyncHTTPServer), port, url (http://127.0.0.1:PORT/v1/models/NAME).
    """

    def __init__(self, flags):
        from tf_fusedrec.serve import ranker as ranker_lib  # noqa: PLC0415

        args = ranker_lib.parse_args(["--port", "0", "--host", "127.0.0.1", *flags])
        self.ranker = ranker_lib.build(args)
        self.server = ranker_lib.make_server(self.ranker, args)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1/models/{args.name}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="test_ranker_http", daemon=True)
        self._thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)
        self.ranker.close()


def post(url, payload, timeout=30):
    """POST a JSON payload (or raw bytes) -> (status, decoded JSON answer)."""
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


def raw_http(port, data, timeout=30.0):
    """Bytes sent as they are on a new loopback connection -> (status, decoded JSON body), reading until the server
    closes the connection or the answer's Content-Length is in."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        received = b""
        while True:
            head, sep, body = received.partition(b"\r\n\r\n")
            if sep:
                match = re.search(rb"(?i)content-length:\s*(\d+)", head)
                if match and len(body) >= int(match.group(1)):
                    break
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else None
    return status, json.loads(body) if body else None


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


# --- certificates: the documented openssl commands ------------------------------------------------------------------

SECURITY_DOC = os.path.join(ROOT, "docs", "guide", "serving-security.md")
HAS_OPENSSL = shutil.which("openssl") is not None
# The TLS tests make their certificates with the openssl CLI (scripts/install.sh installs it): they skip without it on a
# developer's machine, saying so, but in CI (CI=true, as tests/cluster/conftest.py) a missing one fails the run.
if not HAS_OPENSSL and os.environ.get("CI", "").lower() == "true":
    raise RuntimeError("the TLS tests need the openssl CLI, which scripts/install.sh installs (apt-get install openssl)")


def documented_pki_commands():
    """The bash block of docs/guide/serving-security.md that follows its "tested" marker."""
    with open(SECURITY_DOC) as f:
        text = f.read()
    match = re.search(r"<!-- tested: [^>]*-->\s*```bash\n(.*?)```", text, re.S)
    if not match:
        raise AssertionError(f"{SECURITY_DOC}: no tested bash block")
    return match.group(1)


def make_pki(base, extra=""):
    """Runs the documented commands in `base` (they write base/pki: a CA, certificates, publish.token), then `extra`
    (bash, in base/pki, with the documented `cert NAME SUBJECT_ALT_NAMES [DAYS]` function) -> the pki directory."""
    script = documented_pki_commands() + extra
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=base, capture_output=True, text=True,
                            timeout=120)
    if result.returncode != 0:
        raise AssertionError(f"{script}\n{result.stderr[-3000:]}")
    return os.path.join(base, "pki")

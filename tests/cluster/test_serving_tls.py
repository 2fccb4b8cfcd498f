"""Serving across the cluster's namespaced hosts under mutual TLS (issue 58's invariant): the two embedding servers
and the ranker each on a host of its own, bound to the host's address (beyond loopback: mutual TLS and the publish
token, certificates of a throwaway CA naming each host's address), and the trainer's seat on a fourth host
(tests/cluster/tls_serving_client.py): the ranker's predictions over HTTPS equal the in-process model's (1e-6), and a
publish (rows staged and committed, the dense weights installed) reaches every server and the ranker, whose
predictions of the new version still equal the model's."""

import json
import os
import secrets
import subprocess
import sys
import threading
import time

import pytest

from tests.serve import serve_fixtures
from tests.subprocess_runner import ROOT, child_env, tail
from tf_fusedrec.cluster import Cluster
from tf_fusedrec.serve import security

START_TIMEOUT_S = 300  # TensorFlow's import and the export's load, four processes on two shared cores
SERVER_PORT, RANKER_PORT, PUBLISH_PORT = 7001, 8501, 8601


class _InHost:
    """python ARGS in a host's network namespace (ip netns exec), its stderr in log_path; start() waits for the
    "ready" line a server prints once it serves."""

    def __init__(self, host, args, log_path):
        self.host, self.log_path = host, log_path
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(["ip", "netns", "exec", host.netns, sys.executable, *args], cwd=ROOT,
                                         env=child_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=log, text=True, start_new_session=True)
        self.lines = []
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.strip() == "ready":
                self._ready.set()

    def wait_ready(self, timeout_s):
        deadline = time.monotonic() + timeout_s
        while not self._ready.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                with open(self.log_path) as f:
                    pytest.fail(f"{self.host.name}: not ready (exit {self.proc.poll()}):\n{tail(f.read())}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.mark.skipif(not serve_fixtures.HAS_OPENSSL, reason="the openssl CLI is not installed")
def test_serving_across_hosts_under_mutual_tls(cluster_ok, netstate, tmp_path, tmp_path_factory):  # noqa: ARG001
    export = serve_fixtures.trained_export(tmp_path_factory)
    token = tmp_path / "publish.token"
    token.write_text(secrets.token_hex(32) + "\n")
    os.chmod(token, 0o600)
    processes = []
    with Cluster(hosts=4, link_rate=None) as cluster:
        servers, ranker_host, trainer_host = cluster.hosts[:2], cluster.hosts[2], cluster.hosts[3]
        pki = security.make_throwaway_pki(str(tmp_path / "pki"),
                                          {h.name: f"DNS:{h.name},IP:{h.address}" for h in cluster.hosts})

        def tls_flags(host):
            cert, key = pki[host.name]
            return ["--tls-cert", cert, "--tls-key", key, "--tls-ca", pki["ca"]]

        try:
            for shard, host in enumerate(servers):
                processes.append(_InHost(host, [
                    "-m", "tf_fusedrec.serve.embedding_server", "--export", export, "--shard", str(shard),
                    "--num-shards", "2", "--host", host.address, "--port", str(SERVER_PORT), "--accept-publish",
                    *tls_flags(host), "--tls-client-auth", "--publish-token-file", str(token)],
                    str(tmp_path / f"server{shard}.log")))
            for p in processes:
                p.wait_ready(START_TIMEOUT_S)
            addresses = [f"{h.address}:{SERVER_PORT}" for h in servers]
            processes.append(_InHost(ranker_host, [
                "-m", "tf_fusedrec.serve.ranker", "--export", export, "--servers", ",".join(addresses),
                "--host", ranker_host.address, "--port", str(RANKER_PORT), "--publish-host", ranker_host.address,
                "--publish-port", str(PUBLISH_PORT), *tls_flags(ranker_host), "--tls-client-auth",
                "--publish-token-file", str(token), "--name", "model"], str(tmp_path / "ranker.log")))
            processes[-1].wait_ready(START_TIMEOUT_S)
            client = subprocess.run(
                ["ip", "netns", "exec", trainer_host.netns, sys.executable,
                 str(ROOT / "tests" / "cluster" / "tls_serving_client.py"), "--export", export,
                 "--ranker", f"{ranker_host.address}:{RANKER_PORT}",
                 "--publish", f"{ranker_host.address}:{PUBLISH_PORT}", *tls_flags(trainer_host),
                 "--publish-token-file", str(token)],
                cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=START_TIMEOUT_S)
            assert client.returncode == 0, tail(client.stderr)
            report = json.loads(client.stdout.strip().splitlines()[-1])
        finally:
            for p in reversed(processes):
                p.stop()
        namespaces = cluster.namespaces
    # The predictions crossed the hosts' links over mutual TLS and equal the in-process model's, before and after.
    assert report["before"]["version"] == "0" and report["before"]["close"], report
    assert report["without_certificate"].startswith("refused"), report
    assert report["servers"] == sorted(addresses)
    assert report["held"] == {a: [0, 1] for a in addresses}, report  # the publish reached every server
    assert report["dense"] == {"version": 1, "step": 11}
    assert report["after"]["version"] == "1" and report["after"]["close"], report  # and the ranker
    assert report["after"]["count"] == report["before"]["count"] > 0
    netstate(namespaces)  # the cluster left nothing behind

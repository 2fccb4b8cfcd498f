"""TLS and authenticated publishing on loopback (tf_fusedrec/serve/security.py), with certificates made by the
commands of docs/guide/serving-security.md (run here with the openssl CLI):

* with TLS, and with mutual TLS, the ranker's predictions over HTTPS equal the in-process model's (1e-6), the load
  generator (serve/loadtest.py) gets every request answered, and a publish (Stage, Commit, the dense install) reaches
  every embedding server and the ranker;
* a publish with no token, a wrong token, a client certificate of another CA, or in plain text to a TLS port is
  refused before anything is staged, logged with the peer's address, and the servers keep serving the previous
  version bit for bit; the ranker's publish endpoint refuses the same with 401 before reading the body;
* a lookup client without the CA, or facing an expired or wrong-host certificate, fails with an error naming the
  cause; so does the trainer's client of the ranker's endpoint;
* a server that would take unauthenticated publishes beyond loopback refuses to start unless --insecure (which logs
  every publish), and one that serves beyond loopback without TLS warns.
"""

import json
import logging
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.serve import serve_fixtures
from tests.serve.serve_fixtures import instances_of
from tests.subprocess_runner import ROOT, child_env
from tf_fusedrec.export import format as fmt
from tf_fusedrec.serve import embedding_pb2 as pb
from tf_fusedrec.serve import embedding_server, loadtest, publish, security
from tf_fusedrec.serve.client import RemoteBackend, ServerUnavailable

pytestmark = pytest.mark.skipif(not serve_fixtures.HAS_OPENSSL, reason="the openssl CLI is not installed")

TOKEN = b"0123456789abcdef0123456789abcdef"
GROUP = "hashed"
TABLES = serve_fixtures.fake_tables(keys_per_feature=200)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Two CAs made by the documented commands (each in its DIR/pki), and, with the documented `cert` function, the
    loopback certificates the tests use: "local" (127.0.0.1 and localhost), "client", "expired" and "wronghost" of
    the first CA, "local" of the other -> {name: (cert, key)} paths, "ca", "other_ca", "token"."""
    paths = {}
    for which in ("main", "other"):
        base = tmp_path_factory.mktemp(f"pki_{which}")
        extra = {"main": 'cert local "DNS:localhost,IP:127.0.0.1"\ncert client "DNS:client.example.internal"\n'
                         'cert expired "IP:127.0.0.1" -1\ncert wronghost "DNS:elsewhere.example.internal"\n',
                 "other": 'cert local "DNS:localhost,IP:127.0.0.1"\n'}[which]
        pki_dir = Path(serve_fixtures.make_pki(base, extra))
        prefix = "" if which == "main" else "other_"
        for name in ("local", "client", "expired", "wronghost", "emb1", "emb2", "ranker", "trainer"):
            if (pki_dir / f"{name}.pem").exists():
                paths[prefix + name] = (str(pki_dir / f"{name}.pem"), str(pki_dir / f"{name}.key"))
        paths[prefix + "ca"] = str(pki_dir / "ca.pem")
        paths[prefix + "token"] = str(pki_dir / "publish.token")
    return paths


def test_the_documented_commands_make_a_ca_certificates_and_a_token(pki):
    ca = pki["ca"]
    names = ["emb1", "emb2", "ranker", "trainer", "local", "client"]
    out = subprocess.run(["openssl", "verify", "-CAfile", ca, *[pki[n][0] for n in names]], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.count(": OK") == len(names), out.stdout + out.stderr
    text = subprocess.run(["openssl", "x509", "-in", pki["emb1"][0], "-noout", "-text"], capture_output=True,
                          text=True, timeout=60).stdout
    assert "IP Address:10.0.0.11" in text and "TLS Web Server Authentication" in text
    assert "TLS Web Client Authentication" in text
    assert oct(os.stat(pki["emb1"][1]).st_mode & 0o777) == "0o600"
    assert re.fullmatch(r"[0-9a-f]{64}", security.read_token(pki["token"]).decode())
    # The documented files load as the flags take them.
    tls = security.TLS.from_files(*pki["emb1"], ca, client_auth=True)
    assert tls.serves and tls.verifies and tls.client_auth
    # A certificate of the other CA does not chain to this one.
    assert subprocess.run(["openssl", "verify", "-CAfile", ca, pki["other_local"][0]], capture_output=True,
                          timeout=60).returncode != 0


def tls_of(pki, name="local", ca="ca", client_auth=False):
    cert, key = pki[name] if name else (None, None)
    return security.TLS.from_files(cert, key, pki[ca] if ca else None, client_auth=client_auth)


# --- publishing refused before staging, on the embedding servers ----------------------------------------------------


@pytest.fixture
def export(tmp_path):
    return serve_fixtures.write_fake_export(str(tmp_path / "export"), keys_per_feature=200, source={"step": 7})


def snapshot(server):
    """What a server serves: its versions and every version's rows, copied."""
    return [(v, step, {name: (g.keys.copy(), g.rows.copy()) for name, g in groups.items()})
            for v, step, groups in server._versions]  # noqa: SLF001


def assert_unchanged(server, before):
    after = snapshot(server)
    assert [(v, s) for v, s, _ in after] == [(v, s) for v, s, _ in before]
    for (_, _, groups_after), (_, _, groups_before) in zip(after, before):
        for name, (keys, rows) in groups_before.items():
            np.testing.assert_array_equal(groups_after[name][0], keys)
            assert groups_after[name][1].tobytes() == rows.tobytes(), name  # bit for bit
    assert server._staging is None  # noqa: SLF001  (nothing staged either)


def stage_one(publisher, version=1):
    spec, _, _, keys, rows = TABLES[GROUP]
    publisher.stage(version, GROUP, spec["dim"], keys[:20], rows[:20] + 1, np.zeros(0, np.int64))


def publish_one(table, tls, token=None):
    """Publishes stage_one's rows as version 1 (staged, then committed) with these credentials."""
    publisher = publish.Publisher(table, timeout_s=5, tls=tls, token=token)
    try:
        stage_one(publisher)
        publisher.commit(1, step=1, full=False, keep_from=0)
    finally:
        publisher.close()


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_a_publish_without_credentials_is_refused_before_staging(export, pki, caplog, mutual):
    server_tls = tls_of(pki, client_auth=mutual)
    server = embedding_server.EmbeddingServer(export, tls=server_tls, publish_token=TOKEN, accept_publish=True)
    address = f"127.0.0.1:{server.start()}"
    table = publish.RangeTable.even([address])
    # The client side of each attempt: its TLS (with a client certificate under mutual TLS) and token.
    good_tls = tls_of(pki, "client" if mutual else None)
    attempts = {
        "no token": (good_tls, None, "UNAUTHENTICATED: Stage refused: no publish token"),
        "wrong token": (good_tls, b"f" * 32, "UNAUTHENTICATED: Stage refused: wrong publish token"),
        "plain text to the TLS port": (None, TOKEN, "UNAVAILABLE"),
    }
    if mutual:
        attempts["a client certificate of another CA"] = (tls_of(pki, "other_local"), TOKEN, "UNAVAILABLE")
    before = snapshot(server)
    try:
        for what, (tls, token, expected) in attempts.items():
            caplog.clear()
            publisher = publish.Publisher(table, timeout_s=5, tls=tls, token=token)
            publisher._max_request[address] = publish.MAX_STAGE_BYTES  # noqa: SLF001  (Info is not what is tested)
            try:
                with pytest.raises(publish.PublishError, match=f"server {address}: Stage of version 1.*{expected}"):
                    stage_one(publisher)
                with pytest.raises(publish.PublishError, match=f"server {address}: Commit of version 1"):
                    publisher.commit(1, step=1, full=False, keep_from=0)
            finally:
                publisher.close()
            assert_unchanged(server, before)
            if expected.startswith("UNAUTHENTICATED"):
                assert re.search(r"refused Stage from ipv4:127\.0\.0\.1:\d+: ", caplog.text), (what, caplog.text)
                assert re.search(r"refused Commit from ipv4:127\.0\.0\.1:\d+: ", caplog.text), (what, caplog.text)
        # Lookups of a client with the CA (and its certificate under mutual TLS) read version 0, the export's rows.
        backend = RemoteBackend(export, table, tls=good_tls)
        try:
            _, ids, categories, _, rows = TABLES[GROUP]
            assert backend.rows(GROUP, ids, categories).tobytes() == rows.tobytes()
            # The right token publishes (under mutual TLS with the certificate too), and the version is served.
            publish_one(table, good_tls, token=TOKEN)
            assert [v for v, _ in server.versions] == [0, 1]
            np.testing.assert_array_equal(backend.rows(GROUP, ids[:20], categories[:20], version=1), rows[:20] + 1)
        finally:
            backend.close()
    finally:
        server.stop(grace=0)


def test_under_mutual_tls_a_client_certificate_authenticates_a_publish(export, pki):
    server = embedding_server.EmbeddingServer(export, tls=tls_of(pki, client_auth=True), accept_publish=True)
    address = f"127.0.0.1:{server.start()}"
    assert "mutual TLS; publishes authenticated by client certificate" in server.describe()
    table = publish.RangeTable.even([address])
    before = snapshot(server)
    try:
        # No certificate: the handshake fails, nothing is staged, and the error hints at the missing flag.
        publisher = publish.Publisher(table, timeout_s=5, tls=tls_of(pki, None))
        try:
            with pytest.raises(publish.PublishError, match=r"Info: UNAVAILABLE: .*give --tls-cert/--tls-key"):
                stage_one(publisher)
        finally:
            publisher.close()
        assert_unchanged(server, before)
        publish_one(table, tls_of(pki, "client"))
        assert [v for v, _ in server.versions] == [0, 1]
    finally:
        server.stop(grace=0)


# --- lookups: errors that name the cause ----------------------------------------------------------------------------


@pytest.mark.parametrize("case,expected", [
    ("plain client", r"Socket closed.*if the server serves TLS, give --tls-ca"),
    ("another CA", r"CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate"),
    ("expired", r"CERTIFICATE_VERIFY_FAILED: certificate has expired"),
    ("wrong host", r"Hostname Verification Check failed"),
    ("no client certificate", r"Socket closed.*requires client certificates .*give --tls-cert/--tls-key"),
])
def test_a_lookup_client_that_cannot_verify_fails_naming_the_cause(export, pki, case, expected):
    server_cert = {"expired": "expired", "wrong host": "wronghost"}.get(case, "local")
    server = embedding_server.EmbeddingServer(
        export, tls=tls_of(pki, server_cert, client_auth=case == "no client certificate"))
    address = f"127.0.0.1:{server.start()}"
    client_tls = {"plain client": None, "another CA": tls_of(pki, None, "other_ca")}.get(case, tls_of(pki, None))
    _, ids, categories, _, _ = TABLES[GROUP]
    try:
        backend = RemoteBackend(export, [address], tls=client_tls, timeout_s=5)
        try:
            with pytest.raises(ServerUnavailable, match=f"server {re.escape(address)}.*{expected}"):
                backend.rows(GROUP, ids[:4], categories[:4])
        finally:
            backend.close()
    finally:
        server.stop(grace=0)


# --- safe defaults ----------------------------------------------------------------------------------------------------


def test_publishing_beyond_loopback_without_authentication_refuses_to_start(export, pki, caplog):
    with pytest.raises(security.SecurityError, match="embedding server: binding 0.0.0.0 .* add --publish-token-file"):
        embedding_server.EmbeddingServer(export, host="0.0.0.0", accept_publish=True)
    with pytest.raises(security.SecurityError, match="ranker publish endpoint: binding 0.0.0.0 .*--insecure"):
        publish.serve_publish(object(), host="0.0.0.0")
    # Lookups only, beyond loopback, without TLS: a warning; with TLS and a token: neither.
    caplog.set_level(logging.WARNING, "tf_fusedrec.serve")
    embedding_server.EmbeddingServer(export, host="0.0.0.0")
    assert "embedding server: WARNING: serves 0.0.0.0 without TLS" in caplog.text
    caplog.clear()
    embedding_server.EmbeddingServer(export, host="0.0.0.0", accept_publish=True, publish_token=TOKEN,
                                     tls=tls_of(pki))
    assert caplog.text == ""
    # --insecure starts, and logs every commit with its peer.
    server = embedding_server.EmbeddingServer(export, host="0.0.0.0", accept_publish=True, insecure=True)
    assert "takes unauthenticated publishes on 0.0.0.0 (--insecure)" in caplog.text
    publisher = publish.Publisher(publish.RangeTable.even([f"127.0.0.1:{server.start()}"]), timeout_s=5)
    try:
        stage_one(publisher)
        publisher.commit(1, step=1, full=False, keep_from=0)
        stage_one(publisher, version=2)
        publisher.commit(2, step=2, full=False, keep_from=0)
    finally:
        publisher.close()
        server.stop(grace=0)
    assert len(re.findall(r"unauthenticated commit of version \d from ipv4:127\.0\.0\.1:\d+ \(--insecure\)",
                          caplog.text)) == 2, caplog.text


def test_the_server_cli_refuses_to_start_and_says_how_to_fix_it(export, pki, tmp_path):
    short = tmp_path / "short.token"
    short.write_text("abc\n")
    for flags, message in (
            (["--host", "0.0.0.0", "--accept-publish"], r"add --publish-token-file FILE \(openssl rand -hex 32 > FILE"),
            (["--publish-token-file", str(short), "--accept-publish"], "at least 16 characters"),
            (["--tls-cert", pki["local"][0]], "--tls-cert and --tls-key go together"),
            (["--tls-cert", pki["local"][0], "--tls-key", pki["client"][1]], "--tls-cert .* / --tls-key"),
            (["--tls-client-auth", "--tls-cert", pki["local"][0], "--tls-key", pki["local"][1]], "needs --tls-ca"),
            (["--tls-ca", pki["token"]], "--tls-ca .*publish.token"),
            (["--tls-ca", pki["ca"]], "a server's TLS needs --tls-cert and --tls-key")):
        result = subprocess.run([sys.executable, "-m", "tf_fusedrec.serve.embedding_server", "--export", export,
                                 "--port", "0", *flags], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 2, (flags, result.stderr[-2000:])
        assert re.search(message, result.stderr), (flags, result.stderr[-2000:])
    # The ranker's publish port says so before it loads the model.
    result = subprocess.run([sys.executable, "-m", "tf_fusedrec.serve.ranker", "--export", export, "--servers",
                             "127.0.0.1:1", "--port", "0", "--publish-port", "0", "--publish-host", "0.0.0.0"],
                            cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "ranker: ranker publish endpoint: binding 0.0.0.0" in result.stderr, (
        result.stderr[-2000:])


# --- the ranker: HTTPS predictions equal in-process ones, publishing reaches everything ------------------------------


def https(url, payload=None, context=None, headers=None):
    data = json.dumps(payload).encode() if isinstance(payload, (dict, list)) else payload
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    import tf_fusedrec as fr  # noqa: PLC0415

    export_dir = serve_fixtures.trained_export(tmp_path_factory)
    return export_dir, fr.export.load_model(export_dir)


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_predictions_over_tls_equal_in_process_and_a_publish_reaches_everything(trained, pki, caplog, mutual):
    export_dir, local = trained
    server_tls = tls_of(pki, client_auth=mutual)
    token_file = pki["token"]
    token = security.read_token(token_file)
    servers = [embedding_server.EmbeddingServer(export_dir, start, end, accept_publish=True, tls=server_tls,
                                                publish_token=token) for start, end in fmt.even_ranges(2)]
    addresses = [f"127.0.0.1:{s.start()}" for s in servers]
    cert, key = pki["local"]
    flags = ["--export", export_dir, "--servers", ",".join(addresses), "--tls-cert", cert, "--tls-key", key,
             "--tls-ca", pki["ca"], "--publish-token-file", token_file] + (["--tls-client-auth"] if mutual else [])
    ranker = serve_fixtures.RankerThread(flags)
    endpoint = None
    client = tls_of(pki, "client" if mutual else None)  # the trainer's and the HTTP client's settings
    context = client.client_context()
    try:
        from tf_fusedrec.serve import ranker as ranker_lib  # noqa: PLC0415

        args = ranker_lib.parse_args(["--port", "0", "--publish-port", "0", *flags])
        endpoint = publish.serve_publish(ranker.ranker.model, "127.0.0.1", 0, tls=security.TLS.from_args(args),
                                         token=token)
        url = f"https://127.0.0.1:{ranker.port}/v1/models/model"
        publish_address = f"127.0.0.1:{endpoint.server_address[1]}"
        instances = instances_of(serve_fixtures.scenario().make_batch(1000))
        inputs = {name: [inst[name] for inst in instances] for name in instances[0]}
        want = local.predict(inputs, allow_padding=False)
        status, answer = https(f"{url}:predict", {"instances": instances}, context)
        assert status == 200 and answer["model_version"] == "0", answer
        np.testing.assert_allclose(answer["predictions"], want, rtol=1e-6, atol=1e-7)
        # The load generator over HTTPS, its /stats reads too (presenting the client certificate under mutual TLS):
        # a short closed-loop run, every request answered.
        report = loadtest.LoadTest(url, loadtest.CycledInstances(instances), loadtest.ClosedLoop(2), 16, 0.5, 10.0,
                                   tls=client).run()
        assert report["ok"] > 0 and report["error_count"] == 0 and report["unfinished"] == 0, report["errors"]
        assert report["ranker_delta"]["requests"] == report["sent"]
        # Plain HTTP to the HTTPS port gets no answer; neither does a client without a certificate under mTLS.
        with pytest.raises(OSError):  # urllib's URLError, or the connection reset
            https(f"http://127.0.0.1:{ranker.port}/v1/models/model", context=None)
        if mutual:
            with pytest.raises(OSError):
                https(url, context=tls_of(pki, None).client_context())

        # The publish endpoint: no token and a wrong one are refused (401) before the body is read.
        weights = [v.numpy() for v in ranker.ranker.model._loaded[0].dense_variables]  # noqa: SLF001
        body = publish.encode_weights(weights)
        for headers, reason in (({}, "no publish token"), ({"Authorization": "Bearer " + "0" * 64}, "wrong")):
            caplog.clear()
            status, answer = https(f"https://{publish_address}/publish/dense?version=1&step=1", body, context,
                                   headers)
            assert status == 401 and reason in answer["error"], answer
            assert re.search(r"refused POST /publish/dense from 127\.0\.0\.1:\d+", caplog.text), caplog.text
        with pytest.raises(publish.PublishError, match=f"ranker {publish_address}: GET /publish/targets: HTTP 401: "
                                                       f"refused: wrong publish token"):
            publish.ranker_targets(publish_address, tls=client, token=b"1" * 32)
        with pytest.raises(publish.PublishError, match=f"ranker {publish_address}: .*give --tls-ca"):
            publish.ranker_targets(publish_address, token=token)  # plain HTTP to HTTPS
        with pytest.raises(publish.PublishError, match="CERTIFICATE_VERIFY_FAILED"):
            publish.ranker_targets(publish_address, tls=tls_of(pki, None, "other_ca"), token=token)
        assert ranker.ranker.model.version == 0

        # The trainer's side with the CA and the token: the targets, a version staged and committed on every
        # server, the dense weights installed; predictions then come from version 1 and still equal the model's
        # (the rows staged are the servers' own).
        targets = publish.ranker_targets(publish_address, tls=client, token=token)
        table = publish.table_of_targets(targets)
        assert sorted(table.addresses) == sorted(addresses)
        publisher = publish.Publisher(table, timeout_s=10, tls=client, token=token)
        try:
            for server in servers:
                for name, rows_of in server.groups.items():
                    publisher.stage(1, name, rows_of.dim, rows_of.keys[:50], rows_of.rows[:50],
                                    np.zeros(0, np.int64))
            publisher.commit(1, step=11, full=False, keep_from=0)
        finally:
            publisher.close()
        assert [[v for v, _ in s.versions] for s in servers] == [[0, 1]] * 2
        assert publish.push_dense(publish_address, 1, 11, weights, tls=client, token=token) == {"version": 1,
                                                                                                "step": 11}
        assert ranker.ranker.model.version == 1
        status, answer = https(f"{url}:predict", {"instances": instances}, context)
        assert status == 200 and answer["model_version"] == "1", answer
        np.testing.assert_allclose(answer["predictions"], want, rtol=1e-6, atol=1e-7)
    finally:
        if endpoint is not None:
            endpoint.shutdown()
            endpoint.server_close()
        ranker.close()
        for s in servers:
            s.stop(grace=0)


def test_info_still_answers_without_a_token(export, pki):
    """Info and Credits are lookups' calls: they need TLS (where served) but no publish token."""
    server = embedding_server.EmbeddingServer(export, tls=tls_of(pki), publish_token=TOKEN, accept_publish=True)
    address = f"127.0.0.1:{server.start()}"
    publisher = publish.Publisher(publish.RangeTable.even([address]), timeout_s=5, tls=tls_of(pki, None))
    try:
        info = publisher.info(address)
        assert isinstance(info, pb.InfoResponse) and info.accepts_publish
    finally:
        publisher.close()
        server.stop(grace=0)


def test_the_documented_deployment_commands_parse(pki):
    """Every command of the docs page's deployment takes the flags the page gives it."""
    import shlex  # noqa: PLC0415

    from tf_fusedrec.serve import ranker as ranker_lib  # noqa: PLC0415
    from tf_fusedrec.train import app  # noqa: PLC0415

    with open(serve_fixtures.SECURITY_DOC) as f:
        blocks = re.findall(r"```bash\n(.*?)```", f.read(), re.S)
    commands = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()
                if " -m tf_fusedrec." in line]
    parsers = {"tf_fusedrec.serve.embedding_server": embedding_server.parse_args,
               "tf_fusedrec.serve.ranker": ranker_lib.parse_args, "tf_fusedrec.train": app.parse_args,
               "tf_fusedrec.serve.loadtest": loadtest._parser().parse_args}  # noqa: SLF001
    seen = set()
    for command in commands:
        words = shlex.split(command)
        module = words[words.index("-m") + 1]
        args = parsers[module](words[words.index("-m") + 2:])
        seen.add(module)
        assert args.tls_ca or args.tls_cert, command
        if module != "tf_fusedrec.serve.loadtest":  # the load generator publishes nothing
            assert args.publish_token_file == "pki/publish.token", command
    assert seen == set(parsers)

"""TLS and publish authentication for the serving services (embedding servers, the ranker, the trainer's publisher).

One set of flags, named alike on every command (add_tls_flags, add_publish_auth_flags):

  --tls-cert, --tls-key   this process's certificate chain and private key (PEM): what a server presents; what a
                          client presents to a server started with --tls-client-auth (the ranker and the trainer
                          use the same pair both ways, so the certificate must allow both uses)
  --tls-ca                the CA (PEM) a peer's certificate must chain to: a client verifies the server with it (a
                          client uses TLS when it is given); a server with --tls-client-auth verifies clients with it
  --tls-client-auth       a server takes only clients whose certificate chains to --tls-ca (mutual TLS)
  --publish-token-file    a file holding the shared publish token: a server takes a publish only with it (checked in
                          constant time before any byte of the payload is read); the trainer sends it
  --insecure              a server that takes publishes beyond loopback without authentication starts anyway (and
                          logs every publish it takes so)

Who may publish: with --publish-token-file, whoever presents the token (also under mutual TLS); without it, under
--tls-client-auth, every client, since the handshake already checked its certificate; without either, anyone who
reaches the port: allowed on a loopback address only, beyond it with --insecure (refuse_unsafe_start).
"""

import dataclasses
import hmac
import ipaddress
import logging
import os
import shutil
import ssl
import subprocess

LOG = logging.getLogger("tf_fusedrec.serve")
# The gRPC metadata key and the HTTP header carrying the publish token ("Bearer TOKEN").
TOKEN_METADATA = "authorization"
TOKEN_HEADER = "Authorization"
# A token shorter than this is refused when it is read: a guessable secret protects nothing.
MIN_TOKEN_CHARS = 16
# The most bytes read from a token file (a token is a line; a larger file is a mistake, e.g. a certificate given).
MAX_TOKEN_BYTES = 4096


class SecurityError(ValueError):
    """A TLS or publish-authentication setting that cannot work; the message names the flag and the file."""


def log_to_stderr():
    """A command's security log (refused publishes, warnings) as lines on stderr, once, not through the root logger
    (TensorFlow's absl handler would print them a second time)."""
    if not LOG.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        LOG.addHandler(handler)
        LOG.setLevel(logging.INFO)
        LOG.propagate = False


def is_loopback(host):
    """Whether binding `host` serves this machine only (127.0.0.0/8, ::1, localhost)."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve beyond this machine


def _read(path, flag):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise SecurityError(f"{flag} {path}: {e.strerror or e}") from None


@dataclasses.dataclass(frozen=True)
class TLS:
    """TLS settings of one process (the module docstring says what each is for); files are read when built.

    Attributes:
      cert, key: this process's certificate chain and key (PEM bytes), or None.
      ca: the CA certificates (PEM bytes) peers must chain to, or None.
      client_auth: servers require a client certificate chaining to `ca`.
      paths: {flag: path} as given (for messages and ssl, which reads files).
    """

    cert: bytes = None
    key: bytes = None
    ca: bytes = None
    client_auth: bool = False
    paths: dict = dataclasses.field(default_factory=dict, compare=False)

    @classmethod
    def from_files(cls, cert=None, key=None, ca=None, client_auth=False):
        """The settings of --tls-cert, --tls-key, --tls-ca, --tls-client-auth (paths); None when none is given.
        SecurityError naming the flag when a file cannot be read or the combination cannot work."""
        if not (cert or key or ca or client_auth):
            return None
        if bool(cert) != bool(key):
            raise SecurityError("--tls-cert and --tls-key go together (a certificate and its private key)")
        if client_auth and not (ca and cert):
            raise SecurityError("--tls-client-auth needs --tls-ca (the CA client certificates must chain to) and "
                                "--tls-cert/--tls-key (the server's own certificate)")
        paths = {"--tls-cert": cert, "--tls-key": key, "--tls-ca": ca}
        tls = cls(cert=_read(cert, "--tls-cert") if cert else None, key=_read(key, "--tls-key") if key else None,
                  ca=_read(ca, "--tls-ca") if ca else None, client_auth=bool(client_auth),
                  paths={k: v for k, v in paths.items() if v})
        if cert:
            tls.server_context()  # a certificate that does not match its key fails here, by name
        if ca:
            tls.client_context()  # so does a CA file that holds no certificate
        return tls

    @classmethod
    def from_args(cls, args):
        """The settings of parsed add_tls_flags flags; None without any."""
        return cls.from_files(args.tls_cert, args.tls_key, args.tls_ca, args.tls_client_auth)

    @property
    def serves(self):
        """Whether a server of these settings serves TLS (it has a certificate)."""
        return self.cert is not None

    @property
    def verifies(self):
        """Whether a client of these settings uses TLS (it has a CA to verify the server with)."""
        return self.ca is not None

    # --- gRPC ---

    def server_credentials(self):
        """grpc.ServerCredentials: this certificate; with client_auth, clients must chain to the CA."""
        import grpc  # noqa: PLC0415  (the trainer reads these flags without loading gRPC)

        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca if self.client_auth
                                           else None, require_client_auth=self.client_auth)

    def channel_credentials(self):
        """grpc.ChannelCredentials: the server verified against the CA (its name too); this certificate presented
        where there is one (mutual TLS)."""
        import grpc  # noqa: PLC0415

        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)

    # --- HTTP (ssl) ---

    def server_context(self):
        """ssl.SSLContext of an HTTPS server: this certificate, TLS 1.2 at least; with client_auth, clients must
        present a certificate chaining to the CA."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.paths["--tls-cert"], self.paths["--tls-key"])
            if self.client_auth:
                context.load_verify_locations(cadata=self.ca.decode("ascii", "replace"))
                context.verify_mode = ssl.CERT_REQUIRED
        except ssl.SSLError as e:
            raise SecurityError(f"--tls-cert {self.paths['--tls-cert']} / --tls-key {self.paths['--tls-key']} / "
                                f"--tls-ca: {e}") from None
        return context

    def client_context(self):
        """ssl.SSLContext of an HTTPS client: the server verified against the CA (without one, against the system's
        CAs), its host name or IP checked; this certificate presented where there is one."""
        try:
            context = ssl.create_default_context(
                ssl.Purpose.SERVER_AUTH, cadata=self.ca.decode("ascii", "replace") if self.ca is not None else None)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            if self.cert is not None:
                context.load_cert_chain(self.paths["--tls-cert"], self.paths["--tls-key"])
        except ssl.SSLError as e:
            raise SecurityError(f"--tls-ca {self.paths.get('--tls-ca')}: {e}") from None
        return context


def grpc_channel(address, tls, options):
    """A gRPC channel to host:port: TLS verified against tls.ca when `tls` verifies, plain otherwise."""
    import grpc  # noqa: PLC0415

    if tls is not None and tls.verifies:
        return grpc.secure_channel(address, tls.channel_credentials(), options=options)
    return grpc.insecure_channel(address, options=options)


def explain(details, tls):
    """A hint to append to a connection error's details where gRPC names no cause: a server that closes the
    connection at once is, most often, one that speaks TLS to a plain client or wants a client certificate ("" when
    the details name their cause, or are no such failure)."""
    details = details or ""
    if "Socket closed" not in details and "Connection reset" not in details:
        return ""
    if tls is None or not tls.verifies:
        return " (the connection was closed at once: if the server serves TLS, give --tls-ca)"
    if tls.cert is None:
        return (" (the connection was closed at once: if the server requires client certificates "
                "(--tls-client-auth), give --tls-cert/--tls-key)")
    return (" (the connection was closed at once: if the server requires client certificates, this one "
            "(--tls-cert) must chain to its --tls-ca)")


def read_token(path):
    """The publish token in a file (surrounding whitespace dropped) as bytes; SecurityError naming the file when it
    cannot be read, is empty or too short, or is too large to be a token."""
    data = _read(path, "--publish-token-file")
    if len(data) > MAX_TOKEN_BYTES:
        raise SecurityError(f"--publish-token-file {path}: {len(data)} bytes, at most {MAX_TOKEN_BYTES} (a token is "
                            f"one line, e.g. openssl rand -hex 32)")
    token = data.strip()
    if len(token) < MIN_TOKEN_CHARS or b"\n" in token:
        raise SecurityError(f"--publish-token-file {path}: the token must be one line of at least {MIN_TOKEN_CHARS} "
                            f"characters (openssl rand -hex 32 > {path})")
    return token


def bearer(token):
    """The value of the token's metadata entry or header."""
    return "Bearer " + token.decode("ascii", "replace")


class PublishGuard:
    """Decides whether a publish call is authenticated (module docstring: who may publish).

    Args:
      token: the shared token (bytes), or None.
      client_certs: the server requires client certificates (mutual TLS): every caller's certificate was checked.
      insecure: publishes are taken without authentication (loopback, or --insecure beyond it); they are logged.
    """

    def __init__(self, token=None, client_certs=False, insecure=False):
        self.token, self.client_certs, self.insecure = token, bool(client_certs), bool(insecure)

    @property
    def authenticates(self):
        return self.token is not None or self.client_certs

    def refusal(self, presented):
        """None when a call presenting `presented` (the metadata entry's or header's value, or None) may publish;
        else the reason it may not."""
        if self.token is None:
            return None  # mutual TLS (the handshake checked the certificate) or no authentication at all
        if presented is None:
            return "no publish token (the publisher needs --publish-token-file)"
        expected = bearer(self.token).encode()
        if not hmac.compare_digest(presented.encode("utf-8", "replace"), expected):
            return "wrong publish token (the --publish-token-file files differ)"
        return None


def check_publish_exposure(what, host, guard):
    """SecurityError saying how to add authentication when `what` would take publishes on `host` beyond loopback
    without any (and without --insecure)."""
    if not is_loopback(host) and not guard.authenticates and not guard.insecure:
        raise SecurityError(
            f"{what}: binding {host} (beyond this machine) would let anyone who reaches the port publish versions "
            f"of the model: add --publish-token-file FILE (openssl rand -hex 32 > FILE; the same file for the "
            f"trainer), or --tls-client-auth with --tls-ca/--tls-cert/--tls-key, or pass --insecure on a network "
            f"you trust")


def refuse_unsafe_start(what, host, publishes, guard, tls):
    """Checks a service's exposure before it binds (the safe defaults):

    * publishing beyond loopback without authentication: SecurityError saying how to add it
      (check_publish_exposure), unless the guard is insecure (--insecure), which is then logged;
    * lookups (or predictions) beyond loopback without TLS: a warning logged.

    Args:
      what: the service, for messages ("embedding server", "ranker publish endpoint", ...).
      host: the interface it binds.
      publishes: it takes publishes.
      guard: its PublishGuard (None when it takes no publishes).
      tls: its TLS settings, or None.
    """
    if is_loopback(host):
        return
    if publishes:
        check_publish_exposure(what, host, guard)
        if not guard.authenticates:
            LOG.warning("%s: WARNING: takes unauthenticated publishes on %s (--insecure)", what, host)
    if tls is None or not tls.serves:
        LOG.warning("%s: WARNING: serves %s without TLS: anyone on the network can read what it answers "
                    "(--tls-cert/--tls-key)", what, host)


def add_tls_flags(parser, server=True):
    """Adds --tls-cert, --tls-key, --tls-ca (and, for a server, --tls-client-auth) to an argparse parser."""
    parser.add_argument("--tls-cert", metavar="PEM",
                        help="this process's certificate chain: a server serves TLS with it; a client presents it to "
                             "servers that require client certificates (--tls-client-auth)")
    parser.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    parser.add_argument("--tls-ca", metavar="PEM",
                        help="the CA certificates peers must chain to: this process's connections to servers use "
                             "TLS and verify the server (its certificate and host name) against it" +
                             ("; with --tls-client-auth, clients' certificates must chain to it" if server else ""))
    if server:
        parser.add_argument("--tls-client-auth", action="store_true",
                            help="mutual TLS: take only clients whose certificate chains to --tls-ca (a client "
                                 "certificate then also authenticates publishing)")
    else:
        parser.set_defaults(tls_client_auth=False)


def add_publish_auth_flags(parser, server=True):
    """Adds --publish-token-file (and, for a server, --insecure) to an argparse parser."""
    parser.add_argument("--publish-token-file", metavar="FILE",
                        help="a file holding the shared publish token (one line, e.g. openssl rand -hex 32): " +
                             ("publishes without it are refused" if server else "sent with every publish call"))
    if server:
        parser.add_argument("--insecure", action="store_true",
                            help="take publishes beyond loopback without authentication (every one is logged); "
                                 "without it such a server refuses to start")


# --- throwaway certificates ------------------------------------------------------------------------------------------

# The CA and the `cert` function of docs/guide/serving-security.md, line for line (tests/serve/test_serve_bench.py
# checks it): the serve bench's --tls makes its certificates with them.
PKI_COMMANDS = r"""
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 365 \
    -subj "/CN=tf_fusedrec serving CA" -keyout ca.key -out ca.pem \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
cert() {
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$1" \
        -keyout "$1.key" -out "$1.csr"
    printf '%s\n' "subjectAltName=$2" "basicConstraints=critical,CA:FALSE" \
        "keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth,clientAuth" \
        "subjectKeyIdentifier=hash" "authorityKeyIdentifier=keyid,issuer" > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days "${3:-90}" \
        -extfile "$1.ext" -out "$1.pem"
    rm "$1.csr" "$1.ext"
}
"""


def make_throwaway_pki(directory, certs, timeout_s=120):
    """A new CA and certificates made in `directory` (created, private) by PKI_COMMANDS.

    Args:
      directory: where ca.pem, ca.key, NAME.pem and NAME.key go.
      certs: {NAME: subjectAltName} (e.g. {"local": "DNS:localhost,IP:127.0.0.1"}), NAME a plain word.

    Returns:
      {"ca": the CA's path, NAME: (certificate path, key path), ...}.

    Raises:
      SecurityError: openssl is not installed, or failed (with its output).
    """
    if shutil.which("openssl") is None:
        raise SecurityError("making certificates needs the openssl command, which is not installed")
    for name, alt_names in certs.items():
        if not name.isidentifier() or "'" in alt_names:
            raise SecurityError(f"certificate {name!r} ({alt_names!r}): the name must be a plain word and the "
                                "subjectAltName hold no quote")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    script = PKI_COMMANDS + "".join(f"cert {name} '{alt_names}'\n" for name, alt_names in certs.items())
    try:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=directory, capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise SecurityError(f"openssl did not make the certificates in {directory} within {timeout_s:g} s") from None
    if done.returncode != 0:
        raise SecurityError(f"openssl failed to make the certificates in {directory}: {done.stderr[-2000:]}")
    paths = {"ca": os.path.join(directory, "ca.pem")}
    for name in certs:
        paths[name] = (os.path.join(directory, f"{name}.pem"), os.path.join(directory, f"{name}.key"))
    return paths

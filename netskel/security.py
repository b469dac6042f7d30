"""Transport security: who may call what.

Agents, the controller and the analyzer talk over mutual TLS. A certificate
names its holder in a URI subject alternative name — `netskel://agent/<container>`,
`netskel://analyzer`, `netskel://operator` — so identity comes from the CA's
signature, not from what a request claims: an agent may register, heartbeat,
report and deregister only as its own container and read only its own list.
People and diagnosis engines reach NetDiag with a client certificate or a
bearer token (compared in constant time). Plaintext is an explicit choice
(`--insecure`) and logged as such.

Certificates for tests and the demo are made at run time (`netskel certs`),
never committed."""

from __future__ import annotations

import datetime
import hmac
import ipaddress
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc

from netskel.errors import InputError

log = logging.getLogger(__name__)
SCHEME = "netskel://"
AGENT = SCHEME + "agent/"
ANALYZER = SCHEME + "analyzer"
OPERATOR = SCHEME + "operator"
CONTROLLER = SCHEME + "controller"


def agent_id(container: str) -> str:
    return AGENT + quote(container, safe="")


@dataclass(frozen=True)
class Tls:
    """PEM bytes of this process's certificate chain, key and trusted CA."""
    cert: bytes
    key: bytes
    ca: bytes

    @classmethod
    def load(cls, cert: str, key: str, ca: str) -> Tls:
        """All three files; a client may leave cert and key empty (then it
        verifies the server but presents no certificate)."""
        out = []
        for what, path in (("--tls-cert", cert), ("--tls-key", key), ("--tls-ca", ca)):
            if not path and what != "--tls-ca":
                out.append(b"")
                continue
            try:
                data = Path(path).read_bytes()
            except OSError as e:
                raise InputError(f"{what} {path}: {e.strerror or e}") from None
            if b"-----BEGIN" not in data:
                raise InputError(f"{what} {path}: not a PEM file")
            out.append(data)
        return cls(*out)


@dataclass(frozen=True)
class Security:
    """What a process was told: TLS material, a bearer token, or plaintext."""
    tls: Tls | None = None
    token: str | None = None

    @property
    def insecure(self) -> bool:
        return self.tls is None


def from_flags(cert: str, key: str, ca: str, insecure: bool, role: str,
               token_file: str = "") -> Security:
    """One rule for every command: all three TLS files, or --insecure."""
    given = [x for x in (cert, key, ca) if x]
    if given and insecure:
        raise InputError(f"{role}: --insecure and --tls-* exclude each other")
    if given and len(given) != 3:
        raise InputError(f"{role}: --tls-cert, --tls-key and --tls-ca go together")
    if not given and not insecure:
        raise InputError(f"{role}: give --tls-cert, --tls-key and --tls-ca "
                         "(make them with `netskel certs`), or --insecure for plaintext")
    token = read_token(token_file) if token_file else None
    return Security(Tls.load(cert, key, ca) if given else None, token)


def warn_if_insecure(sec: Security, role: str) -> None:
    """Once the server or agent is up (a failed start says only why)."""
    if sec.insecure:
        log.warning("%s: --insecure: plaintext, no peer identities%s", role,
                    "; bearer tokens cross in the clear" if sec.token else "")


def read_token(path: str) -> str:
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"--token-file {path}: {e}") from None
    if len(token) < 16 or any(c.isspace() for c in token):
        raise InputError(f"--token-file {path}: a token is one word of 16 or more characters")
    return token


# -- servers -----------------------------------------------------------------
def server_credentials(tls: Tls, require_client_cert: bool) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(tls.key, tls.cert)], root_certificates=tls.ca,
                                       require_client_auth=require_client_cert)


def peer_ids(context: Any) -> list[str]:
    """The URI names the peer's verified certificate carries ([] without one)."""
    ids = context.peer_identities() or []
    return [i.decode("utf-8", "replace") if isinstance(i, bytes) else str(i) for i in ids]


def bearer_ok(metadata: Iterable[tuple[str, Any]] | None, token: str) -> bool:
    want = ("Bearer " + token).encode()
    for k, v in metadata or ():
        if k == "authorization":
            got = v.encode() if isinstance(v, str) else bytes(v)
            if hmac.compare_digest(got, want):
                return True
    return False


class Guard:
    """A server's checks, called first thing in each handler. Open (no
    checks) only for plaintext without a token: the testbed and tests."""

    def __init__(self, tls: bool = False, token: str | None = None) -> None:
        self.tls = tls
        self.token = token

    @property
    def open(self) -> bool:
        return not self.tls and not self.token

    async def agent(self, context: Any, container: str) -> None:
        """Only the agent whose certificate names `container` acts for it."""
        if not self.tls:
            return
        ids = peer_ids(context)
        if agent_id(container) not in ids:
            who = ", ".join(ids) or "no certificate"
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"{who} may not act for container '{container}'")

    async def role(self, context: Any, *roles: str) -> None:
        if not self.tls:
            return
        ids = peer_ids(context)
        if not any(r in ids for r in roles):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"{', '.join(ids) or 'no certificate'} is not one of "
                                f"{', '.join(roles)}")

    async def reader(self, context: Any) -> None:
        """A verified client certificate or the bearer token."""
        if self.open:
            return
        if self.tls and peer_ids(context):
            return
        if self.token and bearer_ok(context.invocation_metadata(), self.token):
            return
        await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                            "a client certificate or a bearer token (authorization: Bearer ...) "
                            "is required")


# -- clients -----------------------------------------------------------------
def channel(target: str, sec: Security, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """A channel as the flags say: mutual TLS (this process's certificate),
    and the bearer token on every call when one is given."""
    opts = list(options)
    if sec.tls is None:
        ch = grpc.insecure_channel(target, options=opts)
        if sec.token:
            ch = grpc.intercept_channel(ch, _TokenInterceptor(sec.token))
        return ch
    return grpc.secure_channel(target, _credentials(sec.tls, sec.token), options=opts)


def _credentials(tls: Tls, token: str | None) -> grpc.ChannelCredentials:
    """This process's certificate against the CA, and the bearer token on
    every call when one is given."""
    creds = grpc.ssl_channel_credentials(tls.ca, tls.key or None, tls.cert or None)
    if token:
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
    return creds


def aio_channel(target: str, sec: Security, options: Sequence[tuple[str, Any]] = ()
                ) -> grpc.aio.Channel:
    """`channel` on gRPC's asyncio client (the agent's control session).
    Mutual TLS or plaintext; a bearer token rides on TLS only (agents prove
    who they are by certificate, never by token)."""
    opts = list(options)
    if sec.tls is None:
        if sec.token:
            raise InputError("a bearer token needs TLS on this channel")
        return grpc.aio.insecure_channel(target, options=opts)
    return grpc.aio.secure_channel(target, _credentials(sec.tls, sec.token), options=opts)


class _TokenInterceptor(grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
                        grpc.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    """The bearer token on a plaintext channel (grpc refuses call credentials
    there): for the testbed only, which says so in its log."""

    def __init__(self, token: str) -> None:
        self.header = ("authorization", "Bearer " + token)

    def _with(self, details: Any) -> Any:
        md = [*(details.metadata or ()), self.header]
        return details._replace(metadata=md)

    def intercept_unary_unary(self, cont: Any, details: Any, request: Any) -> Any:
        return cont(self._with(details), request)

    def intercept_unary_stream(self, cont: Any, details: Any, request: Any) -> Any:
        return cont(self._with(details), request)


# -- certificates ------------------------------------------------------------
def make_certs(out: Path, agents: Iterable[str], hosts: Sequence[str] = ("localhost",),
               days: int = 30) -> dict[str, Path]:
    """A CA and one certificate per role in `out` (keys mode 0600): ca.pem,
    controller, analyzer, operator, agent-<container>. Server certificates
    name `hosts` (DNS names or IP addresses) for clients to verify."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "netskel CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                         critical=True)
          .sign(ca_key, hashes.SHA256()))
    files = {"ca": out / "ca.pem"}
    files["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    def leaf(stem: str, uri: str, server: bool) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(uri)]
        if server:
            for h in hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(h)))
                except ValueError:
                    names.append(x509.DNSName(h))
        usage = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH]
                                                     if server else [])
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, stem)]))
                .issuer_name(ca_name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=days))
                .add_extension(x509.SubjectAlternativeName(names), critical=False)
                .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
                .sign(ca_key, hashes.SHA256()))
        cpath, kpath = out / f"{stem}.pem", out / f"{stem}.key"
        cpath.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        fd = os.open(kpath, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
        files[stem] = cpath

    leaf("controller", CONTROLLER, server=True)
    leaf("analyzer", ANALYZER, server=True)
    leaf("operator", OPERATOR, server=False)
    for c in agents:
        leaf(f"agent-{safe_stem(c)}", agent_id(c), server=False)
    return files


def safe_stem(container: str) -> str:
    return quote(container, safe="-_.")

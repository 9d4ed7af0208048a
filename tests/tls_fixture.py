"""A throw-away certificate authority for the TLS tests: no certificate file is
committed; every test run makes its own with the ``cryptography`` package.

    ca = make_ca(tmp_path / "ca")                      # ca.cert: the CA's PEM certificate
    server = ca.issue("server")                        # server.cert / server.key (PEM), SAN
                                                       # localhost, 127.0.0.1, ::1
    client = ca.issue("worker-1", client=True, ou="ops")   # a client certificate (mTLS)
    ssl_server = server.server_context(client_ca=ca)   # an ssl.SSLContext for a test server

Keys are EC P-256 (fast to make). ``tls_ca`` is a session-scoped pytest fixture (one CA, a
server certificate and a client certificate for the whole run); ``make_ca`` makes another, e.g.
a CA the client does not trust.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_DNS = ("localhost",)
DEFAULT_IPS = ("127.0.0.1", "::1")


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(cn: str, ou: str | None = None, o: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if ou is not None:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ou))
    if o is not None:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o))
    return x509.Name(attrs)


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as PEM files."""

    name: str
    cert: Path
    key: Path

    def server_context(self, client_ca: TestCA | None = None,
                       require_client_cert: bool = True) -> ssl.SSLContext:
        """A server-side context with this certificate; with ``client_ca`` it asks for a client
        certificate signed by that CA (required unless ``require_client_cert`` is false)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)
        if client_ca is not None:
            ctx.load_verify_locations(client_ca.cert)
            ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
        return ctx


@dataclass(frozen=True)
class TestCA:
    """A self-signed CA in ``directory`` (``cert``: its PEM certificate)."""

    __test__ = False  # (not a pytest test class)

    directory: Path
    cert: Path
    key: Path

    def _load(self) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        cert = x509.load_pem_x509_certificate(self.cert.read_bytes())
        key = serialization.load_pem_private_key(self.key.read_bytes(), None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return cert, key

    def issue(self, name: str, *, client: bool = False, dns: Sequence[str] = DEFAULT_DNS,
              ips: Sequence[str] = DEFAULT_IPS, cn: str | None = None, ou: str | None = None,
              o: str | None = None, days: int = 2, expired: bool = False) -> Issued:
        """A certificate signed by this CA, written to ``directory/name.cert`` and ``.key``.
        Server certificates (default) carry ``dns`` and ``ips`` as subject alternative names
        and serverAuth; ``client=True`` gives clientAuth and no SAN. The subject is
        ``CN=cn (default name)[,OU=ou][,O=o]``. ``expired``: valid until yesterday."""
        ca_cert, ca_key = self._load()
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        start, end = ((now - datetime.timedelta(days=3), now - datetime.timedelta(days=1))
                      if expired else (now - datetime.timedelta(minutes=5),
                                       now + datetime.timedelta(days=days)))
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn or name, ou, o))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=True, key_cert_sign=False, crl_sign=False,
                encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]),
                critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
        )
        if not client:
            sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            if sans:
                builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        cert_path = self.directory / f"{name}.cert"
        key_path = self.directory / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(_pem_key(key))
        key_path.chmod(0o600)
        return Issued(name, cert_path, key_path)


def make_ca(directory: Path | str, cn: str = "connect-coordinator test CA") -> TestCA:
    """A new self-signed CA (EC P-256, valid 10 days) in ``directory`` (created)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = _name(cn)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=10))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path = directory / "ca.cert"
    key_path = directory / "ca.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(_pem_key(key))
    key_path.chmod(0o600)
    return TestCA(directory, cert_path, key_path)


@dataclass(frozen=True)
class TlsFiles:
    """What ``tls_ca`` gives: the CA, a server certificate (localhost, 127.0.0.1, ::1) and a
    client certificate (CN=worker-1,OU=ops)."""

    ca: TestCA
    server: Issued
    client: Issued


@pytest.fixture(scope="session")
def tls_ca(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    ca = make_ca(tmp_path_factory.mktemp("tls-ca"))
    return TlsFiles(ca, ca.issue("server"), ca.issue("worker-1", client=True, ou="ops"))

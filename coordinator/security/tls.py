"""TLS for the SSL and SASL_SSL listeners: the server's ``ssl.SSLContext`` from
Kafka-named settings (PEM files, as Python's ssl module reads them), and the principal of a
client certificate as Kafka writes it.

Settings (coordinator.config): ``ssl.certfile`` (the server certificate chain, PEM; Kafka's
``ssl.keystore.location`` with ``ssl.keystore.type=PEM``), ``ssl.keyfile`` (its private key,
PEM; empty: in the certfile), ``ssl.key.password``, ``ssl.cafile`` (CAs trusted for client
certificates: Kafka's truststore), ``ssl.client.auth`` (none | requested | required) and
``ssl.enabled.protocols`` (TLSv1.2,TLSv1.3). Every SSL and SASL_SSL listener uses them.

The principal of a client that presented a certificate on an SSL listener is
``User:<subject>``, the subject written as Java's ``X500Principal.getName()`` (RFC 2253), which
is what Kafka's default ``ssl.principal.mapping.rules`` gives: the relative distinguished names
from the last to the first (``CN=worker-1,OU=ops,O=Example`` for a subject whose DER order is
O, OU, CN), the keywords CN, C, L, ST, O, OU, STREET, DC and UID, other attributes as their
dotted OID with the value hex-encoded, special characters escaped with a backslash.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from coordinator.group.config import ConfigError

CLIENT_AUTH = ("none", "requested", "required")
_VERSIONS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}

# OpenSSL's long names (what SSLObject.getpeercert() gives) -> RFC 2253 keywords (Java's).
_KEYWORDS = {
    "commonName": "CN", "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST",
    "organizationName": "O", "organizationalUnitName": "OU", "streetAddress": "STREET",
    "domainComponent": "DC", "userId": "UID",
}
# Attributes whose value Java hex-encodes with their ASN.1 string type: IA5String for these,
# PrintableString for those, UTF8String otherwise (getpeercert() loses the type).
_IA5 = {"emailAddress", "domainComponent"}
_PRINTABLE = {"serialNumber", "countryName", "dnQualifier"}
_ESCAPED = ',=+<>#;"\\'


def check_protocols(text: str) -> str | None:
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [n for n in names if n not in _VERSIONS]
    if not names or bad:
        return f"must be a comma-separated subset of {', '.join(_VERSIONS)}"
    return None


def server_context(values: Mapping[str, Any]) -> ssl.SSLContext:
    """The server context of the TLS listeners; ConfigError naming the setting when a file is
    missing or unusable."""
    certfile = values["ssl.certfile"]
    keyfile = values["ssl.keyfile"] or None
    cafile = values["ssl.cafile"]
    client_auth = values["ssl.client.auth"]
    if not certfile:
        raise ConfigError("an SSL or SASL_SSL listener needs ssl.certfile (the server's "
                          "certificate chain, PEM) and ssl.keyfile (its key, PEM)")
    for setting, path in (("ssl.certfile", certfile), ("ssl.keyfile", keyfile),
                          ("ssl.cafile", cafile)):
        if path and not Path(path).is_file():
            raise ConfigError(f"{setting}={path!r}: no such file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = sorted(_VERSIONS[p.strip()] for p in values["ssl.enabled.protocols"].split(",")
                      if p.strip())
    ctx.minimum_version, ctx.maximum_version = versions[0], versions[-1]
    password = values["ssl.key.password"] or None
    try:
        ctx.load_cert_chain(certfile, keyfile, password=password)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(f"ssl.certfile={certfile!r} / ssl.keyfile={keyfile or ''!r}: cannot load "
                          f"the certificate and its key ({exc}); ssl.key.password if the key is "
                          "encrypted") from None
    if cafile:
        try:
            ctx.load_verify_locations(cafile)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise ConfigError(f"ssl.cafile={cafile!r}: cannot load the CA certificates ({exc})"
                              ) from None
    if client_auth != "none" and not cafile:
        raise ConfigError(f"ssl.client.auth={client_auth} needs ssl.cafile (the CAs that sign "
                          "the client certificates)")
    ctx.verify_mode = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
                       "required": ssl.CERT_REQUIRED}[client_auth]
    return ctx


def _oid(long_name: str) -> str:
    try:
        return ssl._txt2obj(long_name, name=True)[3]  # type: ignore[attr-defined]
    except (AttributeError, ValueError, TypeError):
        return long_name


def _der_hex(long_name: str, value: str) -> str:
    tag = 0x16 if long_name in _IA5 else 0x13 if long_name in _PRINTABLE else 0x0C
    raw = value.encode()
    n = len(raw)
    length = bytes([n]) if n < 0x80 else (bytes([0x81, n]) if n < 0x100
                                           else bytes([0x82, n >> 8, n & 0xFF]))
    return "#" + (bytes([tag]) + length + raw).hex()


def _escape(value: str) -> str:
    out = []
    for i, ch in enumerate(value):
        if ch in _ESCAPED or (ch == " " and (i == 0 or i == len(value) - 1)):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append("\\" + format(ord(ch), "02x"))
        else:
            out.append(ch)
    return "".join(out)


def rfc2253(subject: Iterable[Iterable[tuple[str, str]]]) -> str:
    """``getpeercert()['subject']`` (RDNs in DER order) as Java's RFC 2253 string."""
    rdns = []
    for rdn in reversed(list(subject)):
        avas = []
        for name, value in rdn:
            keyword = _KEYWORDS.get(name)
            if keyword is not None:
                avas.append(f"{keyword}={_escape(value)}")
            else:
                avas.append(f"{_oid(name)}={_der_hex(name, value)}")
        rdns.append("+".join(avas))
    return ",".join(rdns)


def peer_principal(ssl_object: Any) -> str | None:
    """``User:<subject DN>`` of the verified client certificate, None without one."""
    if ssl_object is None:
        return None
    try:
        cert = ssl_object.getpeercert()
    except (ValueError, ssl.SSLError):
        return None
    if not cert or not cert.get("subject"):
        return None
    return "User:" + rfc2253(cert["subject"])

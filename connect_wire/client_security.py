"""Kafka's client security, as our clients speak it: the worker (``connect-worker``,
:mod:`worker_client.client`) and the admin CLI (:mod:`coordinator.admin`) both use this module.

Settings (Kafka's client names; docs/security.md, "Clients"):

================================  ==========================================================
``security.protocol``             PLAINTEXT (default) | SSL | SASL_PLAINTEXT | SASL_SSL
``sasl.mechanism``                PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512 (required with SASL)
``sasl.username``                 the SASL user (required with SASL)
password                          ``--sasl-password-file FILE`` (flag), else the environment
                                  variable ``CONNECT_SASL_PASSWORD``, else the configuration
                                  file's ``sasl.password.file``, ``sasl.password`` or the
                                  ``password="..."`` of a Kafka ``sasl.jaas.config``. Never a
                                  command-line value.
``ssl.cafile``                    PEM CA bundle the server's certificate is checked against
                                  (default: the system's CAs)
``ssl.certfile``, ``ssl.keyfile`` PEM client certificate and key (mutual TLS); a key's
                                  password: ``ssl.key.password`` in the file or
                                  ``CONNECT_SSL_KEY_PASSWORD``
``ssl.check.hostname``            true (default) | false: the certificate must name the host
                                  connected to (Kafka: ``ssl.endpoint.identification.algorithm``
                                  ``https`` | empty, also accepted)
================================  ==========================================================

They come from a configuration file (``--command-config FILE`` for the admin commands, as
Kafka's tools; ``--client-config FILE`` for the worker): a Kafka-style ``.properties`` file, or
TOML when the name ends in ``.toml`` (the same dotted names as keys), then the environment (the
passwords only), then flags (``--security-protocol``, ``--sasl-mechanism``, ``--sasl-username``,
``--sasl-password-file``, ``--ssl-cafile``, ``--ssl-certfile``, ``--ssl-keyfile``,
``--ssl-check-hostname``), each overriding the one before. Other keys of the file (e.g.
``bootstrap.servers``) are ignored, so a file shared with Kafka's own tools works. A setting
that cannot apply (``sasl.*`` without a SASL protocol, ``ssl.*`` without TLS, a JKS keystore,
GSSAPI) is a configuration error (:class:`SecurityConfigError`), never silently ignored.

The connection sequence (Kafka's ``SaslClientAuthenticator``), driven by :func:`open_exchange`,
a generator both the asyncio and the blocking client run: TCP, TLS for SSL/SASL_SSL (the
certificate checked), ApiVersions v3 (not on PLAINTEXT), then for SASL SaslHandshake v1 and
SaslAuthenticate at the highest version both sides have (v2, else v1 or v0): PLAIN's one
message, or SCRAM's client-first / client-final with scramp's ``ScramClient`` (the server's
final message is checked: a server that does not know the password is refused too). A
SaslAuthenticate v1+ answer's SessionLifetimeMs (KIP-368) makes the client authenticate again
on the same connection (SaslHandshake + SaslAuthenticate, no ApiVersions) after 85-95 % of it,
as Kafka's Java client does; see :func:`reauth_delay_s`.

Errors: :class:`AuthenticationFailed` (SASL_AUTHENTICATION_FAILED, UNSUPPORTED_SASL_MECHANISM,
ILLEGAL_SASL_STATE, a server without SASL, a certificate that does not verify, a TLS handshake
the server refuses) and :class:`AuthorizationFailed` (GROUP_AUTHORIZATION_FAILED, raised by the
callers) are :class:`SecurityError`: retrying cannot fix them, the clients stop. A broken
connection or a timeout during the exchange is the caller's ordinary transient failure.
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import re
import ssl
import tomllib
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from connect_wire.apis import APIS
from connect_wire.errors import ErrorCode, error_name
from connect_wire.framing import request_header_version, response_header_version

__all__ = [
    "KEY_PASSWORD_ENV",
    "MECHANISMS",
    "PASSWORD_ENV",
    "PROTOCOLS",
    "SECURITY_CODES",
    "AuthenticationFailed",
    "AuthorizationFailed",
    "ClientSecurity",
    "SecurityConfigError",
    "SecurityError",
    "Session",
    "add_arguments",
    "from_args",
    "load_config_file",
    "open_exchange",
    "reauth_delay_s",
    "reauth_exchange",
    "resolve",
    "tls_failure",
    "wire_types",
]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
PASSWORD_ENV = "CONNECT_SASL_PASSWORD"
"""The environment variable a SASL password may come from."""
KEY_PASSWORD_ENV = "CONNECT_SSL_KEY_PASSWORD"
"""The environment variable the password of an encrypted client key may come from."""

# Kafka's codes (kio's table has them; ours may not yet).
SASL_AUTHENTICATION_FAILED = 58
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
GROUP_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED = 30, 31
SECURITY_CODES = frozenset({GROUP_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED,
                            UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE,
                            SASL_AUTHENTICATION_FAILED})
"""Error codes that refuse a client's credentials or permissions: fatal, never retried."""
API_VERSIONS_KEY, SASL_HANDSHAKE_KEY, SASL_AUTHENTICATE_KEY = 18, 17, 36

SOFTWARE_NAME = "connect-coordinator"
SOFTWARE_VERSION = "0.1.0"


# ------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------


class SecurityConfigError(ValueError):
    """The security settings are wrong or incomplete (a usage error: exit 2)."""


class SecurityError(Exception):
    """The server refused this client's credentials or permissions: retrying cannot fix it.
    ``code`` is the Kafka error code when the server gave one (None for TLS failures)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(" ".join(message.split()))  # one line, whatever the server wrote
        self.code = code


class AuthenticationFailed(SecurityError):
    """TLS or SASL authentication failed."""


class AuthorizationFailed(SecurityError):
    """Authenticated, but not allowed (GROUP_AUTHORIZATION_FAILED and the like)."""


def code_name(code: int) -> str:
    """Kafka's name of an error code, also for codes our table does not carry."""
    if ErrorCode.from_int(code) is not None:
        return error_name(code)
    try:
        from kio.schema.errors import ErrorCode as KioErrorCode

        return KioErrorCode(code).name.upper()
    except (ImportError, ValueError):
        return error_name(code)


# ------------------------------------------------------------------------------------------
# Settings
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientSecurity:
    """A client's resolved security settings (see the module's table)."""

    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    cafile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    key_password: str | None = field(default=None, repr=False)
    check_hostname: bool = True

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def describe(self) -> str:
        """``SASL_SSL SCRAM-SHA-512 as alice`` (for logs; never the password)."""
        if self.uses_sasl:
            return f"{self.protocol} {self.mechanism} as {self.username}"
        if self.certfile:
            return f"{self.protocol} with client certificate {self.certfile}"
        return self.protocol

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client's TLS context (None on PLAINTEXT / SASL_PLAINTEXT): the server's
        certificate is always verified (against ``cafile`` or the system's CAs), its host name
        checked unless ``check_hostname`` is false, TLS 1.2 or later."""
        if not self.uses_tls:
            return None
        try:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.cafile)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.check_hostname = self.check_hostname
            ctx.verify_mode = ssl.CERT_REQUIRED
            if self.certfile:
                ctx.load_cert_chain(self.certfile, self.keyfile, password=self.key_password)
        except (OSError, ssl.SSLError, ValueError) as exc:
            what = (f"ssl.cafile {self.cafile}" if self.cafile and not _loadable(self.cafile)
                    else f"ssl.certfile/ssl.keyfile {self.certfile} / {self.keyfile or self.certfile}"
                    if self.certfile else f"ssl.cafile {self.cafile}")
            raise SecurityConfigError(f"cannot load {what}: {exc}") from None
        return ctx


def _loadable(path: str) -> bool:
    try:
        ssl.create_default_context(cafile=path)
        return True
    except (OSError, ssl.SSLError, ValueError):
        return False


_ALIASES = {
    # librdkafka's names for the same settings
    "sasl.mechanisms": "sasl.mechanism",
    "ssl.ca.location": "ssl.cafile",
    "ssl.certificate.location": "ssl.certfile",
    "ssl.key.location": "ssl.keyfile",
}
_KNOWN = {
    "security.protocol", "sasl.mechanism", "sasl.username", "sasl.password", "sasl.password.file",
    "sasl.jaas.config", "ssl.cafile", "ssl.certfile", "ssl.keyfile", "ssl.key.password",
    "ssl.check.hostname", "ssl.endpoint.identification.algorithm", "ssl.truststore.location",
    "ssl.truststore.type", "ssl.keystore.location", "ssl.keystore.type",
}


def parse_properties(text: str) -> dict[str, str]:
    """A Java ``.properties`` file: ``key=value``, ``key: value`` or ``key value``; ``#`` and
    ``!`` comments; a line ending in an odd number of backslashes continues on the next;
    ``\\t``, ``\\n``, ``\\uXXXX`` and other backslash escapes."""
    out: dict[str, str] = {}
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.lstrip() if pending or not raw.strip().startswith(("#", "!")) else ""
        if not pending and not line:
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            pending += line[:-1]
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending)
    for line in logical:
        key, i = [], 0
        while i < len(line):
            ch = line[i]
            if ch == "\\" and i + 1 < len(line):
                key.append(line[i:i + 2])
                i += 2
                continue
            if ch in "=:" or ch.isspace():
                break
            key.append(ch)
            i += 1
        rest = line[i:].lstrip()
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip()
        out[_unescape("".join(key))] = _unescape(rest)
    return out


def _unescape(text: str) -> str:
    def sub(m: re.Match[str]) -> str:
        s = m.group(1)
        if s[0] == "u":
            return chr(int(s[1:], 16))
        return {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}.get(s, s)

    return re.sub(r"\\(u[0-9a-fA-F]{4}|.)", sub, text)


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "."))
        elif isinstance(value, bool):
            out[name] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            out[name] = str(value)
        else:
            raise SecurityConfigError(f"{name}: expected a string, not {type(value).__name__}")
    return out


def load_config_file(path: str | Path) -> dict[str, str]:
    """The settings of a ``.properties`` file, or of a TOML file (name ending in ``.toml``:
    nested tables give dotted names, ``security.protocol = "SASL_SSL"``)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SecurityConfigError(f"cannot read the client configuration {path}: "
                                  f"{exc.strerror or exc}") from None
    if p.suffix.lower() == ".toml":
        try:
            return _flatten(tomllib.loads(text))
        except tomllib.TOMLDecodeError as exc:
            raise SecurityConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_properties(text)


def _read_secret(path: str, what: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SecurityConfigError(f"cannot read {what} {path}: "
                                  f"{getattr(exc, 'strerror', None) or exc}") from None
    secret = text.rstrip("\r\n")  # the file's line end is not part of the password
    if not secret:
        raise SecurityConfigError(f"{what} {path} is empty")
    return secret


_JAAS_FIELD = re.compile(r'\b(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')


def _bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "yes", "1"):
        return True
    if v in ("false", "no", "0"):
        return False
    raise SecurityConfigError(f"{name}: expected true or false, not {value!r}")


def resolve(file_settings: Mapping[str, str] | None = None,
            flags: Mapping[str, Any] | None = None,
            environ: Mapping[str, str] | None = None,
            source: str = "the client configuration") -> ClientSecurity:
    """The settings from a configuration file's entries, then the environment (passwords),
    then flags (keys: the setting names, ``sasl.password.file`` for the password; None =
    not given), validated. Raises :class:`SecurityConfigError` naming what is wrong."""
    environ = os.environ if environ is None else environ
    given: dict[str, str] = {}
    for key, value in (file_settings or {}).items():
        given[_ALIASES.get(key, key)] = value
    settings = {k: v for k, v in given.items() if k in _KNOWN}

    # Kafka's PEM trust/key stores.
    for store, target in (("ssl.truststore", "ssl.cafile"), ("ssl.keystore", "ssl.certfile")):
        location = settings.pop(f"{store}.location", None)
        kind = settings.pop(f"{store}.type", None)
        if location is None:
            continue
        if (kind or "JKS").upper() != "PEM":
            raise SecurityConfigError(
                f"{source}: {store}.type {kind or 'JKS (the default)'} is not supported: give PEM "
                f"files ({target}{', ssl.keyfile' if store == 'ssl.keystore' else ''}) or "
                f"{store}.type=PEM")
        settings.setdefault(target, location)
        if store == "ssl.keystore":
            settings.setdefault("ssl.keyfile", location)  # a PEM keystore holds both
    algorithm = settings.pop("ssl.endpoint.identification.algorithm", None)
    if algorithm is not None and "ssl.check.hostname" not in settings:
        if algorithm.strip().lower() not in ("", "https"):
            raise SecurityConfigError(f"{source}: ssl.endpoint.identification.algorithm must be "
                                      f"https or empty, not {algorithm!r}")
        settings["ssl.check.hostname"] = "true" if algorithm.strip() else "false"
    jaas = settings.pop("sasl.jaas.config", None)
    if jaas is not None:
        found = {k: _unescape(v) for k, v in _JAAS_FIELD.findall(jaas)}
        if "username" in found:
            settings.setdefault("sasl.username", found["username"])
        if "password" in found:
            settings.setdefault("sasl.password", found["password"])

    password: str | None = None
    password_from = ""
    if settings.get("sasl.password.file"):
        password = _read_secret(settings["sasl.password.file"], "sasl.password.file")
        password_from = "sasl.password.file"
    elif settings.get("sasl.password"):
        password, password_from = settings["sasl.password"], "sasl.password"
    if environ.get(PASSWORD_ENV):  # (not an error with a protocol without SASL: it may be
        password = environ[PASSWORD_ENV]  # set for other commands of the same environment)
    key_password = settings.get("ssl.key.password") or None
    if environ.get(KEY_PASSWORD_ENV):
        key_password = environ[KEY_PASSWORD_ENV]

    for key, value in (flags or {}).items():
        if value is None:
            continue
        if key == "sasl.password.file":
            password = _read_secret(value, "--sasl-password-file")
            password_from = "--sasl-password-file"
        elif key == "ssl.check.hostname" and isinstance(value, bool):
            settings[key] = "true" if value else "false"
        else:
            settings[key] = str(value)

    protocol = settings.get("security.protocol", "PLAINTEXT").strip().upper()
    if protocol not in PROTOCOLS:
        raise SecurityConfigError(f"security.protocol must be one of {', '.join(PROTOCOLS)}, "
                                  f"not {protocol!r}")
    sasl = protocol.startswith("SASL_")
    tls = protocol.endswith("SSL")
    sasl_given = [k for k in ("sasl.mechanism", "sasl.username") if settings.get(k)]
    if password_from:
        sasl_given.append(password_from)
    if not sasl and sasl_given:
        raise SecurityConfigError(f"{', '.join(sasl_given)} given but security.protocol is "
                                  f"{protocol} (SASL needs SASL_PLAINTEXT or SASL_SSL)")
    ssl_given = [k for k in ("ssl.cafile", "ssl.certfile", "ssl.keyfile", "ssl.check.hostname")
                 if settings.get(k)]
    if not tls and ssl_given:
        raise SecurityConfigError(f"{', '.join(ssl_given)} given but security.protocol is "
                                  f"{protocol} (TLS needs SSL or SASL_SSL)")
    mechanism = username = None
    if sasl:
        mechanism = (settings.get("sasl.mechanism") or "").strip().upper() or None
        if mechanism is None:
            raise SecurityConfigError(f"security.protocol {protocol} needs sasl.mechanism "
                                      f"({', '.join(MECHANISMS)})")
        if mechanism not in MECHANISMS:
            raise SecurityConfigError(f"sasl.mechanism {mechanism} is not supported "
                                      f"(supported: {', '.join(MECHANISMS)})")
        username = settings.get("sasl.username") or None
        if username is None:
            raise SecurityConfigError(f"security.protocol {protocol} needs sasl.username")
        if password is None:
            raise SecurityConfigError(
                f"security.protocol {protocol} needs a password: --sasl-password-file FILE, "
                f"the environment variable {PASSWORD_ENV}, or sasl.password.file in the "
                "client configuration file")
    certfile = settings.get("ssl.certfile") or None
    keyfile = settings.get("ssl.keyfile") or None
    if keyfile and not certfile:
        raise SecurityConfigError("ssl.keyfile given without ssl.certfile")
    check = _bool("ssl.check.hostname", settings["ssl.check.hostname"]) \
        if settings.get("ssl.check.hostname") else True
    return ClientSecurity(protocol=protocol, mechanism=mechanism, username=username,
                          password=password if sasl else None,
                          cafile=settings.get("ssl.cafile") or None, certfile=certfile,
                          keyfile=keyfile, key_password=key_password if tls else None,
                          check_hostname=check)


# ------------------------------------------------------------------------------------------
# Command-line flags (the worker and the admin commands)
# ------------------------------------------------------------------------------------------

_FLAG_SETTINGS = {
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_username": "sasl.username",
    "sasl_password_file": "sasl.password.file",
    "ssl_cafile": "ssl.cafile",
    "ssl_certfile": "ssl.certfile",
    "ssl_keyfile": "ssl.keyfile",
    "ssl_check_hostname": "ssl.check.hostname",
}


def _flag_bool(text: str) -> bool:
    try:
        return _bool("--ssl-check-hostname", text)
    except SecurityConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser, config_flag: str) -> None:
    """Add the security flags and ``config_flag`` (``--command-config`` / ``--client-config``:
    a properties or TOML file of Kafka client settings) as a group of ``parser``."""
    g = parser.add_argument_group(
        "security (Kafka client settings; docs/security.md)",
        f"Settings come from {config_flag} FILE (Kafka .properties, or TOML when it ends in "
        f".toml: security.protocol, sasl.mechanism, sasl.username, sasl.password.file, "
        f"ssl.cafile, ssl.certfile, ssl.keyfile, ssl.check.hostname), then the environment "
        f"({PASSWORD_ENV}: the SASL password; {KEY_PASSWORD_ENV}: a client key's password), "
        "then these flags. A password is never given on the command line.")
    g.add_argument(config_flag, dest="security_config", metavar="FILE",
                   help="Kafka client settings file (.properties, or .toml)")
    g.add_argument("--security-protocol", type=str.upper, choices=PROTOCOLS,
                   metavar="{" + ",".join(PROTOCOLS) + "}",
                   help="security.protocol (default PLAINTEXT)")
    g.add_argument("--sasl-mechanism", type=str.upper, choices=MECHANISMS,
                   metavar="{" + ",".join(MECHANISMS) + "}", help="sasl.mechanism")
    g.add_argument("--sasl-username", metavar="NAME", help="sasl.username")
    g.add_argument("--sasl-password-file", metavar="FILE",
                   help=f"file holding the SASL password (its final line end is dropped); "
                   f"else ${PASSWORD_ENV}, else the settings file")
    g.add_argument("--ssl-cafile", metavar="FILE",
                   help="PEM CA certificates to verify the server with (default: the system's)")
    g.add_argument("--ssl-certfile", metavar="FILE", help="PEM client certificate (mutual TLS)")
    g.add_argument("--ssl-keyfile", metavar="FILE",
                   help="PEM key of the client certificate (default: in --ssl-certfile)")
    g.add_argument("--ssl-check-hostname", type=_flag_bool, metavar="{true,false}",
                   help="the server's certificate must name the host connected to (default true)")


def from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ClientSecurity:
    """The settings given by :func:`add_arguments`' flags and file (SecurityConfigError)."""
    path = getattr(args, "security_config", None)
    file_settings = load_config_file(path) if path else None
    flags = {setting: getattr(args, dest, None) for dest, setting in _FLAG_SETTINGS.items()}
    return resolve(file_settings, flags, environ, source=path or "the client configuration")


# ------------------------------------------------------------------------------------------
# TLS failures
# ------------------------------------------------------------------------------------------

_FATAL_TLS = re.compile(r"ALERT|CERTIFICATE|WRONG_VERSION_NUMBER|UNKNOWN_PROTOCOL|"
                        r"HANDSHAKE_FAILURE|NO_SHARED_CIPHER|UNSUPPORTED_PROTOCOL", re.I)


HANDSHAKE_CUT = (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError, ssl.SSLZeroReturnError)
"""How a TLS handshake ends when the listener does not speak TLS: it reads the ClientHello as a
request frame it cannot take and closes the connection."""


def protocol_mismatch(security: ClientSecurity | None, settings: str) -> str:
    """The likely cause of a listener closing a connection before its first answer, or in the
    middle of the TLS handshake: its security protocol is not this client's (a PLAINTEXT
    client at a TLS or SASL listener, a TLS client at a PLAINTEXT one, a TLS client without
    SASL at a SASL_SSL one: the server drops what it cannot take on that listener without a
    word). ``settings``: where this client's protocol is set."""
    mine = security.protocol if security is not None else "PLAINTEXT"
    return (f"the listener's security protocol probably does not match this client's ({mine}; "
            f"set {settings})")


def tls_failure(exc: BaseException, address: str, security: ClientSecurity | None) \
        -> AuthenticationFailed | None:
    """The :class:`AuthenticationFailed` for a TLS error that retrying cannot fix (the server's
    certificate does not verify, the server refused ours, the server does not speak TLS), or
    None for one that looks transient (a connection closed mid-handshake)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = exc.verify_message or exc.reason or str(exc)
        hint = ("check ssl.cafile" if "hostname" not in str(why).lower() and "IP address"
                not in str(why) else "the certificate does not name this host: connect with a "
                "name it has, or set ssl.check.hostname=false")
        return AuthenticationFailed(f"TLS: {address}: the server's certificate did not verify: "
                                    f"{why} ({hint})")
    if isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError | ssl.SSLWantReadError):
        return None
    if isinstance(exc, ssl.SSLError):
        reason = str(exc.reason or exc)
        if _FATAL_TLS.search(reason) or _FATAL_TLS.search(str(exc)):
            if "WRONG_VERSION_NUMBER" in reason.upper() or "UNKNOWN_PROTOCOL" in reason.upper():
                hint = "the server does not speak TLS there: check security.protocol"
            elif "CERTIFICATE" in reason.upper() or "ALERT" in reason.upper():
                hint = ("the server refused the TLS handshake: check ssl.certfile/ssl.keyfile "
                        "(a client certificate its CA signed)"
                        if security is None or not security.certfile or "CERTIFICATE_REQUIRED"
                        not in reason.upper() else "the server wants a client certificate")
            else:
                hint = "check the TLS settings"
            return AuthenticationFailed(f"TLS: {address}: {reason} ({hint})")
    return None


# ------------------------------------------------------------------------------------------
# The exchange (sans-IO: a generator that yields requests and is sent their answers)
# ------------------------------------------------------------------------------------------


@cache
def wire_types(request_cls: type) -> tuple[int, int, int, type, int]:
    """(api key, version, request header version, response class, response header version) of
    a request class: from the API table when it has that version, else from kio's module of
    the same name (SaslHandshake, SaslAuthenticate: the clients need them whether or not the
    server's table lists them)."""
    key = int(request_cls.__api_key__)  # type: ignore[attr-defined]
    version = int(request_cls.__version__)  # type: ignore[attr-defined]
    a = APIS.get(key)
    if a is not None and a.supports(version):
        return (key, version, a.request_header_version(version), a.response_class(version),
                a.response_header_version(version))
    module = request_cls.__module__
    if not (module.startswith("kio.schema.") and module.endswith(".request")):
        raise LookupError(f"no response class known for {request_cls.__name__}")
    response_module = importlib.import_module(module[: -len("request")] + "response")
    response_cls = getattr(response_module, request_cls.__name__[: -len("Request")] + "Response")
    return (key, version, request_header_version(request_cls.__flexible__),  # type: ignore[attr-defined]
            response_cls, response_header_version(key, response_cls.__flexible__))


def _kio_request(module: str, version: int) -> type:
    mod = importlib.import_module(f"kio.schema.{module}.v{version}.request")
    (cls,) = [obj for name, obj in vars(mod).items()
              if isinstance(obj, type) and name.endswith("Request") and obj.__module__ == mod.__name__]
    return cls


@dataclass
class Session:
    """What authentication gave: the versions to re-authenticate with, and the session's
    lifetime (ms; 0 = unlimited) counted from ``started`` (monotonic seconds, the send time of
    the last SaslAuthenticate)."""

    handshake_version: int = 1
    authenticate_version: int = 0
    lifetime_ms: int = 0
    started: float = 0.0

    def reauth_at(self, rng: random.Random | None = None) -> float | None:
        """Monotonic time to re-authenticate at, or None (no lifetime)."""
        if self.lifetime_ms <= 0:
            return None
        return self.started + reauth_delay_s(self.lifetime_ms, rng)


def reauth_delay_s(lifetime_ms: int, rng: random.Random | None = None) -> float:
    """When to re-authenticate, as Kafka's Java client: after 85 % of the session lifetime plus
    up to 10 % jitter (so that connections made together do not all re-authenticate at once),
    counted from the send time of the SaslAuthenticate that was answered with it."""
    r = (rng or random).random()
    return lifetime_ms * (0.85 + 0.10 * r) / 1000


class _RawName:
    """A SCRAM user name as Kafka's clients send it: escaped (``=`` -> ``=3D``, ``,`` ->
    ``=2C``), not SASLprepped."""

    def __init__(self, name: str) -> None:
        self.name = name

    def escape(self) -> str:
        return self.name.replace("=", "=3D").replace(",", "=2C")

    def __str__(self) -> str:
        return self.name


class _RawPassword:
    """A password as Kafka's clients and the coordinator salt it: its UTF-8 bytes, not
    SASLprepped (scramp would apply SASLprep, which changes e.g. compatibility characters)."""

    def __init__(self, password: str) -> None:
        self.password = password

    def __bytes__(self) -> bytes:
        return self.password.encode()


def _kafka_scram_client(mechanism: str, username: str, password: str) -> Any:
    """scramp's ``ScramClient`` with Kafka's treatment of the user name and password (no
    SASLprep). Relies on the client keeping them as ``username`` (``escape()``) and
    ``password`` (``bytes()``), as scramp 1.5 does; another layout falls back to scramp's own."""
    from scramp import ScramClient

    client = ScramClient([mechanism], "user", "password")
    if hasattr(getattr(client, "username", None), "escape") and \
            hasattr(getattr(client, "password", None), "__bytes__"):
        client.username = _RawName(username)
        client.password = _RawPassword(password)
        return client
    return ScramClient([mechanism], username, password)  # pragma: no cover - other scramp


class _Mechanism:
    """PLAIN or SCRAM as a client: ``first()`` then ``respond(server bytes)`` until None."""

    def __init__(self, mechanism: str, username: str, password: str) -> None:
        self.mechanism = mechanism
        self.username, self.password = username, password
        self._scram: Any = None
        self._step = 0

    def first(self) -> bytes:
        if self.mechanism == "PLAIN":
            return b"\0" + self.username.encode() + b"\0" + self.password.encode()
        self._scram = _kafka_scram_client(self.mechanism, self.username, self.password)
        return self._scram.get_client_first().encode()

    def respond(self, challenge: bytes, address: str) -> bytes | None:
        if self._scram is None:
            return None  # PLAIN: one message, the server's answer ends it
        from scramp import ScramException

        self._step += 1
        try:
            text = challenge.decode()
            if self._step == 1:
                self._scram.set_server_first(text)
                return self._scram.get_client_final().encode()
            if self._step == 2:
                self._scram.set_server_final(text)
                return None
        except (ScramException, UnicodeDecodeError) as exc:
            raise AuthenticationFailed(
                f"SASL {self.mechanism}: {address}: the server's SCRAM answer is wrong ({exc}): "
                "it does not hold this user's credential, or something in between changed it",
                SASL_AUTHENTICATION_FAILED) from None
        raise AuthenticationFailed(f"SASL {self.mechanism}: {address}: more SCRAM messages than "
                                   "the exchange has", ILLEGAL_SASL_STATE)


class ExchangeError(Exception):
    """An answer the exchange cannot use (not a refusal): the caller's transient failure."""


def _handshake_and_authenticate(security: ClientSecurity, session: Session, address: str,
                                clock: Any) -> Generator[Any, Any, Session]:
    handshake = _kio_request("sasl_handshake", session.handshake_version)
    resp = yield handshake(mechanism=security.mechanism)
    code = int(resp.error_code)
    if code == UNSUPPORTED_SASL_MECHANISM:
        enabled = ", ".join(resp.mechanisms) or "none"
        raise AuthenticationFailed(
            f"UNSUPPORTED_SASL_MECHANISM: {address} does not enable sasl.mechanism "
            f"{security.mechanism} (it enables: {enabled})", code)
    if code:
        raise AuthenticationFailed(f"{code_name(code)}: {address} refused SaslHandshake for "
                                   f"{security.mechanism}", code)
    assert security.mechanism and security.username and security.password is not None
    mech = _Mechanism(security.mechanism, security.username, security.password)
    token: bytes | None = mech.first()
    authenticate = _kio_request("sasl_authenticate", session.authenticate_version)
    lifetime = 0
    started = clock()
    while token is not None:
        started = clock()
        resp = yield authenticate(auth_bytes=token)
        code = int(resp.error_code)
        if code:
            message = resp.error_message or "no message"
            hint = (" (check sasl.username and the password)"
                    if code == SASL_AUTHENTICATION_FAILED else "")
            raise AuthenticationFailed(f"{code_name(code)}: {address}: {message}{hint}", code)
        life = getattr(resp, "session_lifetime", None)
        if life is not None:
            lifetime = int(life.total_seconds() * 1000) if hasattr(life, "total_seconds") else int(life)
        token = mech.respond(bytes(resp.auth_bytes or b""), address)
    return replace(session, lifetime_ms=max(0, lifetime), started=started)


def open_exchange(security: ClientSecurity, address: str,
                  clock: Any = None) -> Generator[Any, Any, Session | None]:
    """What a new connection sends before its first request, as a generator: it yields each
    request and is sent each answer; returns the :class:`Session` (None on PLAINTEXT, where
    nothing is sent). Raises :class:`AuthenticationFailed` for a refusal and
    :class:`ExchangeError` for an unusable answer."""
    import time

    clock = clock or time.monotonic
    if security.protocol == "PLAINTEXT":
        return None
    api_versions = _kio_request("api_versions", 3)
    resp = yield api_versions(client_software_name=SOFTWARE_NAME,
                              client_software_version=SOFTWARE_VERSION)
    if int(resp.error_code):
        raise ExchangeError(f"ApiVersions at {address}: {code_name(int(resp.error_code))}")
    if not security.uses_sasl:
        return Session()
    versions = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in resp.api_keys}
    hs = versions.get(SASL_HANDSHAKE_KEY)
    au = versions.get(SASL_AUTHENTICATE_KEY)
    if hs is None or hs[1] < 1 or au is None:
        missing = ("no SaslHandshake" if hs is None else "no SaslAuthenticate" if au is None
                   else "SaslHandshake v0 only")
        raise AuthenticationFailed(
            f"{address} does not offer SASL (ApiVersions lists {missing}): check "
            "security.protocol and that the listener is SASL_PLAINTEXT or SASL_SSL",
            UNSUPPORTED_SASL_MECHANISM)
    session = Session(handshake_version=1, authenticate_version=min(2, au[1]))
    return (yield from _handshake_and_authenticate(security, session, address, clock))


def reauth_exchange(security: ClientSecurity, session: Session, address: str,
                    clock: Any = None) -> Generator[Any, Any, Session]:
    """KIP-368 re-authentication on an authenticated connection: SaslHandshake and
    SaslAuthenticate again with the versions of the first time; returns the new session."""
    import time

    return (yield from _handshake_and_authenticate(security, session, address,
                                                   clock or time.monotonic))

"""The server side of the SASL mechanisms: PLAIN and SCRAM-SHA-256/512, sans-IO.

A mechanism server takes the client's tokens one at a time (:meth:`MechanismServer.step`) and
answers a challenge, until it is ``done`` (then ``user`` is the authenticated user) or raises
:class:`SaslFailure`. The transport (coordinator.server.connection) carries the tokens in
SaslAuthenticate requests; nothing here knows about the wire.

* **SCRAM-SHA-256 / SCRAM-SHA-512** (RFC 5802/7677, as Kafka's ScramSaslServer): scramp's server
  with the stored credential from ``Security.scram_credential(user, mechanism)`` (salt, stored
  key, server key, iterations; never the password). Two steps: client-first -> server-first,
  client-final -> server-final. An unknown user is given a made-up credential (derived from the
  name and a per-process secret), so it fails exactly like a wrong password, at the proof, and
  the answer does not tell which names exist (Kafka fails an unknown user at the first message).
* **PLAIN** (RFC 4616): ``authzid NUL authcid NUL password`` in one token. The password is
  checked against the user's stored SCRAM credential (SCRAM-SHA-256 if the user has one, else
  SCRAM-SHA-512): the salted password is derived with the stored salt and iterations (the
  password's UTF-8 bytes, no SASLprep, as Kafka) and its stored key compared in constant time,
  so no password is kept anywhere. That derivation is the
  costly part (PBKDF2, >= 4096 iterations): ``blocking`` tells the transport to run it off the
  event loop. An authorization id other than empty or the user name is refused (as Kafka).

Failures carry Kafka's messages; the transport answers SASL_AUTHENTICATION_FAILED with them.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable

from scramp import ScramException, ScramMechanism

from coordinator.security import SCRAM_MECHANISMS, ScramCredential
from coordinator.security.scram import DEFAULT_ITERATIONS, salted_password

PLAIN = "PLAIN"
MECHANISMS = (PLAIN, *SCRAM_MECHANISMS)
_HASH = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
_SECRET = os.urandom(32)  # the made-up credentials of unknown users (per process)
MAX_TOKEN = 64 * 1024  # a SCRAM or PLAIN token is a few hundred bytes

CredentialLookup = Callable[[str, str], ScramCredential | None]


class SaslFailure(Exception):
    """Authentication failed: ``message`` is what the client is told."""


def failed(mechanism: str) -> SaslFailure:
    return SaslFailure("Authentication failed during authentication due to invalid credentials "
                       f"with SASL mechanism {mechanism}")


class MechanismServer:
    mechanism = ""
    blocking = False  # step() is CPU-heavy: run it in a thread
    done = False
    user: str | None = None

    def step(self, token: bytes) -> bytes:
        raise NotImplementedError


def _fake(user: str, mechanism: str) -> ScramCredential:
    """The made-up credential of an unknown user: looks like one of ``users add`` (a 32-byte
    salt, DEFAULT_ITERATIONS), stable for a user within this process's lifetime (not across
    restarts). A real user with other iterations stays distinguishable by them
    (docs/security.md)."""
    def part(label: str) -> bytes:
        return hmac.new(_SECRET, f"{label}\0{mechanism}\0{user}".encode(), hashlib.sha512).digest()
    size = 32 if mechanism == "SCRAM-SHA-256" else 64
    return ScramCredential(mechanism, part("salt")[:32], part("stored")[:size],
                           part("server")[:size], DEFAULT_ITERATIONS)


class ScramServer(MechanismServer):
    def __init__(self, mechanism: str, lookup: CredentialLookup) -> None:
        self.mechanism = mechanism
        self._lookup = lookup
        self._known = False
        self._sent_user: str | None = None
        self._server = ScramMechanism(mechanism).make_server(self._auth)
        self._stage = 0

    def _auth(self, user: str) -> tuple[bytes, bytes, bytes, int]:
        # scramp hands over the name SASLprep'ed; Kafka looks the name up as sent (unescaped
        # only), and so do we: a name SASLprep would change is still found.
        user = self._sent_user if self._sent_user is not None else user
        credential = self._lookup(user, self.mechanism)
        self._known = credential is not None
        c = credential if credential is not None else _fake(user, self.mechanism)
        self.user = user
        return c.salt, c.stored_key, c.server_key, c.iterations

    def step(self, token: bytes) -> bytes:
        if len(token) > MAX_TOKEN:
            raise SaslFailure(f"Authentication failed: a {self.mechanism} message of {len(token)} "
                              "bytes")
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise SaslFailure(f"Authentication failed: the {self.mechanism} message is not "
                              "UTF-8") from None
        stage = self._stage
        try:
            if stage == 0:
                self._stage = 1
                self._sent_user = _sent_user(text)
                self._server.set_client_first(text)
                self._check_authzid(text)
                return self._server.get_server_first().encode()
            if stage == 1:
                self._stage = 2
                self._server.set_client_final(text)
                if not self._known:
                    raise failed(self.mechanism)
                final = self._server.get_server_final().encode()
                self.done = True
                return final
        except ScramException as exc:
            if stage == 0:
                raise SaslFailure(f"Authentication failed: invalid {self.mechanism} client-first "
                                  f"message ({exc})") from None
            raise failed(self.mechanism) from None
        raise SaslFailure(f"Authentication failed: unexpected {self.mechanism} message after "
                          "the exchange completed")

    def _check_authzid(self, client_first: str) -> None:
        # gs2-header = cbind-flag "," [ "a=" authzid ] ","
        parts = client_first.split(",", 2)
        authzid = parts[1][2:] if len(parts) > 2 and parts[1].startswith("a=") else ""
        authzid = authzid.replace("=2C", ",").replace("=3D", "=")
        if authzid and authzid != self.user:
            raise SaslFailure("Authentication failed: Client requested an authorization id that "
                              "is different from username")


def _sent_user(client_first: str) -> str | None:
    """The user name of a client-first message as sent, unescaped (=2C, =3D), or None."""
    parts = client_first.split(",", 3)
    if len(parts) < 3 or not parts[2].startswith("n="):
        return None
    return parts[2][2:].replace("=2C", ",").replace("=3D", "=")


class PlainServer(MechanismServer):
    mechanism = PLAIN
    blocking = True

    def __init__(self, lookup: CredentialLookup) -> None:
        self._lookup = lookup
        self._password: str | None = None
        self._credential: ScramCredential | None = None

    def step(self, token: bytes) -> bytes:
        self.prepare(token)
        return self.finish()

    def prepare(self, token: bytes) -> None:
        """Parse the token and look the credential up (cheap: on the event loop)."""
        if self.done or self._password is not None or len(token) > MAX_TOKEN:
            raise SaslFailure("Authentication failed: invalid PLAIN message")
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise SaslFailure("Invalid SASL/PLAIN response: expected 3 tokens, got "
                              f"{len(parts)}")
        try:
            authzid, user, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            raise SaslFailure("Authentication failed: the PLAIN message is not UTF-8") from None
        if not user:
            raise SaslFailure("Authentication failed: username not specified")
        if not password:
            raise SaslFailure("Authentication failed: password not specified")
        if authzid and authzid != user:
            raise SaslFailure("Authentication failed: Client requested an authorization id that "
                              "is different from username")
        self.user = user
        self._password = password
        for mechanism in SCRAM_MECHANISMS:
            self._credential = self._lookup(user, mechanism)
            if self._credential is not None:
                break

    def finish(self) -> bytes:
        """Check the password (PBKDF2: costly, may run in a thread)."""
        known = self._credential is not None
        c = self._credential if self._credential is not None else _fake(self.user or "",
                                                                        "SCRAM-SHA-256")
        if not verify_password(c, self._password or "") or not known:
            raise SaslFailure("Authentication failed: Invalid username or password")
        self.done = True
        return b""


def verify_password(credential: ScramCredential, password: str) -> bool:
    """Whether ``password`` is the one ``credential`` was made from (constant-time compare).
    The password's UTF-8 bytes without SASLprep, as Kafka (coordinator.security.scram)."""
    name = _HASH.get(credential.mechanism, "sha256")
    salted = salted_password(credential.mechanism, password, credential.salt,
                             credential.iterations)
    client_key = hmac.new(salted, b"Client Key", name).digest()
    stored_key = hashlib.new(name, client_key).digest()
    return hmac.compare_digest(stored_key, credential.stored_key)


def new_server(mechanism: str, lookup: CredentialLookup) -> MechanismServer:
    if mechanism == PLAIN:
        return PlainServer(lookup)
    if mechanism in SCRAM_MECHANISMS:
        return ScramServer(mechanism, lookup)
    raise ValueError(mechanism)

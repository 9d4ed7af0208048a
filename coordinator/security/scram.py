"""SCRAM credentials as Kafka makes and stores them (RFC 5802; Kafka's ScramFormatter).

A credential is (salt, StoredKey, ServerKey, iterations), never the password::

    SaltedPassword = PBKDF2-HMAC-H(password as UTF-8, salt, iterations)
    ClientKey      = HMAC-H(SaltedPassword, "Client Key")
    StoredKey      = H(ClientKey)
    ServerKey      = HMAC-H(SaltedPassword, "Server Key")

:func:`credential_from_password` is what an offline ``users add`` and a client-side salting do;
:func:`credential_from_salted_password` is what the broker does with an
AlterUserScramCredentials upsertion (the client sends the salt and SaltedPassword). The password
is taken as UTF-8 bytes without SASLprep, as Kafka's clients and broker do (scramp's
``make_auth_info`` SASLpreps it first: equal for ASCII passwords, which tests/test_security_state.py
checks, but not for every other one).
"""

from __future__ import annotations

import hashlib
import hmac
import os

from coordinator.security import SCRAM_MECHANISMS, ScramCredential

__all__ = [
    "DEFAULT_ITERATIONS",
    "MAX_ITERATIONS",
    "MECHANISM_CODES",
    "MIN_ITERATIONS",
    "credential_from_password",
    "credential_from_salted_password",
    "mechanism_code",
    "mechanism_name",
    "salted_password",
]

MIN_ITERATIONS = 4096
"""Kafka's ScramMechanism.minIterations (both mechanisms)."""
MAX_ITERATIONS = 16384
"""Kafka's ScramMechanism.maxIterations (both mechanisms)."""
DEFAULT_ITERATIONS = 4096
"""kafka-configs' and kafka-storage's default."""

MECHANISM_CODES = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
"""Kafka's ScramMechanism type codes (AlterUserScramCredentials, DescribeUserScramCredentials)."""
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
assert tuple(MECHANISM_CODES) == SCRAM_MECHANISMS


def mechanism_code(name: str) -> int:
    """``"SCRAM-SHA-256"`` -> 1; ValueError for another name."""
    try:
        return MECHANISM_CODES[name.strip().upper().replace("_", "-")]
    except KeyError:
        raise ValueError(f"unsupported SCRAM mechanism {name!r} (one of "
                         f"{', '.join(SCRAM_MECHANISMS)})") from None


def mechanism_name(code: int) -> str | None:
    """1 -> ``"SCRAM-SHA-256"``; None for an unknown code (Kafka's UNKNOWN mechanism)."""
    for name, c in MECHANISM_CODES.items():
        if c == code:
            return name
    return None


def salted_password(mechanism: str, password: str | bytes, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i) of RFC 5802: PBKDF2 with the mechanism's HMAC."""
    raw = password.encode("utf-8") if isinstance(password, str) else password
    return hashlib.pbkdf2_hmac(_HASHES[mechanism], raw, salt, iterations)


def credential_from_salted_password(mechanism: str, salt: bytes, salted: bytes,
                                    iterations: int) -> ScramCredential:
    """The stored credential for a SaltedPassword (what Kafka's broker computes from an
    AlterUserScramCredentials upsertion)."""
    h = _HASHES[mechanism]
    client_key = hmac.new(salted, b"Client Key", h).digest()
    stored_key = hashlib.new(h, client_key).digest()
    server_key = hmac.new(salted, b"Server Key", h).digest()
    return ScramCredential(mechanism, bytes(salt), stored_key, server_key, iterations)


def credential_from_password(mechanism: str, password: str | bytes,
                             iterations: int = DEFAULT_ITERATIONS,
                             salt: bytes | None = None) -> ScramCredential:
    """A new credential for ``password`` with a random 32-byte salt (or ``salt``)."""
    if mechanism not in _HASHES:
        raise ValueError(f"unsupported SCRAM mechanism {mechanism!r}")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be within [{MIN_ITERATIONS}, {MAX_ITERATIONS}], "
                         f"got {iterations}")
    salt = os.urandom(32) if salt is None else salt
    return credential_from_salted_password(
        mechanism, salt, salted_password(mechanism, password, salt, iterations), iterations)

"""Security of the coordinator the way a Kafka broker does it.

The shared vocabulary of the transport (listeners, TLS, SASL: coordinator/server/) and of the
security state (credentials and ACLs, their records, the authorizer: this package). The
transport asks only the :class:`Security` interface below; the state behind it is built in
:mod:`coordinator.security.state`.

* A **principal** is Kafka's ``"User:<name>"`` string: ``User:ANONYMOUS`` on a PLAINTEXT or SSL
  listener without a client certificate, ``User:<SASL user name>`` after SASL, and with mutual
  TLS ``User:<the certificate subject's distinguished name as Kafka prints it, e.g.
  CN=worker-1,OU=ops>``.
* **Operations** and **resource types** are Kafka's names (``kio.schema.types`` has their wire
  codes in AclOperation / ResourceType): operations READ, WRITE, CREATE, DELETE, ALTER,
  DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALL; resource
  types GROUP, CLUSTER (name ``kafka-cluster``), TOPIC, TRANSACTIONAL_ID, DELEGATION_TOKEN, USER.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from coordinator.group.model import ANONYMOUS

__all__ = ["ANONYMOUS", "CLUSTER_NAME", "SCRAM_MECHANISMS", "ScramCredential", "Security"]

CLUSTER_NAME = "kafka-cluster"
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class ScramCredential:
    """A salted SCRAM credential as Kafka stores it (never the password)."""

    mechanism: str  # "SCRAM-SHA-256" | "SCRAM-SHA-512"
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


class Security(Protocol):
    """What the transport and the request router ask of the security state."""

    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        """The user's credential for ``mechanism``, or None (unknown user or mechanism)."""
        ...

    def authorize(self, principal: str, host: str, operation: str, resource_type: str,
                  name: str) -> bool:
        """Kafka's authorizer decision for one action (super users, ACLs, implied DESCRIBE,
        DENY wins, allow.everyone.if.no.acl.found)."""
        ...

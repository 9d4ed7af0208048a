"""The API table: which API keys and versions exist, and the classes and headers of each.

Both sides use it: the coordinator to route and to answer ApiVersions, the worker client to
pick classes. The connect APIs (10000-10008) are our generated classes; the Kafka APIs the
coordinator answers (ApiVersions, Metadata, FindCoordinator, DescribeGroups, ListGroups,
JoinGroup, SyncGroup, Heartbeat, LeaveGroup, SaslHandshake, SaslAuthenticate, DescribeConfigs,
IncrementalAlterConfigs, the ACL and SCRAM APIs) are kio's own classes, not regenerated. Header
versions follow Kafka: a flexible request version uses request header v2 (else v1); a flexible
response version uses response header v1 (else v0), except ApiVersions, whose responses always
use response header v0.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache

from kio.static.constants import EntityType

from connect_wire import messages

__all__ = ["API", "APIS", "ApiKey", "api", "request_class", "response_class"]


class ApiKey:
    """API keys, as on the wire."""

    METADATA = 3
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    SASL_AUTHENTICATE = 36
    DESCRIBE_CONFIGS = 32
    INCREMENTAL_ALTER_CONFIGS = 44
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    CONNECT_GROUP_HEARTBEAT = 10000
    CONNECT_GROUP_PREPARE_ASSIGNMENT = 10001
    CONNECT_GROUP_INSTALL_ASSIGNMENT = 10002
    CONNECT_GROUP_DESCRIBE = 10003
    CONNECT_GROUP_ALTER_CONNECTORS = 10004
    CONNECT_GROUP_WRITE_TASK_CONFIGS = 10005
    CONNECT_GROUP_COMMIT_OFFSETS = 10006
    CONNECT_GROUP_FETCH_OFFSETS = 10007
    CONNECT_GROUP_ALTER_OFFSETS = 10008


@dataclass(frozen=True)
class API:
    key: int
    name: str
    min_version: int
    max_version: int
    kio_module: str | None  # e.g. "api_versions"; None for our generated APIs

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def request_class(self, version: int) -> type:
        return request_class(self.key, version)

    def response_class(self, version: int) -> type:
        return response_class(self.key, version)

    def request_header_version(self, version: int) -> int:
        return 2 if self.request_class(version).__flexible__ else 1  # type: ignore[attr-defined]

    def response_header_version(self, version: int) -> int:
        if self.key == ApiKey.API_VERSIONS:
            return 0
        return 1 if self.response_class(version).__flexible__ else 0  # type: ignore[attr-defined]


APIS: dict[int, API] = {
    a.key: a
    for a in (
        API(ApiKey.METADATA, "Metadata", 0, 12, "metadata"),
        API(ApiKey.FIND_COORDINATOR, "FindCoordinator", 0, 6, "find_coordinator"),
        # The classic group APIs, for classic Kafka Connect workers (protocol type "connect",
        # coordinator/server/classic_apis.py): the versions Kafka 4.0 serves.
        API(ApiKey.JOIN_GROUP, "JoinGroup", 2, 9, "join_group"),
        API(ApiKey.HEARTBEAT, "Heartbeat", 0, 4, "heartbeat"),
        API(ApiKey.LEAVE_GROUP, "LeaveGroup", 0, 5, "leave_group"),
        API(ApiKey.SYNC_GROUP, "SyncGroup", 0, 5, "sync_group"),
        API(ApiKey.DESCRIBE_GROUPS, "DescribeGroups", 0, 5, "describe_groups"),
        API(ApiKey.LIST_GROUPS, "ListGroups", 0, 5, "list_groups"),
        # SaslHandshake v0 (raw SASL tokens after it, no SaslAuthenticate framing) is not
        # served, as Kafka 4.0 (KIP-896): a v0 request is answered UNSUPPORTED_VERSION in a
        # SaslHandshakeResponse v0 and the connection closed (coordinator.server.connection).
        API(ApiKey.SASL_HANDSHAKE, "SaslHandshake", 1, 1, "sasl_handshake"),
        API(ApiKey.API_VERSIONS, "ApiVersions", 0, 3, "api_versions"),
        API(ApiKey.SASL_AUTHENTICATE, "SaslAuthenticate", 0, 2, "sasl_authenticate"),
        # Credentials and ACLs (coordinator/security/apis.py): the versions kio 0.6.5 has.
        API(ApiKey.DESCRIBE_ACLS, "DescribeAcls", 1, 3, "describe_acls"),
        API(ApiKey.CREATE_ACLS, "CreateAcls", 1, 3, "create_acls"),
        API(ApiKey.DELETE_ACLS, "DeleteAcls", 1, 3, "delete_acls"),
        # Group configs (coordinator/server/group_configs.py): DescribeConfigs v1-4 as Kafka 4
        # (KIP-896 removed v0), IncrementalAlterConfigs v0-1.
        API(ApiKey.DESCRIBE_CONFIGS, "DescribeConfigs", 1, 4, "describe_configs"),
        API(ApiKey.INCREMENTAL_ALTER_CONFIGS, "IncrementalAlterConfigs", 0, 1,
            "incremental_alter_configs"),
        API(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, "DescribeUserScramCredentials", 0, 0,
            "describe_user_scram_credentials"),
        API(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, "AlterUserScramCredentials", 0, 0,
            "alter_user_scram_credentials"),
        API(ApiKey.CONNECT_GROUP_HEARTBEAT, "ConnectGroupHeartbeat", 0, 0, None),
        API(ApiKey.CONNECT_GROUP_PREPARE_ASSIGNMENT, "ConnectGroupPrepareAssignment", 0, 0, None),
        API(ApiKey.CONNECT_GROUP_INSTALL_ASSIGNMENT, "ConnectGroupInstallAssignment", 0, 0, None),
        API(ApiKey.CONNECT_GROUP_DESCRIBE, "ConnectGroupDescribe", 0, 0, None),
        API(ApiKey.CONNECT_GROUP_ALTER_CONNECTORS, "ConnectGroupAlterConnectors", 0, 0, None),
        API(ApiKey.CONNECT_GROUP_WRITE_TASK_CONFIGS, "ConnectGroupWriteTaskConfigs", 0, 0, None),
        API(ApiKey.CONNECT_GROUP_COMMIT_OFFSETS, "ConnectGroupCommitOffsets", 0, 0, None),
        API(ApiKey.CONNECT_GROUP_FETCH_OFFSETS, "ConnectGroupFetchOffsets", 0, 0, None),
        API(ApiKey.CONNECT_GROUP_ALTER_OFFSETS, "ConnectGroupAlterOffsets", 0, 0, None),
    )
}


def api(key: int) -> API | None:
    """The API with this key, or None when unknown."""
    return APIS.get(key)


def _kio_class(module: str, version: int, kind: str) -> type:
    mod = importlib.import_module(f"kio.schema.{module}.v{version}.{kind}")
    suffix = "Request" if kind == "request" else "Response"
    entity = EntityType.request if kind == "request" else EntityType.response
    # (by entity type, not name only: IncrementalAlterConfigs' module also has a nested
    # AlterConfigsResourceResponse)
    classes = [
        obj for name, obj in vars(mod).items()
        if isinstance(obj, type) and name.endswith(suffix) and obj.__module__ == mod.__name__
        and getattr(obj, "__type__", None) is entity
    ]
    if len(classes) != 1:
        raise LookupError(f"kio.schema.{module}.v{version}.{kind}: expected one {suffix} class")
    return classes[0]


@cache
def request_class(key: int, version: int) -> type:
    """The request class of API ``key`` at ``version``; LookupError when unsupported."""
    a = APIS.get(key)
    if a is None or not a.supports(version):
        raise LookupError(f"unsupported API {key} version {version}")
    if a.kio_module is None:
        return messages.REQUESTS[(key, version)]
    return _kio_class(a.kio_module, version, "request")


@cache
def response_class(key: int, version: int) -> type:
    """The response class of API ``key`` at ``version``; LookupError when unsupported."""
    a = APIS.get(key)
    if a is None or not a.supports(version):
        raise LookupError(f"unsupported API {key} version {version}")
    if a.kio_module is None:
        return messages.RESPONSES[(key, version)]
    return _kio_class(a.kio_module, version, "response")

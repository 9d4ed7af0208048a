"""The security state of a running daemon: built from the settings, loaded from its store, and
the admin APIs over it (what :class:`coordinator.server.app.CoordinatorServer` holds).

    service = SecurityService(config, metrics)
    server.security = service.state          # the Security the transport and the router ask
    await service.start_file(data_dir)       # store=file: before listening
    await service.start_etcd(cluster)        # store=etcd: once the node's etcd client is up
    await service.apis.handle(api_key, version, request, principal, host)
    await service.stop()                     # before the etcd client closes

Settings (``coordinator.config``): ``authorizer`` (``none``: every request is allowed, the admin
APIs included; ``acl``: Kafka's StandardAuthorizer), ``super.users``,
``allow.everyone.if.no.acl.found``, ``request.max.items``, ``log.fsync`` (file store),
``etcd.request.timeout.ms`` and ``etcd.max.txn.ops`` (etcd store).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from coordinator import logs
from coordinator.security.apis import API_KEYS, SecurityApis
from coordinator.security.model import Authorizer
from coordinator.security.state import SecurityState
from coordinator.security.store import EtcdSecurityStore, FileSecurityStore, SecurityStore

__all__ = ["API_KEYS", "SecurityService"]

log = logs.get("coordinator.security")


def _setting(config: Any, name: str, default: Any) -> Any:
    values = getattr(config, "values", config)
    return values.get(name, default) if hasattr(values, "get") else default


class SecurityService:
    def __init__(self, config: Any, metrics: Any = None) -> None:
        self.state = SecurityState(Authorizer(
            _setting(config, "super.users", ""),
            bool(_setting(config, "allow.everyone.if.no.acl.found", False))))
        self.enforce = _setting(config, "authorizer", "none") == "acl"
        self.config = config
        self.store: SecurityStore | None = None
        denied = getattr(metrics, "authorization_denied", None)
        self.apis = SecurityApis(
            self.state, enforce=self.enforce,
            max_items=int(_setting(config, "request.max.items", 10_000)),
            on_denied=(lambda _p, _h, api: denied.labels(api, "CLUSTER").inc())
            if denied is not None else None)

    async def start_file(self, data_dir: Path) -> None:
        """Load ``data_dir/security/`` (raises what opening the log raises: the daemon does not
        start on a security log it cannot read)."""
        fsync = getattr(self.config, "fsync", None)
        await self._start(FileSecurityStore(data_dir, self.state, fsync))

    async def start_etcd(self, cluster: Any) -> None:
        """Load and watch ``{etcd.prefix}/security/`` with the node's etcd client."""
        await self._start(EtcdSecurityStore(
            cluster.client, cluster.prefix, self.state, timeout_s=cluster.timeout_s,
            max_txn_ops=cluster.max_txn_ops, node_id=str(cluster.node_id)))

    async def _start(self, store: SecurityStore) -> None:
        self.store = store
        await store.load()
        self.apis.attach(store)

    async def stop(self) -> None:
        store, self.store = self.store, None
        if store is not None:
            try:
                await store.close()
            except Exception as exc:  # noqa: BLE001 (stopping anyway)
                log.error("closing the security store failed", error=repr(exc))

"""Where the security records live: a log in the data dir, or keys in etcd.

Both stores keep a :class:`~coordinator.security.state.SecurityState` current and are used the
same way::

    store = FileSecurityStore(data_dir, state, fsync)     # or EtcdSecurityStore(client, prefix, state)
    await store.load()                # the state now holds what the store holds
    await store.apply(records)        # durable when it returns, then applied to the state
    store.on_change.append(hook)      # hook(records) after every change of the state
    await store.close()

**File store** (``store = "file"``): one log, ``<data dir>/security/``, a
:class:`~coordinator.runtime.log.PartitionLog` like a partition's (same batches, CRCs,
recovery, compaction), holding only the security records. ``apply`` appends the records as
one batch and fsyncs it unless ``log.fsync`` is ``never`` (``interval:N`` fsyncs too: changes
are rare, and an acknowledged credential or ACL should survive a power loss); ``load`` replays
it (closed segments are compacted first). The daemon holds the data dir's lock, so the
offline ``users add --data-dir`` (:func:`append_offline`) refuses while it runs.

**etcd store** (``store = "etcd"``): one key per live record under ``{prefix}/security/``::

    {prefix}/security/r/<hex of the record's key bytes>   the record's value bytes
                                                          (coordinator.runtime.serde); a
                                                          tombstone deletes the key
    {prefix}/security/written                             rewritten by every change (a
                                                          unique value: see apply)

There is no partition owner: any node may write, in one transaction per request, without a
compare (last writer wins per key). Every node watches the prefix
(:class:`~coordinator.runtime.etcd_watch.PrefixWatcher`: read, then watch from the read's
revision, read again if the watch is cancelled) and rebuilds its state from the keys on every
change, so every node converges on what etcd holds. ``apply`` returns once this node's watch
has seen the transaction (the ``written`` key makes every transaction visible to it), so the
node that answered a change already decides with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from coordinator import logs
from coordinator.group.records import Record
from coordinator.runtime import serde
from coordinator.runtime.log import FsyncMode, FsyncPolicy, PartitionLog
from coordinator.security.state import SecurityState, is_security_record

log = logs.get("coordinator.security")

__all__ = [
    "EtcdSecurityStore",
    "FileSecurityStore",
    "SECURITY_DIR",
    "SecurityStore",
    "SecurityStoreError",
    "append_offline",
    "etcd_security_prefix",
    "read_offline",
    "write_etcd",
]

SECURITY_DIR = "security"
SEGMENT_BYTES = 4 * 1024 * 1024
TOMBSTONE_RETENTION_MS = 24 * 3600 * 1000

KAFKA_STORAGE_ERROR = 56
REQUEST_TIMED_OUT = 7
UNKNOWN_SERVER_ERROR = -1
INVALID_REQUEST = 42

ChangeHook = Callable[[Sequence[Record]], None]


class SecurityStoreError(Exception):
    """A change could not be made durable (``code``: the Kafka error to answer with)."""

    def __init__(self, message: str, code: int = UNKNOWN_SERVER_ERROR) -> None:
        super().__init__(message)
        self.code = code


class SecurityStore:
    """The interface both stores implement (see the module doc)."""

    def __init__(self, state: SecurityState) -> None:
        self.state = state
        self.on_change: list[ChangeHook] = []
        self.loaded = asyncio.Event()
        """Set once :meth:`load` has filled the state."""

    async def load(self) -> None:
        raise NotImplementedError

    async def apply(self, records: Sequence[Record]) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        pass

    def _changed(self, records: Sequence[Record]) -> None:
        for hook in list(self.on_change):
            try:
                hook(records)
            except Exception as exc:  # noqa: BLE001 (a hook must not undo a durable change)
                log.error("security change hook failed", error=repr(exc))


def _check(records: Sequence[Record]) -> list[tuple[bytes, bytes | None]]:
    if not records:
        raise ValueError("no records")
    out = []
    for record in records:
        if not is_security_record(record):
            raise ValueError(f"not a security record: {type(record.key).__name__}")
        out.append(serde.encode_record(record))
    return out


# -- the file store ---------------------------------------------------------------------------


def _sink(state: SecurityState, directory: Path) -> Callable[[list[tuple[bytes, bytes | None]]], None]:
    warned: set[tuple[int, int]] = set()

    def sink(batch: list[tuple[bytes, bytes | None]]) -> None:
        for key, value in batch:
            try:
                record = serde.decode_record(key, value)
            except serde.UnknownRecordType as exc:  # a newer version's record: skipped
                if (exc.record_type, exc.version) not in warned:
                    warned.add((exc.record_type, exc.version))
                    log.warning("skipping unknown record type", log=str(directory), error=str(exc))
                continue
            if not is_security_record(record):
                raise serde.CorruptRecord(f"{directory}: a {type(record.key).__name__} record "
                                          "in the security log")
            state.apply(record)
    return sink


def _open(directory: Path, state: SecurityState) -> PartitionLog:
    """Open (create) the security log, replaying it into ``state``."""
    plog, report = PartitionLog.open(directory, segment_bytes=SEGMENT_BYTES,
                                     sink=_sink(state, directory))
    if not report.clean:
        log.warning("security log recovered", report=report.summary())
    return plog


class FileSecurityStore(SecurityStore):
    """The security log in ``<data_dir>/security/`` (see the module doc)."""

    def __init__(self, data_dir: str | os.PathLike[str], state: SecurityState,
                 fsync: FsyncPolicy | None = None) -> None:
        super().__init__(state)
        self.directory = Path(data_dir) / SECURITY_DIR
        self.fsync = fsync if fsync is not None else FsyncPolicy()
        self.log: PartitionLog | None = None
        self._lock = asyncio.Lock()

    async def load(self) -> None:
        loaded = SecurityState()  # built in a worker thread, then copied on the loop

        def blocking() -> PartitionLog:
            plog = _open(self.directory, loaded)
            if len(plog.segments) > 1:
                plog.compact(int(time.time() * 1000), TOMBSTONE_RETENTION_MS)
            return plog

        self.log = await asyncio.to_thread(blocking)
        self.state.reset(loaded.records())
        self.loaded.set()
        log.info("security state loaded", directory=str(self.directory),
                 users=len(self.state.users), acls=len(self.state.acls))

    async def apply(self, records: Sequence[Record]) -> None:
        encoded = _check(records)
        async with self._lock:
            plog = self.log
            if plog is None:
                raise SecurityStoreError("the security log is not open", KAFKA_STORAGE_ERROR)
            sync = self.fsync.mode is not FsyncMode.NEVER

            def write() -> None:
                plog.append(encoded)
                if sync:
                    plog.sync()
            try:
                await asyncio.to_thread(write)
            except OSError as exc:
                raise SecurityStoreError(f"cannot write the security log {self.directory}: {exc}",
                                         KAFKA_STORAGE_ERROR) from None
            for record in records:
                self.state.apply(record)
        self._changed(records)

    async def close(self) -> None:
        async with self._lock:
            plog, self.log = self.log, None
            if plog is not None:
                def blocking() -> None:
                    with contextlib.suppress(OSError):
                        plog.sync()
                    plog.close()
                await asyncio.to_thread(blocking)


def read_offline(data_dir: str | os.PathLike[str], state: SecurityState | None = None
                 ) -> SecurityState:
    """The security state a data dir holds (reads the log; takes no lock)."""
    state = state if state is not None else SecurityState()
    directory = Path(data_dir) / SECURITY_DIR
    if directory.is_dir():
        _open(directory, state).close()
    return state


def append_offline(data_dir: str | os.PathLike[str], records: Sequence[Record]) -> SecurityState:
    """Append ``records`` to the data dir's security log with no daemon running (the offline
    ``users add``, like ``kafka-storage format --add-scram``): takes the data dir's lock
    (:class:`coordinator.runtime.datadir.DataDirLocked` while a daemon holds it), replays the
    log, appends and fsyncs. Returns the state after the change."""
    from coordinator.runtime import datadir

    encoded = _check(records)
    path = Path(data_dir)
    path.mkdir(parents=True, exist_ok=True)
    lock = datadir.lock_data_dir(path)
    try:
        state = SecurityState()
        plog = _open(path / SECURITY_DIR, state)
        try:
            plog.append(encoded)
            plog.sync()
        finally:
            plog.close()
        state.replay(records)
        return state
    finally:
        lock.release()


# -- the etcd store ---------------------------------------------------------------------------


def etcd_security_prefix(prefix: str) -> bytes:
    return f"{prefix.rstrip('/')}/security/".encode()


_RECORDS = "r/"
_WRITTEN = "written"


def _ops(base: bytes, encoded: list[tuple[bytes, bytes | None]], marker: bytes) -> list[Any]:
    from etcd3aio.kv import KVService

    ops: dict[bytes, Any] = {}
    for key, value in encoded:  # the last write of a key wins, as in a log
        full = base + _RECORDS.encode() + key.hex().encode()
        ops[full] = (KVService.txn_op_delete(full) if value is None
                     else KVService.txn_op_put(full, value))
    ops[base + _WRITTEN.encode()] = KVService.txn_op_put(base + _WRITTEN.encode(), marker)
    return list(ops.values())


async def write_etcd(client: Any, prefix: str, records: Sequence[Record], *,
                     timeout_s: float = 5.0, max_txn_ops: int = 128, writer: str = "") -> int:
    """Write ``records`` in one etcd transaction; returns its revision. SecurityStoreError if
    they cannot fit in one transaction or etcd does not take it (``REQUEST_TIMED_OUT`` when the
    outcome is unknown)."""
    encoded = _check(records)
    keys = {k for k, _ in encoded}
    if len(keys) + 1 > max_txn_ops:
        raise SecurityStoreError(
            f"{len(keys)} changes in one request: one etcd transaction takes at most "
            f"{max_txn_ops - 1} (etcd.max.txn.ops={max_txn_ops}); make fewer at a time",
            INVALID_REQUEST)
    marker = json.dumps({"writer": writer, "at_ms": int(time.time() * 1000),
                         "nonce": os.urandom(8).hex()}).encode()
    try:
        resp = await client.kv.txn([], _ops(etcd_security_prefix(prefix), encoded, marker), [],
                                   timeout=timeout_s, max_attempts=1)
    except Exception as exc:  # noqa: BLE001 (gRPC / etcd3aio errors)
        from coordinator.runtime.etcd_store import describe_error
        raise SecurityStoreError(f"etcd did not confirm the change (it may or may not have "
                                 f"been applied): {describe_error(exc)}", REQUEST_TIMED_OUT) from None
    return int(resp.header.revision)


class EtcdSecurityStore(SecurityStore):
    """The security keys under ``{prefix}/security/`` (see the module doc)."""

    def __init__(self, client: Any, prefix: str, state: SecurityState, *,
                 timeout_s: float = 5.0, max_txn_ops: int = 128, node_id: str = "") -> None:
        super().__init__(state)
        self.client = client
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.max_txn_ops = max_txn_ops
        self.node_id = node_id
        self.watcher: Any = None
        self._live: dict[str, bytes] = {}  # record key (hex) -> value bytes, as last applied
        self._lock = asyncio.Lock()

    async def load(self) -> None:
        from coordinator.runtime.etcd_watch import PrefixWatcher

        self.watcher = PrefixWatcher(self.client, etcd_security_prefix(self.prefix),
                                     lambda value: bytes(value), timeout_s=self.timeout_s,
                                     name="etcd-security-watch")
        self.watcher.on_change = self._on_view
        await self.watcher.start()
        self.loaded.set()
        log.info("security state loaded", prefix=self.prefix, users=len(self.state.users),
                 acls=len(self.state.acls))

    def _on_view(self, view: dict[str, Any]) -> None:
        live = {k[len(_RECORDS):]: v for k, v in view.items() if k.startswith(_RECORDS)}
        changed: list[Record] = []
        for key_hex in self._live.keys() - live.keys():
            record = self._decode(key_hex, None)
            if record is not None:
                changed.append(record)
        for key_hex, value in live.items():
            if self._live.get(key_hex) != value:
                record = self._decode(key_hex, value)
                if record is not None:
                    changed.append(record)
        self._live = live
        if not changed:
            return
        for record in changed:
            self.state.apply(record)
        self._changed(changed)

    def _decode(self, key_hex: str, value: bytes | None) -> Record | None:
        try:
            record = serde.decode_record(bytes.fromhex(key_hex), value)
        except (ValueError, serde.RecordSerdeError) as exc:
            log.warning("ignoring an unreadable security key in etcd", key=key_hex,
                        error=str(exc))
            return None
        if not is_security_record(record):
            log.warning("ignoring a non-security record under the security prefix", key=key_hex)
            return None
        return record

    async def apply(self, records: Sequence[Record]) -> None:
        if self.watcher is None:
            raise SecurityStoreError("the security store is not loaded")
        async with self._lock:
            revision = await write_etcd(self.client, self.prefix, records,
                                        timeout_s=self.timeout_s, max_txn_ops=self.max_txn_ops,
                                        writer=self.node_id)
            watcher = self.watcher
            try:
                await watcher.wait_for(lambda _view: watcher.revision >= revision, self.timeout_s)
            except TimeoutError:
                # Durable in etcd all the same; this node's state catches up with its watch.
                log.warning("the security watch has not seen a change yet", revision=revision,
                            seen=watcher.revision)

    async def close(self) -> None:
        if self.watcher is not None:
            await self.watcher.close()
            self.watcher = None

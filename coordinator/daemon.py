"""The daemon process behind ``connect-coordinator serve``: the server
(:mod:`coordinator.server.app`) with, on ``store=etcd``, its cluster node
(:mod:`coordinator.cluster.node`), run until SIGTERM or SIGINT; what keeps it from starting is
written as one line (JSON under the JSON log format) and an exit code (2: the configuration or
another process is in the way; 1: anything else).

The wiring is here, above both: the cluster node drives the server's shards, so the server is
handed the node's constructor rather than importing it (docs/architecture.md, "The one direction
of the arrows").
"""

from __future__ import annotations

import asyncio
import contextlib

from coordinator import logs
from coordinator.config import ServerConfig
from coordinator.group.config import ConfigError
from coordinator.runtime import datadir
from coordinator.server.app import ClusterFactory, StartupError, install_loop, run

log = logs.get("coordinator.server")


class NodeIdTaken(Exception):  # stands in when the etcd extra is not installed
    pass


def cluster_node(config: ServerConfig) -> ClusterFactory | None:
    """The cluster node's constructor on ``store=etcd``; None on the file store."""
    if config["store"] != "etcd":
        return None
    try:
        from coordinator.cluster.node import ClusterNode
    except ImportError as exc:
        raise ConfigError(
            f"store=etcd needs the etcd client: pip install 'connect-coordinator[etcd]' "
            f"({exc})") from None
    return ClusterNode


def main_serve(config: ServerConfig) -> int:
    global NodeIdTaken
    if config["store"] == "etcd":
        with contextlib.suppress(ImportError):
            from coordinator.cluster.registry import NodeIdTaken
    loop_name = install_loop()
    logs.configure(config["log.format"], config["log.level"])
    log.info("event loop", loop=loop_name)
    try:
        asyncio.run(run(config, cluster=cluster_node(config)))
    except ConfigError as exc:  # e.g. a --partitions that does not match the data dir
        logs.exit_line(f"connect-coordinator: configuration error: {exc}")
        return 2
    except NodeIdTaken as exc:  # store=etcd: another live node has this node.id
        logs.exit_line(f"connect-coordinator: cannot start: {exc}")
        return 2
    except datadir.DataDirLocked as exc:  # another daemon holds the data dir
        logs.exit_line(f"connect-coordinator: cannot start: {exc}")
        return 2
    except StartupError as exc:  # e.g. every partition failed to load
        logs.exit_line(f"connect-coordinator: cannot start: {exc}")
        return 1
    except OSError as exc:
        logs.exit_line(f"connect-coordinator: cannot start: {exc}")
        return 1
    return 0

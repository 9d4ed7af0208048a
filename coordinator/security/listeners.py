"""Listeners as a Kafka broker declares them: ``listeners``,
``listener.security.protocol.map`` and ``advertised.listener(s)``.

* ``listeners`` is a comma-separated list of ``NAME://HOST:PORT`` entries; ``NAME`` is a listener
  name, mapped to one of Kafka's security protocols (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL) by
  ``listener.security.protocol.map`` (by default each protocol's own name maps to itself, so
  ``SASL_SSL://0.0.0.0:9094`` just works). A bare ``HOST:PORT`` is the listener ``PLAINTEXT``
  (what ``listeners`` always meant before: the quick start is unchanged). An empty host
  (``SSL://:9093``) binds every IPv4 interface; ``[::1]:9092`` is IPv6. Names and ports are
  unique.
* ``advertised.listener`` (alias ``advertised.listeners``, Kafka's name) is the same kind of list,
  naming for some listeners the address clients are told to use (Metadata, FindCoordinator). A
  listener it does not name advertises its bound address (a wildcard host as 127.0.0.1). A bare
  ``HOST:PORT`` is allowed when there is one listener (the setting's old meaning).

Kafka answers Metadata and FindCoordinator with the advertised address *of the listener the
request came in on*: a client that bootstrapped on the SASL_SSL listener is sent to SASL_SSL
addresses, one on the internal plaintext listener to plaintext ones. So does the coordinator
(coordinator.server.app, and the node registry on etcd, which records every listener of each
node).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from coordinator.group.config import ConfigError

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
DEFAULT_PROTOCOL_MAP = ",".join(f"{p}:{p}" for p in PROTOCOLS)
_NAME = re.compile(r"[A-Za-z0-9_]+")
WILDCARDS = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class Listener:
    """One configured listener (before it is bound)."""

    name: str
    protocol: str
    host: str
    port: int

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")


def _hostport(text: str, setting: str, allow_empty_host: bool) -> tuple[str, int]:
    # (coordinator.config.parse_hostport, but an empty host allowed in the URL form, as Kafka)
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
    else:
        host, sep, port = text.rpartition(":")
    if not sep or (not host and not allow_empty_host) or not port.isdigit():
        raise ConfigError(f"{setting}: {text!r} is not HOST:PORT")
    number = int(port)
    if not 0 <= number <= 65535:
        raise ConfigError(f"{setting}: port {number} is out of range")
    return host or "0.0.0.0", number


def entries(text: str, setting: str) -> list[tuple[str | None, str, int]]:
    """(name or None for a bare entry, host, port) of each entry of a listener list."""
    out: list[tuple[str | None, str, int]] = []
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        return out
    for part in parts:
        if not part:
            raise ConfigError(f"{setting}={text!r}: an empty entry (a stray comma?)")
        name, sep, rest = part.partition("://")
        if sep:
            if not _NAME.fullmatch(name):
                raise ConfigError(f"{setting}: {name!r} in {part!r} is not a listener name "
                                  "(letters, digits and _)")
            host, port = _hostport(rest, setting, allow_empty_host=True)
            out.append((name.upper(), host, port))
        else:
            host, port = _hostport(part, setting, allow_empty_host=False)
            out.append((None, host, port))
    return out


def parse_protocol_map(text: str) -> dict[str, str]:
    """``listener.security.protocol.map``: ``NAME:PROTOCOL,...`` -> {NAME: PROTOCOL}."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, protocol = part.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not _NAME.fullmatch(name):
            raise ConfigError(f"listener.security.protocol.map: {part!r} is not NAME:PROTOCOL")
        if protocol not in PROTOCOLS:
            raise ConfigError(f"listener.security.protocol.map: {protocol!r} (for {name}) is not "
                              f"one of {', '.join(PROTOCOLS)}")
        if name in out and out[name] != protocol:
            raise ConfigError(f"listener.security.protocol.map: {name} is mapped twice")
        out[name] = protocol
    return out


def parse_listeners(text: str, protocol_map: str = DEFAULT_PROTOCOL_MAP) -> list[Listener]:
    """The listeners of ``listeners`` (ConfigError naming the setting on anything wrong)."""
    mapping = parse_protocol_map(protocol_map)
    listeners: list[Listener] = []
    for name, host, port in entries(text, "listeners"):
        name = name or "PLAINTEXT"
        protocol = mapping.get(name)
        if protocol is None:
            raise ConfigError(
                f"listeners: listener {name} has no security protocol in "
                f"listener.security.protocol.map ({protocol_map!r}); add {name}:PROTOCOL to it")
        if any(ln.name == name for ln in listeners):
            raise ConfigError(f"listeners: the listener name {name} is used twice (each "
                              "listener needs its own name, e.g. INTERNAL://... and EXTERNAL://...; "
                              "map them in listener.security.protocol.map)")
        if port and any(ln.port == port for ln in listeners):
            raise ConfigError(f"listeners: port {port} is used by two listeners")
        listeners.append(Listener(name, protocol, host, port))
    if not listeners:
        raise ConfigError("listeners: at least one listener is needed")
    return listeners


def parse_advertised(text: str, listeners: list[Listener],
                     setting: str = "advertised.listener") -> dict[str, tuple[str, int]]:
    """{listener name: advertised (host, port)} for the listeners ``text`` names."""
    out: dict[str, tuple[str, int]] = {}
    names = {ln.name for ln in listeners}
    for name, host, port in entries(text, setting):
        if name is None:
            if len(listeners) != 1:
                raise ConfigError(
                    f"{setting}: a bare HOST:PORT ({host}:{port}) is only allowed with one "
                    f"listener; name the listener, e.g. {listeners[0].name}://{host}:{port}")
            name = listeners[0].name
        if name not in names:
            raise ConfigError(f"{setting}: {name} is not a listener of 'listeners' "
                              f"({', '.join(sorted(names))})")
        if name in out:
            raise ConfigError(f"{setting}: listener {name} is advertised twice")
        if host in WILDCARDS:
            raise ConfigError(f"{setting}: {name} advertises the wildcard address {host!r}; "
                              "clients cannot connect to it")
        if port == 0:
            raise ConfigError(f"{setting}: {name} advertises port 0")
        out[name] = (host, port)
    return out


def describe(name: str, protocol: str, host: str, port: int) -> str:
    """How a bound listener is printed (the banner): ``HOST:PORT`` for the PLAINTEXT listener,
    ``NAME://HOST:PORT`` for the others."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return where if name == "PLAINTEXT" and protocol == "PLAINTEXT" else f"{name}://{where}"

"""Bootstrap address lists, shared by the worker and the admin CLI.

``--bootstrap a:1,b:2`` and repeated ``--bootstrap`` flags both give a list of (host, port);
IPv6 hosts are written in brackets (``[::1]:9092``). A bad entry is named in the error.
"""

from __future__ import annotations

from collections.abc import Iterable

Address = tuple[str, int]


def parse_address(entry: str) -> Address:
    """``"host:port"`` or ``"[v6]:port"`` -> (host, port) with 0 < port < 65536."""
    text = entry.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
    else:
        host, sep, port = text.rpartition(":")
        if ":" in host:
            raise ValueError(f"{entry!r} is not HOST:PORT (write an IPv6 host as [HOST]:PORT)")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{entry!r} is not HOST:PORT")
    if not 0 < int(port) < 65536:
        raise ValueError(f"{entry!r}: port {int(port)} is out of range (1-65535)")
    return host, int(port)


def parse_bootstrap(values: str | Iterable[str]) -> list[Address]:
    """Comma-separated ``HOST:PORT`` entries (one string or several) -> addresses in order,
    duplicates dropped. Raises ValueError naming the first bad entry (an empty one included)."""
    out: list[Address] = []
    for value in [values] if isinstance(values, str) else values:
        for entry in value.split(","):
            if not entry.strip():
                raise ValueError(f"empty address in {value!r}")
            address = parse_address(entry)
            if address not in out:
                out.append(address)
    if not out:
        raise ValueError("no address given")
    return out


def format_addresses(addresses: Iterable[Address]) -> str:
    return ", ".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in addresses)

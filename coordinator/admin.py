"""A small blocking KRPC client for admin commands (the CLI, tests, scripts).

One request at a time over one TCP connection; responses are matched by correlation id.
Errors in responses are left to the caller (they are values on the wire).
"""

from __future__ import annotations

import itertools
import socket
import struct
from typing import Any

from connect_wire import codec
from connect_wire.apis import APIS
from connect_wire.framing import encode_request_frame, parse_response_header


class AdminError(Exception):
    """The coordinator could not be reached or answered something unreadable."""


class AdminClient:
    def __init__(self, host: str, port: int, timeout_s: float = 10.0,
                 client_id: str = "connect-coordinator-cli") -> None:
        self.address = (host, port)
        self.timeout_s = timeout_s
        self.client_id = client_id
        self._ids = itertools.count(1)
        try:
            self.sock = socket.create_connection(self.address, timeout=timeout_s)
        except OSError as exc:
            raise AdminError(f"cannot connect to {host}:{port}: {exc}") from None

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read_exactly(self, n: int) -> bytes:
        chunks = []
        while n:
            # Bounded reads: recv(n) allocates n bytes, whatever size the peer declared.
            chunk = self.sock.recv(min(n, 1 << 16))
            if not chunk:
                raise AdminError(f"{self.address[0]}:{self.address[1]} closed the connection")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def call(self, request: Any, version: int | None = None) -> Any:
        api = APIS[type(request).__api_key__]
        version = type(request).__version__ if version is None else version
        correlation_id = next(self._ids)
        frame = encode_request_frame(
            api.key, version, correlation_id, self.client_id, codec.encode(request),
            header_version=api.request_header_version(version),
        )
        try:
            self.sock.sendall(frame)
            (size,) = struct.unpack(">i", self._read_exactly(4))
            if size < 0:  # was a ValueError from recv(), escaping the AdminError contract
                raise AdminError(f"{self.address[0]}:{self.address[1]} sent a negative frame size")
            body = self._read_exactly(size)
        except (OSError, struct.error) as exc:
            raise AdminError(f"request to {self.address[0]}:{self.address[1]} failed: {exc}") from None
        got, offset = parse_response_header(body, api.response_header_version(version))
        if got != correlation_id:
            raise AdminError(f"correlation id {got} != {correlation_id}")
        try:
            return codec.decode(api.response_class(version), body, offset)[0]
        except codec.DecodeError as exc:
            raise AdminError(f"unreadable response: {exc}") from None

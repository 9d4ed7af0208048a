"""The connection-rate load of ``python -m bench security``, a process of its own:
``python -m bench._security_load SPEC.json`` prints one JSON line of results.

SPEC: host, port, workers, warmup_s, duration_s, tls (null or {"cafile": PATH}), sasl (null or
{"mechanism", "user", "password"}). Each of ``workers`` concurrent tasks loops: connect (TLS
when asked, full handshake: no session resumption), ApiVersions v3, then with SASL the
exchange (SaslHandshake v1, SaslAuthenticate v2 x 2), then close; the connections completed in
the measured window are counted and each one's time from connect to authenticated is kept.

The SCRAM client here caches the salted password per (salt, iterations), so that its PBKDF2
(4096+ iterations, milliseconds) is paid once and the load measures the server, not the
client: the server never derives anything for SCRAM (it holds StoredKey and ServerKey), it only
checks the proof (HMACs). Kafka's Java client derives it at every connection.

:func:`authenticate` is also used by ``bench/_loadgen.py`` (heartbeats over SASL listeners).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import ssl
import struct
import sys
import time
from pathlib import Path
from typing import Any

import uvloop

from connect_wire import codec
from connect_wire.apis import APIS, ApiKey
from connect_wire.framing import encode_request_frame, parse_response_header

_SIZE = struct.Struct(">i")
_HASH = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
_SALTED: dict[tuple[str, str, bytes, int], bytes] = {}


class AuthFailed(Exception):
    pass


def tls_context(spec: dict[str, Any] | None) -> ssl.SSLContext | None:
    if not spec:
        return None
    ctx = ssl.create_default_context(cafile=spec["cafile"])
    return ctx


async def _call(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: int,
                version: int, request: Any, correlation: int) -> Any:
    api = APIS[key]
    writer.write(encode_request_frame(key, version, correlation, "bench-security",
                                      codec.encode(request), api.request_header_version(version)))
    (size,) = _SIZE.unpack(await reader.readexactly(4))
    frame = await reader.readexactly(size)
    _, offset = parse_response_header(frame, api.response_header_version(version))
    return codec.decode(api.response_class(version), frame, offset)[0]


def _scram_first(user: str) -> tuple[str, str]:
    nonce = base64.b64encode(os.urandom(18)).decode()
    bare = f"n={user},r={nonce}"
    return bare, nonce


async def authenticate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       sasl: dict[str, Any], correlation: int = 1000) -> None:
    """SaslHandshake v1 and a SCRAM exchange over SaslAuthenticate v2 (raises AuthFailed)."""
    mechanism, user, password = sasl["mechanism"], sasl["user"], sasl["password"]
    name = _HASH[mechanism]
    shook = await _call(reader, writer, ApiKey.SASL_HANDSHAKE, 1,
                        APIS[ApiKey.SASL_HANDSHAKE].request_class(1)(mechanism=mechanism),
                        correlation)
    if shook.error_code:
        raise AuthFailed(f"SaslHandshake: error {int(shook.error_code)}")
    cls = APIS[ApiKey.SASL_AUTHENTICATE].request_class(2)
    bare, nonce = _scram_first(user)
    first = await _call(reader, writer, ApiKey.SASL_AUTHENTICATE, 2,
                        cls(auth_bytes=("n,," + bare).encode()), correlation + 1)
    if first.error_code:
        raise AuthFailed(f"client-first: {first.error_message}")
    server_first = first.auth_bytes.decode()
    fields = dict(part.split("=", 1) for part in server_first.split(","))
    if not fields["r"].startswith(nonce):
        raise AuthFailed("server nonce")
    salt, iterations = base64.b64decode(fields["s"]), int(fields["i"])
    key = (mechanism, password, salt, iterations)
    salted = _SALTED.get(key)
    if salted is None:
        salted = _SALTED[key] = hashlib.pbkdf2_hmac(name, password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", name).digest()
    stored_key = hashlib.new(name, client_key).digest()
    without_proof = f"c=biws,r={fields['r']}"
    auth_message = f"{bare},{server_first},{without_proof}".encode()
    signature = hmac.new(stored_key, auth_message, name).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    final = await _call(reader, writer, ApiKey.SASL_AUTHENTICATE, 2, cls(
        auth_bytes=f"{without_proof},p={base64.b64encode(proof).decode()}".encode()),
        correlation + 2)
    if final.error_code:
        raise AuthFailed(f"client-final: {final.error_message}")
    server_key = hmac.new(salted, b"Server Key", name).digest()
    expected = "v=" + base64.b64encode(hmac.new(server_key, auth_message, name).digest()).decode()
    if final.auth_bytes.decode() != expected:
        raise AuthFailed("the server's signature does not match")


async def open_authenticated(host: str, port: int, tls: ssl.SSLContext | None,
                             sasl: dict[str, Any] | None
                             ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(
        host, port, ssl=tls, server_hostname=host if tls is not None else None)
    versions = APIS[ApiKey.API_VERSIONS].request_class(3)(
        client_software_name="bench", client_software_version="1")
    answer = await _call(reader, writer, ApiKey.API_VERSIONS, 3, versions, 1)
    if answer.error_code:
        raise AuthFailed(f"ApiVersions: error {int(answer.error_code)}")
    if sasl:
        await authenticate(reader, writer, sasl)
    return reader, writer


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    tls = tls_context(spec.get("tls"))
    sasl = spec.get("sasl")
    measuring = False
    count = errors = total = 0
    latencies: list[float] = []
    stop = False

    async def worker() -> None:
        nonlocal count, errors, total
        while not stop:
            started = time.perf_counter()
            try:
                reader, writer = await open_authenticated(spec["host"], spec["port"], tls, sasl)
            except (OSError, AuthFailed, asyncio.IncompleteReadError, ssl.SSLError):
                errors += measuring
                await asyncio.sleep(0.01)
                continue
            took = time.perf_counter() - started
            total += 1
            if measuring:
                count += 1
                latencies.append(took)
            writer.close()
            try:
                await writer.wait_closed()
            except (OSError, ssl.SSLError):
                pass

    tasks = [asyncio.create_task(worker()) for _ in range(spec["workers"])]
    await asyncio.sleep(spec["warmup_s"])
    measuring = True
    started = time.perf_counter()
    cpu_started = time.process_time()
    await asyncio.sleep(spec["duration_s"])
    measuring = False
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    stop = True
    await asyncio.gather(*tasks, return_exceptions=True)
    lat = sorted(latencies)

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, round(q * (len(lat) - 1)))] * 1e3 if lat else float("nan")

    return {"connections": count, "total_connections": total, "seconds": elapsed,
            "per_second": count / elapsed,
            "p50_ms": pct(0.5), "p99_ms": pct(0.99), "errors": errors, "cpu_seconds": cpu}


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    print(json.dumps(uvloop.run(run(spec))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

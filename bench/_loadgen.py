"""The throughput load generator, a process of its own:
``python -m bench._loadgen SPEC.json`` prints one JSON line of results.

SPEC: host, port, group, members ([member_id, epoch] pairs), connections, depth, warmup_s,
duration_s, check (decode a sample of responses and count errors: on for the coordinator; ``error_codes``
in the result counts them by "code: message").
Several servers/groups at once: ``targets``, a list of {host, port, group, members,
connections}, instead of the first five (``bench/cluster.py``: each group at its node).
``tls`` ({"cafile": PATH}) and ``sasl`` ({"mechanism", "user", "password"}): connect with TLS
and/or authenticate each connection with SCRAM first (``bench/_security_load.py``).
``announce``: print ``measuring`` when the measured window opens and ``measured`` when it
closes (a caller samples the servers' CPU time then). The result includes the generator's own
CPU seconds in the window (``cpu_seconds``).
``kind``: ``heartbeat`` (the default) or ``commit``: then each entry of ``members`` is
[member_id, epoch, connector, task] and the requests are ConnectGroupCommitOffsets of that item,
one source partition each (``{"source": "CONNECTOR/TASK"}``), its offset alternating between
``{"position": 1}`` and ``{"position": 2}`` so every commit changes what is stored
(``bench/commits.py``). ``count_errors``: read the error code of every response (both kinds
start with ThrottleTimeMs, ErrorCode) and report ``responses`` and ``error_codes_all`` over the
whole run, warm-up included.
Members are spread round robin over the connections; each connection keeps ``min(depth, its
members)`` steady heartbeats (MemberEpoch = the member's epoch, every optional field null,
MaxWaitMs = 0) in flight, one per member at most, and sends the next one the moment a response
arrives (closed loop, no think time). Frames are encoded once up front, responses are only
split (size prefix) and timed: the client costs the same against the coordinator and the echo
server. Latency is per request, send to response, at the client, in the measured window only."""

from __future__ import annotations

import asyncio
import json
import struct
import sys
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

import uvloop

from connect_wire import codec
from connect_wire.apis import APIS
from connect_wire.framing import encode_request_frame, parse_response_header
from connect_wire.messages import (
    ConnectGroupCommitOffsetsRequest,
    ConnectGroupCommitOffsetsResponse,
    ConnectGroupHeartbeatRequest,
    ConnectGroupHeartbeatResponse,
)
from connect_wire.messages import connect_group_commit_offsets_request_v0 as _commit

_SIZE = struct.Struct(">i")
_I16 = struct.Struct(">h")
RESPONSES = {"heartbeat": ConnectGroupHeartbeatResponse, "commit": ConnectGroupCommitOffsetsResponse}
SAMPLES_PER_CONNECTION = 5


class Stats:
    def __init__(self) -> None:
        self.measuring = False
        self.count = 0
        self.latencies: list[float] = []
        self.samples: list[bytes] = []
        self.responses = 0
        self.codes: Counter[int] = Counter()
        """Nonzero error codes of every response (``count_errors``)."""


class Client(asyncio.Protocol):
    def __init__(self, frames: list[bytes], depth: int, stats: Stats, check: bool,
                 count_errors: bool = False) -> None:
        self.frames = frames
        self.depth = depth
        self.stats = stats
        self.check = check
        self.count_errors = count_errors
        self.next = 0
        self.sent: deque[float] = deque()
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.sampled = 0
        self.lost = asyncio.get_running_loop().create_future()

    def _send(self, n: int) -> None:
        frames, k, count = self.frames, self.next, len(self.frames)
        out = []
        now = time.perf_counter()
        for _ in range(n):
            out.append(frames[k])
            k += 1
            if k == count:
                k = 0
            self.sent.append(now)
        self.next = k
        assert self.transport is not None
        self.transport.write(b"".join(out))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._send(self.depth)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        end = len(buf)
        pos = n = 0
        stats = self.stats
        keep = stats.measuring and self.check and self.sampled < SAMPLES_PER_CONNECTION
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if end - pos - 4 < size:
                break
            if keep and self.sampled < SAMPLES_PER_CONNECTION:
                stats.samples.append(bytes(buf[pos + 4: pos + 4 + size]))
                self.sampled += 1
            if self.count_errors:
                stats.responses += 1
                code = error_code(buf, pos + 4, size)
                if code:
                    stats.codes[code] += 1
            pos += 4 + size
            n += 1
        if not n:
            return
        del buf[:pos]
        now = time.perf_counter()
        sent = self.sent
        if stats.measuring:
            lat = stats.latencies
            for _ in range(n):
                lat.append(now - sent.popleft())
            stats.count += n
        else:
            for _ in range(n):
                sent.popleft()
        self._send(n)


def error_code(buf: bytearray, start: int, size: int) -> int:
    """The ErrorCode of a response frame at ``buf[start:start + size]`` (header v1: correlation
    id, tagged fields; the body begins with ThrottleTimeMs int32, ErrorCode int16)."""
    if buf[start + 4] == 0:  # no tagged fields in the header: the usual case
        return _I16.unpack_from(buf, start + 9)[0]
    _, offset = parse_response_header(bytes(buf[start:start + size]), 1)
    return _I16.unpack_from(buf, start + offset + 4)[0]


def canonical(obj: dict[str, Any]) -> str:
    """A partition or offset as the coordinator compares them: canonical JSON."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def commit_frames(group: str, items: list[tuple[str, int, str, int]]) -> list[bytes]:
    """Two commits per item (positions 1 and 2), all the first ones, then all the second ones:
    cycled through with at most one in flight per item, each commit changes the item's offset."""
    api = APIS[ConnectGroupCommitOffsetsRequest.__api_key__]
    version = ConnectGroupCommitOffsetsRequest.__version__
    out = []
    for position in (1, 2):
        offset = canonical({"position": position})
        for member_id, epoch, connector, task in items:
            body = codec.encode(ConnectGroupCommitOffsetsRequest(
                group_id=group, member_id=member_id, member_epoch=epoch, connector=connector,
                task=task, offsets=(_commit.PartitionOffset(
                    partition=canonical({"source": f"{connector}/{task}"}), offset=offset),)))
            out.append(encode_request_frame(api.key, version, len(out) + 1, "bench-loadgen", body,
                                            api.request_header_version(version)))
    return out


def frames_for(group: str, members: list[tuple[str, int]]) -> list[bytes]:
    api = APIS[ConnectGroupHeartbeatRequest.__api_key__]
    version = ConnectGroupHeartbeatRequest.__version__
    out = []
    for k, (member_id, epoch) in enumerate(members):
        body = codec.encode(ConnectGroupHeartbeatRequest(
            group_id=group, member_id=member_id, member_epoch=epoch, max_wait_ms=0))
        out.append(encode_request_frame(api.key, version, k + 1, "bench-loadgen", body,
                                        api.request_header_version(version)))
    return out


async def _secured(host: str, port: int, spec: dict[str, Any], client: Client) -> Client:
    """A TLS and/or SASL connection: authenticated with streams, then handed to ``client``."""
    from bench._security_load import open_authenticated, tls_context
    _, writer = await open_authenticated(host, port, tls_context(spec.get("tls")),
                                         spec.get("sasl"))
    client.writer = writer  # type: ignore[attr-defined]  # (a StreamWriter collected closes it)
    transport = writer.transport
    transport.set_protocol(client)
    client.connection_made(transport)
    return client


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    targets = spec.get("targets") or [{k: spec[k] for k in
                                       ("host", "port", "group", "members", "connections")}]
    stats = Stats()
    kind = spec.get("kind", "heartbeat")
    count_errors = bool(spec.get("count_errors"))
    clients = []
    for target in targets:
        members = [tuple(m) for m in target["members"]]
        connections = target["connections"]
        for c in range(connections):
            mine = members[c::connections]
            if not mine:
                continue
            frames = (commit_frames(target["group"], mine) if kind == "commit"  # type: ignore[arg-type]
                      else frames_for(target["group"], mine))  # type: ignore[arg-type]
            depth = max(1, min(spec["depth"], len(mine)))
            if spec.get("tls") or spec.get("sasl"):
                proto = await _secured(target["host"], target["port"], spec,
                                       Client(frames, depth, stats, spec["check"], count_errors))
            else:
                _, proto = await loop.create_connection(
                    lambda f=frames, d=depth: Client(f, d, stats, spec["check"], count_errors),
                    target["host"], target["port"])
            clients.append(proto)
    await asyncio.sleep(spec["warmup_s"])
    if spec.get("announce"):
        print("measuring", flush=True)
    stats.measuring = True
    started = time.perf_counter()
    cpu_started = time.process_time()
    await asyncio.sleep(spec["duration_s"])
    stats.measuring = False
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    if spec.get("announce"):
        print("measured", flush=True)
    in_flight = sum(c.depth for c in clients)
    for c in clients:
        if c.transport is not None:
            c.transport.close()
    errors = 0
    codes: Counter[str] = Counter()
    if spec["check"]:
        response = RESPONSES[kind]
        header_version = APIS[response.__api_key__].response_header_version(0)
        for frame in stats.samples:
            _, offset = parse_response_header(frame, header_version)
            resp = codec.decode(response, frame, offset)[0]
            if resp.error_code:
                errors += 1
                codes[f"{resp.error_code}: {resp.error_message}"] += 1
    lat = sorted(stats.latencies)

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, round(q * (len(lat) - 1)))] * 1e6 if lat else float("nan")

    return {"requests": stats.count, "seconds": elapsed, "per_second": stats.count / elapsed,
            "p50_us": pct(0.50), "p99_us": pct(0.99), "connections": len(clients),
            "in_flight": in_flight, "checked": len(stats.samples), "errors": errors,
            "error_codes": dict(codes), "cpu_seconds": cpu,
            **({"responses": stats.responses, "error_codes_all": {str(k): n for k, n in stats.codes.items()}}
               if count_errors else {})}


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    print(json.dumps(uvloop.run(run(spec))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

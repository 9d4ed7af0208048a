"""The throughput ceiling: ``python -m bench._echo`` listens on 127.0.0.1:0, prints
``listening on HOST:PORT`` and echoes every size-prefixed frame back unchanged (split by the
coordinator's own FrameDecoder, nothing decoded), one write per received chunk."""

from __future__ import annotations

import asyncio
import signal
import struct

import uvloop

from connect_wire.framing import FrameDecoder

_SIZE = struct.Struct(">i")


class Echo(asyncio.Protocol):
    def __init__(self) -> None:
        self.decoder = FrameDecoder()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        frames = self.decoder.feed(data)
        if frames and self.transport is not None:
            out = []
            for frame in frames:
                out.append(_SIZE.pack(len(frame)))
                out.append(frame)
            self.transport.write(b"".join(out))


async def serve() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Echo, "127.0.0.1", 0, backlog=1024)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"listening on {host}:{port}", flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    server.close()


if __name__ == "__main__":
    uvloop.run(serve())

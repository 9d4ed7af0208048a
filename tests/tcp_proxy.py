"""A TCP forwarder on 127.0.0.1 that a test can cut and heal: a network partition between one
process and a server, while everything else still reaches both (real sockets, real bytes).

    proxy = TcpProxy("127.0.0.1", etcd_port)    # listens on proxy.port
    proxy.cut()                                  # bytes stop flowing both ways (held, not
                                                 # dropped: like a link that went silent)
    proxy.heal()                                 # they flow again
    proxy.close()
"""

from __future__ import annotations

import select
import socket
import threading


class TcpProxy:
    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open = threading.Event()
        self._open.set()
        self._closed = False
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._closed = True
        self._open.set()
        for s in [self._listener, *self._socks]:
            try:
                s.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            self._socks += [client, server]
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self._closed:
                if not self._open.wait(0.05):
                    continue  # cut: hold everything (the kernel buffers fill, then senders wait)
                ready, _, _ = select.select([a, b], [], [], 0.05)
                for s in ready:
                    if not self._open.is_set():
                        break
                    data = s.recv(65536)
                    if not data:
                        return
                    peers[s].sendall(data)
        except (OSError, ValueError):  # closed under us
            return
        finally:
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

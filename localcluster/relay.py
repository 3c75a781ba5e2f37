"""A TCP relay from an address pods can reach to a service that listens on loopback only.

The host's test services (the embedded object store) bind to 127.0.0.1; the real node's pods reach
the host at the bridge address. The relay passes bytes through unchanged, so an S3 request signed
for the relay's host:port verifies at the store.
"""

from __future__ import annotations

import socket
import threading


class Relay:
    """A TCP relay: one accept thread, two pump threads per connection; closed with the node."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]):
        self.target = target
        self.server = socket.create_server(listen, reuse_port=False)
        self.server.settimeout(0.5)
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True, name=f"relay-{listen[1]}").start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                conn.close()
                continue
            upstream.settimeout(None)
            conn.settimeout(None)
            pair = Pair(conn, upstream)
            for src, dst in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=_pump, args=(src, dst, pair), daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self.server.close()


class Pair:
    """Both sockets of a relayed connection, closed when both directions are done."""

    def __init__(self, *socks: socket.socket):
        self.socks, self.left, self.lock = socks, 2, threading.Lock()

    def done(self) -> None:
        with self.lock:
            self.left -= 1
            if self.left == 0:
                for sock in self.socks:
                    sock.close()


def _pump(src: socket.socket, dst: socket.socket, pair: Pair) -> None:
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass
        pair.done()

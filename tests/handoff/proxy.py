"""A TCP proxy on loopback that a test can cut and restore: a broker outage we control.

The shared brokers must never be stopped; traffic to them goes through a
``Proxy`` instead, and ``cut()`` closes every proxied connection and refuses
new ones (accepted, then closed at once) until ``restore()``.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Proxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``; ``cut()``/``restore()`` the link."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._up = threading.Event()
        self._up.set()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._clients: set[socket.socket] = set()  # of ``_sockets``, the clients' ends
        self._closed = False
        self.cuts = 0
        threading.Thread(target=self._accept, daemon=True, name=f"proxy-{self.port}").start()

    @property
    def up(self) -> bool:
        return self._up.is_set()

    def cut(self) -> None:
        """Close every proxied connection; refuse new ones until ``restore``."""
        self._up.clear()
        self.cuts += 1
        with self._lock:
            sockets, self._sockets = self._sockets, set()
            self._clients.clear()
        for sock in sockets:
            _close(sock)

    def restore(self) -> None:
        self._up.set()

    def cut_for(self, seconds: float) -> threading.Timer:
        """``cut()`` now and ``restore()`` after ``seconds``."""
        self.cut()
        timer = threading.Timer(seconds, self.restore)
        timer.daemon = True
        timer.start()
        return timer

    def inject(self, data: bytes) -> None:
        """Write ``data`` to every proxied client as if the target had sent it."""
        with self._lock:
            clients = list(self._clients)
        for client in clients:
            client.sendall(data)

    def close(self) -> None:
        self._closed = True
        self.cut()
        _close(self._listener)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self._up.is_set():
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._sockets.update((client, upstream))
                self._clients.add(client)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data or not self._up.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _close(src)
            _close(dst)
            with self._lock:
                self._sockets.difference_update((src, dst))
                self._clients.difference_update((src, dst))


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()

"""A TCP proxy in front of an endpoint that can go down and come back: an outage that keeps
what the endpoint holds.

Killing moto's server loses everything it stored; this proxy stands where the endpoint
is reached instead. During :meth:`Outage.down` it drops every connection and listens no
more (a client's connect is refused, as a gateway pod being replaced refuses it), then it
listens again on the same port and forwards as before.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

__all__ = ["Outage"]


class Outage:
    """Forwards ``127.0.0.1:<port>`` to ``target`` (host, port) while up."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = self._listen(0)
        self.port = int(self._listener.getsockname()[1])
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        self._accepting = self._start(self._listener)

    @staticmethod
    def _listen(port: int) -> socket.socket:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        listener.settimeout(0.1)
        return listener

    def _start(self, listener: socket.socket) -> threading.Thread:
        thread = threading.Thread(target=self._accept, args=(listener,), daemon=True,
                                  name="outage-proxy")
        thread.start()
        return thread

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed: down, or done
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(1 << 16):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def _drop(self) -> None:
        self._listener.close()
        self._accepting.join(5)
        with self._lock:
            conns, self._open = self._open, set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    @contextlib.contextmanager
    def down(self) -> Iterator[None]:
        """Inside: nothing listens on the port and every connection is gone."""
        self._drop()
        try:
            yield
        finally:
            if not self._closed:
                self._listener = self._listen(self.port)
                self._accepting = self._start(self._listener)

    def down_for(self, seconds: float) -> threading.Thread:
        """An outage of ``seconds`` from now, in the background; its thread."""
        def outage() -> None:
            with self.down():
                time.sleep(seconds)

        thread = threading.Thread(target=outage, daemon=True, name="outage")
        thread.start()
        return thread

    def close(self) -> None:
        self._closed = True
        self._drop()

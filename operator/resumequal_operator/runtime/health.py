"""One HTTP port for ``/metrics`` (Prometheus text), ``/healthz`` and ``/readyz``.

``/healthz`` fails when a thread the operator needs has died (the kubelet restarts the
pod); ``/readyz`` succeeds once the watch caches are synced and the leader state is known,
so a rolling update waits for the new replica to be able to take over.

The port is reachable by anything in the cluster: a connection gets ``timeout_seconds`` to
send its request and read the answer, and at most ``max_connections`` are served at
once (one thread each); one more is closed at once, so idle sockets cannot pile up
threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

Check = Callable[[], str | None]  # None when fine, else what is wrong

# A probe or a scrape sends a few hundred bytes and reads a few KiB on a cluster network:
# 5 s is far more than either needs. Kubelet probes, one or two Prometheus scrapers and a
# person with curl are a handful of connections at once; 16 leaves room for all of them.
TIMEOUT_SECONDS = 5.0
MAX_CONNECTIONS = 16


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` threads at once."""

    daemon_threads = True
    block_on_close = False  # stop() does not wait for connections in flight
    request_queue_size = 128  # the listen backlog: a burst of connections waits for accept

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 max_connections: int) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            log.debug("health port: %s refused, %s", client_address, "all connections busy")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class HealthServer:
    """Serves the registry and two checks on ``host:port`` (port 0: any free port)."""

    def __init__(self, registry: CollectorRegistry, healthy: Check, ready: Check,
                 port: int = 8080, host: str = "0.0.0.0", *,
                 timeout_seconds: float = TIMEOUT_SECONDS,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            timeout = timeout_seconds  # on the socket: reads and writes of one connection

            def do_GET(self) -> None:
                outer._serve(self)

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds would drown the log

        self.registry, self.healthy, self.ready = registry, healthy, ready
        self.server = _BoundedServer((host, port), Handler, max_connections)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def _serve(self, req: BaseHTTPRequestHandler) -> None:
        path = req.path.split("?", 1)[0]
        if path == "/metrics":
            body, ctype, code = generate_latest(self.registry), CONTENT_TYPE_LATEST, 200
        elif path in ("/healthz", "/readyz"):
            problem = (self.healthy if path == "/healthz" else self.ready)()
            code = 200 if problem is None else 503
            body, ctype = (problem or "ok").encode() + b"\n", "text/plain; charset=utf-8"
        else:
            body, ctype, code = b"not found\n", "text/plain; charset=utf-8", 404
        req.send_response(code)
        req.send_header("Content-Type", ctype)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.server.serve_forever, name="health",
                                        daemon=True)
        self._thread.start()
        log.info("serving /metrics, /healthz, /readyz on port %d", self.port)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

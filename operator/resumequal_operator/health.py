"""One HTTP port for ``/metrics`` (Prometheus text), ``/healthz`` and ``/readyz``.

``/healthz`` fails when a thread the operator needs has died (the kubelet restarts the
pod); ``/readyz`` succeeds once the watch caches are synced and the leader state is known,
so a rolling update waits for the new replica to be able to take over.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

Check = Callable[[], str | None]  # None when fine, else what is wrong


class HealthServer:
    """Serves the registry and two checks on ``host:port`` (port 0: any free port)."""

    def __init__(self, registry: CollectorRegistry, healthy: Check, ready: Check,
                 port: int = 8080, host: str = "0.0.0.0") -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer._serve(self)

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds would drown the log

        self.registry, self.healthy, self.ready = registry, healthy, ready
        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
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

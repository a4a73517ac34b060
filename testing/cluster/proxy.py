"""A recording, fault-injecting proxy in front of a real kube-apiserver, for tests.

Clients (the operator under test) talk plain HTTP to it on loopback; it forwards each
request over TLS as the cluster's admin and hands the answer back as it came, watches
streamed line by line. What it adds is what a test needs and a real API server does not
offer: the requests it served (method, path, query), the objects created and the delete
requests (their options), validators called on what clients create or replace (as a
validating webhook is, for a test's own rules), injected failures (the next N matching
requests answered with a Status of a given code, as an overloaded or failing server
answers), watches ended on demand (as an API server ends them when it restarts or its
timeout passes) and the server taken away and brought back on the same port.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger(__name__)

Obj = dict[str, Any]
# Sees an object a client creates or replaces; raises or returns a message to refuse it.
Validator = Callable[[Obj], object]
# Request headers a client's connection owns, not the request.
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "host",
        "proxy-connection", "content-length", "authorization"}


@dataclass(frozen=True)
class Target:
    """What a request's path names: ``resource`` is ``plural`` or ``plural.group``."""

    resource: str
    namespace: str | None
    name: str | None
    subresource: str | None


def parse_path(path: str) -> Target | None:
    """The resource a request path names (``/api/v1/namespaces/ns/pods/x/status``), or
    None for discovery and other non-resource paths."""
    parts = [p for p in urllib.parse.urlsplit(path).path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    elif len(rest) in (1, 2) and rest[0] == "namespaces" and group == "":
        # A Namespace itself: /api/v1/namespaces[/name]
        return Target("namespaces", None, rest[1] if len(rest) == 2 else None, None)
    if not rest:
        return None
    plural = rest[0]
    return Target(f"{plural}.{group}" if group else plural, namespace,
                  rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None)


@dataclass
class Fault:
    """The next ``times`` requests matching answered with a Status of ``code``."""

    method: str
    resource: str
    name: str | None
    subresource: str | None
    code: int
    times: int
    message: str

    def matches(self, method: str, target: Target | None) -> bool:
        if target is None:
            return False
        return (self.method in ("*", method) and self.resource in ("*", target.resource)
                and self.name in (None, target.name) and self.subresource == target.subresource)


@dataclass(frozen=True)
class Deletion:
    """One delete request the proxy forwarded and the server accepted."""

    kind: str  # plural or plural.group
    namespace: str
    name: str
    uid: str
    grace_period_seconds: int | None
    propagation_policy: str | None
    cause: str
    time: float


_REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 409: "Conflict",
            410: "Gone", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
            503: "ServiceUnavailable", 504: "Timeout"}


def status_body(code: int, message: str) -> bytes:
    """A ``Status`` as the API server writes one for a failed request."""
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {},
                       "status": "Failure", "message": message,
                       "reason": _REASONS.get(code, "InternalError"), "code": code}).encode()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], proxy: RecordingProxy) -> None:
        super().__init__(address, _Handler)
        self.proxy = proxy


class RecordingProxy:
    """Plain HTTP on ``127.0.0.1:<port>`` to the API server at ``upstream`` (``host:port``,
    TLS with ``context``: the admin's client certificate)."""

    def __init__(self, upstream: tuple[str, int], context: ssl.SSLContext) -> None:
        self.upstream = upstream
        self.context = context
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str]] = []
        self.created: list[tuple[str, Obj]] = []  # (resource, object as the server stored it)
        self.deletions: list[Deletion] = []
        self.faults: list[Fault] = []
        self.validators: list[tuple[Validator, frozenset[str] | None]] = []
        self.watch_generation = 0
        self.connections: set[socket.socket] = set()
        self.watches: set[Any] = set()  # upstream sockets of the watches being streamed
        self._server: _Server | None = None
        self._port = 0

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> RecordingProxy:
        """Listen (on the same port as before, after a ``stop``)."""
        if self._server is None:
            self._server = _Server(("127.0.0.1", self._port), self)
            self._port = self._server.server_address[1]
            threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                             name=f"api-proxy-{self._port}", daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening and cut every client connection, watches included."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        self.end_watches()
        with self.lock:
            conns = list(self.connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def end_watches(self) -> None:
        """End every open watch stream cleanly (clients resume from their last version)."""
        with self.lock:
            self.watch_generation += 1
            upstream = list(self.watches)
        for sock in upstream:  # its reader wakes, sees the generation moved on, ends
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def reset(self) -> None:
        """Forget the records and faults (between tests)."""
        with self.lock:
            self.requests.clear()
            self.created.clear()
            self.deletions.clear()
            self.faults.clear()

    def add_validator(self, fn: Validator, kinds: frozenset[str] | None) -> None:
        with self.lock:
            self.validators.append((fn, kinds))

    def admit(self, method: str, body: bytes) -> str | None:
        """What a validating webhook would answer for an object created or replaced: None
        to let it through, else why not."""
        if method not in ("POST", "PUT") or not body or not self.validators:
            return None
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        if not isinstance(obj, dict):
            return None
        with self.lock:
            validators = list(self.validators)
        for fn, kinds in validators:
            if kinds is not None and obj.get("kind") not in kinds:
                continue
            try:
                message = fn(obj)
            except Exception as e:  # a webhook's refusal, whatever raised it
                return str(e) or type(e).__name__
            if message:
                return str(message)
        return None

    def inject(self, fault: Fault) -> None:
        with self.lock:
            self.faults.append(fault)

    def take_fault(self, method: str, target: Target | None) -> Fault | None:
        """The first injected fault matching this request, consumed once."""
        with self.lock:
            for fault in self.faults:
                if fault.matches(method, target):
                    fault.times -= 1
                    if fault.times <= 0:
                        self.faults.remove(fault)
                    return fault
        return None


class _Handler(BaseHTTPRequestHandler):
    """One client connection, its requests forwarded one after another on one upstream
    connection of its own."""

    protocol_version = "HTTP/1.1"
    # Nagle's algorithm against the client's delayed ACK holds each small response 40 ms.
    disable_nagle_algorithm = True
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.upstream: http.client.HTTPSConnection | None = None
        with self.server.proxy.lock:
            self.server.proxy.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.proxy.lock:
            self.server.proxy.connections.discard(self.connection)
        if self.upstream is not None:
            self.upstream.close()
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("proxy: " + format, *args)

    def do_GET(self) -> None:
        self._forward("GET")

    def do_POST(self) -> None:
        self._forward("POST")

    def do_PUT(self) -> None:
        self._forward("PUT")

    def do_PATCH(self) -> None:
        self._forward("PATCH")

    def do_DELETE(self) -> None:
        self._forward("DELETE")

    def _connection(self) -> http.client.HTTPSConnection:
        if self.upstream is None:
            proxy = self.server.proxy
            host, port = proxy.upstream
            self.upstream = http.client.HTTPSConnection(host, port, context=proxy.context,
                                                        timeout=120)
        return self.upstream

    def _forward(self, method: str) -> None:
        proxy = self.server.proxy
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        with proxy.lock:
            proxy.requests.append((method, self.path))
        target = parse_path(self.path)
        fault = proxy.take_fault(method, target)
        if fault is not None:
            self._reply(fault.code, status_body(fault.code, fault.message),
                        "application/json")
            return
        denied = proxy.admit(method, body)
        if denied is not None:
            self._reply(400, status_body(400, f"admission webhook denied the request: "
                                              f"{denied}"), "application/json")
            return
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        watching = method == "GET" and query.get("watch", [""])[0] in ("1", "true")
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        conn = self._connection()
        try:
            conn.request(method, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            self.upstream = None
            self._reply(503, status_body(503, f"the API server did not answer: {e}"),
                        "application/json")
            return
        if watching and resp.status == 200:
            self._stream(resp)
            return
        data = resp.read()
        self._record(method, target, resp.status, data, body, query)
        self._reply(resp.status, data, resp.getheader("Content-Type") or "application/json")

    def _reply(self, code: int, data: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, resp: http.client.HTTPResponse) -> None:
        """A watch: each event line handed on as it comes, until the server or a test ends
        it; the upstream connection is not reused after."""
        proxy = self.server.proxy
        generation = proxy.watch_generation
        self.send_response(200)
        self.send_header("Content-Type", resp.getheader("Content-Type") or "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        conn, self.upstream = self.upstream, None
        assert conn is not None
        sock = conn.sock
        with proxy.lock:
            proxy.watches.add(sock)
        try:
            while proxy.watch_generation == generation:
                try:
                    line = resp.readline()
                except (OSError, http.client.HTTPException):
                    break  # ended by end_watches (its socket shut) or by the server
                if not line:
                    break
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True
        finally:
            with proxy.lock:
                proxy.watches.discard(sock)
            conn.close()

    def _record(self, method: str, target: Target | None, code: int, data: bytes,
                body: bytes, query: dict[str, list[str]]) -> None:
        if target is None or code >= 300 or target.subresource is not None:
            return
        proxy = self.server.proxy
        if method == "POST" and code == 201:
            with contextlib.suppress(ValueError), proxy.lock:
                proxy.created.append((target.resource, json.loads(data)))
        elif method == "DELETE" and target.name is not None:
            options: Obj = {}
            with contextlib.suppress(ValueError):
                options = json.loads(body) if body else {}
            grace = options.get("gracePeriodSeconds", _int(query.get("gracePeriodSeconds")))
            policy = options.get("propagationPolicy", _first(query.get("propagationPolicy")))
            uid = ""
            with contextlib.suppress(ValueError, AttributeError):
                uid = json.loads(data).get("metadata", {}).get("uid", "")
            with proxy.lock:
                proxy.deletions.append(Deletion(target.resource, target.namespace or "",
                                                target.name, uid, grace, policy, "api",
                                                time.time()))


def _first(values: list[str] | None) -> str | None:
    return values[0] if values else None


def _int(values: list[str] | None) -> int | None:
    try:
        return int(values[0]) if values else None
    except ValueError:
        return None

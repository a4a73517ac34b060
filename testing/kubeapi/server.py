"""The HTTP front: URL routing, JSON bodies, Status errors, chunked watch streams.

A ``ThreadingHTTPServer`` speaking HTTP/1.1 with keep-alive, as the client's urllib3 pool
and kubectl expect. Routes: ``/version``, ``/api``, ``/apis``, ``/api/v1``,
``/apis/<g>/<v>`` (legacy discovery: kubectl asks for aggregated discovery first and takes
these when the answer is not an ``APIGroupDiscoveryList``), ``/openapi/v3[/<gv>]``
(:mod:`.kubectl`), then ``/api/v1/...`` and ``/apis/<g>/<v>/...`` with
``namespaces/<ns>/<plural>[/<name>[/status]]`` or ``<plural>[/<name>[/status]]`` (cluster
scoped kinds, and lists/watches of namespaced kinds across all namespaces). Reads of custom
resources answer ``Accept: ...;as=Table;g=meta.k8s.io`` with a Table (:mod:`.kubectl`),
watches included; writes honour ``fieldValidation`` (Strict fails on fields the schema does
not declare, Warn answers them in ``Warning`` headers). ``/openapi/v2`` is not served:
kubectl 1.32 falls back to it only when v3 is missing, and then wants protobuf. List
pagination (``limit``/``continue``) is not implemented: every list is one page.
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from . import kubectl
from .errors import ApiError
from .resources import Kind, Registry
from .selectors import Selector
from .store import FieldValidation, Store, WatchEvent

log = logging.getLogger(__name__)

VERSION_INFO = {"major": "1", "minor": "32", "gitVersion": "v1.32.0", "gitCommit": "emulator",
                "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.22", "compiler": "gc", "platform": "linux/amd64"}
# How often an idle watch checks whether its client went away.
WATCH_POLL_S = 0.5


@dataclass
class Fault:
    """An injected failure: the next ``times`` matching requests get ``code``."""

    method: str  # GET, POST, PUT, PATCH, DELETE or "*"
    kind: str  # storage key (pods, jobs.batch, ...) or "*"
    name: str | None
    subresource: str | None
    code: int
    times: int
    message: str


@dataclass(frozen=True)
class _Target:
    kind: Kind
    namespace: str | None
    name: str | None
    subresource: str | None


def _first(query: dict[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    return values[0] if values else None


def _field_validation(query: dict[str, list[str]]) -> FieldValidation:
    """The ``fieldValidation`` query parameter; Warn when absent, as on a real server."""
    directive = _first(query, "fieldValidation") or "Warn"
    if directive not in ("Ignore", "Warn", "Strict"):
        raise ApiError.invalid(f'fieldValidation: Unsupported value: "{directive}": supported '
                               'values: "Ignore", "Strict", "Warn"')
    return FieldValidation(directive)


class Server(ThreadingHTTPServer):
    """The listening socket plus the state every handler thread shares."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], store: Store, registry: Registry) -> None:
        super().__init__(address, Handler)
        self.store = store
        self.registry = registry
        self.faults: list[Fault] = []
        # Bumped to end every open watch stream (as an API server does when it restarts or
        # rotates connections); clients must resume from their last resourceVersion.
        self.watch_generation = 0
        self.requests: list[tuple[str, str]] = []
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()

    def close_connections(self) -> None:
        """Cut every open client connection (idle keep-alives included)."""
        with self.connections_lock:
            conns = list(self.connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def take_fault(self, method: str, target: _Target) -> Fault | None:
        """The first injected fault matching this request, consumed once."""
        with self.connections_lock:
            for fault in self.faults:
                if (fault.method in ("*", method) and fault.kind in ("*", target.kind.key)
                        and fault.name in (None, target.name)
                        and fault.subresource == target.subresource):
                    fault.times -= 1
                    if fault.times <= 0:
                        self.faults.remove(fault)
                    return fault
        return None


class Handler(BaseHTTPRequestHandler):
    """One client connection; requests on it are served one after another."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: with Nagle's algorithm on, the body waits
    # for the client's delayed ACK (~40 ms per response on Linux).
    disable_nagle_algorithm = True
    server: Server

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # ----------------------------------------------------------------- plumbing

    def _send_json(self, code: int, payload: Any, warnings: list[str] | None = None) -> None:
        self._send(code, json.dumps(payload).encode(), warnings=warnings)

    def _send(self, code: int, data: bytes, *, warnings: list[str] | None = None,
              headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for warning in warnings or []:
            # RFC 7234 warn-code 299 with agent "-", as k8s.io/apiserver/pkg/warning writes.
            self.send_header("Warning", f"299 - {json.dumps(warning)}")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except json.JSONDecodeError as e:
            raise ApiError.bad_request(f"the request body is not JSON: {e.msg}") from e

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query, keep_blank_values=True)
        self.server.requests.append((method, self.path))
        try:
            body = self._body()
            handled = self._discovery(method, url.path)
            if handled is not None:
                self._send_json(200, handled)
                return
            if method == "GET" and url.path.rstrip("/").startswith("/openapi/v3"):
                self._openapi(url.path)
                return
            target = self._target(url.path)
            fault = self.server.take_fault(method, target)
            if fault is not None:
                raise ApiError(fault.code, "InternalError" if fault.code >= 500 else "Injected",
                               fault.message)
            self._serve(method, target, query, body)
        except ApiError as e:
            self._send_json(e.code, e.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:
            log.exception("emulator failed on %s %s", method, url.path)
            self._send_json(500, ApiError(500, "InternalError", f"{type(e).__name__}: {e}")
                            .status())

    def _discovery(self, method: str, path: str) -> dict[str, Any] | None:
        parts = [p for p in path.split("/") if p]
        if method != "GET":
            return None
        registry = self.server.registry
        if parts == ["version"]:
            return VERSION_INFO
        if parts == ["api"]:
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}
        if parts == ["apis"]:
            return registry.discovery_group_list()
        if parts == ["api", "v1"]:
            return registry.discovery_resource_list("", "v1")
        if len(parts) == 3 and parts[0] == "apis":
            return registry.discovery_resource_list(parts[1], parts[2])
        if len(parts) == 2 and parts[0] == "apis":
            return registry.discovery_group(parts[1])
        return None

    def _openapi(self, path: str) -> None:
        """``/openapi/v3`` and one group-version's document (:mod:`.kubectl`)."""
        gv = path.rstrip("/").removeprefix("/openapi/v3").strip("/")
        registry = self.server.registry
        self._send_json(200, kubectl.openapi_document(registry, gv) if gv
                        else kubectl.openapi_index(registry))

    def _table(self, kind: Kind) -> bool:
        """Whether the request asks for a Table of a kind printed server-side."""
        return kind.printer_columns is not None and kubectl.wants_table(
            self.headers.get("Accept"))

    def _target(self, path: str) -> _Target:
        parts = [p for p in path.split("/") if p]
        if len(parts) >= 3 and parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 4 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError.not_found_path(f"the server could not find the requested resource "
                                          f"({path})")
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
            namespace, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise ApiError.not_found_path(f"the server could not find the requested resource "
                                          f"({path})")
        kind = self.server.registry.lookup(group, version, rest[0])
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if namespace is not None and not kind.namespaced:
            raise ApiError.not_found_path(f"{kind.plural} is not namespaced")
        if kind.namespaced and namespace is None and name is not None:
            raise ApiError.not_found_path(f"{kind.plural} is namespaced; the URL needs one")
        return _Target(kind, namespace, name, sub)

    # ----------------------------------------------------------------- verbs

    def _serve(self, method: str, t: _Target, query: dict[str, list[str]], body: Any) -> None:
        store = self.server.store
        if query.get("dryRun") or (isinstance(body, dict) and body.get("dryRun")):
            raise ApiError.bad_request("dryRun is not emulated")
        ns = t.namespace or ""
        if t.name is None:
            if method == "GET":
                if (_first(query, "watch") or "").lower() in ("true", "1"):
                    self._watch(t, query)
                    return
                selector = Selector.parse(_first(query, "labelSelector"),
                                          _first(query, "fieldSelector"), t.kind.key)
                items, rv = store.select(t.kind, t.namespace, selector)
                if self._table(t.kind):
                    self._send_json(200, kubectl.table(
                        items, t.kind, resource_version=str(rv),
                        include=_first(query, "includeObject")))
                    return
                self._send_json(200, {"kind": t.kind.list_kind, "apiVersion": t.kind.api_version,
                                      "metadata": {"resourceVersion": str(rv)}, "items": items})
            elif method == "POST":
                validation = _field_validation(query)
                self._send_json(201, store.create(t.kind, t.namespace, body,
                                                  validation=validation), validation.warnings)
            else:  # deletecollection is not emulated either

                raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on a collection")
            return
        if method == "GET":
            obj = store.get(t.kind, ns, t.name)
            if self._table(t.kind):
                obj = kubectl.table([obj], t.kind,
                                    resource_version=obj["metadata"]["resourceVersion"],
                                    include=_first(query, "includeObject"))
            self._send_json(200, obj)
        elif method == "PUT":
            validation = _field_validation(query)
            self._send_json(200, store.update(t.kind, ns, t.name, body, subresource=t.subresource,
                                              validation=validation),
                            validation.warnings)
        elif method == "PATCH":
            content_type = self.headers.get("Content-Type") or ""
            validation = _field_validation(query)
            self._send_json(200, store.patch(t.kind, ns, t.name, body, content_type,
                                             subresource=t.subresource,
                                             validation=validation), validation.warnings)
        elif method == "DELETE":
            self._delete(t, ns, t.name, query, body)
        else:
            raise ApiError(405, "MethodNotAllowed", f"{method} is not allowed on an object")

    @staticmethod
    def _delete_options(query: dict[str, list[str]], body: Any) -> dict[str, Any]:
        options: dict[str, Any] = dict(body) if isinstance(body, dict) else {}
        grace = _first(query, "gracePeriodSeconds")
        if grace is not None and options.get("gracePeriodSeconds") is None:
            options["gracePeriodSeconds"] = int(grace)
        policy = _first(query, "propagationPolicy")
        if policy and not options.get("propagationPolicy"):
            options["propagationPolicy"] = policy
        if options.get("orphanDependents") is True and not options.get("propagationPolicy"):
            options["propagationPolicy"] = "Orphan"
        return options

    def _delete(self, t: _Target, ns: str, name: str, query: dict[str, list[str]],
                body: Any) -> None:
        options = self._delete_options(query, body)
        grace = options.get("gracePeriodSeconds")
        obj, gone = self.server.store.delete(
            t.kind, ns, name, grace_period_seconds=None if grace is None else int(grace),
            propagation_policy=options.get("propagationPolicy"),
            preconditions=options.get("preconditions"))
        if t.kind.delete_returns_object or not gone:
            self._send_json(200 if gone else 202, obj)
            return
        meta = obj["metadata"]
        self._send_json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                              "status": "Success", "details": {
                                  "name": name, "group": t.kind.group, "kind": t.kind.plural,
                                  "uid": meta["uid"]}})

    # ----------------------------------------------------------------- watch

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _write_event(self, event_type: str, obj: Any) -> None:
        data = json.dumps({"type": event_type, "object": obj}).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    def _event_writer(self, kind: Kind,
                      query: dict[str, list[str]]) -> Callable[[str, Any], None]:
        """Writes watch events; asked for as a Table, each object becomes a one-row Table,
        with column definitions in the first only (handlers/response.go
        ``watchEmbeddedEncoder``)."""
        if not self._table(kind):
            return self._write_event
        include = _first(query, "includeObject")
        kubectl.table([], kind, resource_version="", include=include)  # 400 before the stream
        first = [True]

        def write(event_type: str, obj: Any) -> None:
            if event_type in ("ADDED", "MODIFIED", "DELETED"):
                obj = kubectl.table([obj], kind, resource_version=obj["metadata"].get(
                    "resourceVersion", ""), include=include, headers=first[0])
                first[0] = False
            self._write_event(event_type, obj)
        return write

    def _watch(self, t: _Target, query: dict[str, list[str]]) -> None:
        store = self.server.store
        selector = Selector.parse(_first(query, "labelSelector"), _first(query, "fieldSelector"),
                                  t.kind.key)
        rv_param = _first(query, "resourceVersion")
        timeout_param = _first(query, "timeoutSeconds")
        try:
            start_rv = None if rv_param in (None, "", "0") else int(str(rv_param))
            timeout = float(timeout_param) if timeout_param else None
        except ValueError as e:
            raise ApiError.bad_request(f"bad resourceVersion or timeoutSeconds: {e}") from e
        if _first(query, "sendInitialEvents"):  # streaming lists: nothing under test asks
            raise ApiError.bad_request("sendInitialEvents is not emulated")
        bookmarks = (_first(query, "allowWatchBookmarks") or "").lower() in ("true", "1")
        write = self._event_writer(t.kind, query)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        matches = _matcher(t, selector)
        try:
            if start_rv is None:
                items, rv = store.snapshot(t.kind, t.namespace, selector)
                for obj in items:
                    write("ADDED", obj)
            else:
                rv = start_rv
            deadline = None if timeout is None else time.monotonic() + timeout
            generation = self.server.watch_generation
            while not store.closed and generation == self.server.watch_generation:
                wait = WATCH_POLL_S
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        break
                try:
                    events = store.events_after(t.kind, rv, wait)
                except ApiError as e:
                    self._write_event("ERROR", e.status())
                    break
                if generation != self.server.watch_generation:
                    break  # ended: the resumed watch delivers these from the same version
                for event in events:
                    rv = event.rv
                    translated = _translate(event, matches)
                    if translated is not None:
                        write(translated, _versioned(t.kind, event.object))
                if not events and self._client_gone():
                    return
            if bookmarks and not store.closed:
                self._write_event("BOOKMARK", {"kind": t.kind.kind,
                                               "apiVersion": t.kind.api_version,
                                               "metadata": {"resourceVersion": str(rv)}})
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            return


def _versioned(kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
    if obj.get("apiVersion") == kind.api_version:
        return obj
    return {**obj, "apiVersion": kind.api_version}


def _matcher(t: _Target, selector: Selector) -> Callable[[dict[str, Any] | None], bool]:
    def matches(obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        if t.namespace is not None and obj["metadata"].get("namespace") != t.namespace:
            return False
        return selector.matches(obj)
    return matches


def _translate(event: WatchEvent,
               matches: Callable[[dict[str, Any] | None], bool]) -> str | None:
    """The event type a selective watcher sees: objects entering or leaving its selection
    arrive as ADDED / DELETED, as on a real server."""
    now, before = matches(event.object), matches(event.old)
    if event.type == "ADDED":
        return "ADDED" if now else None
    if event.type == "DELETED":
        return "DELETED" if now or before else None
    if now and before:
        return "MODIFIED"
    if now:
        return "ADDED"
    if before:
        return "DELETED"
    return None

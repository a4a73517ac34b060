"""A small typed door to the Kubernetes API: JSON objects in and out, our errors only.

Every request goes through the official client's ``ApiClient`` (its configuration, auth,
TLS and connection pool); objects are plain dicts so that manifests built by
:mod:`resumequal_operator.pytorchjob` go out unchanged. A failed request raises
:class:`resumequal.errors.ClusterError` (or a subclass naming the cause), chained ``from``
the client's exception; the message carries the HTTP status, the Status reason and at
most :data:`MESSAGE_LIMIT` characters of the Status message, never the response body.

    ClusterError
    ├── NotFound     404
    ├── Conflict     409 (AlreadyExists, or a stale resourceVersion)
    ├── Gone         410 (a watch's resourceVersion is too old: list again)
    └── InvalidName  a namespace, name or kind that is no path segment: never sent

Names become segments of the request's path; some come from places others write (a pod
name in a beacon, a name in a manifest), so :meth:`Kind.path` checks every segment itself
rather than trusting each caller to have: ``../secrets/x`` must not become another path.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as k8s  # type: ignore[import-untyped]
from kubernetes.client.exceptions import ApiException  # type: ignore[import-untyped]

from resumequal.errors import ClusterError

log = logging.getLogger(__name__)

Obj = dict[str, Any]
# A Status message names the object and the field at fault; anything longer is cut so
# that an echoed object (admission errors may quote it) never reaches a log whole.
MESSAGE_LIMIT = 300
_AUTH = ["BearerToken"]


class NotFound(ClusterError):
    """The object does not exist (404)."""


class Conflict(ClusterError):
    """The object exists already, or was changed since it was read (409)."""


class Gone(ClusterError):
    """The resourceVersion a watch started from is no longer available (410)."""


class InvalidName(ClusterError):
    """A namespace, name or kind that cannot be a segment of an API path; no request is
    sent for it."""


_BY_STATUS: dict[int, type[ClusterError]] = {404: NotFound, 409: Conflict, 410: Gone}

# What the API server accepts for each segment (k8s.io/apimachinery/pkg/util/validation):
# object names a DNS-1123 subdomain (every kind the operator touches), namespaces a
# DNS-1123 label; groups, versions, plurals and subresources are lowercase words. None
# admits '/', '..', '%' or an empty segment.
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_WORD = re.compile(r"[a-z][a-z0-9]*")
_MAX_NAME, _MAX_NAMESPACE = 253, 63


def _segment(what: str, value: object, pattern: re.Pattern[str], limit: int) -> str:
    if not isinstance(value, str) or len(value) > limit or not pattern.fullmatch(value):
        # Cut: the value may come from a file anyone with store access wrote.
        shown = repr(value)[:80]
        raise InvalidName(f"{what} {shown} is not a valid path segment (DNS-1123, at most "
                          f"{limit} characters); no request sent", status=400,
                          reason="Invalid")
    return value


@dataclass(frozen=True)
class Kind:
    """One API resource: group ('' for core), version, plural, whether namespaced."""

    group: str
    version: str
    plural: str
    namespaced: bool = True

    def __post_init__(self) -> None:
        if self.group:
            _segment("API group", self.group, _SUBDOMAIN, _MAX_NAME)
        _segment("API version", self.version, _WORD, _MAX_NAMESPACE)
        _segment("resource", self.plural, _WORD, _MAX_NAMESPACE)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None,
             sub: str | None = None) -> str:
        """The request path; InvalidName when a segment is not one."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{_segment('namespace', namespace, _LABEL, _MAX_NAMESPACE)}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{_segment(f'{self.plural} name', name, _SUBDOMAIN, _MAX_NAME)}"
        if sub is not None:
            base += f"/{_segment('subresource', sub, _WORD, _MAX_NAMESPACE)}"
        return base


QUALIFICATION_RUNS = Kind("resumequal.dev", "v1alpha1", "qualificationruns")
PYTORCHJOBS = Kind("kubeflow.org", "v1", "pytorchjobs")
TRAINJOBS = Kind("trainer.kubeflow.org", "v1alpha1", "trainjobs")
JOBS = Kind("batch", "v1", "jobs")
PODS = Kind("", "v1", "pods")
SECRETS = Kind("", "v1", "secrets")
EVENTS = Kind("", "v1", "events")
LEASES = Kind("coordination.k8s.io", "v1", "leases")
NETWORK_POLICIES = Kind("networking.k8s.io", "v1", "networkpolicies")


def _error(e: ApiException, what: str) -> ClusterError:
    status = int(e.status or 0)
    reason, message = str(e.reason or ""), ""
    try:
        body = json.loads(e.body or "{}")
        if isinstance(body, dict) and body.get("kind") == "Status":
            reason = str(body.get("reason") or reason)
            message = str(body.get("message") or "")
    except (TypeError, ValueError):
        pass  # not a Status: say nothing of the body
    if len(message) > MESSAGE_LIMIT:
        message = message[:MESSAGE_LIMIT] + "…"
    text = f"{what}: HTTP {status} {reason}" + (f": {message}" if message else "")
    return _BY_STATUS.get(status, ClusterError)(text, status=status, reason=reason)


# The verb (Kubernetes' names: get, list, create, update, patch, delete), the resource
# (plural, "/status" for the subresource) and the seconds one request took.
RequestObserver = Callable[[str, str, float], None]


def _resource(kind: Kind, sub: str | None) -> str:
    return f"{kind.plural}/{sub}" if sub else kind.plural


class Kube:
    """JSON requests against one API server, thread-safe (the client's pool is shared)."""

    def __init__(self, api_client: Any, request_timeout: float = 30.0,
                 observe: RequestObserver | None = None) -> None:
        self.api = api_client
        self.request_timeout = request_timeout
        # Told the verb, the resource and the seconds of every request but a watch (the
        # operator's request-duration histogram), answered or not.
        self.observe = observe

    @classmethod
    def from_configuration(cls, configuration: Any) -> Kube:
        return cls(k8s.ApiClient(configuration))

    def close(self) -> None:
        self.api.close()

    def _call(self, method: str, path: str, what: str, *, query: list[tuple[str, Any]] | None
              = None, body: Any = None, content_type: str = "application/json",
              timeout: float | None = None, verb: str = "", resource: str = "") -> Obj:
        start = time.perf_counter()
        try:
            return self._answer(method, path, what, query=query, body=body,
                                content_type=content_type, timeout=timeout)
        finally:
            if self.observe is not None and verb:
                self.observe(verb, resource, time.perf_counter() - start)

    def _answer(self, method: str, path: str, what: str, *,
                query: list[tuple[str, Any]] | None, body: Any, content_type: str,
                timeout: float | None) -> Obj:
        try:
            resp = self.api.call_api(
                path, method, query_params=query or [],
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body, auth_settings=_AUTH, _preload_content=False,
                _request_timeout=timeout or self.request_timeout,
            )
            data = resp.data
        except ApiException as e:
            raise _error(e, what) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise ClusterError(f"{what}: no answer from the API server ({type(e).__name__})"
                               ) from e
        try:
            out = json.loads(data or b"{}")
        except ValueError as e:
            raise ClusterError(f"{what}: the API server answered with something not JSON"
                               ) from e
        return out if isinstance(out, dict) else {}

    # -- verbs ---------------------------------------------------------------------------

    def get(self, kind: Kind, namespace: str | None, name: str) -> Obj:
        return self._call("GET", kind.path(namespace, name), f"get {kind.plural} {name}",
                          verb="get", resource=kind.plural)

    def list(self, kind: Kind, namespace: str | None = None, *, labels: str | None = None,
             fields: str | None = None) -> Obj:
        query = [(k, v) for k, v in (("labelSelector", labels), ("fieldSelector", fields))
                 if v]
        return self._call("GET", kind.path(namespace), f"list {kind.plural}", query=query,
                          verb="list", resource=kind.plural)

    def create(self, kind: Kind, namespace: str | None, obj: Obj) -> Obj:
        name = obj.get("metadata", {}).get("name") or obj.get("metadata", {}).get(
            "generateName", "")
        return self._call("POST", kind.path(namespace), f"create {kind.plural} {name}",
                          body=obj, verb="create", resource=kind.plural)

    def replace(self, kind: Kind, namespace: str | None, obj: Obj,
                sub: str | None = None) -> Obj:
        name = obj["metadata"]["name"]
        what = f"replace {kind.plural} {name}" + (f"/{sub}" if sub else "")
        return self._call("PUT", kind.path(namespace, name, sub), what, body=obj,
                          verb="update", resource=_resource(kind, sub))

    def patch(self, kind: Kind, namespace: str | None, name: str, patch: Any, *,
              sub: str | None = None) -> Obj:
        what = f"patch {kind.plural} {name}" + (f"/{sub}" if sub else "")
        return self._call("PATCH", kind.path(namespace, name, sub), what, body=patch,
                          content_type="application/merge-patch+json", verb="patch",
                          resource=_resource(kind, sub))

    def delete(self, kind: Kind, namespace: str | None, name: str, *,
               grace_seconds: int | None = None, propagation: str | None = None,
               uid: str | None = None) -> Obj:
        body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        if propagation is not None:
            body["propagationPolicy"] = propagation
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        return self._call("DELETE", kind.path(namespace, name), f"delete {kind.plural} {name}",
                          body=body, verb="delete", resource=kind.plural)

    def watch(self, kind: Kind, namespace: str | None, resource_version: str, *,
              timeout_seconds: int, labels: str | None = None,
              stop: threading.Event | None = None, on_open: Any = None) -> Iterator[Obj]:
        """Events after ``resource_version`` until the server ends the stream.

        An ERROR event with code 410 raises :class:`Gone`; ``on_open(response)`` receives
        the open response so that another thread can close it to stop the watch.
        """
        what = f"watch {kind.plural}"
        query = [("watch", "true"), ("resourceVersion", resource_version),
                 ("allowWatchBookmarks", "true"), ("timeoutSeconds", timeout_seconds)]
        if labels:
            query.append(("labelSelector", labels))
        try:
            resp = self.api.call_api(
                kind.path(namespace), "GET", query_params=query,
                header_params={"Accept": "application/json"}, auth_settings=_AUTH,
                _preload_content=False, _request_timeout=(10, timeout_seconds + 10),
            )
        except ApiException as e:
            raise _error(e, what) from e
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise ClusterError(f"{what}: no answer from the API server ({type(e).__name__})"
                               ) from e
        if on_open is not None:
            on_open(resp)
        try:
            buffer = b""
            for chunk in resp.stream(4096, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        obj = event.get("object") or {}
                        code = int(obj.get("code") or 0)
                        err = _BY_STATUS.get(code, ClusterError)
                        raise err(f"{what}: HTTP {code} {obj.get('reason', '')}", status=code,
                                  reason=str(obj.get("reason", "")))
                    yield event
                if stop is not None and stop.is_set():
                    return
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as e:
            if stop is not None and stop.is_set():
                return
            raise ClusterError(f"{what}: the stream broke ({type(e).__name__})") from e
        finally:
            resp.release_conn()

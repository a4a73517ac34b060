"""The cluster's API as the bisection needs it: QualificationRuns created, read, deleted.

:class:`RunsApi` is the narrow interface the cluster runner drives (tests stand a fake in
for it); :class:`KubernetesRunsApi` serves it with the official ``kubernetes`` client
(``resumequal[operator]``), imported only here and only for a bisection over images.
Every failure is a :class:`~resumequal.errors.ClusterError` naming the run and the HTTP
status with the API's Status message (clipped, redacted), never the response body.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from resumequal.errors import ClusterError, UsageError
from resumequal.redact import redact
from resumequal.words import clip

GROUP, VERSION, PLURAL = "resumequal.dev", "v1alpha1", "qualificationruns"
REQUEST_TIMEOUT_S = 30.0  # one request; the wait for a verdict is the runner's
Obj = dict[str, Any]


class RunsApi(Protocol):
    """QualificationRuns in a namespace; each method raises ClusterError on failure."""

    def create(self, namespace: str, body: Obj, *, dry_run: bool = False) -> Obj: ...

    def get(self, namespace: str, name: str) -> Obj | None:
        """The run, or None when it does not exist."""

    def delete(self, namespace: str, name: str) -> None:
        """Delete the run (its finalizer then removes what it made); gone already is fine."""


def _hint(status: int) -> str:
    """A few words that tell the usual causes apart."""
    if status == 404:
        return " (is the QualificationRun CRD installed, and the namespace there?)"
    if status in (401, 403):
        return " (the kubeconfig's user may not do this)"
    return ""


class KubernetesRunsApi:
    """:class:`RunsApi` over the official client's CustomObjectsApi."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client  # type: ignore[import-untyped]

        self.api_client = api_client
        self.objects = client.CustomObjectsApi(api_client)

    @property
    def server(self) -> str:
        return str(self.api_client.configuration.host)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException  # type: ignore[import-untyped]

        try:
            return fn(GROUP, VERSION, *args, _request_timeout=REQUEST_TIMEOUT_S, **kwargs)
        except ApiException as e:
            raise _error(e, what) from e
        except Exception as e:  # urllib3: refused, reset, timed out, TLS (no answer)
            raise ClusterError(f"{what}: no answer from the API server at {self.server}: "
                               f"{type(e).__name__}", status=0) from e

    def create(self, namespace: str, body: Obj, *, dry_run: bool = False) -> Obj:
        name = body.get("metadata", {}).get("name", "")
        extra = {"dry_run": "All"} if dry_run else {}
        created: Obj = self._call(f"create QualificationRun {namespace}/{name}",
                                  self.objects.create_namespaced_custom_object, namespace,
                                  PLURAL, body, **extra)
        return created

    def get(self, namespace: str, name: str) -> Obj | None:
        try:
            found: Obj = self._call(f"get QualificationRun {namespace}/{name}",
                                    self.objects.get_namespaced_custom_object, namespace,
                                    PLURAL, name)
        except ClusterError as e:
            if e.status == 404:
                return None
            raise
        return found

    def delete(self, namespace: str, name: str) -> None:
        try:
            self._call(f"delete QualificationRun {namespace}/{name}",
                       self.objects.delete_namespaced_custom_object, namespace, PLURAL, name)
        except ClusterError as e:
            if e.status != 404:
                raise


def _error(e: Any, what: str) -> ClusterError:
    """The API's answer in words: status, reason and the Status message, nothing else."""
    status, reason, message = int(e.status or 0), str(e.reason or ""), ""
    try:
        body = json.loads(e.body or "{}")
        if isinstance(body, dict) and body.get("kind") == "Status":
            reason = str(body.get("reason") or reason)
            message = clip(redact(str(body.get("message") or "")), 600)
    except (TypeError, ValueError):
        pass  # not a Status: say nothing of the body
    text = f"{what}: HTTP {status} {reason}" + (f": {message}" if message else "")
    return ClusterError(text + _hint(status), status=status, reason=reason)


def connect(kubeconfig: Path | None, context: str | None) -> KubernetesRunsApi:
    """A client from ``kubeconfig`` (default: ``$KUBECONFIG``, ``~/.kube/config``, else the
    pod's service account when run in a cluster). A kubeconfig that cannot be loaded, or
    a missing client, is a usage error: nothing was created."""
    try:
        from kubernetes import client, config
        from kubernetes.config.config_exception import (  # type: ignore[import-untyped]
            ConfigException,
        )
    except ImportError as e:
        raise UsageError("bisecting images on a cluster needs the kubernetes client: "
                         "pip install 'resumequal[operator]'") from e
    configuration = client.Configuration()
    try:
        if kubeconfig is None and context is None and _in_cluster():
            config.load_incluster_config(client_configuration=configuration)
        else:
            config.load_kube_config(config_file=str(kubeconfig) if kubeconfig else None,
                                    context=context, client_configuration=configuration)
    except (ConfigException, OSError, TypeError, ValueError) as e:
        where = kubeconfig or "the default kubeconfig"
        raise UsageError(f"--kubeconfig: cannot load {where}"
                         f"{f' (context {context})' if context else ''}: "
                         f"{clip(redact(str(e)), 300)}") from e
    return KubernetesRunsApi(client.ApiClient(configuration))


def _in_cluster() -> bool:
    import os

    from kubernetes.config.incluster_config import (  # type: ignore[import-untyped]
        SERVICE_HOST_ENV_NAME,
    )

    own = os.environ.get("KUBECONFIG") or (Path.home() / ".kube" / "config").exists()
    return SERVICE_HOST_ENV_NAME in os.environ and not own


__all__ = ["GROUP", "PLURAL", "VERSION", "KubernetesRunsApi", "RunsApi", "connect"]

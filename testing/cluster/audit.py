"""What service accounts asked of the local API server, from its audit log.

The API server records, at the ``Metadata`` level, every request a service account of the
audited namespaces makes, once answered (a watch once its response started): no body but a
pod delete's options (Secrets pass through here); the controllers' requests are left out. A test
reads the operator's requests as the authorizer saw them: verb, API group, resource with
its subresource, namespace, name and the answer's HTTP code.
Upstream: k8s.io/apiserver ``pkg/apis/audit/v1/types.go`` (Event, Policy).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml


def write_policy(path: Path, namespaces: tuple[str, ...]) -> Path:
    """An audit policy for the service accounts of ``namespaces`` (nothing when none)."""
    groups = [f"system:serviceaccounts:{n}" for n in namespaces]
    rules: list[dict[str, object]] = [{"level": "None"}]
    if namespaces:
        rules[:0] = [
            # A pod's delete with its options (the grace period of a kill).
            {"level": "Request", "userGroups": groups, "verbs": ["delete"],
             "resources": [{"group": "", "resources": ["pods"]}]},
            {"level": "Metadata", "userGroups": groups},
        ]
    path.write_text(yaml.safe_dump({
        "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
        # A watch is logged when its response starts (it may never complete while the
        # cluster runs); every other request once answered.
        "omitStages": ["RequestReceived", "Panic"], "rules": rules,
    }, sort_keys=False))
    return path


def log_path(root: Path) -> Path:
    return root / "logs" / "audit.log"


@dataclass(frozen=True)
class Request:
    """One answered request, as RBAC saw it."""

    user: str
    verb: str
    group: str
    resource: str  # with its subresource: qualificationruns/status
    namespace: str | None
    name: str | None
    code: int
    # The request's body where the policy keeps it (a pod's DeleteOptions), else None.
    body: dict[str, object] | None = None

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        return (f"{self.verb} {self.group or 'core'}/{self.resource} {self.name or ''}{where}"
                f" -> {self.code}")


def requests(root: Path, user: str) -> list[Request]:
    """Every resource request ``user`` made, in the order the server answered them."""
    out: list[Request] = []
    path = log_path(root)
    if not path.exists():
        return out
    seen: set[str] = set()
    for line in path.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef")
        if event.get("user", {}).get("username") != user or not ref \
                or event["auditID"] in seen:
            continue
        seen.add(event["auditID"])
        resource = "/".join(p for p in (ref.get("resource"), ref.get("subresource")) if p)
        out.append(Request(user, event["verb"], ref.get("apiGroup", ""), resource,
                           ref.get("namespace"), ref.get("name"),
                           int(event.get("responseStatus", {}).get("code", 0)),
                           event.get("requestObject")))
    return out

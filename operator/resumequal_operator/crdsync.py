"""The QualificationRun CRD brought up to date when the operator starts.

Helm installs a chart's ``crds/`` on ``helm install`` only, never on upgrade: after an
upgrade the API server would keep the old schema and prune every status field the new
operator writes, so the operator would rewrite its status on every reconcile. The CRD
carries a digest of its spec (:data:`~resumequal_operator.crd.DIGEST_ANNOTATION`); at
start-up the operator compares it with its own and, by policy, applies its CRD
(``apply``), refuses to start on a difference (``verify``) or does nothing (``skip``).
"""

from __future__ import annotations

import logging
from typing import Literal

from resumequal.errors import ClusterError, ResumequalError
from resumequal_operator.crd import CRD_NAME, DIGEST_ANNOTATION, build_crd
from resumequal_operator.kube import Conflict, Kind, Kube, NotFound, Obj

log = logging.getLogger(__name__)

CRDS = Kind("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
Policy = Literal["apply", "verify", "skip"]
ATTEMPTS = 3


class CRDMismatch(ResumequalError):
    """The installed CRD is missing or not this operator's, and may not be changed."""


def _digest(obj: Obj) -> str | None:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(DIGEST_ANNOTATION)
    return value if isinstance(value, str) else None


def ensure_crd(kube: Kube, policy: Policy) -> str:
    """Bring the CRD to this operator's version by ``policy``; what was done: ``current``,
    ``created``, ``updated`` or ``skipped``. CRDMismatch when it cannot be."""
    if policy == "skip":
        return "skipped"
    want = build_crd()
    digest = _digest(want)
    for _ in range(ATTEMPTS):
        try:
            have: Obj | None = kube.get(CRDS, None, CRD_NAME)
        except NotFound:
            have = None
        if have is not None and _digest(have) == digest:
            return "current"
        found = "not installed" if have is None else \
            f"installed with schema digest {_digest(have) or '(none)'}"
        if policy == "verify":
            raise CRDMismatch(f"CRD {CRD_NAME} is {found}; this operator needs {digest}: "
                              "apply charts/resumequal/crds/ (or run with --crd=apply)")
        try:
            if have is None:
                kube.create(CRDS, None, want)
                log.info("CRD %s created (schema digest %s)", CRD_NAME, digest)
                return "created"
            body = {**want, "metadata": {**have["metadata"], **want["metadata"],
                                         "resourceVersion": have["metadata"]["resourceVersion"]}}
            body["metadata"]["annotations"] = {
                **(have["metadata"].get("annotations") or {}), DIGEST_ANNOTATION: digest}
            kube.replace(CRDS, None, body)
            log.info("CRD %s updated: was %s, now %s", CRD_NAME, found, digest)
            return "updated"
        except Conflict:
            continue  # another replica got there first: look again
        except ClusterError as e:
            if e.status == 403:
                raise CRDMismatch(f"CRD {CRD_NAME} is {found} and this operator may not "
                                  f"change it ({e}); apply charts/resumequal/crds/ or grant "
                                  "the operator the chart's CRD role") from e
            raise
    raise CRDMismatch(f"CRD {CRD_NAME}: still changing under us after {ATTEMPTS} attempts")

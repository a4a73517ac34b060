"""``resumequal-operator render``: every object a QualificationRun would create, offline.

A platform team reviews (or a policy tool checks) exactly what the operator would submit —
each leg's PyTorchJob and the comparator Job — before applying a run. The objects are the
ones :class:`~resumequal_operator.backend.KubernetesBackend` builds, from the same
functions; only the run's uid, which the API server assigns, is a stand-in unless the
manifest carries one (``kubectl get qr NAME -o yaml | resumequal-operator render -``).
"""

from __future__ import annotations

from typing import Any

import yaml

from resumequal.plan import qualification_plan
from resumequal.results import run_uri
from resumequal_operator import pytorchjob
from resumequal_operator.kube import Obj
from resumequal_operator.resource import (
    API_VERSION,
    KIND,
    Problem,
    RunSpecError,
    parse_run_spec,
    qualification_spec,
)

# Stands in for metadata.uid, which only the API server assigns: it names the jobs
# (a hash of it) and the run location.
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"


def render_objects(run: Any, *, namespace: str | None = None) -> list[Obj]:
    """The leg PyTorchJobs (in launch order) and the comparator Job of one QualificationRun."""
    if not isinstance(run, dict):
        raise RunSpecError([Problem(path="(document)", message="must be a mapping")])
    problems = []
    if run.get("apiVersion") != API_VERSION:
        problems.append(Problem(path="apiVersion", message=f"must be {API_VERSION}, not "
                                f"{run.get('apiVersion')!r}"))
    if run.get("kind") != KIND:
        problems.append(Problem(path="kind", message=f"must be {KIND}, not "
                                f"{run.get('kind')!r}"))
    raw_meta = run.get("metadata")
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        problems.append(Problem(path="metadata.name", message="is required"))
    if problems or not isinstance(name, str):
        raise RunSpecError(problems)
    ns = namespace or meta.get("namespace") or "default"
    uid = meta.get("uid") or PLACEHOLDER_UID
    spec = parse_run_spec(run.get("spec"))
    uri = run_uri(spec.store.uri, ns, name, uid)
    plan = qualification_plan(qualification_spec(spec, uri))
    objects = [pytorchjob.leg_job(name, ns, uid, spec, leg, uri) for leg in plan.legs]
    objects.append(pytorchjob.comparator_job(name, ns, uid, spec, uri))
    return objects


def render_yaml(text: str, *, namespace: str | None = None) -> str:
    """Every object of every QualificationRun in a YAML stream, as one YAML stream."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise RunSpecError([Problem(path="(file)", message=f"not YAML: {e}")]) from e
    if not docs:
        raise RunSpecError([Problem(path="(file)", message="holds no QualificationRun")])
    out: list[Obj] = []
    for i, doc in enumerate(docs):
        try:
            out += render_objects(doc, namespace=namespace)
        except RunSpecError as e:
            if len(docs) == 1:
                raise
            raise RunSpecError([Problem(path=f"document {i + 1}: {p.path}", message=p.message)
                                for p in e.problems]) from e
    return yaml.dump_all(out, Dumper=_Dumper, sort_keys=False, default_flow_style=False)


class _Dumper(yaml.SafeDumper):
    """Objects share their label maps; a reviewer should read each object whole, without
    YAML anchors and aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True

"""``resumequal-operator render``: every object a QualificationRun would create, offline.

A platform team reviews (or a policy tool checks) exactly what the operator would submit —
the run's checkpoint key Secret, each leg's PyTorchJob or TrainJob (``spec.backend``, or
the operator's default) and the comparator Job — before
applying a run. The objects are the ones :class:`~resumequal_operator.backend.KubernetesBackend`
builds, from the same functions; only the run's uid, which the API server assigns, is a
stand-in unless the manifest carries one (``kubectl get qr NAME -o yaml |
resumequal-operator render -``), and the checkpoint key, which the operator draws at random
when it creates the Secret, is a fixed placeholder: no key is ever drawn or printed here.
The Secret's name, which the API server generates from its ``generateName``, is shown in
the pods' references as that prefix and :data:`PLACEHOLDER_NAME_SUFFIX`. Each leg's
NetworkPolicy precedes its job, and the zoom Job's precedes it, as the operator creates
them with ``--network-policies`` (its default).

A manifest is first judged against the CRD's schema as the API server would judge it
(:mod:`.openapi`), so a field ``kubectl apply`` refuses is refused here too.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import yaml

from resumequal.qualify.plan import qualification_plan
from resumequal.run.name import run_uri
from resumequal.spec.yamlread import YAMLInputError, load_yaml_all
from resumequal_operator import netpolicy, openapi, pytorchjob
from resumequal_operator.crd import open_api_schema
from resumequal_operator.kube import Obj
from resumequal_operator.legjobs import TrainerSettings, leg_jobs
from resumequal_operator.resource import API_VERSION, KIND, Backend
from resumequal_operator.validation import Problem, RunSpecError, parse_run_spec, qualification_spec

# Stands in for metadata.uid, which only the API server assigns: it names the jobs
# (a hash of it) and the run location.
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"
# Stands in for the checkpoint key, drawn at random by the operator when it creates the
# run's Secret (as base64 in the Secret's data, like the real key).
PLACEHOLDER_KEY = "<drawn at random by the operator when it creates this Secret>"
# Stands in for the five characters the API server appends to the Secret's generateName
# (from its alphabet, k8s.io/apimachinery/pkg/util/rand).
PLACEHOLDER_NAME_SUFFIX = "xxxxx"

# What the API server would accept as metadata.name (a DNS subdomain), namespace (a DNS
# label) and uid; each becomes a segment of the run location.
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_UID = re.compile(r"^[A-Za-z0-9-]{1,64}$")


def _bad(pattern: re.Pattern[str], value: Any, limit: int) -> bool:
    return not (isinstance(value, str) and len(value) <= limit and pattern.match(value))


def render_objects(run: Any, *, namespace: str | None = None,
                   default_backend: Backend = "pytorchjob",
                   trainer: TrainerSettings | None = None) -> list[Obj]:
    """The checkpoint key Secret (with :data:`PLACEHOLDER_KEY`), the legs' NetworkPolicies
    and PyTorchJobs or TrainJobs (in launch order) and the comparator Job of one
    QualificationRun, in the order the operator creates them; ``default_backend`` where
    the spec names none."""
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
    elif _bad(_NAME, name, 253):
        problems.append(Problem(path="metadata.name", message="must be a DNS subdomain "
                                "(lowercase letters, digits, '-' and '.')"))
    ns = namespace or meta.get("namespace") or "default"
    if _bad(_NAMESPACE, ns, 63):
        problems.append(Problem(path="metadata.namespace", message="must be a DNS label "
                                "(at most 63 lowercase letters, digits and '-')"))
    uid = meta.get("uid") or PLACEHOLDER_UID
    if _bad(_UID, uid, 64):
        problems.append(Problem(path="metadata.uid", message="must be a uid (letters, "
                                "digits and '-')"))
    if problems or not isinstance(name, str):
        raise RunSpecError(problems)
    run = openapi.admitted(run, _run_schema())
    problems = openapi.problems(run, _run_schema())
    if problems:
        raise RunSpecError(problems)
    raw = run.get("spec")
    if isinstance(raw, dict) and raw.get("backend") is None:
        raw = {**raw, "backend": default_backend}
    spec = parse_run_spec(raw)
    uri = run_uri(spec.store.uri, ns, name, uid)
    plan = qualification_plan(qualification_spec(spec, uri))
    legs = leg_jobs(spec.backend or default_backend, trainer)
    secret = pytorchjob.checkpoint_key_secret(name, ns, uid, PLACEHOLDER_KEY)
    key = secret["metadata"]["generateName"] + PLACEHOLDER_NAME_SUFFIX
    objects = [secret]
    for leg in plan.legs:
        objects += [netpolicy.leg_network_policy(name, ns, uid, leg.name),
                    legs.manifest(name, ns, uid, spec, leg, uri, key_secret=key)]
    objects.append(pytorchjob.comparator_job(name, ns, uid, spec, uri, key_secret=key))
    if spec.zoom == "onFail":  # created only when the verdict is FAIL
        objects += [netpolicy.zoom_network_policy(name, ns, uid),
                    pytorchjob.zoom_job(name, ns, uid, spec, uri, key_secret=key)]
    return objects


@functools.cache
def _run_schema() -> dict[str, Any]:
    # metadata is the server's own ObjectMeta (checked above), and the server ignores the
    # status of a run it creates (the status subresource).
    schema = open_api_schema()
    opened = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    schema["properties"] = {**schema["properties"], "metadata": opened, "status": opened}
    return schema


def render_yaml(text: str, *, namespace: str | None = None,
                default_backend: Backend = "pytorchjob",
                trainer: TrainerSettings | None = None) -> str:
    """Every object of every QualificationRun in a YAML stream, as one YAML stream."""
    try:
        docs = [d for d in load_yaml_all(text) if d is not None]
    except YAMLInputError as e:
        raise RunSpecError([Problem(path="(file)", message=str(e))]) from e
    if not docs:
        raise RunSpecError([Problem(path="(file)", message="holds no QualificationRun")])
    out: list[Obj] = []
    for i, doc in enumerate(docs):
        try:
            out += render_objects(doc, namespace=namespace, default_backend=default_backend,
                                  trainer=trainer)
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

"""Admission as a real API server would do it, for objects the operator creates.

- :func:`validate_pytorchjob`: against the openAPIV3Schema of Kubeflow's PyTorchJob CRD
  (training operator v1.9.0, the fixture), plus each pod template as a core/v1 Pod.
- :func:`validate_qualificationrun`: against the CRD the chart ships.
- :func:`validate_trainer`: Kubeflow Trainer v2 objects and JobSets as their webhooks do.
- :func:`validate_core`: core, batch, coordination and events objects with
  kubernetes-validate's strict schemas of Kubernetes ``K8S_VERSION``.

CRD schemas are OpenAPI v3 with Kubernetes extensions; they are read as JSON Schema draft 4
(boolean exclusive bounds) with ``nullable`` allowing null and ``x-kubernetes-int-or-string``
through its ``anyOf``. A field the schema does not declare is an error here: the real server
would prune it silently (or reject it under strict field validation), so the operator's
intent would be lost either way. Metadata is checked by Kubernetes' naming rules.

Every failure is an AssertionError that names the path, e.g. ``.spec.template.spec``.
"""

from __future__ import annotations

import functools
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[1]
# The training operator v1.9.0 release CRD (Apache-2.0), kept with the tests.
PYTORCHJOB_CRD = ROOT / "tests/crds/kubeflow.org_pytorchjobs.v1.9.0.yaml"
QUALIFICATIONRUN_CRD = ROOT / "charts/resumequal/crds/qualificationruns.resumequal.dev.yaml"
K8S_VERSION = "1.33"

Obj = dict[str, Any]

_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # DNS-1035
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# Kinds whose names end up in DNS labels (pods, services, job-name labels).
_DNS_LABEL_KINDS = frozenset({"PyTorchJob", "Job", "Service", "Namespace"})


class SchemaViolation(AssertionError):
    """A failed check; ``field`` is where (``spec.world.nnodes``), ``detail`` what is wrong.
    The tests' admission check (a validating webhook's, in their API proxy) quotes it when
    it refuses a write."""

    def __init__(self, message: str, field: str = "", detail: str = "") -> None:
        super().__init__(message)
        self.field, self.detail = field, detail or message


def _path(parts: Any) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out or "."


def crd_schema(crd: Mapping[str, Any], version: str | None = None) -> Obj:
    """The openAPIV3Schema of one version of a CRD (its storage version by default)."""
    versions = crd["spec"]["versions"]
    chosen = next(v for v in versions if (v["name"] == version if version else v["storage"]))
    return dict(chosen["schema"]["openAPIV3Schema"])


def as_json_schema(node: Any) -> Any:
    """A CRD schema node as JSON Schema draft 4: nullable fields accept null."""
    if not isinstance(node, dict):
        return node
    out: Obj = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: as_json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = as_json_schema(value)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [as_json_schema(sub) for sub in value]
        else:
            out[key] = value  # keywords and values (default, enum, x-kubernetes-*)
    if node.get("nullable") is True:
        if "type" in out:
            out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
        if "anyOf" in out:
            out["anyOf"] = [*out["anyOf"], {"type": "null"}]
    return out


def _unknown_fields(value: Any, schema: Mapping[str, Any], path: str) -> list[str]:
    """Paths of fields the structural schema does not declare (what pruning would drop)."""
    if schema.get("x-kubernetes-preserve-unknown-fields") or schema.get(
            "x-kubernetes-int-or-string"):
        return []
    found: list[str] = []
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            found += _unknown_fields(item, schema["items"], f"{path}[{i}]")
    elif isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, sub in value.items():
            where = f"{path}.{key}"
            if key in props:
                if key == "metadata" and not props[key].get("properties"):
                    continue  # ObjectMeta: the server's own schema, checked by _metadata
                found += _unknown_fields(sub, props[key], where)
            elif isinstance(extra, Mapping):
                found += _unknown_fields(sub, extra, where)
            elif extra is not True:
                found.append(where)
    return found


@functools.cache
def _crd_validator(path: Path) -> tuple[Obj, jsonschema.Draft4Validator]:
    schema = crd_schema(_load_crd(path))
    return schema, jsonschema.Draft4Validator(as_json_schema(schema))


def _validate_crd_object(obj: Obj, path: Path, what: str) -> None:
    schema, validator = _crd_validator(path)
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        where = _path(e.absolute_path)
        raise SchemaViolation(f"{what} invalid at {where}: {e.message}", where.lstrip("."),
                              e.message)
    unknown = _unknown_fields(obj, schema, "")
    if unknown:
        raise AssertionError(f"{what}: fields the schema does not declare (the API server "
                             f"would prune them): {', '.join(unknown)}")


def _metadata(obj: Obj, what: str, path: str = ".metadata") -> None:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise AssertionError(f"{what}: {path} missing")
    name = meta.get("name")
    if name is None and not meta.get("generateName"):
        raise AssertionError(f"{what}: {path}.name missing")
    if name is not None:
        rule = _DNS_LABEL if obj.get("kind") in _DNS_LABEL_KINDS else _DNS_SUBDOMAIN
        limit = 63 if rule is _DNS_LABEL else 253
        if not (isinstance(name, str) and rule.match(name) and len(name) <= limit):
            raise AssertionError(f"{what}: {path}.name {name!r} is not a valid name "
                                 f"({'DNS-1035 label' if limit == 63 else 'DNS subdomain'})")
    for key, value in (meta.get("labels") or {}).items():
        prefix, _, label = key.rpartition("/")
        if (len(label) > 63 or not _LABEL_NAME.match(label)
                or (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)))):
            raise AssertionError(f"{what}: {path}.labels key {key!r} is not a valid label key")
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            raise AssertionError(f"{what}: {path}.labels[{key}] value {value!r} is not a "
                                 "valid label value")
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        missing = [k for k in ("apiVersion", "kind", "name", "uid") if not ref.get(k)]
        if missing:
            raise AssertionError(f"{what}: {path}.ownerReferences[{i}] lacks {missing}")


@functools.cache
def _load_crd(path: Path) -> Obj:
    data: Obj = yaml.safe_load(path.read_text())
    return data


def validate_core(obj: Obj, version: str = K8S_VERSION) -> None:
    """A built-in object (core, batch, coordination, events ...) under strict schemas."""
    what = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')!r}"
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        where = _path(e.absolute_path)
        raise SchemaViolation(f"{what} invalid at {where}: {e.message}", where.lstrip("."),
                              e.message) from None
    except kubernetes_validate.SchemaNotFoundError as e:
        raise AssertionError(f"{what}: no schema for {obj.get('apiVersion')} "
                             f"{obj.get('kind')} in Kubernetes {version}") from e
    _metadata(obj, what)


def validate_pytorchjob(obj: Obj) -> None:
    """A kubeflow.org/v1 PyTorchJob, and each replica's pod template as a core/v1 Pod."""
    what = f"PyTorchJob {obj.get('metadata', {}).get('name')!r}"
    if obj.get("apiVersion") != "kubeflow.org/v1" or obj.get("kind") != "PyTorchJob":
        raise AssertionError(f"{what}: .apiVersion/.kind are {obj.get('apiVersion')}/"
                             f"{obj.get('kind')}, not kubeflow.org/v1/PyTorchJob")
    _validate_crd_object(obj, PYTORCHJOB_CRD, what)
    _metadata(obj, what)
    for rtype, replica in (obj["spec"].get("pytorchReplicaSpecs") or {}).items():
        template = replica.get("template") or {}
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"{obj['metadata']['name']}-{rtype.lower()}-0",
                            **{k: v for k, v in (template.get("metadata") or {}).items()
                               if k in ("labels", "annotations")}},
               "spec": template.get("spec") or {}}
        try:
            validate_core(pod)
        except AssertionError as e:
            raise AssertionError(f"{what}: .spec.pytorchReplicaSpecs.{rtype}.template as a "
                                 f"Pod: {e}") from None


def validate_qualificationrun(obj: Obj) -> None:
    """A QualificationRun against the CRD the chart ships."""
    what = f"QualificationRun {obj.get('metadata', {}).get('name')!r}"
    if obj.get("apiVersion") != "resumequal.dev/v1alpha1" or obj.get("kind") != "QualificationRun":
        raise AssertionError(f"{what}: .apiVersion/.kind are {obj.get('apiVersion')}/"
                             f"{obj.get('kind')}")
    _validate_crd_object(obj, QUALIFICATIONRUN_CRD, what)
    _metadata(obj, what)


TRAINER_KINDS = ("TrainJob", "TrainingRuntime", "ClusterTrainingRuntime", "JobSet")
# kubeflow/trainer pkg/constants: TorchRunReservedEnvNames (the torch plugin sets these)
# and the trainer's container and ancestor label.
RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                "PET_MASTER_PORT")
_ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
_NODE = "node"


def _trainer_models() -> dict[str, Any]:
    from kubeflow_trainer_api import models as m

    return {"TrainJob": m.TrainerV1alpha1TrainJob,
            "TrainingRuntime": m.TrainerV1alpha1TrainingRuntime,
            "ClusterTrainingRuntime": m.TrainerV1alpha1ClusterTrainingRuntime,
            "JobSet": m.JobsetV1alpha2JobSet}


def unknown_fields(model: Any, value: Any, path: str = "") -> list[str]:
    """Paths of ``value``'s keys that ``model`` (a generated kubeflow-trainer-api model)
    does not declare, recursively: what a strict decoder of the Go types would refuse."""
    if not isinstance(value, dict):
        return []
    fields = {f.alias or n: f.annotation for n, f in model.model_fields.items()}
    out = []
    for key, item in value.items():
        if key not in fields:
            out.append(f"{path}.{key}".lstrip("."))
            continue
        out += _unknown_in(fields[key], item, f"{path}.{key}")
    return out


def _unknown_in(annotation: Any, value: Any, path: str) -> list[str]:
    from pydantic import BaseModel

    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (list, typing.List) and isinstance(value, list):  # noqa: UP006
        return [e for i, item in enumerate(value) for e in _unknown_in(args[0], item,
                                                                       f"{path}[{i}]")]
    if origin in (dict, typing.Dict) and isinstance(value, dict):  # noqa: UP006
        return [e for k, item in value.items() for e in _unknown_in(args[1], item,
                                                                    f"{path}.{k}")]
    if args:  # Optional[X], Union
        return [e for a in args if a is not type(None) for e in _unknown_in(a, value, path)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel) \
            and annotation.__name__ != "IoK8sApimachineryPkgApisMetaV1ObjectMeta":
        return unknown_fields(annotation, value, path)
    return []


def trainer_problem(obj: Obj) -> str | None:
    """What the Trainer's and JobSet's validating webhooks refuse of ``obj``, or None: the
    kubeflow-trainer-api models, strictly; the torch plugin's reserved env names
    (trainer pkg/runtime/framework/plugins/torch/torch.go Validate, only with
    ``numProcPerNode``); a runtime's ancestor replicated jobs have ``replicas`` 1 and the
    trainer one a ``node`` container (pkg/webhooks/trainingruntime_webhook.go
    validateReplicatedJobs)."""
    kind = str(obj.get("kind"))
    if kind not in TRAINER_KINDS:
        return None
    model = _trainer_models()[kind]
    name = (obj.get("metadata") or {}).get("name", "")
    unknown = unknown_fields(model, obj)
    if unknown:
        return f"{kind} {name}: unknown field(s) {', '.join(unknown[:5])}"
    try:
        model.from_dict(obj)
    except ValueError as e:
        return f"{kind} {name}: {e}"
    spec = obj.get("spec") or {}
    if kind == "TrainJob":
        trainer = spec.get("trainer") or {}
        reserved = sorted({e["name"] for e in trainer.get("env") or []} & set(RESERVED_ENV))
        if trainer.get("numProcPerNode") is not None and reserved:
            return (f"spec.trainer.env: Invalid value: must not have reserved envs, invalid "
                    f"envs configured: {reserved}")
    if kind in ("TrainingRuntime", "ClusterTrainingRuntime"):
        for i, rjob in enumerate(((spec.get("template") or {}).get("spec") or {}).get(
                "replicatedJobs") or []):
            labels = (rjob["template"].get("metadata") or {}).get("labels") or {}
            if _ANCESTOR not in labels:
                continue
            where = f"spec.template.spec.replicatedJobs[{i}]"
            if rjob.get("replicas", 1) != 1:
                return f"{where}.replicas: Invalid value: always must be 1"
            containers = (((rjob["template"].get("spec") or {}).get("template") or {})
                          .get("spec") or {}).get("containers") or []
            if labels[_ANCESTOR] == "trainer" and not any(c.get("name") == _NODE
                                                           for c in containers):
                return (f"{where}: must contain the required container for the ancestor: "
                        f"trainer (a container named {_NODE})")
    return None


def validate_trainer(obj: Obj) -> None:
    """A Kubeflow Trainer v2 object (TrainJob, TrainingRuntime, ClusterTrainingRuntime) or a
    JobSet as the real webhooks check it (:func:`trainer_problem`); a runtime's or JobSet's
    Job templates also as batch/v1 Jobs under Kubernetes' strict schemas. The real
    Trainer and JobSet run in the cluster suite (tests/cluster)."""
    what = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')!r}"
    problem = trainer_problem(obj)
    if problem is not None:
        raise AssertionError(f"{what}: {problem}")
    _metadata(obj, what)
    spec = obj.get("spec") or {}
    jobset = spec if obj.get("kind") == "JobSet" else (spec.get("template") or {}).get("spec")
    for i, rjob in enumerate((jobset or {}).get("replicatedJobs") or []):
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": f"{obj['metadata']['name']}-{rjob['name']}-0",
                            **(rjob["template"].get("metadata") or {})},
               "spec": rjob["template"].get("spec") or {}}
        try:
            validate_core(job)
        except AssertionError as e:
            raise AssertionError(f"{what}: replicatedJobs[{i}].template as a Job: {e}") from None

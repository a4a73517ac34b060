"""Kubeflow Trainer v2 (TrainJob) and JobSet as upstream behaves, one reconcile at a time.

Paths are in kubeflow/trainer (v2.3) and kubernetes-sigs/jobset (v0.8); the Job controller
underneath is :mod:`.job_controller`, the kubelet :mod:`.kubelet`.

TrainJob (pkg/controller/trainjob_controller.go, pkg/runtime/core/trainingruntime.go,
pkg/runtime/framework/plugins/{jobset,torch}):

- The runtime is the namespace's ``TrainingRuntime`` or the ``ClusterTrainingRuntime``
  (``runtimeRef.kind``, default ClusterTrainingRuntime) named in ``runtimeRef``; a missing
  one fails the reconcile, which is retried (no condition).
- The JobSet has the TrainJob's name and namespace, the TrainJob as controller owner, and
  the labels and annotations of the runtime's template and the runtime patches only
  (newRuntimeInfo). Its spec is the runtime's JobSet spec with each ``runtimePatches[]``
  strategic-merged into the replicated job it names (mergeRuntimePatches); then, on the
  replicated job labelled ``trainer.kubeflow.org/trainjob-ancestor-step: trainer``:
  ``replicas`` 1, ``parallelism`` = ``completions`` = ``trainer.numNodes`` (else
  ``mlPolicy.numNodes``, else 1), and on its ``node`` container the trainer's image,
  command, args and resources replaced, its env upserted by name (builder.go Trainer),
  then the torch plugin's ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` (the
  completion index annotation), ``PET_MASTER_ADDR`` = ``<tj>-node-0-0.<tj>`` and
  ``PET_MASTER_PORT`` 29500, with container port 29500 (torch.go EnforceMLPolicy).
- A JobSet that exists is never re-applied (jobset.go Build, unless suspended: suspend is
  not simulated); a missing one is created again while the TrainJob has not finished.
- Status: the JobSet's ``Completed`` condition is copied as ``Complete``, ``Failed`` as
  ``Failed`` (reason and message as they are), ``jobsStatus`` from its
  ``replicatedJobsStatus``. ``activeDeadlineSeconds`` is a real timer from
  creationTimestamp (reconcileDeadline): past it the TrainJob is ``Failed`` with
  ``DeadlineExceeded`` and its JobSet deleted. A finished TrainJob is left alone.
- The validating webhooks: every object is checked against the kubeflow-trainer-api
  models (unknown fields refused, as a strict decoder would), the torch plugin's reserved
  env names (torch.go Validate: only when ``trainer.numProcPerNode`` is set), a runtime's
  ancestor replicated jobs have ``replicas`` 1 and the trainer one a ``node`` container
  (trainingruntime_webhook.go validateReplicatedJobs).

JobSet (pkg/controllers/jobset_controller.go, pkg/webhooks/jobset_webhook.go):

- Defaults (its mutating webhook, applied here when the Jobs are built): success policy
  All, ``completionMode: Indexed``, pod ``restartPolicy: OnFailure`` when unset, DNS host
  names on (pods get the JobSet's name as ``subdomain``).
- One Job per replica, ``<jobset>-<replicatedJob>-<index>``, controller-owned, with the
  jobset labels and annotations on the Job and its pod template (labelAndAnnotateObject).
- Success (All): every Job ``Complete`` → ``Completed`` (AllJobsCompleted, "jobset
  completed successfully"). Without a failurePolicy, one Job ``Failed`` → ``Failed``
  (FailedJobs, "jobset failed due to one or more job failures (first failed job: X)"); a
  finished JobSet deletes its remaining active Jobs (reconcile, deleteJobs: Foreground
  there, Background here, the emulator's only cascade).

Not simulated (refused): failure policies and restarts, suspend, coordinators, dependsOn,
startup policies other than AnyOrder, initializers, MPI; the headless Service (the emulator
serves no Services: pods reach each other on loopback, :mod:`.processes`).
"""

from __future__ import annotations

import hashlib
import time
import typing
from typing import Any

from pydantic import BaseModel

from .errors import ApiError
from .kubeflow import is_true, owner_reference
from .objects import clone, now_rfc3339, parse_rfc3339
from .store import Store

Obj = dict[str, Any]
CAUSE = "trainer"
TRAINER_GROUP = "trainer.kubeflow.org"
JOBSET_GROUP = "jobset.x-k8s.io"
TRAINJOB_KIND = f"trainjobs.{TRAINER_GROUP}"
JOBSET_KIND = f"jobsets.{JOBSET_GROUP}"
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
NODE = "node"  # constants.Node: the trainer container
MASTER_PORT = 29500  # constants.ContainerTrainerPort
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                "PET_MASTER_PORT")  # constants.TorchRunReservedEnvNames
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_NAME = "jobset.sigs.k8s.io/replicatedjob-name"


# ------------------------------------------------------------------- the CRDs and webhooks

def crd(group: str, kind: str, plural: str, *, namespaced: bool = True) -> Obj:
    """A CRD serving ``kind`` (v1alpha1 for trainer, v1alpha2 for jobset) with a status
    subresource; spec and status kept whole: the webhook checks them against the models."""
    version = "v1alpha2" if group == JOBSET_GROUP else "v1alpha1"
    loose = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "scope": "Namespaced" if namespaced else "Cluster",
                 "names": {"kind": kind, "plural": plural, "singular": kind.lower(),
                           "listKind": f"{kind}List"},
                 "versions": [{"name": version, "served": True, "storage": True,
                               "subresources": {"status": {}},
                               "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                   "apiVersion": {"type": "string"},
                                   "kind": {"type": "string"},
                                   "metadata": {"type": "object"},
                                   "spec": loose, "status": loose}}}}]}}


CRDS = (crd(TRAINER_GROUP, "TrainJob", "trainjobs"),
        crd(TRAINER_GROUP, "TrainingRuntime", "trainingruntimes"),
        crd(TRAINER_GROUP, "ClusterTrainingRuntime", "clustertrainingruntimes",
            namespaced=False),
        crd(JOBSET_GROUP, "JobSet", "jobsets"))


WEBHOOK_KINDS = ("TrainJob", "TrainingRuntime", "ClusterTrainingRuntime", "JobSet")


def _models() -> dict[str, type[BaseModel]]:
    from kubeflow_trainer_api import models as m

    return {"TrainJob": m.TrainerV1alpha1TrainJob,
            "TrainingRuntime": m.TrainerV1alpha1TrainingRuntime,
            "ClusterTrainingRuntime": m.TrainerV1alpha1ClusterTrainingRuntime,
            "JobSet": m.JobsetV1alpha2JobSet}


def unknown_fields(model: type[BaseModel], value: Any, path: str = "") -> list[str]:
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


def webhook(obj: Obj) -> str | None:
    """The trainer's and jobset's validating webhooks (module docstring): a message or None."""
    kind = obj.get("kind")
    # Called for these kinds only, as the webhooks' configurations name them (rules of the
    # trainer's and JobSet's ValidatingWebhookConfigurations): other objects do not load
    # the generated models (seconds of import, the emulator stalled meanwhile).
    if kind not in WEBHOOK_KINDS:
        return None
    model = _models()[str(kind)]
    name = (obj.get("metadata") or {}).get("name", "")
    unknown = unknown_fields(model, obj)
    if unknown:
        return f"{kind} {name}: unknown field(s) {', '.join(unknown[:5])}"
    try:
        model.from_dict(obj)  # type: ignore[attr-defined]
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
            if ANCESTOR not in labels:
                continue
            where = f"spec.template.spec.replicatedJobs[{i}]"
            if rjob.get("replicas", 1) != 1:
                return f"{where}.replicas: Invalid value: always must be 1"
            containers = (((rjob["template"].get("spec") or {}).get("template") or {})
                          .get("spec") or {}).get("containers") or []
            if labels[ANCESTOR] == "trainer" and not any(c.get("name") == NODE
                                                          for c in containers):
                return f"{where}: must have container with name - {NODE}"
    return None


# ------------------------------------------------------------------- runtime patches

# The patch strategy of the PodSpec fields a runtime patch can set (k8s.io/api core/v1
# types.go patchStrategy:"merge" patchMergeKey tags); anything else is replaced.
_MERGE_KEYS = {"containers": "name", "initContainers": "name", "env": "name",
               "volumes": "name", "volumeMounts": "mountPath", "imagePullSecrets": "name"}


def strategic_merge(base: Any, patch: Any, key: str = "") -> Any:
    """``patch`` strategic-merged into ``base`` for the fields of a JobTemplateSpec a
    runtime patch touches (apimachinery strategicpatch): maps merge, lists with a merge
    key merge element by element, other lists and values are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = clone(base)
        for k, v in patch.items():
            out[k] = strategic_merge(base[k], v, k) if k in base else clone(v)
        return out
    merge_key = _MERGE_KEYS.get(key)
    if merge_key and isinstance(base, list) and isinstance(patch, list):
        out_list = [clone(x) for x in base]
        for item in patch:
            at = next((i for i, x in enumerate(out_list)
                       if x.get(merge_key) == item.get(merge_key)), None)
            if at is None:
                out_list.append(clone(item))
            else:
                out_list[at] = strategic_merge(out_list[at], item)
        return out_list
    return clone(patch)


def _upsert_env(env: list[Obj], items: list[Obj]) -> list[Obj]:
    """apply.UpsertEnvVars: replace by name, else append."""
    out = [clone(e) for e in env]
    for item in items:
        at = next((i for i, e in enumerate(out) if e["name"] == item["name"]), None)
        if at is None:
            out.append(clone(item))
        else:
            out[at] = clone(item)
    return out


def jobset_for(trainjob: Obj, runtime: Obj) -> Obj:
    """The JobSet the Trainer builds for ``trainjob`` on ``runtime`` (module docstring)."""
    meta, spec = trainjob["metadata"], trainjob["spec"]
    template = clone(runtime["spec"].get("template") or {})
    labels = dict((template.get("metadata") or {}).get("labels") or {})
    annotations = dict((template.get("metadata") or {}).get("annotations") or {})
    js_spec = template.get("spec") or {}
    for patch in spec.get("runtimePatches") or []:
        tpatch = (patch.get("trainingRuntimeSpec") or {}).get("template") or {}
        labels |= (tpatch.get("metadata") or {}).get("labels") or {}
        annotations |= (tpatch.get("metadata") or {}).get("annotations") or {}
        for rpatch in (tpatch.get("spec") or {}).get("replicatedJobs") or []:
            for rjob in js_spec.get("replicatedJobs") or []:
                if rjob["name"] == rpatch["name"] and "template" in rpatch:
                    rjob["template"] = strategic_merge(rjob["template"], rpatch["template"])
    trainer = spec.get("trainer") or {}
    ml = runtime["spec"].get("mlPolicy") or {}
    nodes = int(trainer.get("numNodes") or ml.get("numNodes") or 1)
    for rjob in js_spec.get("replicatedJobs") or []:
        if ((rjob["template"].get("metadata") or {}).get("labels") or {}).get(
                ANCESTOR) != "trainer":
            continue
        rjob["replicas"] = 1
        job_spec = rjob["template"].setdefault("spec", {})
        job_spec["parallelism"] = job_spec["completions"] = nodes
        for c in job_spec["template"]["spec"]["containers"]:
            if c["name"] != NODE:
                continue
            for field in ("image", "command", "args"):
                if trainer.get(field) is not None:
                    c[field] = clone(trainer[field])
            if trainer.get("resourcesPerNode") is not None:
                c["resources"] = clone(trainer["resourcesPerNode"])
            c["env"] = _upsert_env(c.get("env") or [], trainer.get("env") or [])
            if ml.get("torch") is not None:
                name = meta["name"]
                c["env"] = _upsert_env(c["env"], [
                    {"name": "PET_NNODES", "value": str(nodes)},
                    {"name": "PET_NPROC_PER_NODE",
                     "value": str(trainer.get("numProcPerNode", 1))},
                    {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {
                        "fieldPath": f"metadata.annotations['{INDEX_ANNOTATION}']"}}},
                    {"name": "PET_MASTER_ADDR", "value": f"{name}-{NODE}-0-0.{name}"},
                    {"name": "PET_MASTER_PORT", "value": str(MASTER_PORT)}])
                if not any(p.get("containerPort") == MASTER_PORT for p in c.get("ports") or []):
                    c.setdefault("ports", []).append({"containerPort": MASTER_PORT,
                                                      "protocol": "TCP"})
    return {
        "apiVersion": f"{JOBSET_GROUP}/v1alpha2", "kind": "JobSet",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "labels": labels,
                     "annotations": annotations, "ownerReferences": [owner_reference(trainjob)]},
        "spec": js_spec,
    }


def _condition(status: Obj, ctype: str, reason: str, message: str) -> None:
    status["conditions"] = [c for c in status.get("conditions") or [] if c["type"] != ctype]
    status["conditions"].append({"type": ctype, "status": "True", "reason": reason,
                                 "message": message, "lastTransitionTime": now_rfc3339()})


class _Controller:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.jobs_kind = store.registry.lookup("batch", "v1", "jobs")

    def _kind(self, key: str) -> Any:
        return self.store.registry.resolve(key)

    def _write(self, kind: str, obj: Obj, status: Obj) -> None:
        if status == obj.get("status"):
            return
        meta = obj["metadata"]
        try:
            self.store.update(self._kind(kind), meta["namespace"], meta["name"],
                              {**obj, "status": status}, subresource="status")
        except ApiError as e:
            if e.code not in (404, 409):
                raise

    def _delete(self, kind: Any, obj: Obj) -> None:
        meta = obj["metadata"]
        try:
            self.store.delete(kind, meta["namespace"], meta["name"],
                              propagation_policy="Background", cause=CAUSE)
        except ApiError as e:
            if e.code != 404:
                raise


class TrainJobController(_Controller):
    """Reconciles TrainJobs into JobSets (module docstring)."""

    def reconcile(self, tj: Obj) -> None:
        meta, spec = tj["metadata"], tj["spec"]
        if meta.get("deletionTimestamp"):
            return
        if spec.get("suspend") or spec.get("initializer"):
            raise NotImplementedError(f"TrainJob {meta['name']}: suspend and initializers "
                                      "are not simulated")
        status = clone(tj.get("status") or {})
        if is_true(status, "Complete") or is_true(status, "Failed"):
            return
        jobset_kind = self._kind(JOBSET_KIND)
        try:
            js: Obj | None = self.store.get(jobset_kind, meta["namespace"], meta["name"])
        except ApiError as e:
            if e.code != 404:
                raise
            js = None
        deadline = spec.get("activeDeadlineSeconds")
        if deadline is not None and time.time() >= parse_rfc3339(
                meta["creationTimestamp"]) + float(deadline):
            _condition(status, "Failed", "DeadlineExceeded",
                       "TrainJob exceeded its active deadline")
            if js is not None:
                self._delete(jobset_kind, js)
            return self._write(TRAINJOB_KIND, tj, status)
        if js is None:
            ref = spec["runtimeRef"]
            runtime_kind = ref.get("kind") or "ClusterTrainingRuntime"
            plural = f"{runtime_kind.lower()}s.{TRAINER_GROUP}"
            # A missing runtime is the reconcile's error: retried, no condition.
            runtime = self.store.get(self._kind(plural), meta["namespace"]
                                     if runtime_kind == "TrainingRuntime" else "", ref["name"])
            js = self.store.create(jobset_kind, None, jobset_for(tj, runtime))
        js_status = js.get("status") or {}
        for c in js_status.get("conditions") or []:
            if c.get("status") == "True" and c["type"] in ("Completed", "Failed"):
                _condition(status, "Complete" if c["type"] == "Completed" else "Failed",
                           c.get("reason", ""), c.get("message", ""))
        status["jobsStatus"] = [clone(r) for r in js_status.get("replicatedJobsStatus") or []]
        self._write(TRAINJOB_KIND, tj, status)


class JobSetController(_Controller):
    """Reconciles JobSets into Jobs (module docstring)."""

    def reconcile(self, js: Obj) -> None:
        meta, spec = js["metadata"], js["spec"]
        if meta.get("deletionTimestamp"):
            return
        self._check_supported(js)
        status = clone(js.get("status") or {})
        owned, _ = self.store.select(self.jobs_kind, meta["namespace"], controller=meta["uid"])
        active = [j for j in owned if not (is_true(j.get("status") or {}, "Complete")
                                           or is_true(j.get("status") or {}, "Failed"))]
        if status.get("terminalState"):
            for job in active:
                self._delete(self.jobs_kind, job)
            return
        by_name = {j["metadata"]["name"]: j for j in owned}
        expected = 0
        for rjob in spec.get("replicatedJobs") or []:
            for index in range(int(rjob.get("replicas", 1))):
                expected += 1
                name = f"{meta['name']}-{rjob['name']}-{index}"
                if name not in by_name:
                    self._create_job(js, rjob, index, name)
        failed = [j for j in owned if is_true(j.get("status") or {}, "Failed")]
        complete = [j for j in owned if is_true(j.get("status") or {}, "Complete")]
        if failed:
            first = min(failed, key=lambda j: str(j["metadata"]["creationTimestamp"]))
            _condition(status, "Failed", "FailedJobs", "jobset failed due to one or more job "
                       f"failures (first failed job: {first['metadata']['name']})")
            status["terminalState"] = "Failed"
        elif len(complete) >= expected:
            _condition(status, "Completed", "AllJobsCompleted", "jobset completed successfully")
            status["terminalState"] = "Completed"
        status["replicatedJobsStatus"] = [self._counts(rjob["name"], owned)
                                          for rjob in spec.get("replicatedJobs") or []]
        self._write(JOBSET_KIND, js, status)

    @staticmethod
    def _check_supported(js: Obj) -> None:
        spec, name = js["spec"], js["metadata"]["name"]
        refused = [k for k in ("failurePolicy", "suspend", "coordinator") if spec.get(k)]
        if (spec.get("startupPolicy") or {}).get("startupPolicyOrder", "AnyOrder") != "AnyOrder":
            refused.append("startupPolicy InOrder")
        if (spec.get("successPolicy") or {}).get("operator", "All") != "All":
            refused.append("successPolicy Any")
        if any(r.get("dependsOn") for r in spec.get("replicatedJobs") or []):
            refused.append("dependsOn")
        if refused:
            raise NotImplementedError(f"JobSet {name}: {', '.join(refused)} not simulated")

    def _create_job(self, js: Obj, rjob: Obj, index: int, name: str) -> None:
        meta, spec = js["metadata"], js["spec"]
        replicas = int(rjob.get("replicas", 1))
        jobset_labels = {
            JOBSET_NAME: meta["name"], REPLICATED_JOB_NAME: rjob["name"],
            "jobset.sigs.k8s.io/restart-attempt": str((js.get("status") or {}).get(
                "restarts", 0)),
            "jobset.sigs.k8s.io/replicatedjob-replicas": str(replicas),
            "jobset.sigs.k8s.io/job-index": str(index),
            "jobset.sigs.k8s.io/job-key": hashlib.sha1(
                f"{meta['namespace']}/{name}".encode()).hexdigest(),
        }
        template = clone(rjob["template"])
        job_spec = template.setdefault("spec", {})
        job_spec.setdefault("completionMode", "Indexed")
        pod = job_spec.setdefault("template", {})
        pod_spec = pod.setdefault("spec", {})
        pod_spec.setdefault("restartPolicy", "OnFailure")
        network = spec.get("network") or {}
        if network.get("enableDNSHostnames", True):
            pod_spec["subdomain"] = network.get("subdomain") or meta["name"]
        for obj_meta in (template.setdefault("metadata", {}), pod.setdefault("metadata", {})):
            obj_meta["labels"] = {**(obj_meta.get("labels") or {}), **jobset_labels}
            obj_meta["annotations"] = {**(obj_meta.get("annotations") or {}), **jobset_labels}
        try:
            self.store.create(self.jobs_kind, None, {
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": name, "namespace": meta["namespace"],
                             "labels": template["metadata"]["labels"],
                             "annotations": template["metadata"]["annotations"],
                             "ownerReferences": [owner_reference(js)]},
                "spec": job_spec})
        except ApiError as e:
            if e.code != 409:
                raise

    @staticmethod
    def _counts(rjob: str, jobs: list[Obj]) -> Obj:
        mine = [j for j in jobs if j["metadata"]["labels"].get(REPLICATED_JOB_NAME) == rjob]

        def status(j: Obj) -> Obj:
            return j.get("status") or {}

        return {
            "name": rjob,
            "ready": sum(int(status(j).get("ready", 0)) + int(status(j).get("succeeded", 0))
                         >= int(j["spec"].get("parallelism", 1)) for j in mine),
            "succeeded": sum(is_true(status(j), "Complete") for j in mine),
            "failed": sum(is_true(status(j), "Failed") for j in mine),
            "active": sum(int(status(j).get("active", 0)) > 0 for j in mine),
            "suspended": 0,
        }


__all__ = ["CRDS", "JobSetController", "TrainJobController", "jobset_for", "webhook"]

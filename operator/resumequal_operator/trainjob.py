"""The legs of a QualificationRun as Kubeflow Trainer v2 TrainJobs (``spec.backend: trainjob``).

Pure functions from the resource to manifests, beside :mod:`.pytorchjob` (the comparator
and zoom Jobs and the checkpoint key Secret are the same for both backends). What Trainer
v2 does with a TrainJob, and why the manifests look as they do:

- A TrainJob names a runtime (``runtimeRef``); the Trainer builds a JobSet of the same
  name from the runtime's template, overriding the ``node`` container's image, command,
  args, resources and env from ``spec.trainer``, and setting the Job's parallelism and
  completions to ``numNodes`` (kubeflow/trainer pkg/runtime/framework/plugins/jobset/
  jobset.go ``Build``, builder.go ``Trainer``). One Indexed Job ``<trainjob>-node-0`` holds
  every node; its pods are ``<trainjob>-node-0-<index>-<random>`` with host name
  ``<trainjob>-node-0-<index>``, under the subdomain ``<trainjob>``.
- The torch plugin injects ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` and
  ``PET_MASTER_ADDR``/``PET_MASTER_PORT`` (plugins/torch/torch.go; reserved, so not set
  here) but no elastic launch: the c10d rendezvous comes through ``trainer.env``
  (``PET_RDZV_*`` pass through unchanged), on node 0 at torchrun's own c10d port, with the
  spec's timeouts in ``PET_RDZV_CONF`` as on a PyTorchJob.
- What a preemption needs cannot be patched into a runtime (runtimePatches reach only
  pod-level fields: ``JobSpecPatch`` has only ``template``): ``restartPolicy: Never``,
  ``podFailurePolicy`` (an exit 1-127 is the leg's own failure and fails the Job at once;
  a signal death, 128+N, is a preemption and is counted and replaced) and the
  ``backoffLimit``. So the chart ships a runtime of its own (:func:`leg_runtime`, rendered
  by the chart's ``trainingruntime.yaml``), and each TrainJob patches only the pod's
  placement and security in (``runtimePatches``, manager :data:`PATCH_MANAGER`).
- A deleted pod is replaced by the Job controller under a new name (same index and host
  name), about 10 s later (its pod failure backoff), and counts against the backoffLimit:
  kills target the pod by name and uid, and the index comes from the pod's
  ``batch.kubernetes.io/job-completion-index``.
- No elastic policy (removed in Trainer v2.2): a TrainJob cannot change its number of
  nodes, so a resize is refused on this backend (:mod:`.resource`).
- ``activeDeadlineSeconds`` on the TrainJob is a real timer (trainjob_controller.go
  ``reconcileDeadline``): past it the TrainJob fails and its JobSet is deleted.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from resumequal.qualify.plan import LegPlan
from resumequal_operator import pytorchjob
from resumequal_operator.resource import QualificationRunSpec

Obj = dict[str, Any]

GROUP = "trainer.kubeflow.org"
API_VERSION = f"{GROUP}/v1alpha1"
KIND = "TrainJob"
# The runtime's trainer container and replicated job (trainer pkg/constants Node, and the
# "node" replicated job the torch runtimes name).
CONTAINER = "node"
REPLICATED_JOB = "node"
# The label that marks a runtime's replicated job as the trainer step (constants.go
# LabelTrainJobAncestor / AncestorTrainer).
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_TRAINER = "trainer"
# Who owns the TrainJob's runtime patch (RuntimePatch.manager).
PATCH_MANAGER = "resumequal.dev/operator"
# What the Job controller and JobSet put on every pod (the completion index: an
# annotation always, a label with the PodIndexLabel gate, on by default since 1.28).
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
RuntimeKind = Literal["ClusterTrainingRuntime", "TrainingRuntime"]
DEFAULT_RUNTIME = "resumequal-leg"
DEFAULT_RUNTIME_KIND: RuntimeKind = "ClusterTrainingRuntime"
# Exit codes of a container ended by signal N (1..31), as container runtimes report them:
# a preemption, counted against the backoffLimit and replaced. Every other non-zero code
# (1-127 the leg's own failure, 128 a container that could not start) fails the Job.
SIGNAL_EXIT_CODES = tuple(range(129, 160))
DEFAULT_BACKOFF_LIMIT = 10


def node_job_name(trainjob: str) -> str:
    """The JobSet's one Job: ``<trainjob>-node-0`` (jobset GenJobName)."""
    return f"{trainjob}-{REPLICATED_JOB}-0"


def node_host(trainjob: str, index: int) -> str:
    """The host name of node ``index`` under the JobSet's subdomain (the TrainJob's name):
    what torch.go gives ``PET_MASTER_ADDR`` for node 0."""
    return f"{node_job_name(trainjob)}-{index}.{trainjob}"


def _rdzv_env(leg: LegPlan, name: str) -> list[Obj]:
    conf = pytorchjob.leg_rdzv_conf(leg)
    return [
        {"name": "PET_RDZV_BACKEND", "value": "c10d"},
        {"name": "PET_RDZV_ENDPOINT", "value": f"{node_host(name, 0)}:{pytorchjob.RDZV_PORT}"},
        {"name": "PET_RDZV_ID", "value": name},
        {"name": "PET_RDZV_CONF", "value": ",".join(f"{k}={v}" for k, v in conf.items())},
        {"name": "PET_MAX_RESTARTS", "value": str(leg.spec.world.max_restarts)},
    ]


def _pod_patch(spec: QualificationRunSpec, leg: LegPlan, meta_labels: dict[str, str]) -> Obj:
    """The pod-level fields a runtime patch may set (trainer PodSpecPatch): placement,
    security, the shm volume and the kill grace."""
    pod: Obj = {
        "securityContext": pytorchjob.merged(pytorchjob.POD_SECURITY_CONTEXT,
                                             spec.security.pod_security_context),
        "containers": [{
            "name": CONTAINER,
            "securityContext": pytorchjob.merged(pytorchjob.CONTAINER_SECURITY_CONTEXT,
                                                 spec.security.security_context),
            "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        }],
        "volumes": [{"name": "dshm", "emptyDir": {
            "medium": "Memory", "sizeLimit": spec.security.shm_size_limit}}],
        "terminationGracePeriodSeconds": math.ceil(leg.spec.preemption.grace_seconds),
        **pytorchjob.placement(spec),
    }
    return {"metadata": {"labels": meta_labels}, "spec": pod}


def leg_trainjob(run_name: str, namespace: str, uid: str, spec: QualificationRunSpec,
                 leg: LegPlan, run_uri: str, *, runtime: str = DEFAULT_RUNTIME,
                 runtime_kind: RuntimeKind = DEFAULT_RUNTIME_KIND,
                 key_secret: str | None = None) -> Obj:
    """The trainer.kubeflow.org/v1alpha1 TrainJob of one leg (its own spec is in the run
    location), on the runtime the chart installs."""
    w = leg.spec.world
    name = pytorchjob.leg_job_name(run_name, uid, leg.name)
    meta_labels = pytorchjob.labels(run_name, uid, leg.name)
    trainer: Obj = {
        "image": spec.stack.image,
        "command": pytorchjob.launch_command(leg),
        "args": pytorchjob.leg_args(leg, run_uri),
        "numNodes": w.nnodes,
        "numProcPerNode": w.nproc_per_node,
        "env": [*pytorchjob.leg_env(spec, run_name, uid, w.threads_per_rank, key_secret),
                *_rdzv_env(leg, name)],
    }
    resources = pytorchjob.resources(spec)
    if resources:
        trainer["resourcesPerNode"] = resources
    job_spec: Obj = {
        "runtimeRef": {"apiGroup": GROUP, "kind": runtime_kind, "name": runtime},
        "activeDeadlineSeconds": pytorchjob.leg_deadline_seconds(leg),
        "trainer": trainer,
        "runtimePatches": [{
            "manager": PATCH_MANAGER,
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{
                "name": REPLICATED_JOB,
                "template": {
                    "metadata": {"labels": meta_labels},
                    "spec": {"template": _pod_patch(spec, leg, meta_labels)},
                },
            }]}}},
        }],
    }
    return pytorchjob.owned_object(API_VERSION, KIND, name, namespace, run_name, uid,
                                   meta_labels, job_spec)


def leg_runtime(name: str = DEFAULT_RUNTIME, *, kind: RuntimeKind = DEFAULT_RUNTIME_KIND,
                namespace: str | None = None, image: str = "resumequal-worker",
                backoff_limit: int = DEFAULT_BACKOFF_LIMIT,
                labels: dict[str, str] | None = None) -> Obj:
    """The (Cluster)TrainingRuntime of qualification legs, as the chart renders it: the
    policies a preemption needs, which a TrainJob cannot patch in (module docstring).
    ``image`` is a placeholder: every TrainJob sets its own."""
    meta: Obj = {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch",
                                          **(labels or {})}}
    if kind == "TrainingRuntime":
        meta["namespace"] = namespace or "default"
    job_spec: Obj = {
        # Each preemption (a pod deleted, a node lost) counts once; the operator's own
        # timeouts end a run long before this is reached by anything else.
        "backoffLimit": backoff_limit,
        "podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {
                "containerName": CONTAINER, "operator": "NotIn",
                "values": list(SIGNAL_EXIT_CODES)}},
            # An eviction, a drained or lost node: a preemption, not counted.
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget",
                                                         "status": "True"}]},
        ]},
        "template": {"spec": {
            # A podFailurePolicy needs Never; a failed pod is replaced, never restarted in
            # place (a restarted container would keep the dead process's pod uid).
            "restartPolicy": "Never",
            # Nothing in a leg pod talks to the API server.
            "automountServiceAccountToken": False,
            "containers": [{
                "name": CONTAINER,
                "image": image,
                "ports": [{"name": "c10d", "containerPort": pytorchjob.RDZV_PORT,
                           "protocol": "TCP"}],
            }],
        }},
    }
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "metadata": meta,
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {"spec": {
                "replicatedJobs": [{
                    "name": REPLICATED_JOB,
                    "replicas": 1,
                    "template": {
                        "metadata": {"labels": {ANCESTOR_LABEL: ANCESTOR_TRAINER}},
                        "spec": job_spec,
                    },
                }],
            }},
        },
    }


__all__ = ["API_VERSION", "COMPLETION_INDEX", "KIND", "leg_runtime", "leg_trainjob",
           "node_host", "node_job_name"]

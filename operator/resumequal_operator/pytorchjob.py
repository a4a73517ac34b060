"""The objects a QualificationRun starts: one Kubeflow PyTorchJob per leg, one comparator Job.

Pure functions from the resource to manifests (plain dicts, as the API takes them); no I/O.
What the training operator v1.9 does with them is in the README's cluster section; the
choices below follow from it:

- Elastic PyTorchJob, Worker replicas only (one pod per node), c10d rendezvous on pod
  ``worker-0`` at the container port named ``pytorchjob-port`` — 29400, torchrun's own c10d
  port. min = max replicas: the world size is part of what is qualified, it must not shrink
  — except in a resize (``preemption.resize``, every leg of the run): min = ``toNodes``,
  max = ``world.nnodes`` (``PET_NNODES=min:max``), and the operator lowers the Worker
  replicas to shrink the world and raises them again to grow it (:mod:`.backend`).
  ``rdzvConf`` carries the spec's timeouts: torchrun's default 60 s store read timeout
  fails a worker whose pod starts a minute before worker-0's (uneven image pulls). A
  resize adds the local backend's rendezvous settings (:data:`resumequal.plan.
  NODE_KEEP_ALIVE`, :data:`resumequal.plan.RESIZE_LAST_CALL`): the deleted node leaves the
  rendezvous within seconds, and each re-rendezvous at the smaller size closes after 1 s.
- The container runs ``resumequal launch --mode M -- <torchrun args>``, not torchrun
  itself: torchrun exits 1 on SIGTERM, which the ``ExitCode`` policy treats as the leg's own
  failure and fails the whole job; the launcher exits 128+signal instead. In hard mode it
  SIGKILLs every process of the pod on SIGTERM, because the kubelet always sends SIGTERM
  first, even for a deletion with grace 0, and a hard kill must never save.
- ``restartPolicy: ExitCode`` (replica level; the training operator overwrites a
  template's restartPolicy, so the template has none): a pod whose container died of a
  signal (exit 128+) is recreated under the same name; an exit 1-127 is the leg's own
  failure (bad spec, a checkpoint that does not verify) and fails the job at once, with its
  reason in the store. No ``backoffLimit``: with ExitCode it is never applied.
- ``cleanPodPolicy: None``: an elastic PyTorchJob is Succeeded when its first worker
  succeeds, and ``Running`` would then delete ranks still writing their last trace
  segments and checkpoint. The operator judges a leg done from every rank's completion
  marker in the store and deletes the jobs itself.
- Deadlines: the training operator checks ``activeDeadlineSeconds`` only when an event
  arrives, so each pod carries its own (enforced by the kubelet); a pod killed by it is an
  event, on which the job's deadline fails the job. The operator's timeouts fire first.
- Pods meet the Pod Security "restricted" profile by default (``spec.security``).
- S3 credentials only as ``secretKeyRef`` to ``store.credentialsSecret``; never inlined.
- The checkpoint key (:mod:`resumequal.signing`) only as ``secretKeyRef`` to the run's own
  Secret (:func:`checkpoint_key_secret`: a random key, owned by the run so the garbage
  collector deletes it with the run), in the leg pods and the comparator alike.
  No Kubernetes API token is mounted: nothing in the pods talks to the API server.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from typing import Any

from resumequal.plan import (
    NODE_KEEP_ALIVE,
    RESIZE_LAST_CALL,
    LegPlan,
    leg_module_args,
    rdzv_conf,
)
from resumequal.signing import KEY_ENV
from resumequal.store import ADDRESSING_STYLE_ENV, SIGN_PAYLOADS_ENV
from resumequal_operator.resource import (
    API_VERSION,
    GPU_RESOURCES,
    KIND,
    QualificationRunSpec,
)

Obj = dict[str, Any]

CONTAINER = "pytorch"  # the training operator finds its port on the container of this name
RDZV_PORT = 29400
RDZV_PORT_NAME = "pytorchjob-port"
MANAGED_BY = "app.kubernetes.io/managed-by"
OPERATOR = "resumequal-operator"
COMPONENT = "app.kubernetes.io/component"
RUN_LABEL = "resumequal.dev/run"
UID_LABEL = "resumequal.dev/run-uid"
LEG_LABEL = "resumequal.dev/leg"
# The operator times legs out itself; the deadline only backstops an operator that is down.
DEADLINE_MARGIN_S = 60
COMPARATOR_DEADLINE_S = 1800
# Job names leave room for the training operator's "-worker-<index>" pod and service names,
# which are DNS-1035 labels (<= 63 characters) too.
MAX_JOB_NAME = 50
_NOT_DNS = re.compile(r"[^a-z0-9-]+")
SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
OPTIONAL_SECRET_KEYS = ("AWS_SESSION_TOKEN",)
# The data key of the checkpoint key in a run's Secret.
CHECKPOINT_KEY = "checkpoint-key"


def _digest(*parts: str, n: int = 8) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:n]


def _dns_name(readable: str, unique: tuple[str, ...], limit: int = MAX_JOB_NAME) -> str:
    """A DNS-1035 label: ``readable`` cleaned and cut to fit, then a hash of ``unique``."""
    suffix = _digest(*unique)
    base = _NOT_DNS.sub("-", readable.lower()).strip("-")
    base = base[: limit - len(suffix) - 1].rstrip("-")
    if not base or not base[0].isalpha():
        base = ("qr-" + base)[: limit - len(suffix) - 1].rstrip("-")
    return f"{base}-{suffix}"


def leg_job_name(run_name: str, uid: str, leg: str) -> str:
    """``<run>-<leg>-<hash>``: stable for one run and leg, new when the run is recreated."""
    return _dns_name(f"{run_name}-{leg}", (uid, "leg", leg))


def comparator_job_name(run_name: str, uid: str) -> str:
    """``<run>-compare-<hash>``, stable for one run."""
    return _dns_name(f"{run_name}-compare", (uid, "compare"))


def label_value(value: str) -> str:
    """A label value (<= 63 characters); a longer one is cut and made unique by a hash."""
    if len(value) <= 63:
        return value
    return f"{value[:54].rstrip('-_.')}-{_digest(value)}"


def labels(run_name: str, uid: str, leg: str | None = None) -> dict[str, str]:
    """Labels of everything a run creates; ``leg`` None for the comparator."""
    out = {
        MANAGED_BY: OPERATOR,
        "app.kubernetes.io/name": "resumequal",
        COMPONENT: "leg" if leg is not None else "comparator",
        RUN_LABEL: label_value(run_name),
        UID_LABEL: uid,
    }
    if leg is not None:
        out[LEG_LABEL] = leg
    return out


def owner_reference(run_name: str, uid: str) -> Obj:
    """The QualificationRun as controller owner: deleting it deletes what it started."""
    return {"apiVersion": API_VERSION, "kind": KIND, "name": run_name, "uid": uid,
            "controller": True, "blockOwnerDeletion": True}


def checkpoint_key_secret_name(run_name: str, uid: str) -> str:
    """``<run>-checkpoint-key-<hash>``: the run's Secret holding its checkpoint key."""
    return _dns_name(f"{run_name}-checkpoint-key", (uid, "checkpoint-key"), limit=63)


def checkpoint_key_secret(run_name: str, namespace: str, uid: str, key: str) -> Obj:
    """The v1 Secret holding a run's checkpoint ``key``, owned by the run."""
    meta_labels = labels(run_name, uid)
    meta_labels[COMPONENT] = "checkpoint-key"
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": checkpoint_key_secret_name(run_name, uid),
            "namespace": namespace,
            "labels": meta_labels,
            "ownerReferences": [owner_reference(run_name, uid)],
        },
        "type": "Opaque",
        "immutable": True,
        "data": {CHECKPOINT_KEY: base64.b64encode(key.encode()).decode()},
    }


def _env(spec: QualificationRunSpec, run_name: str, uid: str) -> list[Obj]:
    env: list[Obj] = [
        {"name": KEY_ENV, "valueFrom": {"secretKeyRef": {
            "name": checkpoint_key_secret_name(run_name, uid), "key": CHECKPOINT_KEY}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE",
         "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        # A recreated pod has the same name but a new uid: kills target the uid.
        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
    ]
    store = spec.store
    if store.credentials_secret:
        for key in SECRET_KEYS + OPTIONAL_SECRET_KEYS:
            ref: Obj = {"name": store.credentials_secret, "key": key}
            if key in OPTIONAL_SECRET_KEYS:
                ref["optional"] = True
            env.append({"name": key, "valueFrom": {"secretKeyRef": ref}})
    if store.endpoint_url:
        # S3 only: AWS_ENDPOINT_URL would also send STS (web identity) to the object store.
        env.append({"name": "AWS_ENDPOINT_URL_S3", "value": store.endpoint_url})
    if store.region:
        env += [{"name": "AWS_REGION", "value": store.region},
                {"name": "AWS_DEFAULT_REGION", "value": store.region}]
    if store.addressing_style != "auto":
        # botocore has no variable of its own for it; a worker reads this before it has a spec.
        env.append({"name": ADDRESSING_STYLE_ENV, "value": store.addressing_style})
    if store.sign_payloads:
        env.append({"name": SIGN_PAYLOADS_ENV, "value": "1"})  # the same: no spec yet
    return env


def resources(spec: QualificationRunSpec, gpus: bool) -> Obj:
    """The container's requests and limits (without GPUs where ``gpus`` is false)."""
    out: Obj = {}
    for kind in ("requests", "limits"):
        values = {k: v for k, v in getattr(spec.resources, kind).items()
                  if gpus or k not in GPU_RESOURCES}
        if values:
            out[kind] = values
    return out


# The Pod Security "restricted" profile (k8s.io/pod-security-admission policy checks);
# 65532 is the user of our images, and a training image that runs as root runs as it too.
POD_SECURITY_CONTEXT: Obj = {
    "runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT: Obj = {
    "allowPrivilegeEscalation": False, "privileged": False,
    "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def merged(default: Obj, override: Obj) -> Obj:
    """``override`` over ``default``, key by key (a security context over ours)."""
    return {**default, **override}


def _pod_spec(spec: QualificationRunSpec, container: Obj,
              restart_policy: str | None) -> Obj:
    # Workers and the comparator never call the Kubernetes API (IRSA and workload identity
    # bring their own token), so the pods carry no API credentials.
    container["securityContext"] = merged(CONTAINER_SECURITY_CONTEXT,
                                           spec.security.security_context)
    pod: Obj = {"containers": [container], "automountServiceAccountToken": False,
                "securityContext": merged(POD_SECURITY_CONTEXT,
                                           spec.security.pod_security_context)}
    if restart_policy is not None:
        pod["restartPolicy"] = restart_policy
    return pod | placement(spec)


def placement(spec: QualificationRunSpec) -> Obj:
    """The pod fields of where and as whom a run's pods run (those the run sets)."""
    pod: Obj = {}
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod["tolerations"] = [t.model_dump(mode="json", exclude_none=True)
                              for t in spec.tolerations]
    if spec.stack.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in spec.stack.image_pull_secrets]
    if spec.service_account_name:
        pod["serviceAccountName"] = spec.service_account_name
    return pod


def _container(spec: QualificationRunSpec, command: list[str], args: list[str], env: list[Obj],
               gpus: bool) -> Obj:
    c: Obj = {"name": CONTAINER, "image": spec.stack.image, "command": command, "args": args,
              "env": env}
    if spec.stack.image_pull_policy:
        c["imagePullPolicy"] = spec.stack.image_pull_policy
    needs = resources(spec, gpus)
    if needs:
        c["resources"] = needs
    return c


def leg_args(leg: LegPlan, run_uri: str) -> list[str]:
    """``-m resumequal leg --leg <leg> --run-dir <uri> [--omit X]...``: torchrun's arguments
    after its flags, which the training operator passes as ``PET_*`` variables."""
    return leg_module_args(leg.name, run_uri, omit=leg.omit)


def launch_command(leg: LegPlan) -> list[str]:
    """The leg container's command: our launcher around torchrun (module docstring)."""
    return ["resumequal", "launch", "--mode", leg.spec.preemption.mode, "--"]


def leg_env(spec: QualificationRunSpec, run_name: str, uid: str, threads: int) -> list[Obj]:
    """The env of a leg's container (either backend): the store's and the checkpoint key's,
    the pod's identity, and what torchrun needs beyond its ``PET_*`` flags."""
    return [*_env(spec, run_name, uid),
            {"name": "OMP_NUM_THREADS", "value": str(threads)},
            # A recreated pod (a replaced one, or a resize's grown one) never rejoins
            # otherwise: with the rendezvous store shared with the workers, the surviving
            # rank-0 agent keeps its first round's store address and never publishes it in
            # the new round, where the new agent waits for it
            # (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py, next_rendezvous).
            # Each round then gets a store of its own.
            {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"}]


def leg_deadline_seconds(leg: LegPlan) -> int:
    """The backstop deadline of a leg's job and of each of its pods."""
    return math.ceil(leg.spec.timeouts.leg_seconds) + DEADLINE_MARGIN_S


def leg_rdzv_conf(leg: LegPlan) -> dict[str, str]:
    """The leg's ``elasticPolicy.rdzvConf``: the spec's timeouts, and for a resize the
    keep-alive and last call of the local backend's node-by-node legs."""
    conf = rdzv_conf(leg.spec)
    if leg.spec.preemption.resize is not None:
        conf |= NODE_KEEP_ALIVE | RESIZE_LAST_CALL
    return conf


def min_replicas(leg: LegPlan) -> int:
    """``elasticPolicy.minReplicas``: ``toNodes`` for a resize (the reference leg's too: it
    runs the same elastic launch, never shrunk), else every node."""
    resize = leg.spec.preemption.resize
    return leg.spec.world.nnodes if resize is None else resize.to_nodes


def leg_job(run_name: str, namespace: str, uid: str, spec: QualificationRunSpec,
            leg: LegPlan, run_uri: str) -> Obj:
    """The kubeflow.org/v1 PyTorchJob of one leg (its own spec is in the run location)."""
    w = leg.spec.world
    name = leg_job_name(run_name, uid, leg.name)
    meta_labels = labels(run_name, uid, leg.name)
    env = leg_env(spec, run_name, uid, w.threads_per_rank)
    container = _container(spec, launch_command(leg), leg_args(leg, run_uri), env, gpus=True)
    container["ports"] = [{"name": RDZV_PORT_NAME, "containerPort": RDZV_PORT,
                           "protocol": "TCP"}]
    # NCCL and DataLoader workers use /dev/shm; a container's default is 64 MiB.
    container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    pod = _pod_spec(spec, container, None)
    pod["volumes"] = [{"name": "dshm", "emptyDir": {
        "medium": "Memory", "sizeLimit": spec.security.shm_size_limit}}]
    # A graceful kill deletes the pod with the spec's grace; cleanup uses the same.
    pod["terminationGracePeriodSeconds"] = math.ceil(leg.spec.preemption.grace_seconds)
    pod["activeDeadlineSeconds"] = leg_deadline_seconds(leg)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": meta_labels,
            "ownerReferences": [owner_reference(run_name, uid)],
        },
        "spec": {
            "nprocPerNode": str(w.nproc_per_node),
            "elasticPolicy": {
                "rdzvBackend": "c10d",
                "rdzvId": name,
                "rdzvConf": [{"key": k, "value": v}
                             for k, v in leg_rdzv_conf(leg).items()],
                "minReplicas": min_replicas(leg),
                "maxReplicas": w.nnodes,
                "maxRestarts": w.max_restarts,
            },
            "runPolicy": {
                "cleanPodPolicy": "None",
                "activeDeadlineSeconds": leg_deadline_seconds(leg),
            },
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": w.nnodes,
                    "restartPolicy": "ExitCode",
                    "template": {"metadata": {"labels": meta_labels}, "spec": pod},
                },
            },
        },
    }


def comparator_args(run_name: str, namespace: str, spec: QualificationRunSpec,
                    run_uri: str) -> list[str]:
    """``resumequal compare <uri> --write --pin <pin> --namespace <ns> --name <run>``."""
    return ["compare", run_uri, "--write", "--pin", spec.stack.effective_pin,
            "--namespace", namespace, "--name", run_name]


def comparator_job(run_name: str, namespace: str, uid: str, spec: QualificationRunSpec,
                   run_uri: str, *, ttl_seconds: int | None = None) -> Obj:
    """The batch/v1 Job that compares the finished legs and writes the verdict and reports.

    backoffLimit 0: the comparator is deterministic, and exit 1 (FAIL) or 2 (INVALID) are
    verdicts, written to the store before it exits, not failures to retry.
    """
    meta_labels = labels(run_name, uid)
    container = _container(spec, ["resumequal"],
                           comparator_args(run_name, namespace, spec, run_uri),
                           _env(spec, run_name, uid),
                           gpus=False)
    job_spec: Obj = {
        "backoffLimit": 0,
        "activeDeadlineSeconds": max(COMPARATOR_DEADLINE_S, math.ceil(spec.timeouts.leg_seconds)),
        "template": {
            "metadata": {"labels": meta_labels},
            "spec": _pod_spec(spec, container, "Never"),
        },
    }
    if ttl_seconds is not None:
        job_spec["ttlSecondsAfterFinished"] = ttl_seconds
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": comparator_job_name(run_name, uid),
            "namespace": namespace,
            "labels": meta_labels,
            "ownerReferences": [owner_reference(run_name, uid)],
        },
        "spec": job_spec,
    }


def zoom_job_name(run_name: str, uid: str) -> str:
    """``<run>-zoom-<hash>``, stable for one run."""
    return _dns_name(f"{run_name}-zoom", (uid, "zoom"))


def zoom_deadline_seconds(spec: QualificationRunSpec) -> int:
    """Two replays, each bounded by the leg timeout, and the comparison of their captures."""
    return 2 * math.ceil(spec.timeouts.leg_seconds) + COMPARATOR_DEADLINE_S


def zoom_job(run_name: str, namespace: str, uid: str, spec: QualificationRunSpec,
             run_uri: str, *, ttl_seconds: int | None = None) -> Obj:
    """The batch/v1 Job that replays a FAIL's first divergent step (``resumequal zoom``).

    Every rank of both replays runs in its one pod, with a leg pod's resources (GPUs
    included, so the replay runs on the device the legs did). backoffLimit 0: the replay
    is deterministic, and one that failed fails again.
    """
    meta_labels = labels(run_name, uid) | {COMPONENT: "zoom"}
    container = _container(spec, ["resumequal"],
                           ["zoom", run_uri, "--namespace", namespace],
                           _env(spec, run_name, uid), gpus=True)
    job_spec: Obj = {
        "backoffLimit": 0,
        "activeDeadlineSeconds": zoom_deadline_seconds(spec),
        "template": {
            "metadata": {"labels": meta_labels},
            "spec": _pod_spec(spec, container, "Never"),
        },
    }
    if ttl_seconds is not None:
        job_spec["ttlSecondsAfterFinished"] = ttl_seconds
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": zoom_job_name(run_name, uid),
            "namespace": namespace,
            "labels": meta_labels,
            "ownerReferences": [owner_reference(run_name, uid)],
        },
        "spec": job_spec,
    }

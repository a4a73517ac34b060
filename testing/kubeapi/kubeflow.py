"""What the Kubeflow training operator v1.9.0 writes for a PyTorchJob: pods, env, conditions.

Pure functions over dicts, each following the upstream file it names (paths in
kubeflow/training-operator at tag v1.9.0); :mod:`.training_operator` decides when to use
them. Master replicas are not simulated: the operator under test runs Worker-only
elastic jobs (a Master job is refused by :func:`check_supported`).
"""

from __future__ import annotations

from typing import Any

from .objects import clone, now_rfc3339

Obj = dict[str, Any]

JOB_NAME = "training.kubeflow.org/job-name"
REPLICA_TYPE = "training.kubeflow.org/replica-type"
REPLICA_INDEX = "training.kubeflow.org/replica-index"
OPERATOR_NAME = "training.kubeflow.org/operator-name"
JOB_ROLE = "training.kubeflow.org/job-role"
CONTAINER_NAME = "pytorch"  # kubeflowv1.PyTorchJobDefaultContainerName
PORT_NAME = "pytorchjob-port"  # kubeflowv1.PyTorchJobDefaultPortName
DEFAULT_PORT = 23456  # kubeflowv1.PyTorchJobDefaultPort
NO_EXIT_CODE = 0xBEEF  # pod.go: the "magic number" when the pytorch container has not ended
RESTART_POLICY_WARNING = ("SettedPodTemplateRestartPolicy",
                          "Restart policy in pod template will be overwritten by restart "
                          "policy in replica spec")


def with_defaults(job: Obj) -> Obj:
    """A copy with SetDefaults_PyTorchJob applied (pytorch_defaults.go): cleanPodPolicy None,
    replicas 1, restartPolicy OnFailure, the default port, min/max replicas, nprocPerNode."""
    job = clone(job)
    spec = job.setdefault("spec", {})
    spec.setdefault("runPolicy", {}).setdefault("cleanPodPolicy", "None")
    for rspec in (spec.get("pytorchReplicaSpecs") or {}).values():
        rspec.setdefault("replicas", 1)
        rspec.setdefault("restartPolicy", "OnFailure")
        for c in ((rspec.setdefault("template", {}).setdefault("spec", {}))
                  .get("containers") or []):
            if c.get("name") == CONTAINER_NAME and not any(
                    p.get("name") == PORT_NAME for p in c.get("ports") or []):
                c.setdefault("ports", []).append(
                    {"name": PORT_NAME, "containerPort": DEFAULT_PORT, "protocol": "TCP"})
    elastic = spec.get("elasticPolicy")
    if elastic is not None:
        workers = (spec.get("pytorchReplicaSpecs") or {}).get("Worker", {}).get("replicas")
        elastic.setdefault("minReplicas", elastic.get("maxReplicas", workers))
        elastic.setdefault("maxReplicas", elastic["minReplicas"])
    # setDefaultNprocPerNode: "auto" unless the deprecated elasticPolicy.nProcPerNode is set.
    if elastic is None or elastic.get("nProcPerNode") is None:
        spec.setdefault("nprocPerNode", "auto")
    return job


def check_supported(job: Obj) -> None:
    """Refuse what the simulation does not reproduce (rather than reproduce it wrongly)."""
    if "Master" in (job["spec"].get("pytorchReplicaSpecs") or {}):
        raise NotImplementedError("PyTorchJob Master replicas are not simulated")


def webhook(obj: Obj) -> tuple[str | None, list[str]]:
    """The validating webhook (webhooks/pytorch/pytorchjob_webhook.go): an error message or
    None, and the admission warnings (the deprecated elasticPolicy.nProcPerNode, ~102-105)."""
    spec = obj.get("spec") or {}
    replicas = spec.get("pytorchReplicaSpecs") or {}
    if not replicas:
        return "spec.pytorchReplicaSpecs: Required value", []
    for rtype, rspec in replicas.items():
        if rtype not in ("Master", "Worker"):
            return f"spec.pytorchReplicaSpecs: unsupported replica type {rtype!r}", []
        containers = (((rspec or {}).get("template") or {}).get("spec") or {}).get(
            "containers") or []
        if not any(c.get("name") == CONTAINER_NAME for c in containers):
            return (f"spec.pytorchReplicaSpecs[{rtype}].template.spec.containers: there is "
                    f"no container named {CONTAINER_NAME}"), []
        if rtype == "Master" and (rspec or {}).get("replicas", 1) != 1:
            return "spec.pytorchReplicaSpecs[Master].replicas: must be 1", []
    warnings = []
    if (spec.get("elasticPolicy") or {}).get("nProcPerNode") is not None:
        warnings.append("spec.elasticPolicy.nProcPerNode is deprecated, use "
                        "spec.nprocPerNode instead")
    return None, warnings


def set_condition(status: Obj, ctype: str, reason: str, message: str) -> None:
    """UpdateJobConditions (pkg/util/status.go setCondition, filterOutCondition): nothing
    changes once Failed; Running and Restarting replace each other; Succeeded/Failed turn
    Running False; the new condition goes last."""
    conditions = status.get("conditions") or []
    if any(c["type"] == "Failed" and c["status"] == "True" for c in conditions):
        return
    now = now_rfc3339()
    current = next((c for c in conditions if c["type"] == ctype), None)
    if current and current["status"] == "True" and current["reason"] == reason:
        return
    out = []
    for c in conditions:
        if c["type"] == ctype or {c["type"], ctype} == {"Running", "Restarting"}:
            continue
        if ctype in ("Succeeded", "Failed") and c["type"] == "Running":
            c = {**c, "status": "False"}
        out.append(c)
    out.append({"type": ctype, "status": "True", "reason": reason, "message": message,
                "lastUpdateTime": now, "lastTransitionTime": now})
    status["conditions"] = out


def is_true(status: Obj, ctype: str) -> bool:
    """Whether ``status.conditions`` holds ``ctype`` with status True."""
    return any(c.get("type") == ctype and c.get("status") == "True"
               for c in status.get("conditions") or [])


def retryable(exit_code: int) -> bool:
    """IsRetryableExitCode (pkg/util/train/train_util.go): 128 and up (a signal) only."""
    return exit_code >= 128


def exit_code(pod: Obj) -> int:
    """The exit code of the ``pytorch`` container, 0xbeef while it has none (common/pod.go)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated")
        if cs.get("name") == CONTAINER_NAME and terminated:
            return int(terminated.get("exitCode", 0))
    return NO_EXIT_CODE


def pod_name(job_name: str, rtype: str, index: int) -> str:
    """``<job>-<replica type>-<index>`` (replicaName, pytorch/envvar.go)."""
    return f"{job_name}-{rtype.lower()}-{index}"


def port(rspec: Obj) -> int:
    """The ``pytorchjob-port`` of the ``pytorch`` container (getPortFromPyTorchJob)."""
    for c in ((rspec.get("template") or {}).get("spec") or {}).get("containers") or []:
        if c.get("name") == CONTAINER_NAME:
            for p in c.get("ports") or []:
                if p.get("name") == PORT_NAME:
                    return int(p["containerPort"])
    raise ValueError("port not found")


def env(job: Obj) -> list[Obj]:
    """setPodEnv (pytorch/envvar.go) for a Worker-only job, in its order, then the elastic
    variables of ElasticEnvVarGenerator (pytorch/elastic.go)."""
    spec, name = job["spec"], job["metadata"]["name"]
    workers = spec["pytorchReplicaSpecs"]["Worker"]
    out: list[Obj] = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    if spec.get("nprocPerNode") is not None:
        out.append({"name": "PET_NPROC_PER_NODE", "value": str(spec["nprocPerNode"])})
    elastic = spec.get("elasticPolicy")
    if elastic is None:
        return [*out, {"name": "PET_NNODES", "value": str(workers["replicas"])}]
    host = elastic.get("rdzvHost") or f"{name}-worker-0"
    rdzv_port = elastic.get("rdzvPort") or port(workers)
    out += [{"name": "PET_RDZV_ENDPOINT", "value": f"{host}:{rdzv_port}"},
            {"name": "PET_RDZV_BACKEND", "value": elastic.get("rdzvBackend") or "c10d"},
            # generateEnvNNodes (elastic.go): min:max, both set by the defaults above.
            {"name": "PET_NNODES", "value": f"{elastic['minReplicas']}:{elastic['maxReplicas']}"}]
    if elastic.get("maxRestarts") is not None:
        out.append({"name": "PET_MAX_RESTARTS", "value": str(elastic["maxRestarts"])})
    if elastic.get("nProcPerNode") is not None:  # deprecated, still injected after the above
        out.append({"name": "PET_NPROC_PER_NODE", "value": str(elastic["nProcPerNode"])})
    if elastic.get("rdzvId") is not None:
        out.append({"name": "PET_RDZV_ID", "value": str(elastic["rdzvId"])})
    if elastic.get("rdzvConf") is not None:
        out.append({"name": "PET_RDZV_CONF", "value": ",".join(
            f"{c['key']}={c['value']}" for c in elastic["rdzvConf"])})
    if elastic.get("standalone"):
        out.append({"name": "PET_STANDALONE", "value": ""})
    return out


def owner_reference(job: Obj) -> Obj:
    """A controller ownerReference to ``job`` (a PyTorchJob or a batch Job)."""
    return {"apiVersion": job["apiVersion"], "kind": job["kind"],
            "name": job["metadata"]["name"], "uid": job["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


def replica_pod(job: Obj, rtype: str, index: int) -> tuple[Obj, bool]:
    """createNewPod (common/pod.go): the template with the operator's labels (worker-0 as
    master when there is no Master replica: IsMasterRole, pytorchjob_controller.go ~499-506),
    env, and the replica's restartPolicy; and whether the template set one of its own
    (SetPodTemplateRestartPolicy warns, common/pod.go ~428-434)."""
    rspec = job["spec"]["pytorchReplicaSpecs"][rtype]
    template = clone(rspec.get("template") or {})
    pod_spec = template.get("spec") or {}
    name = job["metadata"]["name"]
    labels = {**((template.get("metadata") or {}).get("labels") or {}),
              OPERATOR_NAME: "pytorchjob-controller", JOB_NAME: name,
              REPLICA_TYPE: rtype.lower(), REPLICA_INDEX: str(index)}
    if rtype == "Worker" and index == 0:
        labels[JOB_ROLE] = "master"
    injected = env(job)
    for container in pod_spec.get("containers") or []:
        container["env"] = [*(container.get("env") or []), *clone(injected)]
    overridden = bool(pod_spec.get("restartPolicy"))
    policy = rspec["restartPolicy"]  # core.SetRestartPolicy: ExitCode pods are Never
    pod_spec["restartPolicy"] = "Never" if policy == "ExitCode" else policy
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": pod_name(name, rtype, index), "namespace": job["metadata"]["namespace"],
        "labels": labels, "annotations": dict((template.get("metadata") or {}).get(
            "annotations") or {}),
        "ownerReferences": [owner_reference(job)]}, "spec": pod_spec}, overridden


def count_pod(counts: Obj, pod: Obj) -> None:
    """updateJobReplicaStatuses (pkg/core/status.go ~34-41): a Running pod with a
    deletionTimestamp counts as failed; Pending pods are not counted."""
    phase = (pod.get("status") or {}).get("phase")
    if phase == "Running":
        key = "failed" if pod["metadata"].get("deletionTimestamp") else "active"
    elif phase in ("Succeeded", "Failed"):
        key = phase.lower()
    else:
        return
    counts[key] = counts.get(key, 0) + 1  # zero counts are omitted (omitempty)

"""What the Kubeflow training operator v1.9 writes: PyTorchJob pods, services, env, conditions.

Pure functions over dicts; :mod:`training` decides when to use them.
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
DEFAULT_PORT = 23456
PORT_NAME = "pytorchjob-port"
CONTAINER_NAME = "pytorch"
REPLICA_TYPES = ("Master", "Worker")


def set_condition(conditions: list[Obj], ctype: str, reason: str, message: str,
                  *, probe_key: str = "lastUpdateTime") -> list[Obj]:
    """The operator's setCondition: Running and Restarting replace each other, Succeeded and
    Failed turn Running false, the new condition goes last (printer columns read the last)."""
    now = now_rfc3339()
    for c in conditions:
        if c.get("type") == ctype and c.get("status") == "True" and c.get("reason") == reason:
            return conditions
    out = []
    for c in conditions:
        if c.get("type") == ctype or {c.get("type"), ctype} == {"Running", "Restarting"}:
            continue
        if ctype in ("Succeeded", "Failed", "Complete") and c.get("type") == "Running":
            c = {**c, "status": "False", probe_key: now, "lastTransitionTime": now}
        out.append(c)
    out.append({"type": ctype, "status": "True", "reason": reason, "message": message,
                probe_key: now, "lastTransitionTime": now})
    return out


def is_true(status: Obj, ctype: str) -> bool:
    """Whether ``status.conditions`` holds ``ctype`` with status True."""
    return any(c.get("type") == ctype and c.get("status") == "True"
               for c in status.get("conditions") or [])


def validate_pytorchjob(obj: Obj) -> str | None:
    """The operator's validating webhook: replica types, a ``pytorch`` container, one Master."""
    if obj.get("kind") != "PyTorchJob":
        return None
    replicas = (obj.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    if not replicas:
        return "spec.pytorchReplicaSpecs: Required value"
    for rtype, rspec in replicas.items():
        if rtype not in REPLICA_TYPES:
            return f"spec.pytorchReplicaSpecs: unsupported replica type {rtype!r}"
        containers = (((rspec or {}).get("template") or {}).get("spec") or {}).get(
            "containers") or []
        if not any(c.get("name") == CONTAINER_NAME for c in containers):
            return (f"spec.pytorchReplicaSpecs[{rtype}].template.spec.containers: there is "
                    f"no container named {CONTAINER_NAME}")
        if rtype == "Master" and (rspec or {}).get("replicas", 1) != 1:
            return "spec.pytorchReplicaSpecs[Master].replicas: must be 1"
    return None


def replicas(job: Obj) -> list[tuple[str, int]]:
    """(replica type, index) of every pod the job wants, Master first."""
    specs = job["spec"].get("pytorchReplicaSpecs") or {}
    return [(rtype, i) for rtype in REPLICA_TYPES if (rspec := specs.get(rtype))
            for i in range(int(rspec.get("replicas", 1)))]


def pod_name(job_name: str, rtype: str, index: int) -> str:
    """``<job>-<replica type>-<index>``, as the operator names pods and services."""
    return f"{job_name}-{rtype.lower()}-{index}"


def retryable(job: Obj, rtype: str, exit_code: int) -> bool:
    """Whether the replica's restartPolicy restarts a container that exited ``exit_code``."""
    rspec = (job["spec"].get("pytorchReplicaSpecs") or {}).get(rtype.capitalize()) or {}
    policy = rspec.get("restartPolicy", "Never")
    if policy == "ExitCode":
        return exit_code >= 128  # killed by a signal: retryable; the program's own error: not
    return policy in ("OnFailure", "Always")


def port(rspec: Obj) -> int:
    """The container port named ``pytorchjob-port`` of the ``pytorch`` container, or 23456."""
    for c in ((rspec.get("template") or {}).get("spec") or {}).get("containers") or []:
        if c.get("name") == CONTAINER_NAME:
            for p in c.get("ports") or []:
                if p.get("name") == PORT_NAME:
                    return int(p["containerPort"])
    return DEFAULT_PORT


def env(job: Obj, rtype: str, index: int) -> list[Obj]:
    """The variables the operator appends to every container of the pod."""
    spec, name = job["spec"], job["metadata"]["name"]
    specs = spec.get("pytorchReplicaSpecs") or {}
    out: list[Obj] = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    nproc = spec.get("nprocPerNode")
    if "Master" in specs:
        master_port = port(specs["Master"])
        total = sum(int(s.get("replicas", 1)) for s in specs.values())
        rank = index + 1 if rtype == "Worker" else index
        out += [{"name": "MASTER_PORT", "value": str(master_port)},
                {"name": "PET_MASTER_PORT", "value": str(master_port)},
                {"name": "MASTER_ADDR", "value": pod_name(name, "master", 0)},
                {"name": "PET_MASTER_ADDR", "value": pod_name(name, "master", 0)},
                {"name": "WORLD_SIZE", "value": str(total)},
                {"name": "RANK", "value": str(rank)},
                {"name": "PET_NNODES", "value": str(total)},
                {"name": "PET_NODE_RANK", "value": str(rank)}]
    elastic = spec.get("elasticPolicy")
    if elastic is not None:
        host = elastic.get("rdzvHost") or pod_name(name, "worker", 0)
        rdzv_port = elastic.get("rdzvPort") or port(specs.get("Worker") or {})
        if elastic.get("minReplicas") is None and elastic.get("maxReplicas") is None:
            nnodes = str((specs.get("Worker") or {}).get("replicas", 1))
        else:
            nnodes = f"{elastic.get('minReplicas')}:{elastic.get('maxReplicas')}"
        out += [{"name": "PET_RDZV_ENDPOINT", "value": f"{host}:{rdzv_port}"},
                {"name": "PET_RDZV_BACKEND", "value": elastic.get("rdzvBackend", "c10d")},
                {"name": "PET_NNODES", "value": nnodes}]
        if elastic.get("maxRestarts") is not None:
            out.append({"name": "PET_MAX_RESTARTS", "value": str(elastic["maxRestarts"])})
        nproc = elastic.get("nProcPerNode", nproc)
        if elastic.get("rdzvId") is not None:
            out.append({"name": "PET_RDZV_ID", "value": str(elastic["rdzvId"])})
        if conf := elastic.get("rdzvConf") or []:
            out.append({"name": "PET_RDZV_CONF",
                        "value": ",".join(f"{c['key']}={c['value']}" for c in conf)})
        if elastic.get("standalone"):
            out.append({"name": "PET_STANDALONE", "value": ""})
    if nproc is not None:
        out.append({"name": "PET_NPROC_PER_NODE", "value": str(nproc)})
    return out


def labels(job: Obj, rtype: str, index: int) -> dict[str, str]:
    """The labels the operator puts on a replica's pod and service."""
    out = {JOB_NAME: job["metadata"]["name"], OPERATOR_NAME: "pytorchjob-controller",
           REPLICA_TYPE: rtype.lower(), REPLICA_INDEX: str(index)}
    if rtype == "Master":
        out[JOB_ROLE] = "master"
    return out


def owner_reference(job: Obj) -> Obj:
    """A controller ownerReference to ``job`` (a PyTorchJob or a batch Job)."""
    return {"apiVersion": job["apiVersion"], "kind": job["kind"],
            "name": job["metadata"]["name"], "uid": job["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


def replica_pod(job: Obj, rtype: str, index: int) -> Obj:
    """The pod for one replica: the template plus labels, owner, env, default port."""
    rspec = job["spec"]["pytorchReplicaSpecs"][rtype]
    template = rspec.get("template") or {}
    tmeta = template.get("metadata") or {}
    pod_spec = clone(template.get("spec") or {})
    policy = rspec.get("restartPolicy", "Never")
    pod_spec["restartPolicy"] = "Never" if policy == "ExitCode" else policy
    injected = env(job, rtype, index)
    for container in pod_spec.get("containers") or []:
        container["env"] = list(container.get("env") or []) + clone(injected)
        if container.get("name") == CONTAINER_NAME and not any(
                p.get("name") == PORT_NAME for p in container.get("ports") or []):
            container.setdefault("ports", []).append(
                {"name": PORT_NAME, "containerPort": DEFAULT_PORT, "protocol": "TCP"})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": pod_name(job["metadata"]["name"], rtype, index),
        "namespace": job["metadata"]["namespace"],
        "labels": {**(tmeta.get("labels") or {}), **labels(job, rtype, index)},
        "annotations": dict(tmeta.get("annotations") or {}),
        "ownerReferences": [owner_reference(job)]}, "spec": pod_spec}


def replica_service(job: Obj, rtype: str, index: int) -> Obj:
    """The headless service that gives a replica's pod its DNS name."""
    selector = labels(job, rtype, index)
    return {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": pod_name(job["metadata"]["name"], rtype, index),
        "namespace": job["metadata"]["namespace"], "labels": selector,
        "ownerReferences": [owner_reference(job)]},
        "spec": {"clusterIP": "None", "selector": selector,
                 "ports": [{"name": PORT_NAME,
                            "port": port(job["spec"]["pytorchReplicaSpecs"][rtype])}]}}


def job_pod(job: Obj) -> Obj:
    """The pod the Job controller creates for a batch/v1 Job (``<job>-<random>``)."""
    template = job["spec"].get("template") or {}
    tmeta = template.get("metadata") or {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "generateName": f"{job['metadata']['name']}-",
        "namespace": job["metadata"]["namespace"],
        "labels": dict(tmeta.get("labels") or {}),
        "annotations": dict(tmeta.get("annotations") or {}),
        "ownerReferences": [owner_reference(job)]},
        "spec": clone(template.get("spec") or {})}


def replica_statuses(job: Obj, pods: list[Obj]) -> Obj:
    """``status.replicaStatuses``: active/succeeded/failed per replica type."""
    out: Obj = {}
    name = job["metadata"]["name"]
    for rtype in dict.fromkeys(r for r, _ in replicas(job)):
        mine = [p for p in pods if p["metadata"]["labels"].get(REPLICA_TYPE) == rtype.lower()]
        phases = [p["status"].get("phase") for p in mine]
        out[rtype] = {"active": phases.count("Running"), "succeeded": phases.count("Succeeded"),
                      "failed": phases.count("Failed"),
                      "selector": f"{JOB_NAME}={name},{OPERATOR_NAME}=pytorchjob-controller,"
                                  f"{REPLICA_TYPE}={rtype.lower()}"}
    return out

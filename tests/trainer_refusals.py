"""Objects Kubeflow Trainer's and JobSet's validating webhooks refuse, each with the words
of the refusal: checked against the real webhooks in the cluster suite and against
:func:`testing.k8s_schemas.trainer_problem` in the unit tests, so that the check the
operator's tests rely on refuses what the real Trainer refuses."""

from __future__ import annotations

from typing import Any

from resumequal_operator.trainjob import leg_runtime

Obj = dict[str, Any]


def trainjob(name: str, namespace: str, *, env: dict[str, str] | None = None) -> Obj:
    """A two-node TrainJob on the chart's runtime, with ``env`` for its trainer."""
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"runtimeRef": {"apiGroup": "trainer.kubeflow.org",
                                    "kind": "ClusterTrainingRuntime",
                                    "name": "resumequal-leg"},
                     "suspend": True,
                     "trainer": {"image": "worker:1", "command": ["resumequal", "launch"],
                                 "args": ["x"], "numNodes": 2, "numProcPerNode": 1,
                                 "env": [{"name": k, "value": v}
                                         for k, v in (env or {}).items()]}}}


def refused(namespace: str) -> dict[str, tuple[Obj, str]]:
    """Name -> (object, a regular expression its refusal matches)."""
    reserved = trainjob("reserved-env", namespace, env={"PET_NNODES": "4"})
    unknown = trainjob("unknown-field", namespace)
    unknown["spec"]["trainer"]["elasticPolicy"] = {"minNodes": 1}
    replicas = leg_runtime("rq-two-replicas")
    replicas["spec"]["template"]["spec"]["replicatedJobs"][0]["replicas"] = 2
    nameless = leg_runtime("rq-no-node-container")
    job = nameless["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]
    job["spec"]["template"]["spec"]["containers"][0]["name"] = "trainer"
    return {
        "reserved env": (reserved, "must not have reserved envs"),
        "unknown field": (unknown, r"unknown field.*elasticPolicy"),
        "ancestor replicas": (replicas, "always must be 1"),
        "no node container": (nameless,
                              "must contain the required container for the ancestor: trainer"),
    }

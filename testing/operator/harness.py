"""What the operator tests share: admission, run manifests, operator replicas, waits.

Every object the operator writes passes admission by the schemas in
``testing/k8s_schemas.py``: PyTorchJobs against Kubeflow's CRD, QualificationRuns (status
included) against the chart's CRD, Jobs, Leases, Events and NetworkPolicies against
Kubernetes' own.
"""

from __future__ import annotations

import collections
import json
import time
import uuid
import weakref
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from resumequal.run.location import RunLocation
from resumequal.store.s3settings import S3Settings
from resumequal_operator.allowlist import Allowlist
from resumequal_operator.kube import QUALIFICATION_RUNS, Kube
from resumequal_operator.manager import Operator, Settings
from resumequal_operator.runkeys import MasterKey
from resumequal_operator.runtime.leader import LeaseSettings
from testing.cluster.testapi import RealAPI
from testing.k8s_schemas import (
    validate_core,
    validate_pytorchjob,
    validate_qualificationrun,
    validate_trainer,
)

NAMESPACE = "quals"
Obj = dict[str, Any]

# Timings for a test: reconciles every 50 ms, leases of 1 s, watches that end every 2 s.
FAST = {"poll_seconds": 0.05, "resync_seconds": 30.0, "watch_timeout_seconds": 2,
        "lease": LeaseSettings(namespace=NAMESPACE, lease_seconds=1.0,
                               renew_deadline_seconds=0.8, retry_seconds=0.1)}


class Admission:
    """Validates what the operator writes; counts what it validated, per kind."""

    def __init__(self) -> None:
        self.validated: collections.Counter[str] = collections.Counter()

    def __call__(self, obj: Obj) -> None:
        kind = obj.get("kind", "")
        if kind == "PyTorchJob":
            validate_pytorchjob(obj)
        elif kind == "QualificationRun":
            validate_qualificationrun(obj)
        elif kind in ("Job", "Lease", "Event", "NetworkPolicy"):
            validate_core(obj)
        elif kind in ("TrainJob", "TrainingRuntime", "ClusterTrainingRuntime", "JobSet"):
            validate_trainer(obj)
        else:
            return
        self.validated[kind] += 1


def run_manifest(name: str, store: dict[str, str], namespace: str = NAMESPACE,
                 **spec: Any) -> Obj:
    """A small valid QualificationRun: 2 nodes x 1 rank, cut on rank 1 (pod worker-1)."""
    body: Obj = {
        "stack": {"image": "ghcr.io/acme/train:2026-11-29"},
        "store": dict(store),
        "world": {"nnodes": 2, "nprocPerNode": 1},
        "training": {"steps": 6, "accumulationSteps": 2},
        "checkpoint": {"everySteps": 2},
        # The scripted workers play pod kills (their pod is deleted); process kills, which
        # torchrun restarts in place, run on the local cluster (tests/cluster).
        "preemption": {"step": 4, "microstep": 1, "rank": 1, "target": "pod"},
        "controls": {"enabled": False},
    }
    for section, value in spec.items():
        if isinstance(value, dict) and isinstance(body.get(section), dict):
            body[section] = {**body[section], **value}
        else:
            body[section] = value
    return {"apiVersion": "resumequal.dev/v1alpha1", "kind": "QualificationRun",
            "metadata": {"name": name, "namespace": namespace}, "spec": body}


# The replicas started in this process and not stopped yet, whose Events ``events`` waits
# for (a replica's recorder writes them from a thread of its own).
_RUNNING: weakref.WeakSet[Operator] = weakref.WeakSet()


class Operators:
    """Starts operator replicas against the test's API server; stops them all at the end.
    ``endpoints``: the store endpoints the replicas' allowlist admits (the tests' S3
    server)."""

    def __init__(self, api: RealAPI, endpoints: tuple[str, ...] = ()) -> None:
        self.api = api
        self.allowlist = Allowlist(endpoints=endpoints)
        self.started: list[tuple[Operator, Kube]] = []

    def start(self, **overrides: Any) -> Operator:
        kube = Kube(self.api.api_client())
        settings = Settings(**{"namespaces": (NAMESPACE,), "port": 0, "host": "127.0.0.1",
                               "identity": f"op-{uuid.uuid4().hex[:6]}", **FAST,
                               "allowlist": self.allowlist, **overrides})
        op = Operator(kube, settings, CollectorRegistry())
        op.start()
        self.started.append((op, kube))
        _RUNNING.add(op)
        return op

    def stop(self, op: Operator) -> None:
        for i, (o, kube) in enumerate(self.started):
            if o is op:
                o.stop()  # writes the Events it recorded
                _RUNNING.discard(o)
                kube.close()
                del self.started[i]
                return

    def stop_all(self) -> None:
        for op, _ in list(self.started):
            self.stop(op)


def run_location(uri: str, uid: str, s3: S3Settings | None = None) -> RunLocation:
    """A run's location sealed as an operator of this process seals it (no --key-file:
    the process's own master key), to write what the operator or the run's pods would."""
    return RunLocation.open(uri, s3, seal=MasterKey.generated().seal(uid))


def qr(api: RealAPI, name: str) -> Obj:
    obj = api.get(QUALIFICATION_RUNS.plural, NAMESPACE, name)
    assert obj is not None, f"QualificationRun {name} is gone"
    return obj


def wait_phase(api: RealAPI, name: str, phases: str | tuple[str, ...],
               timeout: float = 20.0) -> Obj:
    """Wait until the run's status.phase is one of ``phases``; the object."""
    wanted = (phases,) if isinstance(phases, str) else phases
    seen: list[str] = []

    def check() -> Obj | None:
        obj = api.get(QUALIFICATION_RUNS.plural, NAMESPACE, name)
        phase = ((obj or {}).get("status") or {}).get("phase")
        if phase and (not seen or seen[-1] != phase):
            seen.append(phase)
        return obj if phase in wanted else None

    try:
        return api.wait_for(check, timeout, f"{name} in phase {'/'.join(wanted)}")
    except TimeoutError as e:
        obj = api.get(QUALIFICATION_RUNS.plural, NAMESPACE, name) or {}
        conds = (obj.get("status") or {}).get("conditions")
        raise AssertionError(f"{e}; phases seen: {seen}; conditions: {conds}") from None


def live(api: RealAPI, plural: str, run: str) -> list[str]:
    """The names of the objects of ``plural`` that run ``run`` owns, there now."""
    return [o["metadata"]["name"] for o in api.list(plural, NAMESPACE)
            if o["metadata"]["labels"].get("resumequal.dev/run") == run]


def condition(obj: Obj, type_: str) -> Obj:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return dict(c)
    raise AssertionError(f"no condition {type_} in {obj.get('status')}")




def failed_job_status(reason: str = "BackoffLimitExceeded",
                      message: str = "Job has reached the specified backoff limit") -> Obj:
    """A Job's status as the Job controller writes it when the Job fails: the API server
    refuses ``Failed`` without ``startTime`` and the ``FailureTarget`` condition before it
    (pkg/apis/batch/validation/validation.go, validateJobStatusUpdate)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    conditions = [{"type": t, "status": "True", "reason": reason, "message": message,
                   "lastProbeTime": now, "lastTransitionTime": now}
                  for t in ("FailureTarget", "Failed")]
    return {"startTime": now, "active": 0, "ready": 0, "failed": 1, "terminating": 0,
            "conditions": conditions}


def write_kubeconfig(api: RealAPI, path: Path, namespace: str = NAMESPACE) -> Path:
    """A kubeconfig for the test's API server (its proxy), as ``kubectl`` and the operator's
    CLI read it."""
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "tests",
        "clusters": [{"name": "tests", "cluster": {"server": api.url}}],
        "users": [{"name": "tests", "user": {"token": "not-checked"}}],
        "contexts": [{"name": "tests", "context": {"cluster": "tests", "user": "tests",
                                                      "namespace": namespace}}],
    }))
    return path


def flush_events(timeout: float = 10.0) -> None:
    """Wait until every replica running here has written the Events it recorded so far:
    a reconcile queues its Events before it writes the status, so those of every phase a
    test has seen are then in the API server."""
    for op in list(_RUNNING):
        assert op.events.flush(timeout), (
            f"{op.settings.identity}: {op.events.pending} Event(s) still unwritten after "
            f"{timeout:g}s")


def events(api: RealAPI, name: str) -> list[tuple[str, str, str]]:
    """(reason, type, message) of the Events about run ``name``, oldest first, once every
    replica running here has written the Events it recorded (``flush_events``)."""
    flush_events()
    found = sorted(api.list("events", NAMESPACE),
                   key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [(e["reason"], e["type"], e["message"]) for e in found
            if e["involvedObject"]["name"] == name]


def s3_store(endpoint: str, bucket: str) -> dict[str, str]:
    """The ``store`` section of a run in ``bucket`` of the S3 server at ``endpoint``."""
    return {"uri": f"s3://{bucket}/runs", "endpointUrl": endpoint, "region": "us-east-1",
            "addressingStyle": "path"}


def store_s3(store: dict[str, str]) -> S3Settings:
    """The settings scripted workers reach a run's ``store`` section with."""
    return S3Settings(endpoint_url=store["endpointUrl"], region=store["region"],
                  addressing_style="path")

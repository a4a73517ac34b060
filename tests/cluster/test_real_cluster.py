"""Qualifications on a real cluster: by default the local one (``testing/cluster``: a real
kube-apiserver, etcd, controller manager and scheduler, CoreDNS, the Kubeflow training
operator v1.9, Trainer v2 and JobSet, SeaweedFS, the chart installed with helm; pods run
by the node agent as real processes).

Each test applies a QualificationRun (2 nodes on CPU, the cut on the second node) for one
preemption users face — a hard pod kill (deleted with grace 0), a graceful pod kill
(deleted with a grace period), a process kill (a kill order: no pod is deleted) — with
each backend (PyTorchJob, TrainJob), waits for the verdict in the status, checks what the
operator reported and exported, then deletes the run and checks that its finalizer and
the garbage collector removed everything it made. Others check what the real API server
enforces: the chart's RBAC (a rule removed, the operator refused) and Pod Security
``restricted`` in the watched namespaces.

Another cluster can be named instead: ``RESUMEQUAL_CLUSTER_KUBECONFIG`` (a cluster with
the training operator, Trainer v2 and the chart, watching ``RESUMEQUAL_CLUSTER_NAMESPACE``),
``RESUMEQUAL_CLUSTER_STORE`` (``s3://bucket/prefix``), ``RESUMEQUAL_CLUSTER_STORE_ENDPOINT``
and ``RESUMEQUAL_CLUSTER_STORE_SECRET`` (a Secret with ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` in that namespace), ``RESUMEQUAL_CLUSTER_IMAGE`` (the worker image).
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes import client, config

from tests.waiting import eventually

if TYPE_CHECKING:
    from resumequal.results.verdict import Verdict
    from resumequal.run.location import RunLocation
    from testing.cluster.audit import Request
    from testing.cluster.cluster import Cluster

# The first test's setup starts the whole cluster (building what is missing): minutes on
# two cores beside the rest of the suite.
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(1800)]

GROUP, VERSION, PLURAL = "resumequal.dev", "v1alpha1", "qualificationruns"
TIMEOUT_S = float(os.environ.get("RESUMEQUAL_CLUSTER_TIMEOUT", "900"))
PREEMPTIONS: dict[str, dict[str, Any]] = {
    "hard-pod": {"mode": "hard", "target": "pod"},
    "graceful-pod": {"mode": "graceful", "target": "pod", "graceSeconds": 60},
    "hard-process": {"mode": "hard", "target": "process"},
}
BACKENDS = ("pytorchjob", "trainjob")
OPERATOR_SA = "resumequal"  # the chart's ServiceAccount, the release's name
# The checkpoint the resumed attempt restores (a checkpoint every 2 steps, the cut in step
# 5): the periodic one of step 4 after a hard kill; after a graceful one, the emergency
# checkpoint every rank saved at the cut (one microbatch of step 5 run).
RESUMED_FROM = {"hard-pod": "step-00000004", "graceful-pod": "step-00000004+1",
                "hard-process": "step-00000004"}
# Ranks per node, and the rank cut, per preemption. A hard pod kill runs the README
# example's shape, two ranks per node: ranks sharing a node share its staging folder, and
# after the kill the restarted pod's ranks meet the other pod's again (a race there once
# failed the resumed attempt's first upload on TrainJob).
SHAPES = {"hard-pod": (2, 2), "graceful-pod": (1, 1), "hard-process": (1, 1)}


@dataclass(frozen=True)
class Target:
    """Where the runs go and what they name."""

    api: client.ApiClient
    namespace: str
    store: str
    endpoint: str | None
    secret: str | None
    image: str
    local: Cluster | None


@pytest.fixture(scope="module")
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    kubeconfig = os.environ.get("RESUMEQUAL_CLUSTER_KUBECONFIG")
    if kubeconfig:
        configuration = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        with client.ApiClient(configuration) as api:
            yield Target(api, os.environ.get("RESUMEQUAL_CLUSTER_NAMESPACE", "resumequal-e2e"),
                         os.environ["RESUMEQUAL_CLUSTER_STORE"],
                         os.environ.get("RESUMEQUAL_CLUSTER_STORE_ENDPOINT"),
                         os.environ.get("RESUMEQUAL_CLUSTER_STORE_SECRET"),
                         os.environ.get("RESUMEQUAL_CLUSTER_IMAGE", "resumequal-worker:dev"),
                         None)
        return
    from testing.cluster import cluster as local

    running: Cluster = request.getfixturevalue("local_cluster")
    api = request.getfixturevalue("cluster_admin")
    yield Target(api, "resumequal-e2e", f"s3://{local.BUCKET}/e2e", running.s3_in_cluster,
                 local.S3_SECRET, local.WORKER_IMAGE, running)


def manifest(target: Target, name: str, backend: str, preemption: dict[str, Any], *,
             nproc: int = 1, rank: int = 1) -> dict[str, Any]:
    store: dict[str, Any] = {"uri": target.store, "addressingStyle": "path"}
    if target.endpoint:
        store["endpointUrl"] = target.endpoint
    if target.secret:
        store["credentialsSecret"] = target.secret
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "QualificationRun",
        "metadata": {"name": name, "namespace": target.namespace},
        "spec": {
            "stack": {"image": target.image, "pin": f"e2e-{name}",
                      **({"imagePullPolicy": "IfNotPresent"} if backend == "pytorchjob"
                         else {})},
            "store": store,
            "backend": backend,
            "workload": {"name": "tiny-gpt"},
            "world": {"nnodes": 2, "nprocPerNode": nproc, "backend": "gloo"},
            "training": {"steps": 8, "accumulationSteps": 2},
            "checkpoint": {"everySteps": 2},
            "preemption": {"step": 5, "microstep": 1, "rank": rank, **preemption},
            "timeouts": {"armSeconds": 240, "processGroupSeconds": 300, "restartSeconds": 300,
                         "legSeconds": 900},
            "controls": {"enabled": False},
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
            "retention": {"policy": "Delete"},
        },
    }


def _get(objects: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = objects.get_namespaced_custom_object(GROUP, VERSION, namespace,
                                                                   PLURAL, name)
        return obj
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def _wait_ended(objects: client.CustomObjectsApi, namespace: str, name: str,
                pods: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """The run's status once it ended, and the phases it went through; ``pods`` collects
    each leg pod seen meanwhile, by uid (the operator deletes the legs' jobs once they ended)."""
    phases: list[str] = []
    deadline = time.monotonic() + TIMEOUT_S
    core = client.CoreV1Api(objects.api_client)
    while True:
        if pods is not None:
            for pod in core.list_namespaced_pod(
                    namespace, label_selector=f"resumequal.dev/run={name},"
                                              "resumequal.dev/leg").items:
                pods.setdefault(pod.metadata.uid, pod)
        status = (_get(objects, namespace, name) or {}).get("status") or {}
        phase = status.get("phase")
        if phase and (not phases or phases[-1] != phase):
            phases.append(phase)
        if phase in ("Succeeded", "Failed"):
            return status, phases
        assert time.monotonic() < deadline, f"no verdict within {TIMEOUT_S:g}s: {phases}"
        time.sleep(2)


def _delete_and_wait_gone(objects: client.CustomObjectsApi, namespace: str, name: str) -> None:
    objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    gone_by = time.monotonic() + 120
    while _get(objects, namespace, name) is not None:
        assert time.monotonic() < gone_by, "the run's finalizer did not finish"
        time.sleep(1)


def _operator_requests(target: Target) -> list[Request]:
    """What the operator's ServiceAccount asked of the local API server so far, as the
    server's audit log says."""
    from testing.cluster import audit
    from testing.cluster import cluster as local

    assert target.local is not None
    return audit.requests(target.local.controlplane.root,
                          f"system:serviceaccount:{local.OPERATOR_NAMESPACE}:{OPERATOR_SA}")


def _location(target: Target, run_uri: str, monkeypatch: pytest.MonkeyPatch) -> RunLocation:
    """The run's files, read from the local cluster's S3 server."""
    from resumequal.run.location import RunLocation
    from resumequal.store.s3settings import S3Settings

    assert target.local is not None
    s3 = target.local.s3
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)
    return RunLocation.open(run_uri, S3Settings(endpoint_url=s3.endpoint, region=s3.region,
                                            addressing_style="path"))


def _verdict_file(location: RunLocation) -> Verdict:
    verdict = location.read_verdict()
    assert verdict is not None, "no verdict.json"
    return verdict


def _events(target: Target, name: str) -> list[tuple[str, str]]:
    """(reason, message) of the Events about run ``name``, in the order they were stored
    (etcd's revisions grow with every write), once the last one (the ending) is there: the
    operator writes Events from a thread of its own, after the status at times."""
    core = client.CoreV1Api(target.api)

    def ended() -> list[Any] | None:
        found = core.list_namespaced_event(
            target.namespace, field_selector=f"involvedObject.name={name}").items
        return found if any(e.reason in ("Succeeded", "Failed") for e in found) else None

    found = eventually(ended, 30, "the run's last Event", interval=1.0)
    events = [(e.reason, e.message or "") for e in sorted(
        found, key=lambda e: int(e.metadata.resource_version))]
    # A request the API server or a webhook failed under load, which the operator retried
    # (a BackendError Event each time): shown, not part of the run's course.
    for reason, message in events:
        if reason == "BackendError":
            print(f"{name}: retried after {message}")
    return [(r, m) for r, m in events if r != "BackendError"]


def _check_files(location: RunLocation, kind: str, rank: int, node: str) -> None:
    """What the run's files say of the kill and the resume: the checkpoint restored, the
    comparator's timeline of the kill, the armed rank's pod."""
    from resumequal.results.verdict import Report

    verdict = _verdict_file(location)
    assert verdict.resumed_from == RESUMED_FROM[kind], verdict.resumed_from
    base = "preempted/checkpoints/"
    saved = {o.key[len(base):].split("/", 1)[0] for o in location.store.list(base.rstrip("/"))}
    emergency = [c for c in saved if "+" in c]
    assert emergency == ([RESUMED_FROM[kind]] if kind == "graceful-pod" else []), saved
    report = Report.model_validate_json(location.store.get_bytes("report.json", 1 << 26))
    assert report.kill_at is not None and (report.restart_seconds or 0) > 0, report.phases
    [preempted] = [p for p in report.phases if p.phase == "Preempted"]
    assert preempted.at == report.kill_at
    beacon = location.read_beacon("preempted", rank, 0)
    assert beacon is not None and node in str(beacon.pod), beacon
    if kind == "hard-process":
        order = location.leg("preempted").read_kill_order(rank, 0)
        assert order is not None and order.mode == "hard" and order.pod_uid
        assert f"killed pid {order.pid} (hard)" in (preempted.message or ""), preempted
    else:
        grace = 0 if kind == "hard-pod" else PREEMPTIONS[kind]["graceSeconds"]
        mode = PREEMPTIONS[kind]["mode"]
        assert f"deleted pod {beacon.pod} ({mode}, grace {grace}s)" in (
            preempted.message or ""), preempted


def _check_leg_pods(target: Target, pods: list[Any], nproc: int) -> None:
    """The legs' pods as the real training operator or Trainer and JobSet made them: the
    run's image and settings, admitted under Pod Security ``restricted``."""
    assert pods, "no leg pods seen"
    for pod in pods:
        spec = pod.spec
        [container] = spec.containers
        assert container.image == target.image, container.image
        assert container.resources.requests == {"cpu": "500m", "memory": "1Gi"}
        assert spec.automount_service_account_token is False
        # Never on both: the runtime says so for TrainJob; the training operator makes a
        # replica's ExitCode policy a pod's Never and restarts pods itself.
        assert spec.restart_policy == "Never", (pod.metadata.name, spec.restart_policy)
        env = {e.name: e.value for e in container.env or []}
        nproc_env = "PET_NPROC_PER_NODE"
        assert env.get(nproc_env) == str(nproc), (pod.metadata.name, env.get(nproc_env))


def _operator_metrics(target: Target) -> str:
    """The operator's /metrics, scraped at its pod's address as Prometheus scrapes it."""
    core = client.CoreV1Api(target.api)
    pods = core.list_namespaced_pod("resumequal-system",
                                    label_selector="app.kubernetes.io/name=resumequal").items
    running = [p for p in pods if p.status.phase == "Running" and p.status.pod_ip]
    assert running, "no running operator pod"
    with urllib.request.urlopen(f"http://{running[0].status.pod_ip}:8080/metrics",
                                timeout=10) as r:
        return str(r.read().decode())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", PREEMPTIONS)
def test_a_qualification_run_gets_its_verdict_on_a_real_cluster(
    target: Target, backend: str, kind: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = client.CustomObjectsApi(target.api)
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    asked_before = len(_operator_requests(target)) if target.local is not None else 0
    preemption = PREEMPTIONS[kind]
    nproc, rank = SHAPES[kind]
    objects.create_namespaced_custom_object(
        GROUP, VERSION, target.namespace, PLURAL,
        manifest(target, name, backend, preemption, nproc=nproc, rank=rank))
    try:
        seen: dict[str, Any] = {}
        status, phases = _wait_ended(objects, target.namespace, name, seen)
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        assert status["phase"] == "Succeeded", f"phases {phases}; Ready: {conditions.get('Ready')}"
        verdict = status["verdict"]
        assert verdict["result"] == "PASS", verdict
        assert verdict["firstDivergenceSummary"] == "none"
        assert conditions["Qualified"]["status"] == "True"
        assert conditions["Ready"]["status"] == "True"
        assert status["pin"] == f"e2e-{name}"
        assert status["reportUrl"].endswith("/report.html")
        reported = status["preemption"]
        assert reported["rank"] == rank and reported["mode"] == preemption["mode"]
        node1 = "-worker-1" if backend == "pytorchjob" else "-node-0-1-"
        assert node1 in reported["pod"], reported
        assert status["legs"]["preempted"]["attempts"] >= 2
        assert status["legs"]["preempted"]["restartSeconds"] > 0
        events = _events(target, name)
        reasons = [r for r, _ in events]
        assert reasons[:2] == ["LegsRunning", "Armed"], reasons
        assert reasons[-2:] == ["Comparing", "Succeeded"], reasons
        assert {"Preempted", "PreemptionInjected", "Resumed"} <= set(reasons), reasons
        injected = next(m for r, m in events if r == "PreemptionInjected")
        assert f"{preemption['mode']} {preemption['target']} kill" in injected, injected
        _check_leg_pods(target, list(seen.values()), nproc)
        # Both nodes of both legs, and the armed node's pod again after the kill.
        assert len(seen) >= (5 if kind.endswith("-pod") else 4), sorted(
            p.metadata.name for p in seen.values())
        if target.local is not None:
            passed = [line for line in _operator_metrics(target).splitlines()
                      if line.startswith("resumequal_qualification_passed{")
                      and f'run="{name}"' in line]
            assert len(passed) == 1 and passed[0].endswith(" 1.0"), passed
            restart = [line for line in _operator_metrics(target).splitlines()
                       if line.startswith("resumequal_restart_seconds{")
                       and f'run="{name}"' in line]
            assert len(restart) == 1 and float(restart[0].rsplit(" ", 1)[1]) > 0, restart
            _check_files(_location(target, status["runUri"], monkeypatch), kind, rank, node1)
    finally:
        _delete_and_wait_gone(objects, target.namespace, name)
    group, version, plural = (("kubeflow.org", "v1", "pytorchjobs") if backend == "pytorchjob"
                              else ("trainer.kubeflow.org", "v1alpha1", "trainjobs"))
    selector = f"resumequal.dev/run={name}"

    def nothing_left() -> bool:
        jobs = objects.list_namespaced_custom_object(group, version, target.namespace, plural,
                                                     label_selector=selector)["items"]
        core = client.CoreV1Api(target.api)
        pods = core.list_namespaced_pod(target.namespace, label_selector=selector).items
        return not jobs and not pods

    # The garbage collector deletes what the run owned (jobs, their pods, the key Secret).
    eventually(nothing_left, 120, "the run's jobs and pods gone", interval=1.0)
    if target.local is not None:
        _check_requests(target, asked_before, backend, kind)


def _check_requests(target: Target, asked_before: int, backend: str, kind: str) -> None:
    """Every request the operator made for the run was allowed by the chart's RBAC, each
    verb granted on the legs' jobs was needed, and a pod kill was the delete it says."""
    time.sleep(2)  # the audit log is written in batches, a second apart at most
    made = _operator_requests(target)[asked_before:]
    assert [str(r) for r in made if r.code == 403] == []
    plural = "pytorchjobs" if backend == "pytorchjob" else "trainjobs"
    role = client.RbacAuthorizationV1Api(target.api).read_namespaced_role(
        OPERATOR_SA, target.namespace)
    granted = {v for rule in role.rules if plural in rule.resources for v in rule.verbs}
    used = {r.verb for r in made if r.resource == plural}
    # The operator watches the legs' jobs from its start, not per run.
    used |= {r.verb for r in _operator_requests(target)
             if r.resource == plural and r.verb == "watch"}
    # A leg's job is read from the watch; a resize (PyTorchJob) reads and patches it.
    spare = {"get"} | ({"patch"} if backend == "pytorchjob" else set())
    assert granted - used <= spare, (granted, used)
    kills = [r for r in made if (r.verb, r.resource) == ("delete", "pods")]
    if kind.endswith("-pod"):
        assert len(kills) == 1, [str(r) for r in kills]
        grace = (kills[0].body or {}).get("gracePeriodSeconds")
        assert grace == (0 if kind == "hard-pod" else PREEMPTIONS[kind]["graceSeconds"]), grace
    else:
        assert kills == [], [str(r) for r in kills]


def test_a_resize_shrinks_the_pytorchjob_and_grows_it_back(
    target: Target, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An elastic resize on the real training operator: the armed pod deleted and the Worker
    replicas lowered, the survivor resumes alone from step 4, commits step 6, and the
    replicas raised again bring a new worker-1 for steps 7 and 8."""
    objects = client.CustomObjectsApi(target.api)
    name = f"e2e-resize-{uuid.uuid4().hex[:6]}"
    asked_before = len(_operator_requests(target)) if target.local is not None else 0
    body = manifest(target, name, "pytorchjob", PREEMPTIONS["hard-pod"])
    body["spec"]["preemption"]["resize"] = {"toNodes": 1, "growAfterStep": 6}
    body["spec"]["comparison"] = {"mode": "tolerance", "tolerances": {
        "loss": 1.0e-4, "grad_norm": 1.0e-4, "params": 1.0e-4}}
    objects.create_namespaced_custom_object(GROUP, VERSION, target.namespace, PLURAL, body)
    try:
        status, phases = _wait_ended(objects, target.namespace, name)
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        assert status["phase"] == "Succeeded", f"phases {phases}; Ready: {conditions.get('Ready')}"
        assert status["verdict"]["result"] == "PASS", status["verdict"]
        legs = status["legs"]
        assert legs["preempted"]["steps"] == 8 and legs["control"]["steps"] == 8
        assert legs["preempted"]["attempts"] == 3, legs["preempted"]
        reasons = [r for r, _ in _events(target, name)]
        assert reasons.index("Resized") < reasons.index("PreemptionInjected"), reasons
        assert reasons.count("Resized") == 1 and reasons.count("Grown") == 1, reasons
        assert reasons.index("Resized") < reasons.index("Grown") < reasons.index("Comparing"), \
            reasons
        if target.local is not None:
            verdict = _verdict_file(_location(target, status["runUri"], monkeypatch))
            assert verdict.resize is not None and verdict.resumed_from == "step-00000004"
            assert verdict.reason.startswith(
                "resize: 2→1→2 ranks; exact through step 4 before the resize; handoff exact"), \
                verdict.reason
            assert all(part.ok for part in verdict.resize.parts), verdict.resize.parts
    finally:
        _delete_and_wait_gone(objects, target.namespace, name)
    if target.local is not None:
        time.sleep(2)  # the audit log's batch
        made = _operator_requests(target)[asked_before:]
        assert [str(r) for r in made if r.code == 403] == []
        # The replicas lowered at the kill and raised at the grow: two patches of one job.
        patches = [r for r in made if (r.verb, r.resource) == ("patch", "pytorchjobs")]
        assert len(patches) == 2 and len({r.name for r in patches}) == 1, \
            [str(r) for r in patches]
        kills = [r for r in made if (r.verb, r.resource) == ("delete", "pods")]
        assert len(kills) == 1 and (kills[0].body or {}).get("gracePeriodSeconds") == 0, \
            [str(r) for r in kills]


def test_a_trainjob_leg_that_outlives_its_timeout_ends_the_run(target: Target) -> None:
    objects = client.CustomObjectsApi(target.api)
    name = f"e2e-late-{uuid.uuid4().hex[:6]}"
    body = manifest(target, name, "trainjob", PREEMPTIONS["hard-pod"])
    # The killed pod comes back only after the Job's pod failure backoff, and each pod
    # starts torch: no leg finishes within 15 s.
    body["spec"]["timeouts"]["legSeconds"] = 15
    objects.create_namespaced_custom_object(GROUP, VERSION, target.namespace, PLURAL, body)
    try:
        status, phases = _wait_ended(objects, target.namespace, name)
        ready = {c["type"]: c for c in status["conditions"]}["Ready"]
        assert status["phase"] == "Failed" and ready["reason"] == "Timeout", (phases, ready)
        assert "did not finish within timeouts.legSeconds=15" in ready["message"], ready
        assert status["verdict"]["result"] == "INVALID"

        # Everything it started is deleted: the TrainJobs, and with them their JobSets,
        # Jobs and pods, while the run itself is still there.
        def no_trainjobs() -> bool:
            return not objects.list_namespaced_custom_object(
                "trainer.kubeflow.org", "v1alpha1", target.namespace, "trainjobs",
                label_selector=f"resumequal.dev/run={name}")["items"]

        eventually(no_trainjobs, 60, "the TrainJobs deleted", interval=1.0)
        assert _get(objects, target.namespace, name) is not None
    finally:
        _delete_and_wait_gone(objects, target.namespace, name)


def test_the_trainers_webhooks_refuse_what_the_schema_check_refuses(target: Target) -> None:
    """The objects testing/k8s_schemas.py's Trainer check refuses (the operator's other tests
    rely on it), refused by the real Trainer's webhooks and API server for the same cause."""
    from testing.k8s_schemas import trainer_problem
    from tests.trainer_refusals import refused

    objects = client.CustomObjectsApi(target.api)
    accepted: list[tuple[str, dict[str, Any]]] = []
    try:
        for what, (obj, words) in refused(target.namespace).items():
            assert trainer_problem(obj) is not None, what
            group, version = obj["apiVersion"].split("/")
            plural = obj["kind"].lower() + "s"
            try:
                if obj["kind"] == "ClusterTrainingRuntime":
                    objects.create_cluster_custom_object(group, version, plural, obj,
                                                         field_validation="Strict")
                else:
                    objects.create_namespaced_custom_object(
                        group, version, target.namespace, plural, obj,
                        field_validation="Strict")
                accepted.append((what, obj))
                continue
            except client.ApiException as e:
                message = json.loads(e.body).get("message", "") if e.body else str(e)
                assert e.status in (400, 403, 422), (what, e.status, message)
            assert re.search(words, message), (what, message)
        assert [what for what, _ in accepted] == []
    finally:
        for _, obj in accepted:  # nothing left behind, whatever the outcome
            group, version = obj["apiVersion"].split("/")
            plural, name = obj["kind"].lower() + "s", obj["metadata"]["name"]
            if obj["kind"] == "ClusterTrainingRuntime":
                objects.delete_cluster_custom_object(group, version, plural, name)
            else:
                objects.delete_namespaced_custom_object(group, version, target.namespace,
                                                        plural, name)


def test_the_real_api_server_refuses_the_operator_what_its_rbac_does_not_grant(
    target: Target,
) -> None:
    if target.local is None:
        pytest.skip("changes the chart's Role: only on the local cluster")
    rbac = client.RbacAuthorizationV1Api(target.api)
    role = rbac.read_namespaced_role("resumequal", target.namespace)
    original = [r for r in role.rules]
    # Without "create secrets" the operator cannot make the run's checkpoint key Secret.
    role.rules = [r for r in role.rules if r.resources != ["secrets"]]
    assert len(role.rules) == len(original) - 1
    rbac.replace_namespaced_role("resumequal", target.namespace, role)
    objects = client.CustomObjectsApi(target.api)
    name = f"e2e-rbac-{uuid.uuid4().hex[:6]}"
    body = manifest(target, name, "pytorchjob", PREEMPTIONS["hard-pod"])
    body["spec"]["timeouts"]["backendErrorSeconds"] = 20  # then the run gives up
    try:
        objects.create_namespaced_custom_object(GROUP, VERSION, target.namespace, PLURAL, body)

        def refused() -> str | None:
            status = (_get(objects, target.namespace, name) or {}).get("status") or {}
            text = str(((status.get("machine") or {}).get("errors") or {}).get("message"))
            return text if "403" in text else None

        # While it retries, the status says what the API server refused, and why.
        message = eventually(refused, 60, "a 403 in the run's status", interval=1.0)
        assert ('HTTP 403 Forbidden: secrets is forbidden: User "system:serviceaccount:'
                'resumequal-system:resumequal" cannot create resource "secrets"') in message
        status, phases = _wait_ended(objects, target.namespace, name)
        ready = {c["type"]: c for c in status["conditions"]}["Ready"]
        assert status["phase"] == "Failed" and ready["status"] == "False", (phases, ready)
        assert "403 Forbidden" in ready["message"] and "secrets" in ready["message"], ready
    finally:
        role = rbac.read_namespaced_role("resumequal", target.namespace)
        role.rules = original
        rbac.replace_namespaced_role("resumequal", target.namespace, role)
        _delete_and_wait_gone(objects, target.namespace, name)


def test_pod_security_restricted_refuses_a_privileged_pod(target: Target) -> None:
    core = client.CoreV1Api(target.api)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "privileged-probe"},
           "spec": {"containers": [{"name": "c", "image": target.image,
                                    "securityContext": {"privileged": True}}]}}
    with pytest.raises(client.ApiException) as refused:
        core.create_namespaced_pod(target.namespace, pod)
    assert refused.value.status == 403
    message = json.loads(refused.value.body)["message"]
    assert 'violates PodSecurity "restricted:latest"' in message, message
    assert 'privileged (container "c" must not set securityContext.privileged=true)' in message
    # Nothing of it exists.
    assert not [p for p in core.list_namespaced_pod(target.namespace).items
                if p.metadata.name == "privileged-probe"]

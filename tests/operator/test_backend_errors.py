"""A run whose launch or store keeps failing ends Failed, with the reason, within bounds."""

from __future__ import annotations

import time

from resumequal_operator.allowlist import Allowlist
from resumequal_operator.kube import QUALIFICATION_RUNS
from testing.cluster.testapi import RealAPI
from testing.operator.harness import (
    NAMESPACE,
    Operators,
    condition,
    flush_events,
    run_manifest,
    wait_phase,
)
from testing.ports import free_port

BOUND_S = 2.0  # timeouts.backendErrorSeconds of these runs


def _events(api: RealAPI, run: str) -> list[tuple[str, str]]:
    flush_events()
    return [(e["reason"], e["message"]) for e in api.list("events", NAMESPACE)
            if e["involvedObject"]["name"] == run]


def test_a_launch_that_keeps_failing_ends_the_run(
    api: RealAPI, operators: Operators, store: dict[str, str]
) -> None:
    # A validating webhook that refuses every PyTorchJob (or RBAC that forbids them).
    api.inject_fault(method="POST", kind="pytorchjobs.kubeflow.org", code=403, times=10_000,
                     message="admission webhook \"pytorchjob.kubeflow.org\" denied the request")
    operators.start()
    started = time.monotonic()
    api.create(QUALIFICATION_RUNS.plural, run_manifest(
        "refused", store, timeouts={"backendErrorSeconds": BOUND_S}))
    failed = wait_phase(api, "refused", "Failed", timeout=30)
    # The bound, plus at most one backoff of the work queue past it.
    assert time.monotonic() - started < 20
    ready = condition(failed, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "Error"
    assert "HTTP 403" in ready["message"] and "denied the request" in ready["message"]
    assert "timeouts.backendErrorSeconds=2" in ready["message"]
    assert failed["status"]["verdict"]["result"] == "INVALID"
    reasons = [r for r, _ in _events(api, "refused")]
    assert "BackendError" in reasons and "Failed" in reasons
    [backend_error] = [m for r, m in _events(api, "refused") if r == "BackendError"][:1]
    assert "HTTP 403" in backend_error


def test_a_store_that_does_not_answer_ends_the_run(
    api: RealAPI, operators: Operators, store: dict[str, str]
) -> None:
    dead = {**store, "endpointUrl": f"http://127.0.0.1:{free_port()}"}
    operators.start(allowlist=Allowlist(endpoints=(dead["endpointUrl"],)))
    api.create(QUALIFICATION_RUNS.plural, run_manifest(
        "nostore", dead, timeouts={"backendErrorSeconds": BOUND_S}))
    failed = wait_phase(api, "nostore", "Failed", timeout=60)
    message = condition(failed, "Ready")["message"]
    assert "127.0.0.1" in message and "timeouts.backendErrorSeconds" in message
    events = _events(api, "nostore")
    assert "BackendError" in [r for r, _ in events]
    # Each retry wrote to the store again, with the one checkpoint key Secret made on the
    # first: not one more each time.
    keys = [s["metadata"]["name"] for s in api.list("secrets", NAMESPACE)
            if s["metadata"]["name"].startswith("nostore-checkpoint-key-")]
    assert len(keys) == 1, keys
    assert failed["status"]["checkpointKeySecret"] == keys[0]

"""The operator's allowlists: a refused run ends Failed naming the rule, before any object
is created or any store request is sent; an allowed run proceeds."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest

from resumequal_operator.allowlist import Allowlist, SecurityAllowlist
from resumequal_operator.kube import JOBS, PYTORCHJOBS, QUALIFICATION_RUNS
from testing.cluster.testapi import RealAPI
from testing.operator.harness import (
    NAMESPACE,
    Operators,
    condition,
    events,
    qr,
    run_manifest,
    wait_phase,
)
from tests.waiting import eventually

if TYPE_CHECKING:
    from tests.s3server import SeaweedFS


class _Recorder(BaseHTTPRequestHandler):
    """Answers every request 403 and remembers it."""

    seen: list[tuple[str, str, dict[str, str]]]

    def _any(self) -> None:
        self.seen.append((self.command, self.path, dict(self.headers)))
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def elsewhere() -> Iterator[tuple[str, list[tuple[str, str, dict[str, str]]]]]:
    """An endpoint outside the allowlist, on loopback: its URL and the requests it got."""
    seen: list[tuple[str, str, dict[str, str]]] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def _created_for(api: RealAPI, run: str) -> list[str]:
    """Everything ever created for ``run``: jobs, PyTorchJobs, its checkpoint key Secret."""
    return [f"{plural}/{o['metadata']['name']}"
            for plural in (PYTORCHJOBS.plural, JOBS.plural, "secrets")
            for o in api.created(plural)
            if (o["metadata"].get("labels") or {}).get("resumequal.dev/run") == run]


def _assert_refused(api: RealAPI, name: str, field: str, rule: str,
                    aws_env: dict[str, str]) -> str:
    """The run ended Failed, NotAllowed, naming ``field`` and ``rule``; nothing created."""
    failed = wait_phase(api, name, "Failed")
    ready = condition(failed, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "NotAllowed"
    assert field in ready["message"] and rule in ready["message"]
    assert condition(failed, "Qualified")["reason"] == "NotAllowed"
    assert failed["status"]["verdict"]["result"] == "INVALID"
    [(reason, kind, message)] = events(api, name)
    assert (reason, kind) == ("NotAllowed", "Warning") and message == ready["message"]
    assert _created_for(api, name) == []
    text = json.dumps(failed) + json.dumps(events(api, name))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # the operator's own
        assert aws_env[name] not in text
    return str(ready["message"])


@pytest.mark.parametrize(
    ("rules", "spec", "field", "says"),
    [
        ({"images": ("ghcr.io/trusted/*",)}, {},
         "spec.stack.image", "image ghcr.io/acme/train:2026-11-29 is not allowed by "
         "allowlist.images [ghcr.io/trusted/*]"),
        ({"service_accounts": ("qual-*",)}, {"serviceAccountName": "cluster-admin-sa"},
         "spec.serviceAccountName", "service account cluster-admin-sa is not allowed by "
         "allowlist.serviceAccounts [qual-*]"),
        ({"service_accounts": ("qual-*",)}, {},
         "spec.serviceAccountName", "service account default (unset: the namespace's "
         "default) is not allowed by allowlist.serviceAccounts [qual-*]"),
        ({"buckets": ("qual-*",)}, {},
         "spec.store.uri", "is not allowed by allowlist.buckets [qual-*]"),
        ({"security": SecurityAllowlist(capabilities=("SYS_PTRACE",))},
         {"security": {"securityContext": {"capabilities": {"drop": ["ALL"],
                                                            "add": ["SYS_ADMIN"]}}}},
         "spec.security.securityContext.capabilities.add", "capability SYS_ADMIN is not "
         "allowed by allowlist.security.capabilities [SYS_PTRACE]"),
        ({"security": SecurityAllowlist()},
         {"security": {"securityContext": {"privileged": True,
                                           "allowPrivilegeEscalation": True}}},
         "spec.security.securityContext.privileged", "is not allowed by "
         "allowlist.security.privileged (false)"),
        ({"security": SecurityAllowlist()},
         {"security": {"podSecurityContext": {"runAsUser": 0, "runAsNonRoot": False}}},
         "spec.security.podSecurityContext.runAsUser", "uid 0 (root) is not allowed by "
         "allowlist.security.runAsRoot (false)"),
    ],
    ids=["image", "service-account", "default-service-account", "bucket", "capability",
         "privileged", "root"],
)
def test_each_rule_refuses_a_run_naming_itself_while_an_allowed_run_proceeds(
    api: RealAPI, operators: Operators, store: dict[str, str], aws_env: dict[str, str],
    s3_server: SeaweedFS, rules: dict[str, Any], spec: dict[str, Any],
    field: str, says: str,
) -> None:
    bucket = store["uri"].removeprefix("s3://").split("/")[0]
    allowlist = Allowlist(endpoints=(s3_server.endpoint,), **rules)
    operators.start(allowlist=allowlist)
    api.create(QUALIFICATION_RUNS.plural, run_manifest("refused", store, **spec))
    message = _assert_refused(api, "refused", field, says, aws_env)
    if field == "spec.store.uri":
        assert f"bucket {bucket} " in message

    admitted = f"qual-{uuid.uuid4().hex[:12]}"  # a bucket the allowlist admits
    allowed = {"images": {"stack": {"image": "ghcr.io/trusted/train:1"}},
               "service_accounts": {"serviceAccountName": "qual-runner"}, "buckets": {},
               # What the capability rule admits; a restricted run under the others.
               "security": {"security": {"securityContext": {"capabilities": {
                   "drop": ["ALL"], "add": ["SYS_PTRACE"]}}}}
               if rules.get("security") and rules["security"].capabilities else {}}
    [rule] = rules
    if rule == "buckets":
        s3_server.client("s3").create_bucket(Bucket=admitted)
        store = {**store, "uri": f"s3://{admitted}/x"}
    api.create(QUALIFICATION_RUNS.plural, run_manifest("allowed", store, **allowed[rule]))
    wait_phase(api, "allowed", "LegsRunning")
    assert len(eventually(
        lambda: [n for n in _created_for(api, "allowed") if n.startswith(PYTORCHJOBS.plural)]
        or None, what="the allowed run's PyTorchJobs")) >= 1


def test_an_endpoint_outside_the_allowlist_is_never_sent_a_request(
    api: RealAPI, operators: Operators, store: dict[str, str], aws_env: dict[str, str],
    elsewhere: tuple[str, list[tuple[str, str, dict[str, str]]]],
) -> None:
    url, seen = elsewhere
    operators.start()  # the S3 server's endpoint only
    # retention Delete: even the finalizer must not ask that endpoint to delete anything.
    api.create(QUALIFICATION_RUNS.plural, run_manifest(
        "ssrf", {**store, "endpointUrl": url}, retention={"policy": "Delete"}))
    message = _assert_refused(api, "ssrf", "spec.store.endpointUrl",
                              "is not allowed by allowlist.endpoints", aws_env)
    assert url in message  # scheme://host:port, never more
    api.delete(QUALIFICATION_RUNS.plural, NAMESPACE, "ssrf")
    api.wait_for(lambda: api.get(QUALIFICATION_RUNS.plural, NAMESPACE, "ssrf") is None, 10,
                 "the finalizer to let the refused run go")
    assert seen == []


def test_no_endpoint_is_allowed_by_default(
    api: RealAPI, operators: Operators, store: dict[str, str], aws_env: dict[str, str],
    elsewhere: tuple[str, list[tuple[str, str, dict[str, str]]]],
) -> None:
    url, seen = elsewhere
    operators.start(allowlist=Allowlist())
    api.create(QUALIFICATION_RUNS.plural, run_manifest("any", {**store, "endpointUrl": url}))
    message = _assert_refused(api, "any", "spec.store.endpointUrl",
                              "allowlist.endpoints [] (empty", aws_env)
    assert "own credentials" in message
    assert seen == []


def test_a_started_run_that_a_narrower_allowlist_refuses_is_stopped(
    api: RealAPI, operators: Operators, store: dict[str, str], s3_server: SeaweedFS,
) -> None:
    first = operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("narrowed", store))
    wait_phase(api, "narrowed", "LegsRunning")
    eventually(lambda: len(api.list(PYTORCHJOBS.plural, NAMESPACE)) == 2 or None,
               what="both legs' PyTorchJobs")
    operators.stop(first)
    narrow = operators.start(allowlist=Allowlist(images=("ghcr.io/trusted/*",),
                                                 endpoints=(s3_server.endpoint,)))
    failed = wait_phase(api, "narrowed", "Failed")
    assert condition(failed, "Ready")["reason"] == "NotAllowed"
    assert "allowlist.images" in condition(failed, "Ready")["message"]
    eventually(lambda: not [j for j in api.list(PYTORCHJOBS.plural, NAMESPACE)
                            if not j["metadata"].get("deletionTimestamp")] or None,
               what="its legs deleted")
    assert "NotAllowed" in [r for r, _, _ in events(api, "narrowed")]
    # Stopped for good: a wider allowlist again does not start it over its run location.
    operators.stop(narrow)
    wide = operators.start()
    eventually(lambda: wide.reconciles >= 1 or None, what="a reconcile of the stopped run")
    assert qr(api, "narrowed")["status"]["phase"] == "Failed"
    assert len(api.created(PYTORCHJOBS.plural)) == 2


def test_a_run_the_security_allowlist_permits_gets_its_pods_as_asked(
    api: RealAPI, operators: Operators, store: dict[str, str], s3_server: SeaweedFS,
) -> None:
    operators.start(allowlist=Allowlist(endpoints=(s3_server.endpoint,),
                                        security=SecurityAllowlist(privileged=True,
                                                                   run_as_root=True)))
    security = {"podSecurityContext": {"runAsUser": 0, "runAsNonRoot": False},
                "securityContext": {"privileged": True, "allowPrivilegeEscalation": True,
                                    "runAsNonRoot": False}}
    api.create(QUALIFICATION_RUNS.plural, run_manifest("root", store, security=security))
    wait_phase(api, "root", "LegsRunning")
    jobs = eventually(lambda: api.list(PYTORCHJOBS.plural, NAMESPACE) or None,
                      what="the run's PyTorchJobs")
    for job in jobs:
        pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
        assert pod["securityContext"]["runAsUser"] == 0
        assert pod["containers"][0]["securityContext"]["privileged"] is True

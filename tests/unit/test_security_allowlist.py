"""``spec.security`` is bounded by ``allowlist.security``: each way out of the Pod Security
"restricted" profile is refused naming its field, unless the allowlist permits it, and
what is permitted is what the pods get."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from resumequal_operator import pytorchjob, trainjob
from resumequal_operator.allowlist import Allowlist, SecurityAllowlist
from resumequal_operator.main import main
from resumequal_operator.resource import QualificationRunSpec
from resumequal_operator.validation import RunSpecError, parse_run_spec
from tests.pod_security import restricted_violations

POD = "spec.security.podSecurityContext"
CONTAINER = "spec.security.securityContext"


def _spec(pod: dict[str, Any] | None = None,
          container: dict[str, Any] | None = None) -> QualificationRunSpec:
    return parse_run_spec({
        "stack": {"image": "ghcr.io/acme/train:1"}, "store": {"uri": "s3://acme-runs/q"},
        "world": {"nnodes": 2}, "preemption": {"rank": 1},
        "security": {"podSecurityContext": pod or {}, "securityContext": container or {}}})


# (pod context, container context, the field refused, the entry that permits it)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any], str, dict[str, Any]]] = {
    "privileged": ({}, {"privileged": True, "allowPrivilegeEscalation": True},
                   f"{CONTAINER}.privileged", {"privileged": True}),
    "proc-unmasked": ({}, {"procMount": "Unmasked"}, f"{CONTAINER}.procMount",
                      {"privileged": True}),
    "selinux-type": ({"seLinuxOptions": {"type": "spc_t"}}, {}, f"{POD}.seLinuxOptions",
                     {"privileged": True}),
    "uid-0-pod": ({"runAsUser": 0}, {}, f"{POD}.runAsUser", {"run_as_root": True}),
    "uid-0-container": ({}, {"runAsUser": 0}, f"{CONTAINER}.runAsUser",
                        {"run_as_root": True}),
    "non-root-false": ({"runAsNonRoot": False}, {"runAsNonRoot": False},
                       f"{CONTAINER}.runAsNonRoot", {"run_as_root": True}),
    "non-root-unset": ({"runAsNonRoot": None}, {"runAsNonRoot": None},
                       f"{CONTAINER}.runAsNonRoot", {"run_as_root": True}),
    "escalation": ({}, {"allowPrivilegeEscalation": True},
                   f"{CONTAINER}.allowPrivilegeEscalation",
                   {"allow_privilege_escalation": True}),
    "sys-admin": ({}, {"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}},
                  f"{CONTAINER}.capabilities.add", {"capabilities": ("SYS_ADMIN",)}),
    "cap-prefix": ({}, {"capabilities": {"drop": ["ALL"], "add": ["cap_sys_ptrace"]}},
                   f"{CONTAINER}.capabilities.add", {"capabilities": ("CAP_SYS_PTRACE",)}),
    "default-caps-kept": ({}, {"capabilities": {"add": ["NET_BIND_SERVICE"]}},
                          f"{CONTAINER}.capabilities.drop", {"capabilities": ("*",)}),
    "seccomp-unconfined-pod": ({"seccompProfile": {"type": "Unconfined"}}, {},
                               f"{POD}.seccompProfile", {"unconfined": True}),
    "seccomp-unconfined": ({}, {"seccompProfile": {"type": "Unconfined"}},
                           f"{CONTAINER}.seccompProfile", {"unconfined": True}),
    "seccomp-unset": ({"seccompProfile": None}, {"seccompProfile": None},
                      f"{CONTAINER}.seccompProfile", {"unconfined": True}),
    "apparmor-unconfined": ({}, {"appArmorProfile": {"type": "Unconfined"}},
                            f"{CONTAINER}.appArmorProfile", {"unconfined": True}),
    "sysctl": ({"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}, {},
               f"{POD}.sysctls", {"sysctls": ("kernel.*",)}),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_each_way_out_of_the_restricted_profile_is_refused_naming_its_field(
    case: tuple[dict[str, Any], dict[str, Any], str, dict[str, Any]],
) -> None:
    pod, container, field, _ = case
    spec = _spec(pod, container)
    refused = Allowlist().refusals(spec)
    assert field in [p.path for p in refused], refused
    assert all(p.path.startswith("spec.security.") for p in refused)
    assert any("allowlist.security." in p.message for p in refused)
    # What it would render leaves the profile: the refusal is what keeps it off a node.
    rendered = pytorchjob._pod_spec(spec, {"name": "pytorch"}, None)
    assert restricted_violations(rendered) != []


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_each_is_permitted_where_the_allowlist_says_so_and_rendered_as_asked(
    case: tuple[dict[str, Any], dict[str, Any], str, dict[str, Any]],
) -> None:
    pod, container, _, entry = case
    spec = _spec(pod, container)
    assert Allowlist(security=SecurityAllowlist(**entry)).refusals(spec) == []
    rendered = pytorchjob._pod_spec(spec, {"name": "pytorch"}, None)
    for key, value in container.items():
        assert rendered["containers"][0]["securityContext"][key] == value
    for key, value in pod.items():
        assert rendered["securityContext"][key] == value
    patch = trainjob._pod_patch(spec, _leg(), {})["spec"]  # the TrainJob legs' too
    assert patch["securityContext"] == rendered["securityContext"]
    assert patch["containers"][0]["securityContext"] == \
        rendered["containers"][0]["securityContext"]


def _leg() -> Any:
    from resumequal.qualify.plan import qualification_plan
    from resumequal_operator.validation import qualification_spec

    return qualification_plan(qualification_spec(_spec(), "s3://acme-runs/q/x")).legs[0]


def test_an_entry_permits_only_what_it_names() -> None:
    spec = _spec({"runAsUser": 0, "sysctls": [{"name": "net.core.somaxconn", "value": "1"}]},
                 {"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN", "SYS_PTRACE"]}})
    narrow = Allowlist(security=SecurityAllowlist(capabilities=("SYS_PTRACE",),
                                                  sysctls=("net.ipv4.*",), unconfined=True))
    messages = [str(p) for p in narrow.refusals(spec)]
    assert messages == [
        f"{POD}.runAsUser: uid 0 (root) is not allowed by allowlist.security.runAsRoot "
        "(false)",
        f"{CONTAINER}.capabilities.add: capability SYS_ADMIN is not allowed by "
        "allowlist.security.capabilities [SYS_PTRACE]",
        f"{POD}.sysctls: sysctl net.core.somaxconn is not allowed by "
        "allowlist.security.sysctls [net.ipv4.*]",
    ]


def test_privileged_implies_escalation_and_restricted_settings_need_nothing() -> None:
    privileged = _spec(container={"privileged": True, "allowPrivilegeEscalation": True})
    assert Allowlist(security=SecurityAllowlist(privileged=True)).refusals(privileged) == []
    # What the restricted profile itself admits needs no entry.
    fine = _spec({"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 2000,
                  "seccompProfile": {"type": "Localhost", "localhostProfile": "train.json"},
                  "supplementalGroups": [3000]},
                 {"readOnlyRootFilesystem": True, "runAsUser": 1000,
                  "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}})
    assert Allowlist().refusals(fine) == []


@pytest.mark.parametrize("key", ["hostNetwork", "hostPID", "hostIPC", "volumes"])
def test_host_namespaces_are_not_expressible_in_a_security_context(key: str) -> None:
    with pytest.raises(RunSpecError) as info:
        _spec({key: True})
    [problem] = info.value.problems
    assert problem.path == POD and key in problem.message
    with pytest.raises(RunSpecError):
        _spec(container={key: True})


def test_the_options_make_the_security_allowlist() -> None:
    from resumequal_operator.main import security_allowlist_of

    assert security_allowlist_of(True, False, True, False, ("cap_sys_ptrace", "*"),
                                 ("net.*",)) == SecurityAllowlist(
        privileged=True, allow_privilege_escalation=True,
        capabilities=("SYS_PTRACE", "*"), sysctls=("net.*",))
    result = CliRunner().invoke(main, ["run", "--allow-capability", "SYS ADMIN"])
    assert result.exit_code == 2 and "--allow-capability" in result.output

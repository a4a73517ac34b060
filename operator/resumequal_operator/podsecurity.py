"""How far a run's ``spec.security`` takes its pods from the Pod Security "restricted"
profile: each departure, the field that makes it, and the ``allowlist.security`` entry that
would permit it (:mod:`.allowlist` judges them).

The pods' defaults (:data:`.pytorchjob.POD_SECURITY_CONTEXT`,
:data:`.pytorchjob.CONTAINER_SECURITY_CONTEXT`) meet the profile; a run's objects are
merged over them key by key, so what is judged is the merged context every leg, comparator
and zoom pod gets — the same for PyTorchJob and TrainJob legs. The rules follow
k8s.io/pod-security-admission's policy checks (check_privileged.go,
check_allowPrivilegeEscalation.go, check_capabilities_restricted.go, check_runAsNonRoot.go,
check_runAsUser.go, check_seccompProfile_restricted.go, check_appArmorProfile.go,
check_procMount.go, check_seLinuxOptions.go, check_windowsHostProcess.go,
check_sysctls.go). Host namespaces (hostNetwork, hostPID, hostIPC) and host paths are not
expressible in ``spec.security`` at all (:class:`.resource.SecuritySpec` refuses fields
that are not a security context's).

Must not: talk to the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from resumequal_operator.pytorchjob import (
    CONTAINER_SECURITY_CONTEXT,
    POD_SECURITY_CONTEXT,
    merged,
)
from resumequal_operator.resource import SecuritySpec

POD = "spec.security.podSecurityContext"
CONTAINER = "spec.security.securityContext"
# The allowlist.security entries, as the chart's values spell them.
Entry = Literal["privileged", "runAsRoot", "allowPrivilegeEscalation", "unconfined",
                "capabilities", "sysctls"]
# check_capabilities_restricted.go: the one capability a restricted container may add.
RESTRICTED_ADDS = frozenset({"NET_BIND_SERVICE"})
# What a capability entry that keeps the runtime's defaults (no drop of ALL) is listed as.
ANY_CAPABILITY = "*"
# check_seLinuxOptions.go: the types a baseline pod may set.
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t",
                           "container_engine_t"})
_CONFINED = ("RuntimeDefault", "Localhost")


@dataclass(frozen=True)
class Departure:
    """One way the merged contexts leave the restricted profile."""

    path: str  # the field, as a Problem names it
    what: str  # what it does, for the message
    entry: Entry  # the allowlist.security entry that permits it
    item: str | None = None  # the capability or sysctl that entry must list


def capability(name: str) -> str:
    """A capability as the runtime reads it: upper case, without ``CAP_``."""
    upper = name.upper()
    return upper[4:] if upper.startswith("CAP_") else upper


def departures(security: SecuritySpec) -> list[Departure]:
    """Every departure of the pods ``security`` gives, in field order."""
    pod = merged(POD_SECURITY_CONTEXT, security.pod_security_context)
    container = merged(CONTAINER_SECURITY_CONTEXT, security.security_context)
    out = _privileged(pod, container) + _root(pod, container)
    if container.get("allowPrivilegeEscalation") is not False:
        out.append(Departure(f"{CONTAINER}.allowPrivilegeEscalation",
                             "privilege escalation (allowPrivilegeEscalation not false: "
                             "setuid binaries can gain privileges)",
                             "allowPrivilegeEscalation"))
    out += _capabilities(container) + _unconfined(pod, container)
    for sysctl in pod.get("sysctls") or []:
        name = str(sysctl.get("name")) if isinstance(sysctl, dict) else str(sysctl)
        out.append(Departure(f"{POD}.sysctls", f"sysctl {name[:253]}", "sysctls",
                             item=name[:253]))
    return out


def _privileged(pod: dict[str, Any], container: dict[str, Any]) -> list[Departure]:
    out = []
    if container.get("privileged"):
        out.append(Departure(f"{CONTAINER}.privileged", "privileged: true (every capability "
                             "and the host's devices)", "privileged"))
    if container.get("procMount") not in (None, "Default"):
        out.append(Departure(f"{CONTAINER}.procMount", "an unmasked /proc (procMount "
                             f"{container.get('procMount')})", "privileged"))
    for where, ctx in ((POD, pod), (CONTAINER, container)):
        if _get(ctx, "windowsOptions", "hostProcess"):
            out.append(Departure(f"{where}.windowsOptions.hostProcess",
                                 "a Windows host process", "privileged"))
        se = ctx.get("seLinuxOptions") or {}
        if isinstance(se, dict) and (se.get("user") or se.get("role")
                                     or (se.get("type") or "") not in SELINUX_TYPES):
            out.append(Departure(f"{where}.seLinuxOptions", "an SELinux user, role or "
                                 "type of its own", "privileged"))
    return out


def _root(pod: dict[str, Any], container: dict[str, Any]) -> list[Departure]:
    out = []
    for where, ctx in ((POD, pod), (CONTAINER, container)):
        if ctx.get("runAsUser") == 0:
            out.append(Departure(f"{where}.runAsUser", "uid 0 (root)", "runAsRoot"))
        if ctx.get("runAsNonRoot") is False:
            out.append(Departure(f"{where}.runAsNonRoot", "runAsNonRoot: false",
                                 "runAsRoot"))
    # The container's setting wins over the pod's; one of them must say true.
    effective = container.get("runAsNonRoot")
    if effective is None:
        effective = pod.get("runAsNonRoot")
    if effective is not True and not any(d.path.endswith(".runAsNonRoot") for d in out):
        out.append(Departure(f"{CONTAINER}.runAsNonRoot", "runAsNonRoot unset (the image "
                             "may run as root)", "runAsRoot"))
    return out


def _capabilities(container: dict[str, Any]) -> list[Departure]:
    caps = container.get("capabilities") or {}
    if not isinstance(caps, dict):
        caps = {}
    out = []
    if "ALL" not in {capability(str(c)) for c in caps.get("drop") or []}:
        out.append(Departure(f"{CONTAINER}.capabilities.drop", "the runtime's default "
                             "capabilities kept (drop does not name ALL)", "capabilities",
                             item=ANY_CAPABILITY))
    for name in caps.get("add") or []:
        cap = capability(str(name))[:64]
        if cap not in RESTRICTED_ADDS:
            out.append(Departure(f"{CONTAINER}.capabilities.add", f"capability {cap}",
                                 "capabilities", item=cap))
    return out


def _unconfined(pod: dict[str, Any], container: dict[str, Any]) -> list[Departure]:
    out = []
    for where, ctx in ((POD, pod), (CONTAINER, container)):
        for profile in ("seccompProfile", "appArmorProfile"):
            if _get(ctx, profile, "type") == "Unconfined":
                out.append(Departure(f"{where}.{profile}", f"{profile} Unconfined",
                                     "unconfined"))
    seccomp = _get(container, "seccompProfile", "type") or _get(pod, "seccompProfile", "type")
    if seccomp not in _CONFINED and not any(d.path.endswith(".seccompProfile") for d in out):
        out.append(Departure(f"{CONTAINER}.seccompProfile", "no seccomp profile (as "
                             "Unconfined)", "unconfined"))
    return out


def _get(ctx: dict[str, Any], key: str, field: str) -> Any:
    value = ctx.get(key)
    return value.get(field) if isinstance(value, dict) else None


__all__ = ["ANY_CAPABILITY", "Departure", "Entry", "capability", "departures"]

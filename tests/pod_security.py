"""The Pod Security Standards "restricted" profile, as the API server's admission enforces it.

Each rule follows a check in kubernetes/kubernetes
``staging/src/k8s.io/pod-security-admission/policy/`` (the file is named per rule), at the
latest version of the profile. :func:`restricted_violations` returns what the admission
plugin would name in its "violates PodSecurity" message; an empty list means admitted.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

# check_restrictedVolumes.go: the volume types a restricted pod may use.
ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                   "persistentVolumeClaim", "projected", "secret"}
# check_sysctls.go: the safe set.
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}


# check_seLinuxOptions.go: the types a pod may set (user and role never).
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t",
                 "container_engine_t"}


def _selinux(ctx: Obj) -> bool:
    """Whether ``ctx``'s seLinuxOptions break check_seLinuxOptions.go."""
    se = ctx.get("seLinuxOptions") or {}
    return bool(se.get("user") or se.get("role")
                or (se.get("type") or "") not in SELINUX_TYPES)


def _containers(pod: Obj) -> list[Obj]:
    return [*(pod.get("initContainers") or []), *(pod.get("containers") or []),
            *(pod.get("ephemeralContainers") or [])]


def restricted_violations(pod: Obj) -> list[str]:
    """What a pod spec breaks of the restricted profile (empty: admitted)."""
    out: list[str] = []
    psc = pod.get("securityContext") or {}
    # check_hostNamespaces.go
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            out.append(f"host namespaces ({key}=true)")
    # check_restrictedVolumes.go (hostPath is the baseline's check_hostPathVolumes.go)
    for v in pod.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            out.append(f"restricted volume types ({v['name']}: {sorted(kinds)})")
    # check_sysctls.go
    for s in psc.get("sysctls") or []:
        if s.get("name") not in SAFE_SYSCTLS:
            out.append(f"forbidden sysctls ({s.get('name')})")
    pod_non_root = psc.get("runAsNonRoot")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    if psc.get("runAsUser") == 0:  # check_runAsUser.go
        out.append("runAsUser=0 (pod)")
    # check_seccompProfile_restricted.go: a pod-level profile, when set, must be one too.
    if pod_seccomp is not None and pod_seccomp not in ("RuntimeDefault", "Localhost"):
        out.append(f"seccompProfile (pod: {pod_seccomp})")
    if (psc.get("appArmorProfile") or {}).get("type") == "Unconfined":  # check_appArmorProfile.go
        out.append("appArmorProfile Unconfined (pod)")
    if _selinux(psc):
        out.append("seLinuxOptions (pod)")
    for c in _containers(pod):
        name = c.get("name", "?")
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):  # check_privileged.go
            out.append(f"privileged ({name})")
        if sc.get("allowPrivilegeEscalation") is not False:  # check_allowPrivilegeEscalation.go
            out.append(f"allowPrivilegeEscalation != false ({name})")
        caps = sc.get("capabilities") or {}
        # check_capabilities_restricted.go: drop ALL; add nothing but NET_BIND_SERVICE.
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"unrestricted capabilities ({name}: must drop ALL)")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"unrestricted capabilities ({name}: adds {caps.get('add')})")
        # check_runAsNonRoot.go: container setting wins over the pod's; one must be true.
        non_root = sc.get("runAsNonRoot", pod_non_root)
        if non_root is not True:
            out.append(f"runAsNonRoot != true ({name})")
        if sc.get("runAsUser") == 0:  # check_runAsUser.go
            out.append(f"runAsUser=0 ({name})")
        # check_seccompProfile_restricted.go: RuntimeDefault or Localhost, pod or container.
        seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"seccompProfile ({name}: {seccomp or 'unset'})")
        # check_hostPorts.go
        if any(p.get("hostPort") for p in c.get("ports") or []):
            out.append(f"hostPort ({name})")
        # check_procMount.go
        if sc.get("procMount") not in (None, "Default"):
            out.append(f"procMount ({name})")
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            out.append(f"appArmorProfile Unconfined ({name})")  # check_appArmorProfile.go
        if _selinux(sc):
            out.append(f"seLinuxOptions ({name})")  # check_seLinuxOptions.go
    return out

"""The node agent runs a pod's container as a process of the image's command, and reports
how it ended as the kubelet does from a container runtime: the process's own exit code, 128
+ the signal that killed it (a SIGTERM ignored, then SIGKILL after the grace period), and
128 with ``StartError`` for a command that cannot be started (containerd's answer, as the
kubelet shows it). On the pod cluster: the real API server, the agent's real processes."""

from __future__ import annotations

from typing import Any

import pytest

from testing.cluster.cluster import WORKER_IMAGE
from testing.cluster.testapi import RealAPI
from testing.operator.harness import NAMESPACE

pytestmark = pytest.mark.timeout(180)
Obj = dict[str, Any]

# Pod Security "restricted", which the namespace enforces.
RESTRICTED: Obj = {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                   "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def _pod(name: str, command: list[str], grace: int = 30) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": grace,
                     "containers": [{"name": "main", "image": WORKER_IMAGE,
                                     "command": command, "securityContext": RESTRICTED}]}}


def _terminated(pod: Obj | None) -> Obj | None:
    for status in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        if "terminated" in (status.get("state") or {}):
            return dict(status["state"]["terminated"])
    return None


def _ended(api: RealAPI, name: str, timeout: float = 90) -> tuple[Obj, Obj]:
    """The pod once its container has ended, and how it ended."""
    def ended() -> tuple[Obj, Obj] | None:
        pod = api.get("pods", NAMESPACE, name)
        terminated = _terminated(pod)
        return None if pod is None or terminated is None else (pod, terminated)
    return api.wait_for(ended, timeout=timeout, message=f"pod {name}'s container to end")


def test_a_process_exit_code_is_the_containers(pods: Any, api: RealAPI) -> None:
    api.create("pods", _pod("exits-3", ["python3", "-c", "import sys; sys.exit(3)"]))
    pod, terminated = _ended(api, "exits-3")
    assert terminated["exitCode"] == 3 and terminated["reason"] == "Error"
    assert pod["status"]["phase"] == "Failed"

    api.create("pods", _pod("exits-0", ["python3", "-c", "print('done')"]))
    pod, terminated = _ended(api, "exits-0")
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
    assert pod["status"]["phase"] == "Succeeded"


def test_a_command_that_cannot_start_ends_128_start_error(pods: Any, api: RealAPI) -> None:
    api.create("pods", _pod("no-such-command", ["/no/such/command"]))
    pod, terminated = _ended(api, "no-such-command")
    assert (terminated["exitCode"], terminated["reason"]) == (128, "StartError")
    assert "executable file not found" in terminated["message"]
    assert pod["status"]["phase"] == "Failed"


def test_a_sigterm_ignored_ends_137_after_the_grace_period(pods: Any, api: RealAPI) -> None:
    # Ready (a TCP probe the agent makes) once SIGTERM is ignored: deleted before that, the
    # process would die of the SIGTERM itself (143).
    script = ("import signal, socket, time\n"
              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "s = socket.create_server(('0.0.0.0', 8080))\n"
              "time.sleep(600)\n")
    pod = _pod("ignores-sigterm", ["python3", "-c", script], grace=2)
    pod["spec"]["containers"][0]["readinessProbe"] = {
        "tcpSocket": {"port": 8080}, "periodSeconds": 1}
    api.create("pods", pod)
    history = api.watch("pods")

    def ready() -> bool:
        status = (api.get("pods", NAMESPACE, "ignores-sigterm") or {}).get("status") or {}
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in status.get("conditions") or [])
    api.wait_for(ready, timeout=90, message="the pod ready")
    api.delete("pods", NAMESPACE, "ignores-sigterm", grace_period_seconds=2)

    # The kubelet's last status before the pod is removed (a watch sees it; the object is
    # gone afterwards): the process killed by SIGKILL once the 2 s grace ran out.
    def last_status() -> Obj | None:
        events = [e for e in history() if e.object["metadata"]["name"] == "ignores-sigterm"]
        if not any(e.type == "DELETED" for e in events):
            return None
        ended = [t for e in events if (t := _terminated(e.object)) is not None]
        return ended[-1] if ended else {}
    terminated = api.wait_for(last_status, timeout=60, message="the pod removed")
    assert terminated.get("exitCode") == 137, terminated


def _served(api: RealAPI, verb: str, resource: str) -> float:
    """How many ``verb`` requests of ``resource`` the API server has served (its metrics)."""
    import urllib.request

    cp = api.server.cp
    with urllib.request.urlopen(f"{cp.server}/metrics", timeout=30,
                                context=cp.ssl_context()) as r:
        text = r.read().decode()
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
               if line.startswith("apiserver_request_total{") and f'verb="{verb}"' in line
               and f'resource="{resource}"' in line and 'subresource=""' in line)


def test_a_container_sees_its_namespaces_services_from_the_agents_watch(
    pods: Any, api: RealAPI
) -> None:
    """Each container's environment names the Services of its namespace (and the API
    server's) as the kubelet's does, from the agent's watch: no listing per container."""
    created = api.create("services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "my-db"},
        "spec": {"selector": {"app": "none"}, "ports": [{"name": "sql", "port": 5432}]}})
    ip = created["spec"]["clusterIP"]
    script = ("import os, sys\n"
              "env = os.environ\n"
              "sys.exit(0 if env.get('MY_DB_SERVICE_HOST') == sys.argv[1]\n"
              "         and env.get('MY_DB_SERVICE_PORT_SQL') == '5432'\n"
              "         and env.get('KUBERNETES_SERVICE_HOST') else 7)\n")
    lists = _served(api, "LIST", "services")
    for i in range(3):
        api.create("pods", _pod(f"sees-db-{i}", ["python3", "-c", script, ip]))
    for i in range(3):
        _, terminated = _ended(api, f"sees-db-{i}")
        assert terminated["exitCode"] == 0, terminated
    # A relisting at most (a watch that ended), never one per container.
    assert _served(api, "LIST", "services") - lists <= 1

    api.delete("services", NAMESPACE, "my-db")
    gone = "import os, sys; sys.exit(7 if 'MY_DB_SERVICE_HOST' in os.environ else 0)"

    def unseen() -> bool | None:
        name = f"after-{len(api.list('pods', NAMESPACE))}"
        api.create("pods", _pod(name, ["python3", "-c", gone]))
        return _ended(api, name)[1]["exitCode"] == 0 or None
    api.wait_for(unseen, timeout=60, message="a container without the deleted Service")

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

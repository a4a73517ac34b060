"""A simulated kubelet: pods start, run one container each through a :class:`Runtime`, and
end as the kubelet ends them (paths in kubernetes/kubernetes).

- Pending → Running ``start_delay`` s after the kubelet first sees the pod; the container
  gets its env with ``valueFrom`` resolved (fieldRef metadata.name/namespace/uid, a label
  or annotation, status.podIP; secretKeyRef from a Secret: a missing one keeps the pod Pending with
  ``CreateContainerConfigError``, pkg/kubelet/kubelet_pods.go makeEnvironmentVariables).
- Deletion, whatever its grace (0 included): SIGTERM to the container's main process, and
  SIGKILL to every process of the container only after max(grace, 2 s)
  (kuberuntime/kuberuntime_container.go killContainer, ``minimumGracePeriodInSeconds`` in
  kuberuntime_manager.go; kubernetes#120449: older kubelets used the pod's
  terminationGracePeriodSeconds for a grace-0 deletion, pod_workers.go
  calculateEffectiveGracePeriod). A grace-0 deletion has already removed the API object; a
  graceful one keeps it (deletionTimestamp) until the container stopped.
- The terminal phase is written only once the container has stopped (status/
  status_manager.go mergePodStatus), with the exit code, also for a pod being deleted
  (k8s >= 1.27, #115331), before the object is removed: Succeeded for exit 0, else Failed.
- ``spec.activeDeadlineSeconds`` (pkg/kubelet/active_deadline.go): past startTime +
  deadline the container is stopped with the pod's grace and the pod ends Failed with
  reason ``DeadlineExceeded``; the object stays.

Not simulated: in-place container restarts (restartPolicy OnFailure/Always; such a pod
raises), init containers, more than one container per pod, probes, images, volumes.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import ApiError
from .objects import clone, now_rfc3339, parse_rfc3339
from .patch import MERGE
from .store import Store

log = logging.getLogger(__name__)

Obj = dict[str, Any]
MIN_GRACE_S = 2  # kuberuntime_manager.go minimumGracePeriodInSeconds
DEFAULT_GRACE_S = 30  # PodSpec.terminationGracePeriodSeconds default
DEADLINE = ("DeadlineExceeded", "Pod was active on the node longer than the specified deadline")


class ConfigError(Exception):
    """The container cannot be configured (CreateContainerConfigError): a missing Secret."""


@dataclass
class ContainerSpec:
    """What a runtime starts: the pod as it was, its only container, env resolved."""

    pod: Obj
    command: list[str]  # the container's command followed by its args
    env: dict[str, str]


class Handle(Protocol):
    """A started container."""

    def exit_code(self) -> int | None:
        """The exit code (128+signal when a signal ended it), None while it runs."""

    def terminate(self) -> None:
        """SIGTERM to the container's main process."""

    def kill(self) -> None:
        """SIGKILL to every process of the container."""


class Runtime(Protocol):
    """Starts containers: scripted threads (:mod:`.scripted`) or processes (:mod:`.processes`)."""

    def start(self, spec: ContainerSpec, wake: Callable[[], None]) -> Handle:
        """Start the container; ``wake()`` when it exits."""

    def close(self) -> None:
        """Kill whatever still runs."""


@dataclass
class _Pod:
    start_at: float
    handle: Handle | None = None
    kill_at: float | None = None  # SIGTERM sent; SIGKILL due then
    deadline_hit: bool = False
    started_at: str = ""


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase", "Pending"))


class Kubelet:
    """One node running every pod of the emulator (see the module docstring)."""

    def __init__(self, store: Store, runtime: Runtime, wake: Callable[[], None], *,
                 start_delay: float = 0.0) -> None:
        self.store, self.runtime, self.wake = store, runtime, wake
        self.start_delay = start_delay
        self.kind = store.registry.lookup("", "v1", "pods")
        self._pods: dict[str, _Pod] = {}

    def sync(self) -> None:
        """One pass over every pod: start, stop, record, remove. The pods are read as
        stored, not copied (the kubelet's pod manager holds the informer's objects,
        pkg/kubelet/pod/pod_manager.go): only what a container is started with is a copy."""
        now = time.monotonic()
        live = {p["metadata"]["uid"]: p for p in self.store.snapshot(self.kind, None, None)[0]}
        for uid in [u for u in self._pods if u not in live]:
            state = self._pods[uid]
            if state.handle is None or state.handle.exit_code() is not None:
                del self._pods[uid]
            else:  # removed from the API (grace 0): the container is stopped all the same
                self._stop(state, 0, now)
        for uid, pod in live.items():
            state = self._pods.setdefault(uid, _Pod(start_at=now + self.start_delay))
            deleting = pod["metadata"].get("deletionTimestamp")
            if _phase(pod) in ("Succeeded", "Failed") or state.handle is None:
                if deleting:  # nothing runs: the kubelet lets the object go
                    self.store.finish_termination(self.kind, pod["metadata"]["namespace"],
                                                  pod["metadata"]["name"])
                elif _phase(pod) == "Pending" and now >= state.start_at:
                    self._start(pod, state)
                continue
            code = state.handle.exit_code()
            if code is not None:
                # A deleted pod goes on a later pass: the status manager deletes it once the
                # terminal status is written and its resources reclaimed (status_manager.go
                # canBeDeleted), so watchers see how it ended.
                self._record_exit(pod, state, code)
            elif deleting:
                self._stop(state, int(pod["metadata"].get("deletionGracePeriodSeconds") or 0),
                           now)
            elif self._past_deadline(pod):
                state.deadline_hit = True
                self._stop(state, pod["spec"].get("terminationGracePeriodSeconds",
                                                   DEFAULT_GRACE_S), now)

    def close(self) -> None:
        """Kill every container (the node goes away)."""
        self.runtime.close()
        self._pods.clear()

    # ----------------------------------------------------------------- helpers

    def _stop(self, state: _Pod, grace: int, now: float) -> None:
        assert state.handle is not None
        if state.kill_at is None:
            state.handle.terminate()
            state.kill_at = now + max(grace, MIN_GRACE_S)
        elif now >= state.kill_at:
            state.handle.kill()
        else:  # a later deletion may shorten the grace, never lengthen it
            state.kill_at = min(state.kill_at, now + max(grace, MIN_GRACE_S))

    @staticmethod
    def _past_deadline(pod: Obj) -> bool:
        deadline = pod["spec"].get("activeDeadlineSeconds")
        started = (pod.get("status") or {}).get("startTime")
        return deadline is not None and bool(started) and time.time() >= parse_rfc3339(
            started) + float(deadline)

    def _start(self, pod: Obj, state: _Pod) -> None:
        containers = pod["spec"].get("containers") or []
        if len(containers) != 1:
            raise NotImplementedError(f"pod {pod['metadata']['name']}: the simulated kubelet "
                                      "runs exactly one container per pod")
        container = containers[0]
        try:
            env = self._env(pod, container)
        except ConfigError as e:
            self._patch(pod, {"containerStatuses": [self._status(container, {"waiting": {
                "reason": "CreateContainerConfigError", "message": str(e)}})]})
            return
        stamp = now_rfc3339()
        spec = ContainerSpec(clone(pod), [*(container.get("command") or []),
                                          *(container.get("args") or [])], env)
        state.handle = self.runtime.start(spec, self.wake)
        state.started_at = stamp
        self._patch(pod, {
            "phase": "Running", "startTime": stamp, "hostIP": "127.0.0.1", "podIP": "127.0.0.1",
            "containerStatuses": [self._status(container, {"running": {"startedAt": stamp}},
                                               ready=True)],
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": stamp}
                           for t in ("PodScheduled", "Initialized", "ContainersReady",
                                     "Ready")]})

    def _record_exit(self, pod: Obj, state: _Pod, code: int) -> None:
        if pod["spec"].get("restartPolicy", "Always") != "Never":
            raise NotImplementedError(f"pod {pod['metadata']['name']}: restartPolicy "
                                      f"{pod['spec'].get('restartPolicy', 'Always')} (in-place "
                                      "restarts) is not simulated")
        container = pod["spec"]["containers"][0]
        terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                      "startedAt": state.started_at, "finishedAt": now_rfc3339()}
        status: Obj = {"phase": "Succeeded" if code == 0 else "Failed", "containerStatuses": [
            self._status(container, {"terminated": terminated})], "conditions": [
            {"type": "Ready", "status": "False", "lastTransitionTime": now_rfc3339(),
             "reason": "PodCompleted" if code == 0 else "PodFailed"}]}
        if state.deadline_hit:
            status.update(phase="Failed", reason=DEADLINE[0], message=DEADLINE[1])
        self._patch(pod, status)

    @staticmethod
    def _status(container: Obj, state: Obj, ready: bool = False) -> Obj:
        return {"name": container["name"], "image": container.get("image", ""), "imageID": "",
                "ready": ready, "started": "running" in state, "restartCount": 0,
                "state": state}

    def _patch(self, pod: Obj, status: Obj) -> None:
        """Merge into the status of this pod (not of a new one with the same name)."""
        meta = pod["metadata"]
        with self.store.lock:
            current = self.store.current(self.kind, meta["namespace"], meta["name"])
            try:
                if current is not None and current["metadata"]["uid"] == meta["uid"]:
                    self.store.patch(self.kind, meta["namespace"], meta["name"],
                                     {"status": status}, MERGE, subresource="status")
            except ApiError as e:
                if e.code != 404:
                    raise

    def _env(self, pod: Obj, container: Obj) -> dict[str, str]:
        """The container's env, ``valueFrom`` resolved; a later duplicate wins."""
        if container.get("envFrom"):
            raise NotImplementedError("envFrom is not simulated")
        meta, out = pod["metadata"], {}
        fields = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
                  "metadata.uid": meta["uid"], "status.podIP": "127.0.0.1"}
        for item in container.get("env") or []:
            source = item.get("valueFrom")
            if source is None:
                out[item["name"]] = str(item.get("value", ""))
            elif "fieldRef" in source:
                out[item["name"]] = self._field(pod, fields, source["fieldRef"]["fieldPath"])
            elif "secretKeyRef" in source:
                value = self._secret(meta["namespace"], source["secretKeyRef"])
                if value is not None:
                    out[item["name"]] = value
            else:
                raise NotImplementedError(f"env valueFrom {sorted(source)} is not simulated")
        return out

    @staticmethod
    def _field(pod: Obj, fields: dict[str, str], path: str) -> str:
        """A downward API field: the fixed ones, or one label or annotation
        (pkg/fieldpath ExtractFieldPathAsString: ``metadata.labels['k']``, empty when
        absent)."""
        for where in ("labels", "annotations"):
            prefix = f"metadata.{where}['"
            if path.startswith(prefix) and path.endswith("']"):
                return str((pod["metadata"].get(where) or {}).get(path[len(prefix):-2], ""))
        return fields[path]

    def _secret(self, namespace: str, ref: Obj) -> str | None:
        kind = self.store.registry.lookup("", "v1", "secrets")
        try:
            data = self.store.get(kind, namespace, ref["name"]).get("data") or {}
        except ApiError as e:
            if e.code != 404:
                raise
            data = None
        if data is None or ref["key"] not in data:
            if ref.get("optional"):
                return None
            raise ConfigError(f'secret "{ref["name"]}" not found' if data is None else
                              f"couldn't find key {ref['key']} in Secret "
                              f"{namespace}/{ref['name']}")
        try:
            return base64.b64decode(data[ref["key"]], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError) as e:
            raise ConfigError(f"Secret {namespace}/{ref['name']}: {ref['key']} is not "
                              "base64") from e

"""One pod on the node: its worker runs the container, restarts it, probes it, stops it,
and writes its status, as the kubelet's pod worker and status manager do (paths under
kubernetes ``pkg/kubelet/``).

- Start (``kuberuntime/kuberuntime_manager.go`` SyncPod): the sandbox (network namespace,
  address, managed files), the volumes, the environment; a missing Secret or ConfigMap
  keeps the container waiting in ``CreateContainerConfigError`` (env) or the pod in
  ``ContainerCreating`` with a FailedMount (volumes), retried each sync; an image the
  node does not hold waits in ``ErrImagePull``. One container per pod (no init or
  sidecar containers).
- User: the container's, else the pod's ``runAsUser``/``runAsGroup``, else the image's
  USER; ``fsGroup`` and ``supplementalGroups`` as extra groups; ``runAsNonRoot`` refuses
  a root user (``kuberuntime/security_context_others.go`` verifyRunAsNonRoot).
- Restarts (``restartPolicy`` Always, OnFailure) in place, the back-off doubling from
  10 s to 300 s (``kubelet.go`` backOffPeriod, MaxContainerBackOff), reset after 10 min
  running; the last termination kept as ``lastState``.
- Probes: ``httpGet`` and ``tcpSocket`` readiness, liveness and startup probes with their
  delays, periods, timeouts and thresholds (``prober/worker.go``); a liveness failure
  restarts the container. ``exec`` and ``grpc`` probes are not run here (the pod says so).
- Deletion, whatever its grace (0 included): SIGTERM to the container's process, SIGKILL
  to all its processes after max(grace, 2 s) (``kuberuntime/kuberuntime_container.go``
  killContainer, ``kuberuntime_manager.go`` minimumGracePeriodInSeconds); the terminal
  phase and exit code written once it stopped, before the object goes (k8s >= 1.27,
  #115331); then the pod deleted with grace 0 and its uid as precondition
  (``status/status_manager.go`` canBeDeleted, deletePodStatus).
- ``activeDeadlineSeconds`` (``active_deadline.go``): stopped with the pod's grace, then
  Failed with ``DeadlineExceeded``.
- The container's processes: found by a marker in their environment, every one killed
  when the main process ends (a PID namespace dies with its init).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kubernetes.client import ApiException

from resumequal.local.processes import tagged

from . import sandbox as sandboxes
from .envvars import ConfigError
from .images import Image, image_paths
from .refusals import recreated
from .volumes import MountError, PodVolumes

if TYPE_CHECKING:
    from .agent import NodeAgent

log = logging.getLogger(__name__)

Obj = dict[str, Any]
MARKER = "RESUMEQUAL_CONTAINER"
MIN_GRACE_S = 2  # kuberuntime_manager.go minimumGracePeriodInSeconds
DEFAULT_GRACE_S = 30  # PodSpec.terminationGracePeriodSeconds
BACKOFF_START_S, BACKOFF_MAX_S, BACKOFF_RESET_S = 10.0, 300.0, 600.0
RESYNC_S = 10.0  # volumes refreshed, status re-posted at least this often
ENTER = Path(__file__).resolve().parent / "enter.py"
START_ERROR_CODE = 128
DEADLINE = ("DeadlineExceeded", "Pod was active on the node longer than the specified deadline")


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: str) -> float:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.UTC).timestamp()


class Handle(Protocol):
    """A started container, however it runs."""

    @property
    def code(self) -> int | None:
        """Its exit code (128+signal), None while it runs."""

    @property
    def started_at(self) -> str:
        """When it started (RFC 3339)."""

    @property
    def started_mono(self) -> float:
        """When it started (monotonic)."""

    def terminate(self) -> None:
        """SIGTERM to the container's main process."""

    def kill(self) -> None:
        """SIGKILL to every process of the container."""

    @property
    def start_error(self) -> str | None:
        """Why its command could not start (then ``code`` is the starter's), else None."""


@dataclass(frozen=True)
class Launch:
    """What a container is started with, once its pod, image and volumes are ready."""

    pod: Obj
    container: Obj
    image: Image
    argv: list[str]
    env: dict[str, str]  # the image's, then the pod's (resolved)
    mounts: list[Any]
    uid: int | None
    gid: int | None
    groups: list[int]
    sandbox: sandboxes.Sandbox
    restart: int


class Runtime(Protocol):
    """Runs containers: processes in the pod's namespaces (:class:`ProcessRuntime`), or,
    for a bench, scripted stand-ins (:class:`ScriptedRuntime`)."""

    def start(self, launch: Launch, wake: threading.Event) -> Handle:
        """Start the container; set ``wake`` when it exits."""


class Process:
    """A running container: its main process and, by marker, everything it started."""

    def __init__(self, popen: subprocess.Popen[bytes], marker: str, wake: threading.Event,
                 start_error: Path) -> None:
        self.popen, self.marker, self.wake = popen, marker, wake
        self._start_error_file = start_error
        self.start_error: str | None = None
        self.code: int | None = None
        self.started_at = now_rfc3339()
        self.started_mono = time.monotonic()
        threading.Thread(target=self._wait, daemon=True, name=f"wait-{popen.pid}").start()

    def _wait(self) -> None:
        rc = self.popen.wait()
        self.kill()  # the PID namespace dies with its init process
        with contextlib.suppress(OSError):
            self.start_error = self._start_error_file.read_text(errors="replace") or None
        self.code = rc if rc >= 0 else 128 - rc
        self.wake.set()

    def terminate(self) -> None:
        if self.code is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        for pid in tagged(self.marker, MARKER):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


class ProcessRuntime:
    """Containers as processes in their pod's network namespace and a mount namespace of
    their own (:mod:`.enter`), output to ``logs/<container>/<restart>.log`` in the pod's
    folder, every process marked with the container (``RESUMEQUAL_CONTAINER``)."""

    def start(self, launch: Launch, wake: threading.Event) -> Handle:
        sandbox, uid, gid = launch.sandbox, launch.uid, launch.gid
        root = sandbox.root
        for folder in (root / "home", root / "work"):
            folder.mkdir(exist_ok=True)
            if uid is not None:
                os.chown(folder, uid, gid or 0)
        hostname, _ = sandboxes.host_and_domain(launch.pod)
        name = launch.container["name"]
        marker = f"{launch.pod['metadata']['uid']}/{name}"
        cluster = os.environ.get("RESUMEQUAL_CLUSTER", "")
        etc_mounts = [{"target": f"/etc/{n}", "source": str(sandbox.etc / n),
                       "readOnly": False, "tmpfsSize": None}
                      for n in ("hosts", "resolv.conf", "hostname")]
        start_error = root / f"container-{launch.restart}.start-error"
        start_error.unlink(missing_ok=True)
        spec = {"hostname": hostname, "uid": uid, "gid": gid, "groups": launch.groups,
                "start_error": str(start_error),
                "cwd": str(root / "work"), "argv": launch.argv,
                "env": {**launch.env, MARKER: marker, "RESUMEQUAL_CLUSTER": cluster},
                "mounts": etc_mounts + [m.to_json() for m in launch.mounts],
                "image": image_paths()}
        spec_path = root / f"container-{launch.restart}.json"
        spec_path.write_text(json.dumps(spec))
        os.chmod(spec_path, 0o600)
        logs = root / "logs" / name
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{launch.restart}.log", "wb") as out:
            popen = subprocess.Popen(
                ["ip", "netns", "exec", sandbox.netns, "unshare", "--uts", "--",
                 sys.executable, str(ENTER), str(spec_path)],
                env={"PATH": os.environ.get("PATH", ""), MARKER: marker,
                     "RESUMEQUAL_CLUSTER": cluster},
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        return Process(popen, marker, wake, start_error)


@dataclass
class Probe:
    """One probe's counters (prober/worker.go)."""

    spec: Obj
    kind: str  # readiness, liveness, startup
    successes: int = 0
    failures: int = 0
    result: bool | None = None
    next_at: float = 0.0

    def due(self, now: float, started: float) -> bool:
        if now < started + float(self.spec.get("initialDelaySeconds", 0)):
            return False
        return now >= self.next_at

    def record(self, ok: bool, now: float) -> None:
        self.next_at = now + float(self.spec.get("periodSeconds", 10))
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= int(self.spec.get("successThreshold", 1)):
                self.result = True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.failures >= int(self.spec.get("failureThreshold", 3)):
                self.result = False


@dataclass
class _State:
    """What the worker knows of its pod's container."""

    sandbox: sandboxes.Sandbox | None = None
    volumes: PodVolumes | None = None
    process: Handle | None = None
    restarts: int = 0
    waiting: tuple[str, str] | None = None  # reason, message
    last_terminated: Obj | None = None
    terminated: Obj | None = None  # the final termination (no restart follows)
    backoff_s: float = 0.0
    restart_at: float = 0.0
    kill_at: float | None = None
    deadline_hit: bool = False
    probes: list[Probe] = field(default_factory=list)
    start_time: str = ""
    last_sync: float = 0.0
    posted: str = ""
    events: set[str] = field(default_factory=set)


def _container_port(container: Obj, port: object) -> int:
    if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ConfigError(f"probe port {port!r} names no port of the container")


class PodWorker:
    """Runs one pod until it is gone (a thread of its own, as the kubelet's pod worker)."""

    def __init__(self, agent: NodeAgent, pod: Obj) -> None:
        self.agent = agent
        self.uid = pod["metadata"]["uid"]
        self.name = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        self.pod: Obj | None = pod
        self.last_seen: Obj = pod
        self.wake = threading.Event()
        self.state = _State()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"pod-{self.name}")

    def start(self) -> PodWorker:
        self.thread.start()
        return self

    def update(self, pod: Obj | None) -> None:
        """The pod as the API has it now (None: it is gone from the API)."""
        self.pod = pod
        if pod is not None:
            self.last_seen = pod
        self.wake.set()

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        try:
            while not self.agent.stopping.is_set():
                self.wake.clear()
                try:
                    if self._sync():
                        break
                except Exception:
                    log.exception("pod %s: sync failed", self.name)
                self.wake.wait(timeout=0.5)
        finally:
            if self.agent.stopping.is_set():
                self._stop_now()
            self._teardown()
            self.done.set()
            self.agent.forget(self.uid)

    def _sync(self) -> bool:
        """One pass; True once the pod is finished with on this node."""
        pod, st, now = self.pod, self.state, time.monotonic()
        if pod is None:  # deleted from the API with grace 0: the container stops all the same
            grace = int(self.last_seen["metadata"].get("deletionGracePeriodSeconds") or 0)
            return self._stopped(grace, now)
        if pod["metadata"].get("deletionTimestamp"):
            grace = int(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
            if not self._stopped(grace, now):
                return False
            self._post(pod, final=True)
            self._delete(pod)
            return True
        if st.terminated is not None:  # ended for good: waits for its deletion
            self._post_if_due(pod, now)
            return False
        if st.process is None:
            if now >= st.restart_at:
                self._start(pod)
            self._post_if_due(pod, now)
            return False
        if st.process.code is not None:
            self._exited(pod, now)
        elif self._past_deadline(pod):
            st.deadline_hit = True
            self._stopped(int(pod["spec"].get("terminationGracePeriodSeconds",
                                              DEFAULT_GRACE_S)), now)
        else:
            self._probe(pod, now)
            if now - st.last_sync > RESYNC_S and st.volumes is not None:
                st.last_sync = now
                with contextlib.suppress(MountError):
                    st.volumes.pod = pod
                    st.volumes.sync()
        self._post_if_due(pod, now)
        return False

    # ------------------------------------------------------------------ starting

    def _start(self, pod: Obj) -> None:
        st = self.state
        spec = pod["spec"]
        containers = spec.get("containers") or []
        if len(containers) != 1 or spec.get("initContainers"):
            st.waiting = ("CreateContainerError", "the node agent runs one container per "
                          "pod, without init containers")
            return
        container = containers[0]
        image = self.agent.images.find(container.get("image", ""))
        if image is None:
            st.waiting = ("ErrImagePull", f'image "{container.get("image")}" is not one '
                          "this node holds")
            self._event(pod, "Warning", "Failed", f"Failed to pull image "
                        f'"{container.get("image")}": not an image of this node')
            return
        if st.sandbox is None:
            st.sandbox = self.agent.make_sandbox(pod)
            st.start_time = st.start_time or now_rfc3339()
        st.sandbox.write_files(pod, self.agent.dns_ip)
        try:
            if st.volumes is None:
                st.volumes = self.agent.pod_volumes(pod, st.sandbox.root)
            st.volumes.pod = pod
            st.volumes.sync()
            mounts = st.volumes.mounts(container)
        except MountError as e:
            st.waiting = ("ContainerCreating", "")
            self._event(pod, "Warning", "FailedMount", f"MountVolume.SetUp failed: {e}")
            st.restart_at = time.monotonic() + 2.0
            return
        try:
            env = self.agent.container_env(pod, container)
            uid, gid, groups = self._user(pod, container, image)
        except ConfigError as e:
            st.waiting = ("CreateContainerConfigError", str(e))
            self._event(pod, "Warning", "Failed", f"Error: {e}")
            st.restart_at = time.monotonic() + 2.0
            return
        st.waiting = None
        st.process = self._launch(pod, container, image, env, mounts, uid, gid, groups)
        st.probes = [Probe(container[k], k.removesuffix("Probe"))
                     for k in ("startupProbe", "readinessProbe", "livenessProbe")
                     if container.get(k)]
        st.last_sync = time.monotonic()
        self._event(pod, "Normal", "Started", f"Started container {container['name']}")

    def _user(self, pod: Obj, container: Obj, image: Image
              ) -> tuple[int | None, int | None, list[int]]:
        pod_ctx = pod["spec"].get("securityContext") or {}
        ctx = {**pod_ctx, **(container.get("securityContext") or {})}
        image_uid, image_gid = None, None
        if image.user:
            user, _, group = image.user.partition(":")
            image_uid = int(user) if user.isdigit() else None
            image_gid = int(group) if group.isdigit() else None
        uid = ctx.get("runAsUser", image_uid)
        gid = ctx.get("runAsGroup", image_gid if ctx.get("runAsUser") is None else None)
        if ctx.get("runAsNonRoot") and (uid is None or int(uid) == 0):
            raise ConfigError("container has runAsNonRoot and image will run as root")
        groups = [int(g) for g in pod_ctx.get("supplementalGroups") or []]
        if pod_ctx.get("fsGroup") is not None:
            groups.append(int(pod_ctx["fsGroup"]))
        if uid is not None and gid is None:
            gid = 0  # runc: the primary group is 0 unless one is given
        return (None if uid is None else int(uid), None if gid is None else int(gid), groups)

    def _launch(self, pod: Obj, container: Obj, image: Image, env: dict[str, str],
                mounts: list[Any], uid: int | None, gid: int | None, groups: list[int]
                ) -> Handle:
        st = self.state
        assert st.sandbox is not None
        hostname, _ = sandboxes.host_and_domain(pod)
        full_env = {**dict(image.env), "HOME": str(st.sandbox.root / "home"),
                    "HOSTNAME": hostname, **env}
        launch = Launch(pod, container, image, image.argv(container.get("command"),
                                                          container.get("args")),
                        full_env, mounts, uid, gid, groups, st.sandbox, st.restarts)
        return self.agent.runtime_for(container.get("image", "")).start(launch, self.wake)

    # ------------------------------------------------------------------ running

    def _exited(self, pod: Obj, now: float) -> None:
        st = self.state
        assert st.process is not None and st.process.code is not None
        code = st.process.code
        terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                      "startedAt": st.process.started_at, "finishedAt": now_rfc3339(),
                      "containerID": self._container_id()}
        if st.process.start_error is not None:
            # containerd's CRI (internal/cri/server/container_start.go): a container whose
            # task could not start is exited with errorStartExitCode 128, errorStartReason
            # "StartError" and the error as its message.
            code = START_ERROR_CODE
            terminated.update(exitCode=code, reason="StartError",
                              message=st.process.start_error)
        ran = now - st.process.started_mono
        st.process = None
        st.probes = []
        policy = pod["spec"].get("restartPolicy", "Always")
        if st.deadline_hit or policy == "Never" or (policy == "OnFailure" and code == 0):
            st.terminated = terminated
            return
        st.last_terminated = terminated
        st.restarts += 1
        st.backoff_s = (BACKOFF_START_S if st.backoff_s == 0 or ran > BACKOFF_RESET_S
                        else min(st.backoff_s * 2, BACKOFF_MAX_S))
        st.restart_at = now + st.backoff_s
        st.waiting = ("CrashLoopBackOff", f"back-off {st.backoff_s:.0f}s restarting failed "
                      f"container={pod['spec']['containers'][0]['name']} pod={self.name}")
        self._event(pod, "Warning", "BackOff", "Back-off restarting failed container")

    def _probe(self, pod: Obj, now: float) -> None:
        st = self.state
        assert st.process is not None and st.sandbox is not None
        container = pod["spec"]["containers"][0]
        started = st.process.started_mono
        startup = next((p for p in st.probes if p.kind == "startup"), None)
        for probe in st.probes:
            if probe.kind != "startup" and startup is not None and startup.result is not True:
                continue
            if probe.result is True and probe.kind == "startup":
                continue
            if not probe.due(now, started):
                continue
            probe.record(self._check(probe.spec, container, st.sandbox.ip), now)
            if probe.kind in ("liveness", "startup") and probe.result is False:
                self._event(pod, "Warning", "Unhealthy", f"{probe.kind.title()} probe failed")
                self._event(pod, "Normal", "Killing", f"Container {container['name']} failed "
                            f"{probe.kind} probe, will be restarted")
                st.process.terminate()
                st.kill_at = now + int(pod["spec"].get("terminationGracePeriodSeconds",
                                                       DEFAULT_GRACE_S))
                threading.Thread(target=self._kill_later, args=(st.process, st.kill_at),
                                 daemon=True).start()
                st.kill_at = None
                return

    @staticmethod
    def _kill_later(process: Handle, at: float) -> None:
        while process.code is None and time.monotonic() < at:
            time.sleep(0.2)
        process.kill()

    def _check(self, spec: Obj, container: Obj, ip: str) -> bool:
        timeout = float(spec.get("timeoutSeconds", 1))
        try:
            if "httpGet" in spec:
                get = spec["httpGet"]
                scheme = get.get("scheme", "HTTP").lower()
                port = _container_port(container, get["port"])
                host = get.get("host") or ip
                url = f"{scheme}://{host}:{port}{get.get('path', '/')}"
                request = urllib.request.Request(url, headers={
                    h["name"]: h["value"] for h in get.get("httpHeaders") or []})
                context = None
                if scheme == "https":
                    import ssl

                    context = ssl.create_default_context()
                    context.check_hostname = False
                    context.verify_mode = ssl.CERT_NONE  # the kubelet does not verify
                with urllib.request.urlopen(request, timeout=timeout, context=context) as r:
                    return bool(200 <= r.status < 400)
            if "tcpSocket" in spec:
                port = _container_port(container, spec["tcpSocket"]["port"])
                with socket.create_connection((spec["tcpSocket"].get("host") or ip, port),
                                              timeout=timeout):
                    return True
        except urllib.error.HTTPError as e:
            return 200 <= e.code < 400
        except (OSError, ConfigError, ValueError):
            return False
        return False  # exec and grpc probes: not run here, so never succeed

    def _past_deadline(self, pod: Obj) -> bool:
        deadline = pod["spec"].get("activeDeadlineSeconds")
        return (deadline is not None and bool(self.state.start_time)
                and time.time() >= _parse_time(self.state.start_time) + float(deadline))

    # ------------------------------------------------------------------ stopping

    def _stopped(self, grace: int, now: float) -> bool:
        """Stop the container (SIGTERM, SIGKILL after the grace); True once nothing runs."""
        st = self.state
        if st.process is None:
            return True
        if st.process.code is not None:
            self._exited_for_good()
            return True
        if st.kill_at is None:
            st.process.terminate()
            st.kill_at = now + max(grace, MIN_GRACE_S)
        elif now >= st.kill_at:
            st.process.kill()
        else:  # a later deletion may shorten the grace, never lengthen it
            st.kill_at = min(st.kill_at, now + max(grace, MIN_GRACE_S))
        return False

    def _exited_for_good(self) -> None:
        st = self.state
        assert st.process is not None and st.process.code is not None
        code = st.process.code
        st.terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                         "startedAt": st.process.started_at, "finishedAt": now_rfc3339(),
                         "containerID": self._container_id()}
        st.process = None

    def _stop_now(self) -> None:
        if self.state.process is not None:
            self.state.process.terminate()
            time.sleep(0.2)
            self.state.process.kill()

    def _delete(self, pod: Obj) -> None:
        meta = pod["metadata"]
        try:
            self.agent.core.delete_namespaced_pod(
                meta["name"], meta["namespace"], grace_period_seconds=0,
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    def _teardown(self) -> None:
        if self.state.sandbox is not None:
            sandboxes.destroy(self.state.sandbox, self.agent.addresses)

    # ------------------------------------------------------------------ status

    def _container_id(self) -> str:
        return f"resumequal://{self.uid}-{self.state.restarts}"

    def status(self, pod: Obj, *, final: bool = False) -> Obj:
        """The pod's status as the kubelet computes it (kubelet_pods.go generateAPIPodStatus,
        getPhase)."""
        st = self.state
        container = (pod["spec"].get("containers") or [{"name": "", "image": ""}])[0]
        policy = pod["spec"].get("restartPolicy", "Always")
        state: Obj
        ready = False
        if st.process is not None:
            state = {"running": {"startedAt": st.process.started_at}}
            readiness = next((p for p in st.probes if p.kind == "readiness"), None)
            ready = readiness is None or readiness.result is True
        elif st.terminated is not None:
            state = {"terminated": st.terminated}
        else:
            reason, message = st.waiting or ("ContainerCreating", "")
            state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        code = (st.terminated or {}).get("exitCode")
        if st.terminated is not None and (final or policy != "Always"):
            phase = "Succeeded" if code == 0 and not st.deadline_hit else "Failed"
        elif st.process is not None or st.restarts > 0:
            phase = "Running"
        else:
            phase = "Pending"
        stamp = now_rfc3339()
        sandbox_ready = st.sandbox is not None and st.terminated is None
        cond = [("PodReadyToStartContainers", sandbox_ready), ("Initialized", True),
                ("ContainersReady", ready), ("Ready", ready)]
        previous = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}
        conditions = [c for t, c in previous.items() if t not in dict(cond)]  # PodScheduled...
        for kind, ok in cond:
            value = "True" if ok else "False"
            before = previous.get(kind)
            since = (before or {}).get("lastTransitionTime") if (before or {}).get(
                "status") == value else stamp
            entry: Obj = {"type": kind, "status": value, "lastTransitionTime": since,
                          "lastProbeTime": None}
            if kind in ("ContainersReady", "Ready") and not ok:
                entry["reason"] = ("PodCompleted" if phase in ("Succeeded", "Failed")
                                   else "ContainersNotReady")
            conditions.append(entry)
        cs: Obj = {"name": container["name"], "image": container.get("image", ""),
                   "imageID": "", "ready": ready, "started": st.process is not None,
                   "restartCount": st.restarts, "state": state,
                   "lastState": {"terminated": st.last_terminated} if st.last_terminated
                   else {}}
        if st.process is not None or st.terminated is not None:
            cs["containerID"] = self._container_id()
        status: Obj = {"phase": phase, "conditions": conditions, "containerStatuses": [cs],
                       "hostIP": self.agent.node_ip, "hostIPs": [{"ip": self.agent.node_ip}],
                       "qosClass": _qos(container)}
        if st.sandbox is not None:
            status.update(podIP=st.sandbox.ip, podIPs=[{"ip": st.sandbox.ip}])
        if st.start_time:
            status["startTime"] = st.start_time
        if st.deadline_hit:
            status.update(reason=DEADLINE[0], message=DEADLINE[1])
        return status

    def _post_if_due(self, pod: Obj, now: float) -> None:
        self._post(pod)

    def _post(self, pod: Obj, *, final: bool = False) -> None:
        status = self.status(pod, final=final)
        digest = json.dumps({k: v for k, v in status.items() if k != "conditions"},
                            sort_keys=True) + json.dumps(
            [(c["type"], c["status"]) for c in status["conditions"]])
        if digest == self.state.posted:
            return
        meta = pod["metadata"]
        try:
            # The status as a whole (status_manager.go syncPod patches the difference; a
            # merge patch of the whole replaces the lists the same way), only for this
            # pod, not one recreated under its name (the uid precondition).
            self.agent.core.patch_namespaced_pod_status(
                meta["name"], meta["namespace"],
                {"metadata": {"uid": meta["uid"]}, "status": status},
                _content_type="application/merge-patch+json")
            self.state.posted = digest
        except ApiException as e:
            # 422 on metadata.uid: the name now holds a pod recreated under it, which the
            # uid in the patch may not become. status_manager.go syncPod skips such a pod
            # ("Pod was deleted and then recreated, skipping status update"); so does this.
            if e.status not in (404, 409) and not recreated(e):
                raise

    def _event(self, pod: Obj, kind: str, reason: str, message: str) -> None:
        key = f"{reason}:{message}"
        if key in self.state.events and reason not in ("BackOff",):
            return
        self.state.events.add(key)
        self.agent.event(pod, kind, reason, message)


def _qos(container: Obj) -> str:
    resources = container.get("resources") or {}
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    if not requests and not limits:
        return "BestEffort"
    if all(limits.get(r) and (requests.get(r, limits[r]) == limits[r])
           for r in ("cpu", "memory")):
        return "Guaranteed"
    return "Burstable"

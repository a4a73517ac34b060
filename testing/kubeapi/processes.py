"""Real containers: each pod's container runs as a process tree on this machine.

The process gets the container's ``command`` + ``args`` (looked up on the env's PATH, which
starts with the Python environment's bin), the image env (PATH, PYTHONPATH, HOME, ... of
the test process), ``node_env`` (what a node would supply: credentials for the object
store, say, when the test does not put them in a Secret), ``HOSTNAME`` = the pod's host
name, then
the pod's env as the kubelet resolved it. It runs in a session of its own, cwd a fresh
directory, stdout and stderr to ``<root>/<namespace>_<pod>_<uid8>.log``.

Networking: every pod shares the loopback address, so the rendezvous host of node 0 (the
training operator's ``PET_RDZV_ENDPOINT`` ``<job>-worker-0:<port>``) becomes
``127.0.0.1:<a free port chosen per job>``. On a cluster only node 0's agent finds its own
host name in that endpoint and hosts the c10d store; on loopback every agent would, so
``PET_RDZV_CONF`` gets ``is_host=1`` on index 0 and ``is_host=0`` elsewhere (torch's
c10d_rendezvous_backend.py ``_create_tcp_store`` honours is_host before its host-name match),
and ``PET_LOCAL_ADDR`` is ``127.0.0.<index + 1>``, an address of the pod's own that sorts
like its host name, which is what the rendezvous orders nodes (and so ranks) by.

Like a cgroup, a marker in the environment (``KUBEAPI_CONTAINER=<pod uid>``, inherited by
every descendant, torchrun's workers in sessions of their own included) finds the
container's processes in /proc: SIGKILL goes to all of them, and when the main process
ends, whatever it left behind is killed as the container's PID namespace would be.
The exit code is the process's, or 128+signal when a signal ended it, as container runtimes
report.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from resumequal.local.processes import tagged

from .kubelet import ContainerSpec

MARKER = "KUBEAPI_CONTAINER"
IMAGE_ENV = ("PYTHONPATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV")
Obj = dict[str, Any]
NOT_FOUND_EXIT = 128  # a container whose command cannot start ends with StartError, 128


def container_pids(marker: str) -> list[int]:
    """Every process whose environment carries ``KUBEAPI_CONTAINER=<marker>``."""
    return tagged(marker, MARKER)


def _rendezvous_host(pod: Obj) -> tuple[str | None, str, str | None]:
    """The PyTorchJob a leg pod belongs to, the host name of its node 0 (where the c10d
    store lives: ``<job>-worker-0``) and the pod's node index."""
    labels = pod["metadata"].get("labels") or {}
    job = labels.get("training.kubeflow.org/job-name")
    if job:
        return job, f"{job}-worker-0", labels.get("training.kubeflow.org/replica-index")
    return None, "", None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Process:
    def __init__(self, marker: str, proc: subprocess.Popen[bytes] | None,
                 wake: Callable[[], None]) -> None:
        self.marker, self.proc, self.wake = marker, proc, wake
        self.code: int | None = None if proc is not None else NOT_FOUND_EXIT
        if proc is not None:
            threading.Thread(target=self._wait, daemon=True, name=f"wait-{proc.pid}").start()

    def _wait(self) -> None:
        assert self.proc is not None
        rc = self.proc.wait()
        self._kill_all()  # the PID namespace dies with its init process
        self.code = rc if rc >= 0 else 128 - rc
        self.wake()

    def exit_code(self) -> int | None:
        return self.code

    def terminate(self) -> None:
        if self.proc is not None and self.code is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self._kill_all()

    def _kill_all(self) -> None:
        for pid in container_pids(self.marker):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


class ProcessRuntime:
    """Runs pods' containers as real processes under ``root`` (see the module docstring)."""

    def __init__(self, root: Path, *, node_env: Mapping[str, str] | None = None) -> None:
        self.root = root
        self.node_env = dict(node_env or {})
        self.root.mkdir(parents=True, exist_ok=True)
        self._ports: dict[tuple[str, str], int] = {}
        self._started: list[_Process] = []

    def log_paths(self, namespace: str | None = None, pod: str | None = None) -> list[Path]:
        """Log files of the containers started so far (a pod's, or all), oldest first."""
        prefix = f"{namespace}_{pod}_" if namespace and pod else ""
        return sorted(self.root.glob(f"{prefix}*.log"), key=lambda p: p.stat().st_mtime)

    def logs(self, tail: int = 4000) -> str:
        """The end of every container's log, for an assertion message."""
        return "\n".join(f"==== {p.name}\n{p.read_text(errors='replace')[-tail:]}"
                         for p in self.log_paths())

    def start(self, spec: ContainerSpec, wake: Callable[[], None]) -> _Process:
        meta = spec.pod["metadata"]
        base = f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        workdir = self.root / base
        workdir.mkdir()
        env = self._env(spec)
        log = open(self.root / f"{base}.log", "wb")  # noqa: SIM115 - the child keeps it
        executable = shutil.which(spec.command[0], path=env["PATH"]) if spec.command else None
        if executable is None:
            log.write(f"exec: {spec.command[:1]!r}: executable file not found in $PATH\n"
                      .encode())
            log.close()
            handle = _Process(meta["uid"], None, wake)
        else:
            with log:
                proc = subprocess.Popen([executable, *spec.command[1:]], env=env, cwd=workdir,
                                        stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            handle = _Process(meta["uid"], proc, wake)
        self._started.append(handle)
        return handle

    def _env(self, spec: ContainerSpec) -> dict[str, str]:
        meta = spec.pod["metadata"]
        path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
        # The host name is spec.hostname when set, else the pod's name (kubelet_pods.go
        # GeneratePodHostNameAndDomain).
        host = spec.pod["spec"].get("hostname") or meta["name"]
        env = {"PATH": path, **{k: os.environ[k] for k in IMAGE_ENV if k in os.environ},
               **self.node_env, "HOSTNAME": host, **spec.env, MARKER: meta["uid"]}
        job, host0, index = _rendezvous_host(spec.pod)
        endpoint = env.get("PET_RDZV_ENDPOINT", "")
        if job and endpoint.rpartition(":")[0] == host0:
            port = self._ports.setdefault((meta["namespace"], job), _free_port())
            env["PET_RDZV_ENDPOINT"] = f"127.0.0.1:{port}"
            conf = [c for c in env.get("PET_RDZV_CONF", "").split(",") if c]
            env["PET_RDZV_CONF"] = ",".join([*conf, f"is_host={int(index == '0')}"])
            # The rendezvous ranks nodes by their address, sorted (dynamic_rendezvous.py,
            # _NodeDesc and _mark_rendezvous_complete); on a cluster that is the pod's host
            # name, <job>-worker-<i>, so worker-0 holds ranks 0..nproc-1. On loopback every
            # agent has the same name, and the pids would decide: each pod gets a loopback
            # address of its own that sorts as its name does (torchrun's --local-addr).
            if index is not None and index.isdigit() and int(index) < 254:
                env.setdefault("PET_LOCAL_ADDR", f"127.0.0.{int(index) + 1}")
        return env

    def close(self) -> None:
        for handle in self._started:
            handle.kill()

"""Scripted containers on the node agent, for a bench that runs many runs at once: the
containers of chosen images played by the API double's scripted runtimes
(:mod:`testing.kubeapi.scripted`, :mod:`testing.kubeapi.node`) instead of processes, while
everything else — the real API server, controllers and scheduler, and the node agent's
handling of the pods — stays as it is."""

from __future__ import annotations

import copy
import threading
import time

from testing.kubeapi.kubelet import ContainerSpec
from testing.kubeapi.kubelet import Handle as ScriptedHandle
from testing.kubeapi.kubelet import Runtime as ScriptedRuntimes

from .pods import Handle, Launch, now_rfc3339


class _Scripted:
    def __init__(self, handle: ScriptedHandle) -> None:
        self.handle = handle
        self._started_at = now_rfc3339()
        self._started_mono = time.monotonic()

    @property
    def code(self) -> int | None:
        return self.handle.exit_code()

    @property
    def started_at(self) -> str:
        return self._started_at

    @property
    def started_mono(self) -> float:
        return self._started_mono

    def terminate(self) -> None:
        self.handle.terminate()

    def kill(self) -> None:
        self.handle.kill()


class ScriptedRuntime:
    """The node agent's runtime over one of the double's: a container is its script, given
    the pod, the command line and the resolved environment, as the double's kubelet gives."""

    def __init__(self, runtime: ScriptedRuntimes) -> None:
        self.runtime = runtime

    def start(self, launch: Launch, wake: threading.Event) -> Handle:
        spec = ContainerSpec(copy.deepcopy(launch.pod), list(launch.argv), dict(launch.env))
        return _Scripted(self.runtime.start(spec, wake.set))

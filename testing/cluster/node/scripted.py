"""Scripted containers on the node agent, for the operator's tests and a bench that runs
many runs at once: the containers of chosen images played by scripted runtimes
(:mod:`.scriptrt`, :mod:`.scriptnode`) instead of processes, while everything else — the
real API server, controllers and scheduler, and the node agent's handling of the pods —
stays as it is."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable

from .pods import Handle, Launch, now_rfc3339
from .scriptrt import ContainerSpec
from .scriptrt import Handle as ScriptedHandle
from .scriptrt import Runtime as ScriptedRuntimes


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

    @property
    def start_error(self) -> str | None:
        return None  # a script always starts


class ScriptedRuntime:
    """The node agent's runtime over a scripted one: a container is its script, given the
    pod, the command line and the resolved environment."""

    def __init__(self, runtime: ScriptedRuntimes) -> None:
        self.runtime = runtime

    def start(self, launch: Launch, wake: threading.Event) -> Handle:
        spec = ContainerSpec(copy.deepcopy(launch.pod), list(launch.argv), dict(launch.env))
        return _Scripted(self.runtime.start(spec, wake.set))


class Scripts:
    """Scripted containers whose script changes hands (a test session's tests, one after
    another, on one node): ``bind`` takes what makes the scripted runtime, called when the
    first container starts, so what a user set up before its first pod counts; ``unbind``
    closes it, ending whatever of its containers still runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._make: Callable[[], ScriptedRuntimes] | None = None
        self._runtime: ScriptedRuntimes | None = None

    def bind(self, make: Callable[[], ScriptedRuntimes]) -> None:
        self.unbind()
        with self._lock:
            self._make = make

    def unbind(self) -> None:
        with self._lock:
            runtime, self._runtime, self._make = self._runtime, None, None
        if runtime is not None:
            runtime.close()

    def start(self, spec: ContainerSpec, wake: Callable[[], None]) -> ScriptedHandle:
        with self._lock:
            if self._runtime is None:
                if self._make is None:
                    raise RuntimeError("no scripts bound for this container")
                self._runtime = self._make()
            runtime = self._runtime
        return runtime.start(spec, wake)

    def close(self) -> None:
        self.unbind()

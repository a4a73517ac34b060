"""Scripted containers in a process of their own: a :class:`~.scriptrt.ScriptedRuntime` in
a child process, driven over a pipe.

The node agent (:mod:`.agent`, in the tests' process beside the operator under test)
decides what runs and signals it, as the kubelet drives its container runtime over a
socket (the CRI, k8s.io/cri-api pkg/apis/runtime/v1/api.proto ``RuntimeService``:
StartContainer, StopContainer, ContainerStatus); the containers' scripts run in a process
of their own, so their CPU never holds the interpreter lock of the process that runs the
operator. The agent's start, SIGTERM and SIGKILL go to it, and each exit comes back. The
rendezvous of a job's agents lives in that process too, as on one node. The settings of
``run_container`` are pickled when the process starts: a test sets them before its first
pod starts.

A SIGKILL is final at once, as with :class:`~.scriptrt.ScriptedRuntime`: the handle says
137 from the moment the agent sends it, whatever the script still does. An exception in
a script is kept in :attr:`NodeRuntime.errors` (its traceback as text), as the scripted
runtime keeps its own.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import threading
import traceback
from collections.abc import Callable
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

from .scriptrt import SIGKILL_EXIT, ContainerSpec, RunContainer, ScriptedRuntime

log = logging.getLogger(__name__)

# How long close() waits for the node process to stop its containers and exit.
CLOSE_TIMEOUT_S = 10.0


class ContainerFailed(RuntimeError):
    """A script raised in the node process (the message is its traceback)."""


class _Handle:
    """The node agent's side of one container."""

    def __init__(self, runtime: NodeRuntime, ident: int, wake: Callable[[], None]) -> None:
        self.runtime, self.ident, self.wake = runtime, ident, wake
        self.code: int | None = None
        self.lock = threading.Lock()

    def exit_code(self) -> int | None:
        return self.code

    def terminate(self) -> None:
        self.runtime._send(("term", self.ident))

    def kill(self) -> None:
        self.exited(SIGKILL_EXIT)  # SIGKILL cannot be scripted away
        self.runtime._send(("kill", self.ident))

    def exited(self, code: int) -> None:
        with self.lock:
            if self.code is not None:
                return
            self.code = code
        self.wake()


class NodeRuntime:
    """Runs ``run_container`` (picklable: it is sent to the node process) on a thread per
    container in a process of its own; see the module docstring."""

    def __init__(self, run_container: RunContainer, *,
                 exit_barrier_timeout: float = 300.0) -> None:
        context = multiprocessing.get_context("spawn")  # the tests' process has threads
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, run_container,
                                                             exit_barrier_timeout),
                                        name="node", daemon=True)
        self._process.start()
        child.close()
        self.errors: list[BaseException] = []
        self._handles: dict[int, _Handle] = {}
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="node-reader", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int | None:
        """The node process's pid."""
        return self._process.pid

    def start(self, spec: ContainerSpec, wake: Callable[[], None]) -> _Handle:
        handle = _Handle(self, next(self._ids), wake)
        self._handles[handle.ident] = handle
        self._send(("start", handle.ident, spec.pod, spec.command, spec.env))
        return handle

    def _send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            if not self._closed:
                self._conn.send(message)

    def _read(self) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "exit":
                handle = self._handles.get(message[1])
                if handle is not None:
                    handle.exited(int(message[2]))
            elif message[0] == "error":
                self.errors.append(ContainerFailed(message[1]))
        # The node is gone: whatever still ran there has ended with it.
        for handle in list(self._handles.values()):
            handle.exited(SIGKILL_EXIT)

    def close(self) -> None:
        """Kill every container and stop the node process."""
        self._send(("close",))
        self._process.join(CLOSE_TIMEOUT_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        with self._send_lock:
            self._closed = True
            self._conn.close()
        self._reader.join(CLOSE_TIMEOUT_S)


def _serve(conn: Connection, run_container: RunContainer, exit_barrier_timeout: float) -> None:
    """The node process: start, signal and report containers until told to close."""
    lock = threading.Lock()

    def send(message: tuple[Any, ...]) -> None:
        with lock:
            conn.send(message)

    def run(container: Any) -> int | None:
        try:
            return run_container(container)
        except Exception:
            send(("error", traceback.format_exc()))
            raise  # the scripted runtime counts it as exit 1

    runtime = ScriptedRuntime(run, exit_barrier_timeout=exit_barrier_timeout)
    handles: dict[int, Any] = {}
    starting = threading.Lock()  # held while a handle is registered: it may exit meanwhile

    def exited(ident: int) -> None:
        with starting:
            code = handles[ident].exit_code()
        send(("exit", ident, code))

    try:
        while True:
            try:
                message = conn.recv()
            except EOFError:
                break
            verb = message[0]
            if verb == "start":
                ident, pod, command, env = message[1:]
                with starting:
                    handles[ident] = runtime.start(ContainerSpec(pod, command, env),
                                                   partial(exited, ident))
            elif verb == "term":
                handles[message[1]].terminate()
            elif verb == "kill":
                handles[message[1]].kill()
            elif verb == "close":
                break
    finally:
        runtime.close()
        conn.close()


__all__ = ["ContainerFailed", "NodeRuntime"]

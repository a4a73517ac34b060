"""Scripted containers: a test function plays each pod's main process on a thread, for the
node agent's runs' pods in the operator's tests (:mod:`.scripted`).

``run_container(container) -> exit code | None`` runs once per container, from the moment
its pod runs. ``container.killed`` is SIGTERM (the pod is deleted, or the node agent enforces
a deadline); returning None means the process does not end by itself and dies of that
SIGTERM (exit 143). SIGKILL cannot be scripted away: once the node agent sends it, the
container has exited 137 whatever the function still does.

For PyTorchJob pods (``PET_RDZV_ENDPOINT`` in the env) :meth:`Container.rendezvous` plays
torchrun's elastic agent against a shared c10d rendezvous hosted by worker-0's agent
(pytorch/pytorch torch/distributed/elastic/agent/server/api.py ``_invoke_run``,
rendezvous/dynamic_rendezvous.py): a round forms once ``PET_NNODES`` (its max) agents wait;
it breaks when a member's container ends (its peers' workers fail: a restart that counts
against ``PET_MAX_RESTARTS``) or when a new agent waits to join (a membership change: not
counted). A fresh agent starts at restart count 0 while survivors count on. When the host
(worker-0) ends, the store is gone and every other agent gives up. A fresh agent joining a
surviving rank 0 deadlocks with it as on torch 2.13 unless the pod's env has
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (see :meth:`Rendezvous._form`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)

Obj = dict[str, Any]
SIGTERM_EXIT, SIGKILL_EXIT = 143, 137


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
    """Starts scripted containers: on threads (:class:`ScriptedRuntime`) or in a process
    of their own (:class:`~.scriptnode.NodeRuntime`)."""

    def start(self, spec: ContainerSpec, wake: Callable[[], None]) -> Handle:
        """Start the container; ``wake()`` when it exits."""

    def close(self) -> None:
        """Kill whatever still runs."""


@dataclass
class Round:
    """One rendezvous round as an agent's workers see it."""

    number: int  # the same for every member of the round
    rank: int  # this agent's group rank
    nodes: int
    restart_count: int  # TORCHELASTIC_RESTART_COUNT of this agent's workers
    changed: threading.Event  # the agent restarts its workers: leave the round
    deadlocked: bool = False  # the agents wait for each other until read_timeout


class Rendezvous:
    """The c10d rendezvous of one job (its store lives in worker-0's agent). Members are
    ``<pod name>/<uid>``: ranks follow the sorted node descriptors, which start with the
    pod's host name (dynamic_rendezvous.py ``_mark_rendezvous_complete``)."""

    def __init__(self, nodes: int, shared_store: bool) -> None:
        self.nodes, self.shared_store = nodes, shared_store
        self.cond = threading.Condition()
        self.number = -1
        self.members: list[str] = []  # of the running round (until they leave it)
        self.ranks: dict[str, int] = {}
        self.waiting: list[str] = []
        self.changed = threading.Event()
        self.failed = False  # the running round lost a member (not just a newcomer)
        self.closed = False
        self.deadlocked = False
        self.seen: set[str] = set()  # agents that hold bootstrap store info from a round
        self.hosts: set[str] = set()  # agents that were rank 0 (they host a shared store)
        self.formed: list[str] = []  # the running round's members as it formed
        self.finished: set[tuple[int, str]] = set()  # (round, member) at the exit barrier

    def join(self, member: str, stop: threading.Event, timeout: float) -> Round | None:
        """Wait for a round with this member, or None (closed, stopped, timed out)."""
        with self.cond:
            if member in self.members:  # it leaves the running round to start the next
                self.members.remove(member)
            self.waiting.append(member)
            if self.members:
                self.changed.set()  # num_nodes_waiting > 0: the running round restarts
                self.cond.notify_all()  # its members' workers see it (Container.hold)
            if len(self.waiting) >= self.nodes:
                self._form()
            ok = self.cond.wait_for(lambda: member in self.members or self.closed
                                    or stop.is_set(), timeout)
            if not ok or member not in self.members:
                if member in self.waiting:
                    self.waiting.remove(member)
                return None
            return Round(self.number, self.ranks[member], self.nodes, 0, self.changed,
                         self.deadlocked)

    def _form(self) -> None:
        self.number += 1
        self.members = sorted(self.waiting[: self.nodes])
        self.formed = list(self.members)
        self.waiting = self.waiting[self.nodes:]
        self.ranks = {m: r for r, m in enumerate(self.members)}
        self.changed, self.failed = threading.Event(), False
        # torch 2.13 (dynamic_rendezvous.py next_rendezvous): with the TCP store shared (the
        # default; TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 turns it off) an agent builds its
        # bootstrap store info once; a rank 0 that already has it writes no MASTER_ADDR for
        # the new round, so an agent new to the rendezvous waits for it until read_timeout.
        self.deadlocked = self.shared_store and self.members[0] in self.hosts and any(
            m not in self.seen for m in self.members)
        self.seen |= set(self.members)
        self.hosts.add(self.members[0])
        self.cond.notify_all()

    def exit_barrier(self, member: str, number: int, timeout: float) -> bool:
        """torchrun's exit barrier (agent/server/api.py ``_exit_barrier``): an agent whose
        workers succeeded waits until every agent of its round got there, or the store is
        gone, or ``timeout`` (then it logs the error and exits 0 all the same). Whether all
        arrived."""
        with self.cond:
            self.finished.add((number, member))
            self.cond.notify_all()
            return self.cond.wait_for(
                lambda: self.closed or self.number != number
                or all((number, m) in self.finished for m in self.formed), timeout)

    def leave(self, member: str, host: bool, succeeded: bool = False) -> None:
        """The member's container ended: its round breaks; the host takes the store along.

        An agent that exits 0 left after its workers finished, past their last collective:
        the other agents' workers do not notice (nothing restarts them), only a later
        rendezvous or exit barrier finds the host's store gone."""
        with self.cond:
            if member in self.members:
                if not succeeded:
                    self.failed = True
                    self.changed.set()
                self.members = [m for m in self.members if m != member]
            if member in self.waiting:
                self.waiting.remove(member)
            if host:
                self.closed = True
                if not succeeded:
                    self.changed.set()
            self.cond.notify_all()


@dataclass
class Container:
    """One run of a pod's main process, handed to ``run_container``."""

    pod: Obj
    command: list[str]  # the container's command followed by its args
    env: dict[str, str]  # as the pod's env resolves (template env, then the operator's)
    killed: threading.Event = field(default_factory=threading.Event)  # SIGTERM
    # torchrun's exit_barrier_timeout (LaunchConfig, 300 s); tests shorten it to play a
    # rank that is slower than the barrier.
    exit_barrier_timeout: float = 300.0
    _store: Rendezvous | None = None
    _restarts: int = 0
    _round: Round | None = None

    @property
    def pod_name(self) -> str:
        """The pod's name."""
        return str(self.pod["metadata"]["name"])

    @property
    def index(self) -> int:
        """The replica index (0 for a pod of another kind)."""
        labels = self.pod["metadata"].get("labels") or {}
        return int(labels.get("training.kubeflow.org/replica-index", 0))

    def rendezvous(self, timeout: float = 30.0) -> Round | None:
        """Join the next round as torchrun's agent would; None when the agent gives up
        (killed, the store gone, max restarts exhausted, a timeout): the process then exits."""
        if self._store is None:
            raise RuntimeError(f"{self.pod_name}: no elastic rendezvous (PET_RDZV_ENDPOINT)")
        if self._round is not None and self._store.failed:
            if self._restarts >= int(self.env.get("PET_MAX_RESTARTS", "0")):
                return None
            self._restarts += 1
        joined = self._store.join(self.member, self.killed, timeout)
        if joined is None:
            return None
        if joined.deadlocked:  # both sides give up after the store's read_timeout
            conf = dict(c.split("=", 1) for c in self.env.get("PET_RDZV_CONF", "").split(",")
                        if "=" in c)
            self.killed.wait(float(conf.get("read_timeout", 60)))
            return None
        joined.restart_count = self._restarts
        self._round = joined
        return joined

    def hold(self, group: Round, timeout: float) -> bool:
        """The workers of ``group`` wait (a collective that does not return) until SIGTERM
        or until their agent restarts them (the round changed), ``timeout`` seconds at
        most; whether one of those happened. Woken by the rendezvous, which every change
        of a round and every signal to a member notifies, rather than by polling."""
        if self._store is None:
            return self.killed.wait(timeout) or group.changed.is_set()
        with self._store.cond:
            return self._store.cond.wait_for(
                lambda: self.killed.is_set() or group.changed.is_set(), timeout)

    def exit_barrier(self, timeout: float | None = None) -> bool:
        """After its workers succeeded, wait for the other agents of the round as torchrun
        does before it exits 0 (default: its 300 s, or the runtime's). Whether all came."""
        if self._store is None or self._round is None:
            return True
        limit = self.exit_barrier_timeout if timeout is None else timeout
        return self._store.exit_barrier(self.member, self._round.number, limit)

    @property
    def member(self) -> str:
        """How the rendezvous knows this agent: its host name first, as torch sorts them."""
        return f"{self.pod_name}/{self.pod['metadata']['uid']}"


RunContainer = Callable[[Container], "int | None"]


def hold(container: Container) -> int | None:
    """A process that runs until a signal ends it."""
    container.killed.wait()
    return None


class _Thread:
    def __init__(self, container: Container, host: bool, wake: Callable[[], None]) -> None:
        self.container, self.host, self.wake = container, host, wake
        self.code: int | None = None
        self.lock = threading.Lock()

    def exit_code(self) -> int | None:
        return self.code

    def terminate(self) -> None:
        # torchrun's agent passes SIGTERM on to its workers at once: the round breaks now.
        self.container.killed.set()
        self._leave(host=False)

    def kill(self) -> None:
        self.container.killed.set()
        self.exited(SIGKILL_EXIT)

    def exited(self, code: int) -> None:
        with self.lock:
            if self.code is not None:
                return
            self.code = code
        self._leave(self.host, succeeded=code == 0)  # the agent, and a host's store, is gone
        self.wake()

    def _leave(self, host: bool, succeeded: bool = False) -> None:
        if self.container._store is not None:
            self.container._store.leave(self.container.member, host, succeeded)


class ScriptedRuntime:
    """Runs ``run_container`` on a thread per container; errors are kept in ``errors``."""

    def __init__(self, run_container: RunContainer = hold, *,
                 exit_barrier_timeout: float = 300.0) -> None:
        self.run_container = run_container
        self.exit_barrier_timeout = exit_barrier_timeout
        self.errors: list[BaseException] = []
        self._stores: dict[str, Rendezvous] = {}
        self._threads: list[tuple[threading.Thread, _Thread]] = []
        self._lock = threading.Lock()

    def start(self, spec: ContainerSpec, wake: Callable[[], None]) -> _Thread:
        container = Container(spec.pod, spec.command, spec.env,
                              exit_barrier_timeout=self.exit_barrier_timeout)
        endpoint = spec.env.get("PET_RDZV_ENDPOINT")
        if endpoint is not None:
            key = f"{spec.pod['metadata']['namespace']}/{endpoint}"
            with self._lock:
                store = self._stores.get(key)
                # Worker-0's agent hosts the store; the others connect to it, retrying until
                # it is up (torch c10d_rendezvous_backend.py _create_tcp_store: a client
                # TCPStore waits up to read_timeout), so one that starts first waits for it
                # rather than hold a store of its own. A new worker-0 (its pod replaced)
                # hosts a new store once the old host has ended.
                if store is None or (container.index == 0 and store.closed):
                    nodes = int(spec.env.get("PET_NNODES", "1").rpartition(":")[2])
                    shared = spec.env.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") != "1"
                    store = self._stores[key] = Rendezvous(nodes, shared)
            container._store = store
        handle = _Thread(container, endpoint is not None and container.index == 0, wake)
        thread = threading.Thread(target=self._run, args=(handle,), daemon=True,
                                  name=f"container-{container.pod_name}")
        self._threads.append((thread, handle))
        thread.start()
        return handle

    def _run(self, handle: _Thread) -> None:
        try:
            code = self.run_container(handle.container)
        except Exception as e:
            log.exception("container %s failed", handle.container.pod_name)
            self.errors.append(e)
            code = 1
        if code is None:  # runs until a signal: SIGTERM's default action ends it
            handle.container.killed.wait()
            code = SIGTERM_EXIT
        handle.exited(int(code))

    def close(self) -> None:
        for _, handle in self._threads:
            handle.kill()
        deadline = time.monotonic() + 5  # a script that ignores its signals is left behind
        for thread, _ in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._threads = []

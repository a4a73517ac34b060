"""Process-group setup that survives elastic restarts.

torchrun restarts every worker of a group when one fails, but the rendezvous store
outlives the attempt. On torch 2.13 CPU, gloo reads the previous attempt's peer addresses
from that surviving store and fails with ``connectFullMesh ... Connection refused``; a
store namespaced per attempt makes the new group connect cleanly.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from resumequal.errors import TrainingError
from resumequal.train.loopback import is_loopback, loopback_store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placement:
    """Where this process sits in the leg: rank, world, attempt, device."""

    rank: int
    local_rank: int
    world_size: int
    attempt: int
    backend: str
    device: torch.device
    host: str
    joined_at: float


def _env_int(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        if default is None:
            raise TrainingError(f"environment variable {name} is not set; run under torchrun")
        return default
    try:
        return int(raw)
    except ValueError as e:
        raise TrainingError(f"environment variable {name}={raw!r} is not an integer") from e


def resolve_backend(requested: str) -> str:
    """'auto' means nccl where CUDA is available, else gloo."""
    if requested == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if requested == "nccl" and not torch.cuda.is_available():
        raise TrainingError("world.backend is nccl but CUDA is not available here")
    return requested


JOINS_KEY = "resumequal/joins"


def attempt_from_joins(joins: int, world_size: int, restart_count: int) -> int:
    """The group's attempt from this worker's 1-based join number in the agent store.

    Every worker of an attempt joins once, so joins ``k*W+1 .. (k+1)*W`` are attempt ``k``.
    A count below what the local agent already restarted means the store was not the one
    of earlier attempts (a new rendezvous host); the local count is then the better guess.
    """
    by_joins = (joins - 1) // world_size
    if by_joins != restart_count:
        log.info("attempt %d from the group's joins (this agent's restart count is %d)",
                 by_joins, restart_count)
    return by_joins if by_joins >= restart_count else restart_count


def init_process_group(requested_backend: str, timeout_seconds: float,
                       attempts_started: Callable[[], int] | None = None) -> Placement:
    """Join this attempt's process group through a per-attempt namespaced store.

    The attempt number must agree on every rank, and TORCHELASTIC_RESTART_COUNT does not:
    a recreated pod's agent starts at 0, and a membership change restarts the surviving
    agents' workers without counting. With the agent's store (torchrun's default) the
    joins counted in it number the attempts. Without it (TORCH_DISABLE_SHARE_RDZV_TCP_STORE,
    set in leg pods and local legs) rank 0 hosts a fresh store every attempt — on loopback
    alone when the group's address is (a local run's) — and ``attempts_started`` — the
    attempts the run location has seen — does: every rank reads it before the group
    forms and nothing of this attempt is written until it has, so all read the same.
    """
    rank = _env_int("RANK")
    world_size = _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK", 0)
    # Under torchrun the agent hosts the store; standalone launches make rank 0 host it.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "False") == "True"
    attempt = _restart_count(None if agent_store else attempts_started)
    backend = resolve_backend(requested_backend)
    host = os.environ.get("MASTER_ADDR")
    port = _env_int("MASTER_PORT")
    if host is None:
        raise TrainingError("environment variable MASTER_ADDR is not set; run under torchrun")
    timeout = timedelta(seconds=timeout_seconds)
    try:
        base = _rendezvous_store(host, port, rank, world_size, agent_store=agent_store,
                                 timeout=timeout)
        if agent_store:
            attempt = attempt_from_joins(int(base.add(JOINS_KEY, 1)), world_size, attempt)
        store = dist.PrefixStore(f"resumequal/attempt-{attempt}", base)
        device = _device(backend, local_rank)
        dist.init_process_group(
            backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout
        )
    except (RuntimeError, ValueError, OSError) as e:
        raise TrainingError(
            f"rank {rank}: cannot join the {backend} process group at {host}:{port} "
            f"(attempt {attempt}): {e}"
        ) from e
    log.info("rank %d/%d joined %s group (attempt %d)", rank, world_size, backend, attempt)
    return Placement(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        attempt=attempt,
        backend=backend,
        device=device,
        host=socket.gethostname(),
        joined_at=time.time(),
    )


def _restart_count(attempts_started: Callable[[], int] | None) -> int:
    """This agent's restart count, or the attempts the run location has seen where the
    caller reads them from there."""
    attempt = _env_int("TORCHELASTIC_RESTART_COUNT", 0)
    if attempts_started is None:
        return attempt
    started = attempts_started()
    if started != attempt:
        log.info("attempt %d from the run location (this agent's restart count is %d)",
                 started, attempt)
    return started


def _rendezvous_store(host: str, port: int, rank: int, world_size: int, *,
                      agent_store: bool, timeout: timedelta) -> dist.Store:
    """The store the group meets through: the agent's, or one rank 0 hosts."""
    if not agent_store and rank == 0 and is_loopback(host):
        # One machine's group (a local run names 127.0.0.1): its store listens on
        # loopback alone, where torch's own would listen on every interface.
        store: dist.Store = loopback_store(port, world_size=world_size, timeout=timeout,
                                           wait_for_workers=False)
        return store
    return dist.TCPStore(
        host,
        port,
        world_size=None if agent_store else world_size,
        is_master=(not agent_store and rank == 0),
        timeout=timeout,
        wait_for_workers=False,
    )


def _device(backend: str, local_rank: int) -> torch.device:
    """The device this rank trains on: its GPU under nccl (made current), else the CPU."""
    if backend != "nccl":
        return torch.device("cpu")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    return device


def process_started_at() -> float:
    """This process's creation time as a unix timestamp (Linux /proc; else now)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()
    return time.time() - uptime + ticks / hz


# How long a process that leaves its group lets go of the GIL before it goes on to exit.
# gloo's worker threads drop a finished collective's tensors after its waiter has returned;
# a tensor Python has seen needs the GIL to go (TensorImpl::decref_pyobject), and a thread
# that asks for it once the interpreter finalizes is ended by pthread_exit, whose unwinding
# aborts the process ("terminate called without an active exception", exit -6, from
# ProcessGroupGloo::runLoop; pytorch/pytorch#190489). destroy_process_group does not join
# those threads (the group lives on in torch's C++ registries), so they are given the GIL
# while the interpreter is whole. Seen in a worker image on Debian's Python 3.11.2 with
# torch 2.13: a worker aborted at exit in about half the runs, the leg then failed (or a
# control leg restarted); none in 13 runs with this pause.
_LEAVE_PAUSE_S = 0.2


def destroy_process_group() -> None:
    """Leave the group if one exists, then let its worker threads finish with the GIL."""
    if dist.is_initialized():
        dist.destroy_process_group()
        time.sleep(_LEAVE_PAUSE_S)

"""Cut points, kill orders and stops: where a rank waits to be killed, and how it dies.

On its first attempt, the target rank reaches the cut, writes a beacon (pid, pod and pod
uid, attempt, step, microstep, host) and holds until it is killed: by a signal from
outside, or by a kill order for its pid (and pod uid) that it reads from the store while
it holds — how a process kill reaches a worker inside a pod. Holding past the arm timeout
fails the leg for good: a marker in the leg's folder stops every later attempt at once.

In graceful mode a SIGTERM only raises a flag. At the next microbatch boundary every rank
all-reduces its flag, so all ranks see the stop together and can write one emergency
checkpoint with the same commit protocol before exiting; a rank holding at a cut leaves
its hold to join. In hard mode nothing handles SIGTERM: it ends the process as SIGKILL
does, so a pod deletion (SIGTERM first, SIGKILL after the grace) saves nothing either.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Literal

import torch
import torch.distributed as dist

from resumequal.errors import NotAuthentic, StoreError, TrainingError
from resumequal.run.beacons import GROW, KillOrder
from resumequal.run.legfiles import LegFiles

log = logging.getLogger(__name__)

# 128 + SIGTERM: what a process ended by SIGTERM reports; launchers treat it as retryable.
EXIT_PREEMPTED = 143
# How often a holding rank reads its kill order: a few store requests a second, for at
# most timeouts.arm_seconds.
ORDER_POLL_SECONDS = 0.2


class Preempted(Exception):
    """Raised after the emergency checkpoint is committed; the process should exit 143."""


class StopFlag:
    """Set by SIGTERM (graceful mode) or a graceful kill order; read collectively at
    microbatch boundaries."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: object = None

    def install(self) -> None:
        """Turn SIGTERM into a stop request (graceful mode only: in hard mode SIGTERM kills)."""
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def request(self) -> None:
        self.requested = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def agreed(self, device: torch.device) -> bool:
        """True on every rank when any rank was asked to stop (a MAX all-reduce)."""
        flag = torch.tensor([1 if self.requested else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


@dataclass(frozen=True)
class CutPoint:
    """Where the target rank of the preempted leg holds on attempt 0."""

    step: int
    microstep: int
    rank: int
    at: Literal["microbatch", "checkpoint_commit"]
    arm_timeout: float


def order_applies(order: KillOrder, pid: int, pod_uid: str | None) -> bool:
    """Whether a kill order names this process: its pid and, if the order names a pod uid,
    its pod's (a replacement pod has the same name and often the same pids)."""
    return order.pid == pid and (order.pod_uid is None or order.pod_uid == pod_uid)


def _sigkill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Arming:
    """Decides whether this process holds at a position, and does the holding."""

    def __init__(
        self,
        cut: CutPoint | None,
        *,
        rank: int,
        attempt: int,
        files: LegFiles,
        stop: StopFlag,
        on_arm: Callable[[int, int, str], None] | None = None,
        poll_seconds: float = ORDER_POLL_SECONDS,
    ) -> None:
        self.cut = cut
        self.rank = rank
        self.attempt = attempt
        self.files = files
        self.stop = stop
        self.on_arm = on_arm
        self.poll_seconds = poll_seconds
        self.pod_uid = os.environ.get("POD_UID")
        self.watchdog: threading.Timer | None = None
        self._ignored: float | None = None
        self._refused: str | None = None  # the last kill order refused as not the run's

    def armed_at(self, step: int, microstep: int, where: str) -> bool:
        c = self.cut
        return (
            c is not None
            and self.attempt == 0
            and self.rank == c.rank
            and c.at == where
            and (c.step, c.microstep) == (step, microstep)
        )

    def maybe_hold(self, step: int, microstep: int, where: str) -> None:
        """Hold here if this is the cut; returns only when asked to stop gracefully (a
        SIGTERM in graceful mode, or a graceful kill order)."""
        if not self.armed_at(step, microstep, where):
            return
        assert self.cut is not None
        if self.on_arm is not None:
            self.on_arm(step, microstep, where)
        beacon = self.files.write_beacon(self.rank, self.attempt, step, microstep, where)
        log.warning("rank %d armed at step %d microstep %d (%s): %s", self.rank, step,
                    microstep, where, beacon)
        deadline = time.monotonic() + self.cut.arm_timeout
        next_poll = time.monotonic()
        while not self.stop.requested:
            now = time.monotonic()
            if now > deadline:
                reason = (
                    f"rank {self.rank} held at the cut (step {step}, microstep {microstep}, "
                    f"{where}) for {self.cut.arm_timeout:g}s without being killed "
                    "(timeouts.armSeconds)"
                )
                self.files.mark_failed(reason)
                raise TrainingError(reason)
            if now >= next_poll:
                next_poll = now + self.poll_seconds
                self._poll_order()
                continue
            time.sleep(min(0.02, self.poll_seconds))
        log.warning("rank %d: asked to stop while armed; stopping gracefully", self.rank)

    def _poll_order(self) -> None:
        try:
            order = self.files.read_kill_order(self.rank, self.attempt)
        except NotAuthentic as e:
            # Not the run's: never obeyed, said once (it is read several times a second).
            if self._refused != str(e):
                self._refused = str(e)
                log.warning("rank %d: ignoring %s", self.rank, e)
            return
        except StoreError as e:
            # The arm timeout bounds how long a store that keeps failing can be retried.
            log.warning("rank %d: cannot read its kill order: %s", self.rank, e)
            return
        if order is None:
            return
        if not order_applies(order, os.getpid(), self.pod_uid):
            if self._ignored != order.issued_at:
                self._ignored = order.issued_at
                log.warning("rank %d: ignoring a kill order for pid %d, pod uid %s (this is "
                            "pid %d, pod uid %s)", self.rank, order.pid, order.pod_uid,
                            os.getpid(), self.pod_uid)
            return
        self.obey(order)

    def obey(self, order: KillOrder) -> None:
        """Die as the order says: SIGKILL now (hard: no handler runs, the launcher sees a
        signal death); or stop gracefully, with SIGKILL after the order's grace."""
        if order.mode == "hard":
            log.warning("rank %d: hard kill order; SIGKILL", self.rank)
            _sigkill_self()
            return  # not reached: a signal to oneself is delivered before kill() returns
        log.warning("rank %d: graceful kill order; stopping, SIGKILL in %gs", self.rank,
                    order.grace_seconds)
        self.stop.request()
        self.watchdog = threading.Timer(order.grace_seconds, _sigkill_self)
        self.watchdog.daemon = True
        self.watchdog.start()


def hold_for_grow(files: LegFiles, rank: int, attempt: int, step: int,
                  timeout: float) -> None:
    """Wait, on every rank of a shrunk world, for the grown world's restart to end this
    process; rank 0 publishes a beacon (at ``grow``) saying so. Waiting past ``timeout``
    fails the leg for good."""
    if rank == 0:
        beacon = files.write_beacon(rank, attempt, step, 0, GROW)
        log.warning("rank 0 waits at step %d for the world to grow: %s", step, beacon)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.1)
    reason = (f"rank {rank} waited at step {step} for {timeout:g}s for a node to join the "
              "shrunk world (preemption.resize.growAfterStep, timeouts.armSeconds)")
    files.mark_failed(reason)
    raise TrainingError(reason)


def hold_for_full_world(world_size: int, full: int, timeout: float) -> None:
    """Wait for a world that formed before every node had joined to be restarted at its
    full size (torchrun does once the late nodes arrive): a resize run starts full."""
    log.warning("a world of %d of %d ranks formed before every node joined; waiting for the "
                "full one", world_size, full)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.1)
    raise TrainingError(f"the leg started with {world_size} of {full} ranks and no other "
                        f"node joined within {timeout:g}s (timeouts.processGroupSeconds)")


def write_beacon(
    files: LegFiles, rank: int, attempt: int, step: int, microstep: int, where: str
) -> str:
    """Atomically publish that this process is armed, with the pid to kill; its URI."""
    return files.write_beacon(rank, attempt, step, microstep, where)


def mark_failed(files: LegFiles, reason: str) -> None:
    """Fail the leg for every later attempt too (the launcher would otherwise restart it)."""
    files.mark_failed(reason)


def check_not_failed(files: LegFiles) -> None:
    """Refuse to start an attempt of a leg that has already failed for good."""
    reason = files.failure()
    if reason is not None:
        raise TrainingError(f"this leg has already failed: {reason}")

"""Cut points and graceful stops: where a rank waits to be killed, and what SIGTERM does.

On its first attempt, the target rank reaches the cut, writes a beacon (pid, attempt,
step, microstep, host) and holds until it is killed. Holding past the arm timeout fails
the leg for good: a marker in the leg's folder stops every later attempt at once.

A SIGTERM only raises a flag. At the next microbatch boundary every rank all-reduces its
flag, so all ranks see the stop together and can write one emergency checkpoint with the
same commit protocol before exiting; a rank holding at a cut leaves its hold to join.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Literal

import torch
import torch.distributed as dist

from resumequal.errors import TrainingError
from resumequal.runstore import FAILED_MARKER as FAILED_MARKER
from resumequal.runstore import LegFiles

log = logging.getLogger(__name__)

# 128 + SIGTERM: what a process ended by SIGTERM reports; launchers treat it as retryable.
EXIT_PREEMPTED = 143


class Preempted(Exception):
    """Raised after the emergency checkpoint is committed; the process should exit 143."""


class StopFlag:
    """Set by SIGTERM; read collectively at microbatch boundaries."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: object = None

    def install(self) -> None:
        self._previous = signal.signal(signal.SIGTERM, self._handle)

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


class Arming:
    """Decides whether this process holds at a position, and does the holding."""

    def __init__(
        self,
        cut: CutPoint | None,
        *,
        rank: int,
        attempt: int,
        leg_dir: Path | LegFiles,
        stop: StopFlag,
        on_arm: Callable[[int, int, str], None] | None = None,
    ) -> None:
        self.cut = cut
        self.rank = rank
        self.attempt = attempt
        self.leg_dir = leg_dir
        self.stop = stop
        self.on_arm = on_arm

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
        """Hold here if this is the cut; returns only when a SIGTERM arrived."""
        if not self.armed_at(step, microstep, where):
            return
        assert self.cut is not None
        if self.on_arm is not None:
            self.on_arm(step, microstep, where)
        beacon = write_beacon(self.leg_dir, self.rank, self.attempt, step, microstep, where)
        log.warning("rank %d armed at step %d microstep %d (%s): %s", self.rank, step,
                    microstep, where, beacon)
        deadline = time.monotonic() + self.cut.arm_timeout
        while not self.stop.requested:
            if time.monotonic() > deadline:
                reason = (
                    f"rank {self.rank} held at the cut (step {step}, microstep {microstep}, "
                    f"{where}) for {self.cut.arm_timeout:g}s without being killed "
                    "(timeouts.armSeconds)"
                )
                mark_failed(self.leg_dir, reason)
                raise TrainingError(reason)
            time.sleep(0.02)
        log.warning("rank %d: SIGTERM while armed; stopping gracefully", self.rank)


def _files(leg_dir: Path | LegFiles) -> LegFiles:
    return LegFiles.folder(leg_dir) if isinstance(leg_dir, Path) else leg_dir


def write_beacon(
    leg_dir: Path | LegFiles, rank: int, attempt: int, step: int, microstep: int, where: str
) -> Path | str:
    """Atomically publish that this process is armed, with the pid to kill; the beacon's
    path (a leg folder) or URI (a leg in an object store)."""
    files = _files(leg_dir)
    uri = files.write_beacon(rank, attempt, step, microstep, where)
    if isinstance(leg_dir, Path):
        return leg_dir / "beacons" / f"attempt-{attempt}-rank-{rank}.json"
    return uri


def mark_failed(leg_dir: Path | LegFiles, reason: str) -> None:
    """Fail the leg for every later attempt too (the launcher would otherwise restart it)."""
    _files(leg_dir).mark_failed(reason)


def check_not_failed(leg_dir: Path | LegFiles) -> None:
    """Refuse to start an attempt of a leg that has already failed for good."""
    reason = _files(leg_dir).failure()
    if reason is not None:
        raise TrainingError(f"this leg has already failed: {reason}")

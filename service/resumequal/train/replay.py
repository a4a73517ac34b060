"""Replaying one step of a finished leg in fresh processes, for ``resumequal zoom``.

A replay runs where the leg's own process that ran the step started: from the checkpoint
that process restored (or from the beginning), so that what it ran before the step — its
warm-up, the age of its DDP reducer, the history of its modules — is run again, not just
its state loaded. It runs the same loop as the leg, through the step, capturing that step
whole (:mod:`resumequal.train.capture`). It only reads the run: its trace, beacons and
capture go to a local folder, it writes no checkpoint, and nothing is cut.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from resumequal.checkpoint import checkpoint_location
from resumequal.errors import TrainingError
from resumequal.run.location import RunLocation
from resumequal.run.signing import RunSeal
from resumequal.spec import QualificationSpec
from resumequal.train.capture import StepCapture
from resumequal.train.distributed import destroy_process_group, init_process_group
from resumequal.train.loop import Trainer
from resumequal.train.preemption import Arming
from resumequal.train.prime import prime_reducer

log = logging.getLogger(__name__)


def capture_path(out: Path, rank: int) -> Path:
    """Where rank ``rank`` of a replay writes its capture."""
    return out / f"rank-{rank}.pt"


class Replayer(Trainer):
    """Runs a leg from checkpoint ``start`` (None: from the beginning) through ``step``."""

    def __init__(self, *args: object, start: str | None, step: int, out: Path,
                 **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.start = start
        self.out = out
        # Nothing is cut in a replay: the step is run as the leg's surviving process ran it.
        self.arming = Arming(None, rank=self.p.rank, attempt=self.p.attempt, files=self.files,
                             stop=self.stop, on_arm=self._on_arm)
        self.capture = StepCapture(step, self.p.rank)

    def run(self) -> None:
        """Build, restore ``start``, run every step through the captured one, save it."""
        assert self.capture is not None
        live = self._build()
        if self.start is not None:
            self._restore(live, self.start)
        # A mid-step checkpoint (microstep > 0) resumes inside step + 1, as the leg did.
        first = live.counters.step + 1
        if self.capture.step < first:
            raise TrainingError(f"checkpoint {self.start} is at step {live.counters.step}, "
                                f"after the step to replay ({self.capture.step})")
        if self.spec.parallelism.kind == "ddp" and self.spec.ddp.reducer_prime:
            prime_reducer(live, self.precision)
            self.recorder.reset()
        for step in range(first, self.capture.step + 1):
            self._step(live, step)  # the leg's checkpoints are not written again
        self.trace.close()
        self.capture.save(capture_path(self.out, self.p.rank))

    def _maybe_hold_for_grow(self, step: int) -> None:
        """A replay runs at the world size the leg ran the step with; it never waits."""


def replay_leg(spec: QualificationSpec, leg: str, run: str, omit: frozenset[str], *,
               step: int, start: str | None, attempt: int, out: Path) -> int:
    """Replay ``leg`` of the run at ``run`` through ``step`` in this process (under torchrun),
    as attempt ``attempt`` did; the capture and the replay's trace go under ``out``."""
    seal = RunSeal.from_env()
    patience = spec.timeouts.backend_error_seconds  # as a leg's workers wait for the store
    location = RunLocation.open(run, spec.checkpoint.store_settings, seal=seal,
                            retry_seconds=patience)
    spec = location.leg_spec(spec)
    scratch = out / "scratch"
    placement = init_process_group(spec.world.backend, spec.timeouts.process_group_seconds)
    # Records and anything keyed by attempt read as the leg's own attempt did.
    placement = dataclasses.replace(placement, attempt=attempt)
    try:
        local = RunLocation.open(str(out / "run"), seal=seal)
        ckpt = checkpoint_location(spec.checkpoint.store or location.uri,
                                   spec.checkpoint.store_settings,
                                   scratch / f"rank-{placement.rank}", leg, run=seal.run,
                                   retry_seconds=patience)
        replayer = Replayer(spec, leg, local.leg(leg), placement, omit=omit,
                            checkpoint_root=ckpt,
                            trace=local.trace_sink(leg, placement.rank, attempt),
                            scratch=scratch, start=start, step=step, out=out)
        replayer.run()
        return 0
    finally:
        destroy_process_group()

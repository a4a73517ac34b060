"""The entry of a worker process: join the group, check the run location, run the leg.

Everything goes to the run location's store (a folder or ``s3://``); the worker keeps
only scratch files (checkpoint staging, downloaded copies) in ``scratch``, by default a
temporary folder per run location.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch.distributed as dist

from resumequal.checkpoint import CheckpointRoot, checkpoint_location
from resumequal.run.location import RunLocation
from resumequal.run.signing import RunSeal
from resumequal.spec import QualificationSpec
from resumequal.train.distributed import Placement, destroy_process_group, init_process_group
from resumequal.train.loop import Trainer
from resumequal.train.preemption import (
    EXIT_PREEMPTED,
    Preempted,
    check_not_failed,
    hold_for_full_world,
)
from resumequal.train.probes import check_installed

log = logging.getLogger(__name__)


def claim_run_dir(run_dir: Path, spec: QualificationSpec) -> None:
    """Tie a new ``run_dir`` to this spec; an existing one is left for check_run_dir."""
    RunLocation.open(str(run_dir)).claim(spec)


def check_run_dir(run_dir: Path, spec: QualificationSpec) -> None:
    """Raise TrainingError when ``run_dir`` was made for a different spec."""
    RunLocation.open(str(run_dir)).check_claim(spec)


def checkpoint_root(spec: QualificationSpec, run_dir: Path, leg: str) -> CheckpointRoot:
    """Where a leg's checkpoints live: the spec's store (a folder or ``s3://``), else the
    leg's folder. ``run_dir`` is the local folder (the run's, or scratch on S3)."""
    return checkpoint_location(spec.checkpoint.store, spec.checkpoint.store_settings, run_dir,
                               leg)


def _hold_if_the_world_is_short(spec: QualificationSpec, placement: Placement) -> None:
    """A resize run's first attempt formed before every node joined waits for the rest."""
    if (spec.preemption.resize is not None and placement.attempt == 0
            and placement.world_size < spec.world.world_size):
        # Nodes that join after the first ones' last call make torchrun form a smaller
        # world first (--nnodes MIN:MAX); it restarts at the full size once they join.
        hold_for_full_world(placement.world_size, spec.world.world_size,
                            spec.timeouts.process_group_seconds)


def run_leg(
    spec: QualificationSpec,
    leg: str,
    run: str,
    omit: frozenset[str],
    *,
    scratch: Path | None = None,
    trace_every: int = 1,
) -> int:
    """Run one leg in this process under torchrun; returns the process exit code.

    ``run`` is the run location (a folder, ``file://`` or ``s3://`` URI); ``scratch``
    a local folder for staging (default: a temporary folder per run location). Each rank
    writes a trace segment every ``trace_every`` records.
    """
    # A spec that reached a torch lacking one of its features (an image's, when the
    # operator was not told its stack.torchVersion) stops here naming it, before any
    # request or collective, rather than at a missing API halfway through.
    check_installed(spec)
    # What the leg writes (its trace, its checkpoints' manifests) is bound to its run, and
    # what it reads back must be bound to it too.
    seal = RunSeal.from_env()
    # Every request to the store rides out an outage as long as the runner and the
    # operator ride out their own store errors (resumequal.store.patience).
    patience = spec.timeouts.backend_error_seconds
    location = RunLocation.open(run, spec.checkpoint.store_settings, seal=seal,
                                retry_seconds=patience)
    spec = location.leg_spec(spec)
    scratch = scratch or location.scratch()
    files = location.leg(leg)
    # The first request to the store, before any collective: a store that is unreachable
    # or refuses these credentials stops every rank here with an error naming it.
    check_not_failed(files)
    placement = init_process_group(spec.world.backend, spec.timeouts.process_group_seconds,
                                   lambda: location.attempts_started(leg))
    try:
        _hold_if_the_world_is_short(spec, placement)
        if placement.rank == 0:
            location.claim(spec)
        dist.barrier()
        location.check_claim(spec)
        sink = location.trace_sink(leg, placement.rank, placement.attempt, trace_every)
        # Checkpoints default to the run location itself; scratch holds only local copies.
        ckpt = checkpoint_location(spec.checkpoint.store or location.uri,
                                   spec.checkpoint.store_settings, scratch, leg, run=seal.run,
                                   retry_seconds=patience)
        worker = Trainer(spec, leg, files, placement, omit=omit, checkpoint_root=ckpt, trace=sink,
                         scratch=scratch)
        try:
            worker.run()
        except Preempted as e:
            log.warning("rank %d: %s; emergency checkpoint committed", placement.rank, e)
            return EXIT_PREEMPTED
        return 0
    finally:
        destroy_process_group()


__all__ = ["check_run_dir", "checkpoint_root", "claim_run_dir", "run_leg"]

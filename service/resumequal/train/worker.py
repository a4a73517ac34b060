"""The entry of a worker process: join the group, check the run directory, run the leg."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import torch.distributed as dist

from resumequal.checkpoint import RemoteRoot, checkpoint_location
from resumequal.errors import TrainingError
from resumequal.spec import QualificationSpec
from resumequal.train.distributed import destroy_process_group, init_process_group
from resumequal.train.loop import Leg
from resumequal.train.preemption import EXIT_PREEMPTED, Preempted, check_not_failed

log = logging.getLogger(__name__)

RUN_FILE = "run.json"


def claim_run_dir(run_dir: Path, spec: QualificationSpec) -> None:
    """Tie a new ``run_dir`` to this spec; an existing one is left for check_run_dir."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / RUN_FILE
    body = {"spec_digest": spec.digest(), "spec": spec.model_dump(mode="json"),
            "created_at": time.time()}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as f:
        json.dump(body, f, indent=1)


def check_run_dir(run_dir: Path, spec: QualificationSpec) -> None:
    """Raise TrainingError when ``run_dir`` was made for a different spec."""
    path = run_dir / RUN_FILE
    try:
        theirs = json.loads(path.read_text())["spec_digest"]
    except FileNotFoundError as e:
        raise TrainingError(f"{run_dir} is not a run directory (no {RUN_FILE})") from e
    except (ValueError, KeyError) as e:
        raise TrainingError(f"{path}: unreadable run file: {e}") from e
    if theirs != spec.digest():
        raise TrainingError(
            f"run directory {run_dir} belongs to another run (its spec digest "
            f"{theirs[:12]}…, this spec {spec.digest()[:12]}…); use a new --run-dir"
        )


def checkpoint_root(spec: QualificationSpec, run_dir: Path, leg: str) -> Path | RemoteRoot:
    """Where a leg's checkpoints live: the spec's store (a folder or ``s3://``), else the
    leg's folder."""
    return checkpoint_location(spec.checkpoint.store, spec.checkpoint.s3, run_dir, leg)


def run_leg(spec: QualificationSpec, leg: str, run_dir: Path, omit: frozenset[str]) -> int:
    """Run one leg in this process under torchrun; returns the process exit code."""
    leg_dir = run_dir / leg
    placement = init_process_group(spec.world.backend, spec.timeouts.process_group_seconds)
    try:
        if placement.rank == 0:
            claim_run_dir(run_dir, spec)
        dist.barrier()
        check_run_dir(run_dir, spec)
        check_not_failed(leg_dir)
        worker = Leg(spec, leg, leg_dir, placement, omit=omit,
                     checkpoint_root=checkpoint_root(spec, run_dir, leg))
        try:
            worker.run()
        except Preempted as e:
            log.warning("rank %d: %s; emergency checkpoint committed", placement.rank, e)
            return EXIT_PREEMPTED
        return 0
    finally:
        destroy_process_group()

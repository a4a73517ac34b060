"""A store writer with the run's key plants another step's checkpoint under the name the
resume expects: the zoo's MLP (:func:`tests.zoo.state.weight_normed`), whose factory, in the
preempted leg's restarted rank 0 and before any rank looks for a checkpoint, replaces
``workload.params.replace`` with ``workload.params.plant`` (its files, and its manifest
re-signed under the replaced name). The comparator must call that INVALID, not FAIL."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from resumequal.checkpoint.layout import Position
from resumequal.checkpoint.manifest import read_manifest, write_manifest_file
from resumequal.workloads.base import Workload, WorkloadContext, parse_params
from tests.zoo.state import weight_normed


class Params(BaseModel):
    """Where the leg's checkpoints are, the one to replace and the one planted instead."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    checkpoints: str
    replace: str
    plant: str


def _plant(p: Params) -> None:
    root = Path(p.checkpoints)
    source, target = root / p.plant, root / p.replace
    manifest = read_manifest(source)  # authenticated: the planted one is the run's own
    position = Position.parse(p.replace)
    assert position is not None
    shutil.rmtree(target)
    shutil.copytree(source, target)
    write_manifest_file(target, manifest.model_copy(update={
        "name": p.replace, "step": position.step, "microstep": position.microstep}))


def build(ctx: WorkloadContext) -> Workload:
    """The MLP; planting first where this is a restarted rank 0."""
    p = parse_params(Params, ctx.params)
    if ctx.rank == 0 and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) >= 1:
        _plant(p)
    return weight_normed(ctx)

"""What the project does where an older torch of the declared range (2.6 to 2.9) behaves
otherwise than this one, checked here by making this torch behave as the older one does."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.futures import Future

from resumequal.checkpoint import CheckpointManager, FolderRoot, Position, layout
from resumequal.checkpoint import manager as manager_module
from resumequal.errors import CheckpointError
from resumequal.train import state
from tests.unit.rank_states import Plain

WAIT_S = 30.0


@pytest.fixture
def passing_through(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """DCP's staging as torch 2.6's: a CPU tensor is handed on as it is, not copied."""
    monkeypatch.setattr(BlockingAsyncStager, "stage", lambda self, state_dict: state_dict)
    manager_module.staging_copies_cpu_tensors.cache_clear()
    yield
    manager_module.staging_copies_cpu_tensors.cache_clear()


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Every background write waits at its start until the event is set."""
    release = threading.Event()

    class HeldWriter(dcp.FileSystemWriter):
        def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[Any]:
            if not release.wait(WAIT_S):
                raise TimeoutError("the test never released the write")
            return super().write_data(plan, planner)

    monkeypatch.setattr(dcp, "FileSystemWriter", HeldWriter)
    yield release
    release.set()


@pytest.mark.usefixtures("single_process_group", "passing_through")
def test_a_background_save_writes_what_was_there_when_it_was_asked_for(
    held: threading.Event, tmp_path: Path
) -> None:
    assert not manager_module.staging_copies_cpu_tensors()  # found out, not assumed
    mgr = CheckpointManager(FolderRoot(tmp_path), rank=0, world_size=1, attempt=0,
                            keep_last=3, async_save=True, group_timeout=timedelta(seconds=30))
    model = nn.Linear(3, 2)
    saved = model.weight.detach().clone()
    mgr.save(Position(1), {"model": model.state_dict()}, Plain(), background=True)
    with torch.no_grad():
        model.weight.add_(1.0)  # the next optimizer step, while the write is held
    held.set()
    assert mgr.poll(wait=True) == "step-00000001"
    out = {"model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()}}
    dcp.load(out, storage_reader=dcp.FileSystemReader(
        str(tmp_path / "step-00000001" / layout.DCP_DIR)))
    assert torch.equal(out["model"]["weight"], saved)


def _sharded(fsdp_state: object) -> Any:
    """A sharded module as far as ``state`` looks at one: its FSDP state."""
    return SimpleNamespace(_get_fsdp_state=lambda: fsdp_state)


def test_fsdp2s_parameter_groups_are_found_where_each_torch_keeps_them() -> None:
    group = object()
    assert state._fsdp_param_groups(_sharded(SimpleNamespace(
        _fsdp_param_groups=[group, group]))) == [group, group]  # a recent torch: a list
    assert state._fsdp_param_groups(_sharded(SimpleNamespace(
        _fsdp_param_group=group))) == [group]  # torch 2.9: one group, or None
    assert state._fsdp_param_groups(_sharded(SimpleNamespace(_fsdp_param_group=None))) == []
    with pytest.raises(CheckpointError, match="keeps elsewhere"):
        state._fsdp_param_groups(_sharded(SimpleNamespace()))

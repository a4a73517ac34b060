"""Unit tests for background checkpoint saves, in one process with a world-1 gloo group.

What DCP's async_save does before it returns (a CPU snapshot), why a commit must wait for
every rank's background write (a manifest written earlier describes a torn checkpoint),
and the pending-save bookkeeping: commit only when all ranks have written, errors on every
rank, at most one save in flight. Plus the ``checkpoint.async`` spec key.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.futures import Future as TorchFuture

from resumequal.checkpoint import CheckpointManager, FolderRoot, Position, layout, verify
from resumequal.checkpoint.agreement import WriteState, commit_decision
from resumequal.checkpoint.writing import HashingWriter
from resumequal.errors import CheckpointError
from resumequal.spec import SpecError, apply_overrides, parse_spec
from testing.checkpoints import write_manifest
from tests.unit.checkpoint_managers import rank0_manager
from tests.unit.rank_states import Plain
from tests.unit.tensors import clone_tree

FileSystemWriter = dcp.FileSystemWriter  # the real one, whatever a test patches
GATE_TIMEOUT = 30.0


pytestmark = pytest.mark.usefixtures("single_process_group")


class Gate:
    """Holds every background write at its start until opened."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.open = threading.Event()
        self.fail: Exception | None = None

    def hold(self) -> None:
        """Where a background write starts: wait for the test, then maybe fail."""
        self.reached.set()
        if not self.open.wait(GATE_TIMEOUT):
            raise TimeoutError("the test never opened the gate")
        if self.fail is not None:
            raise self.fail

    def writer(self) -> type[dcp.FileSystemWriter]:
        gate = self

        class GatedWriter(FileSystemWriter):
            def write_data(
                self, plan: SavePlan, planner: SavePlanner
            ) -> TorchFuture[Any]:
                gate.hold()
                return super().write_data(plan, planner)

        return GatedWriter


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    """Every FileSystemWriter made during the test is gated, the manager's (a
    HashingWriter) too."""
    g = Gate()
    monkeypatch.setattr(dcp, "FileSystemWriter", g.writer())
    hashing = HashingWriter.write_data

    def gated(self: HashingWriter, plan: SavePlan, planner: SavePlanner) -> TorchFuture[Any]:
        g.hold()
        return hashing(self, plan, planner)

    monkeypatch.setattr(HashingWriter, "write_data", gated)
    yield g
    g.open.set()  # never leave a background thread waiting


def _trained() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(3)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    _step(model, optimizer)
    return model, optimizer


def _step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """One optimizer step: changes parameters and optimizer state in place."""
    model(torch.ones(2, 4)).square().sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": model.state_dict(), "optim": optimizer.state_dict()}


def _zeros(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return torch.full_like(obj, -7.0)
    if isinstance(obj, dict):
        return {k: _zeros(v) for k, v in obj.items()}
    return obj


def _assert_same(a: Any, b: Any, path: str = "") -> int:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), f"differs at {path}"
        return 1
    if isinstance(a, dict):
        assert set(a) == set(b), path
        return sum(_assert_same(a[k], b[k], f"{path}.{k}") for k in a)
    if isinstance(a, list | tuple):
        return sum(_assert_same(x, y, f"{path}[{i}]") for i, (x, y) in
                   enumerate(zip(a, b, strict=True)))
    assert a == b, path
    return 0


def _read(directory: Path, like: dict[str, Any]) -> dict[str, Any]:
    out = _zeros(like)
    dcp.load(out, storage_reader=dcp.FileSystemReader(str(directory)))
    return out  # type: ignore[no-any-return]


# --- what DCP's async_save does --------------------------------------------------------------


def test_async_save_writes_a_snapshot_taken_before_it_returns(
    gate: Gate, tmp_path: Path
) -> None:
    model, optimizer = _trained()
    expected = clone_tree(_state(model, optimizer))
    future = dcp.async_save(_state(model, optimizer),
                            storage_writer=dcp.FileSystemWriter(str(tmp_path)))
    assert gate.reached.wait(GATE_TIMEOUT)  # the write is in flight, held at its start
    _step(model, optimizer)  # parameters, exp_avg(_sq) and the 0-dim step all change
    assert not torch.equal(model.weight, expected["model"]["weight"])
    gate.open.set()
    future.result(timeout=GATE_TIMEOUT)
    compared = _assert_same(expected, _read(tmp_path, expected))
    assert compared == 2 + 2 * 3  # weight, bias; step, exp_avg, exp_avg_sq per parameter


def test_a_manifest_written_before_the_write_finished_does_not_verify(
    gate: Gate, tmp_path: Path
) -> None:
    """The hazard the commit collective prevents: commit on 'issued', not on 'written'."""
    model, optimizer = _trained()
    staging = tmp_path / "step-00000001"  # verified under the name it is committed as
    staging.mkdir()
    (staging / layout.rank_state_file(0)).write_bytes(b'{"rank": 0}')
    future = dcp.async_save(_state(model, optimizer),
                            storage_writer=dcp.FileSystemWriter(str(staging / layout.DCP_DIR)))
    assert gate.reached.wait(GATE_TIMEOUT)
    write_manifest(staging, name="step-00000001", step=1, microstep=0, world_size=1,
                   attempt=0)  # premature: the background write has not finished
    gate.open.set()
    future.result(timeout=GATE_TIMEOUT)
    with pytest.raises(CheckpointError, match=r"not in the manifest: .*\.distcp"):
        verify(staging)

    # The same files, committed once the write is known to be done, verify.
    write_manifest(staging, name="step-00000001", step=1, microstep=0, world_size=1,
                   attempt=0)
    assert verify(staging).name == "step-00000001"


# --- the manager's background save -----------------------------------------------------------


def test_commit_waits_until_the_background_write_is_done(gate: Gate, tmp_path: Path) -> None:
    mgr = rank0_manager(tmp_path, async_save=True)
    model, optimizer = _trained()
    expected = clone_tree(_state(model, optimizer))
    held: list[bool] = []
    mgr.save(Position(1), _state(model, optimizer), Plain(cursor=1), info={"leg": "t"},
             before_commit=lambda: held.append(True), background=True)
    assert held == [True]  # the hook for `preemption.at: checkpoint_commit`
    assert mgr.pending == Position(1)
    staging = layout.staging_path(tmp_path, Position(1), 0)
    # Written at save time, before any background work: this rank's plain state.
    assert json.loads((staging / layout.rank_state_file(0)).read_bytes()) == {"cursor": 1}

    assert gate.reached.wait(GATE_TIMEOUT)
    _step(model, optimizer)  # training goes on while the write is held
    for _ in range(3):
        assert mgr.poll() is None  # every rank polls; not all have written
    assert layout.committed(tmp_path) == []
    assert not (staging / layout.MANIFEST).exists()

    gate.open.set()
    assert mgr.poll(wait=True) == "step-00000001"
    assert mgr.pending is None
    assert not staging.exists()
    manifest = verify(tmp_path / "step-00000001")
    assert manifest.info == {"leg": "t"}
    assert any(f.endswith(".distcp") for f in manifest.files)
    _assert_same(expected, _read(tmp_path / "step-00000001" / layout.DCP_DIR, expected))
    assert mgr.poll() is None  # nothing pending: no collective, nothing to do


def test_a_failed_background_write_is_a_checkpoint_error(gate: Gate, tmp_path: Path) -> None:
    mgr = rank0_manager(tmp_path, async_save=True)
    model, optimizer = _trained()
    gate.fail = OSError("disk full")
    mgr.save(Position(4), _state(model, optimizer), Plain(), background=True)
    gate.open.set()
    with pytest.raises(CheckpointError,
                       match=r"(?s)step-00000004 failed on rank\(s\) 0; rank 0: .*disk full"):
        mgr.poll(wait=True)
    assert mgr.pending is None  # the failed save is dropped, not retried
    assert layout.committed(tmp_path) == []
    assert mgr.collect_garbage() == ["step-00000004.attempt-0"]


def test_a_new_save_first_commits_the_pending_one(gate: Gate, tmp_path: Path) -> None:
    mgr = rank0_manager(tmp_path, keep_last=1, async_save=True)
    model, optimizer = _trained()
    mgr.save(Position(4), _state(model, optimizer), Plain(), background=True)
    assert gate.reached.wait(GATE_TIMEOUT)
    opener = threading.Timer(0.3, gate.open.set)
    opener.start()
    _step(model, optimizer)
    # Blocks until step 4 is in.
    mgr.save(Position(8), _state(model, optimizer), Plain(), background=True)
    opener.join()
    assert [p.name for p in layout.committed(tmp_path)] == ["step-00000004"]
    assert mgr.pending == Position(8)
    assert mgr.poll(wait=True) == "step-00000008"
    # Retention ran after the commit: keep_last=1.
    assert [p.name for p in layout.committed(tmp_path)] == ["step-00000008"]


def test_a_synchronous_save_commits_the_pending_one_first(gate: Gate, tmp_path: Path) -> None:
    """The emergency checkpoint path: background save first, then a synchronous one."""
    mgr = rank0_manager(tmp_path, async_save=True)
    model, optimizer = _trained()
    gate.open.set()
    mgr.save(Position(4), _state(model, optimizer), Plain(), background=True)
    _step(model, optimizer)
    assert mgr.save(Position(5, 1), _state(model, optimizer), Plain()) == "step-00000005+1"
    assert mgr.pending is None
    assert [p.name for p in layout.committed(tmp_path)] == ["step-00000004", "step-00000005+1"]
    for name in ("step-00000004", "step-00000005+1"):
        verify(tmp_path / name)


def test_a_background_save_needs_a_manager_made_for_it(tmp_path: Path) -> None:
    mgr = CheckpointManager(FolderRoot(tmp_path), rank=0, world_size=1, attempt=0, keep_last=1)
    with pytest.raises(CheckpointError, match="without async_save"):
        mgr.save(Position(1), {"x": torch.zeros(1)}, Plain(), background=True)


@pytest.mark.parametrize(
    ("states", "ready"),
    [
        ([WriteState.WRITTEN], True),
        ([WriteState.WRITTEN, WriteState.WRITTEN, WriteState.WRITTEN], True),
        ([WriteState.WRITTEN, WriteState.WRITING], False),
        ([WriteState.WRITING, WriteState.WRITTEN], False),
        ([WriteState.WRITING, WriteState.WRITING], False),
    ],
)
def test_commit_only_when_every_rank_has_written(states: list[int], ready: bool) -> None:
    assert commit_decision(states, "step-00000008") is ready


@pytest.mark.parametrize(
    ("states", "ranks"),
    [
        ([WriteState.WRITTEN, WriteState.FAILED], "1"),
        # A failure anywhere ends the save at once, even while another rank still writes.
        ([WriteState.FAILED, WriteState.WRITING], "0"),
        ([WriteState.FAILED, WriteState.WRITTEN, WriteState.FAILED], "0, 2"),
    ],
)
def test_a_failure_on_any_rank_is_an_error_naming_it(states: list[int], ranks: str) -> None:
    with pytest.raises(CheckpointError,
                       match=rf"^background write of step-00000008 failed on rank\(s\) {ranks}$"):
        commit_decision(states, "step-00000008")


# --- the spec key ----------------------------------------------------------------------------


def test_async_is_the_yaml_key_and_async_save_the_attribute() -> None:
    assert parse_spec({}).checkpoint.async_save is False
    spec = parse_spec({"checkpoint": {"async": True}})
    assert spec.checkpoint.async_save is True
    assert parse_spec({"checkpoint": {"async_save": True}}).checkpoint.async_save is True
    dumped = spec.model_dump(mode="json")["checkpoint"]
    assert dumped["async"] is True and "async_save" not in dumped
    assert parse_spec(spec.model_dump(mode="json")) == spec
    assert apply_overrides(parse_spec({}), ["checkpoint.async=true"]).checkpoint.async_save


def test_async_and_async_save_together_are_refused_naming_the_key() -> None:
    with pytest.raises(SpecError, match=r"checkpoint\.async_save: given twice, as async and "
                                        r"async_save"):
        parse_spec({"checkpoint": {"async": True, "async_save": False}})


def test_async_refuses_a_hard_kill_in_the_step_after_a_save() -> None:
    with pytest.raises(SpecError, match=r"preemption\.step=5 with checkpoint\.async"):
        parse_spec({"checkpoint": {"async": True},
                    "preemption": {"step": 5, "microstep": 1}})
    # Two steps after a save, or a graceful stop (which commits the pending save first).
    parse_spec({"checkpoint": {"async": True}, "preemption": {"step": 6, "microstep": 1}})
    parse_spec({"checkpoint": {"async": True},
                "preemption": {"step": 5, "microstep": 1, "mode": "graceful"}})
    parse_spec({"checkpoint": {"async": True},
                "preemption": {"at": "checkpoint_commit", "step": 8, "microstep": 0}})

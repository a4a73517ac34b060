"""Unit tests for checkpoints and state restore, in one process with a world-1 gloo group:
commit layout, manifest verification, newest/garbage/retention, strict key checks, and the
save -> load -> restore round trip including every negative-control omission."""

from __future__ import annotations

import json
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from resumequal.checkpoint import CheckpointManager, FolderRoot, Loaded, Position, layout, verify
from resumequal.checkpoint.chunks import CHUNK_BYTES
from resumequal.checkpoint.manifest import entry_of, read_manifest, write_manifest_file
from resumequal.errors import CheckpointError
from resumequal.spec import OMISSIONS
from resumequal.train.state import (
    LiveState,
    RankState,
    capture_rng,
    omitted_parts,
    pending_grads_template,
    rank_state,
    restore,
    tensor_state,
)
from resumequal.workloads.base import Microbatch, Workload
from tests.unit.checkpoint_managers import rank0_manager
from tests.unit.tensors import clone_tree

pytestmark = pytest.mark.usefixtures("single_process_group")


# --- a tiny workload -------------------------------------------------------------------------


class CountingDataset:
    """A StatefulDataset whose cursor is one integer; sample ``i`` is a fixed function of i."""

    def __init__(self) -> None:
        self.position = 0

    def _batch(self, ids: list[int]) -> Microbatch:
        x = torch.tensor([[float(i), float(i) / 2, 1.0, -float(i)] for i in ids])
        return Microbatch(sample_ids=ids, data=(x, x.sum(dim=1, keepdim=True).repeat(1, 2)))

    def next_microbatch(self) -> Microbatch:
        ids = [self.position, self.position + 1]
        self.position += 2
        return self._batch(ids)

    def synthetic_microbatch(self) -> Microbatch:
        return self._batch([0, 0])

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"position"}:
            raise KeyError(f"cursor keys {sorted(state)}, expected ['position']")
        self.position = state["position"]


def _loss(model: nn.Module, mb: Microbatch) -> torch.Tensor:
    x, y = mb.data
    return nn.functional.mse_loss(model(x), y)


def _live(seed: int) -> LiveState:
    """A fresh rank-0 state; different seeds give different initial parameters. It trains
    with a loss scaler (precision fp16's) whose scale grows after every step."""
    torch.manual_seed(seed)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    workload = Workload(model=model, optimizer=optimizer, scheduler=scheduler,
                        dataset=CountingDataset(), loss_fn=_loss)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1)
    return LiveState(workload=workload, model=model, rank=0, world_size=1, scaler=scaler)


def _weight(live: LiveState) -> torch.Tensor:
    return dict(live.model.named_parameters())["weight"]


def _backward(live: LiveState) -> None:
    w = live.workload
    assert live.scaler is not None
    live.scaler.scale(_loss(live.model, w.dataset.next_microbatch())).backward()
    live.counters.microstep += 1
    live.counters.global_microstep += 1


def _trained(steps: int, pending_microbatches: int = 0) -> LiveState:
    """Train ``steps`` optimizer steps of two microbatches, then run some more backward."""
    live = _live(seed=1)
    w = live.workload
    for _ in range(steps):
        for _ in range(2):
            _backward(live)
        assert live.scaler is not None
        live.scaler.step(w.optimizer)
        live.scaler.update()
        assert w.scheduler is not None
        w.scheduler.step()
        w.optimizer.zero_grad(set_to_none=True)
        live.counters.step += 1
        live.counters.microstep = 0
    for _ in range(pending_microbatches):
        _backward(live)
    return live


def _seed_rngs(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _draw() -> tuple[float, float, torch.Tensor]:
    return random.random(), float(np.random.rand()), torch.rand(3)


def _save(mgr: CheckpointManager, live: LiveState, position: Position) -> str:
    return mgr.save(position, tensor_state(live, with_pending_grads=live.counters.microstep > 0),
                    rank_state(live))


def _template(live: LiveState) -> Callable[[RankState], dict[str, Any]]:
    """What the training loop asks DCP to fill: model, optimizer and maybe pending grads."""
    def template(ranks: RankState) -> dict[str, Any]:
        tensors = tensor_state(live, with_pending_grads=False)
        if ranks.pending_grads:
            tensors.update(pending_grads_template(live, ranks.pending_grads))
        return tensors
    return template


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and set(a) == set(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return bool(np.array_equal(a, b))
    return bool(a == b)


def _snapshot(live: LiveState) -> dict[str, Any]:
    """Every part of the state, copied, in a form the tests compare."""
    w = live.workload
    assert w.scheduler is not None
    model = live.model
    return {
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "optimizer": clone_tree(w.optimizer.state_dict()),
        "scheduler": clone_tree(w.scheduler.state_dict()),
        "data_cursor": w.dataset.state_dict(),
        "rng": capture_rng(),
        "counters": live.counters.as_tuple(),
        "scaler": None if live.scaler is None else live.scaler.state_dict(),
        "pending_grads": {n: None if p.grad is None else p.grad.clone()
                          for n, p in model.named_parameters()},
    }


# --- Position and layout ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("position", "name"),
    [(Position(0), "step-00000000"), (Position(5), "step-00000005"),
     (Position(5, 1), "step-00000005+1"), (Position(12345678, 12), "step-12345678+12")],
)
def test_position_name_round_trip(position: Position, name: str) -> None:
    assert position.name == name
    assert Position.parse(name) == position


@pytest.mark.parametrize(
    "name",
    ["step-5", "step-0000005", "step-000000005", "step-00000005+", "step-00000005+x",
     "step-00000005-1", "step-00000005.attempt-0", "xstep-00000005", "manifest.json",
     ".staging", "step-00000005+1 ", "step-00000005+0", "step-00000005+01"],
)
def test_position_parse_rejects_junk(name: str) -> None:
    assert Position.parse(name) is None


def test_positions_past_eight_digits_still_parse() -> None:
    assert Position.parse(Position(123456789, 2).name) == Position(123456789, 2)


def test_positions_order_by_step_then_microstep() -> None:
    assert Position(5) < Position(5, 1) < Position(5, 9) < Position(5, 10) < Position(6)


def test_committed_sorts_numerically_and_ignores_non_checkpoints(tmp_path: Path) -> None:
    for name in ["step-00000006", "step-00000005+10", "step-00000005", "step-00000005+9",
                 ".staging", "notes"]:
        (tmp_path / name).mkdir()
    (tmp_path / "step-00000007").write_text("a file, not a checkpoint")
    assert [p.name for p in layout.committed(tmp_path)] == [
        "step-00000005", "step-00000005+9", "step-00000005+10", "step-00000006"]
    assert layout.committed(tmp_path / "absent") == []


# --- save, commit and manifest ---------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One committed checkpoint at step-00000002+1 (pending gradients), never modified."""
    root = tmp_path_factory.mktemp("saved")
    live = _trained(steps=2, pending_microbatches=1)
    assert _save(rank0_manager(root), live, Position(2, 1)) == "step-00000002+1"
    return root


def _copy(saved: Path, tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    shutil.copytree(saved, root)
    return root


def test_save_commits_under_the_position_name(saved: Path) -> None:
    final = saved / "step-00000002+1"
    assert sorted(p.name for p in final.iterdir()) == [
        "dcp", "manifest.hmac", "manifest.json", "rank-0.json"]
    assert any((final / "dcp").glob("*.distcp"))
    assert [p.name for p in (saved / ".staging").iterdir()] == []
    assert not (saved / ".trash").exists()
    assert sorted(p.name for p in saved.iterdir()) == [".staging", "step-00000002+1"]


def test_manifest_lists_every_file_with_size_and_chunk_digests(saved: Path) -> None:
    final = saved / "step-00000002+1"
    manifest = json.loads((final / "manifest.json").read_text())
    on_disk = {str(p.relative_to(final)): p for p in final.rglob("*")
               if p.is_file() and p.name not in ("manifest.json", "manifest.hmac")}
    assert set(manifest["files"]) == set(on_disk)
    assert "rank-0.json" in on_disk and "dcp/.metadata" in on_disk
    for rel, path in on_disk.items():
        data = path.read_bytes()
        chunks = [blake3.blake3(data[i:i + CHUNK_BYTES]).hexdigest()
                  for i in range(0, len(data), CHUNK_BYTES)]
        assert manifest["files"][rel] == {"size": len(data), "chunks": chunks}
    assert (manifest["name"], manifest["step"], manifest["microstep"]) == ("step-00000002+1", 2, 1)
    assert (manifest["world_size"], manifest["attempt"]) == (1, 0)
    assert verify(final).files.keys() == on_disk.keys()


def _shard(directory: Path) -> Path:
    return sorted((directory / "dcp").glob("*.distcp"))[0]


def test_verify_catches_a_flipped_byte(saved: Path, tmp_path: Path) -> None:
    final = _copy(saved, tmp_path) / "step-00000002+1"
    shard = _shard(final)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError,
                       match=re.escape(f"dcp/{shard.name} fails its BLAKE3 check")):
        verify(final)


def test_verify_catches_a_truncated_file(saved: Path, tmp_path: Path) -> None:
    final = _copy(saved, tmp_path) / "step-00000002+1"
    state = final / "rank-0.json"
    size = state.stat().st_size
    state.write_bytes(state.read_bytes()[:-3])
    with pytest.raises(CheckpointError, match=re.escape(
            f"rank-0.json has {size - 3} bytes, the manifest says {size}")):
        verify(final)


def test_verify_catches_a_deleted_file(saved: Path, tmp_path: Path) -> None:
    final = _copy(saved, tmp_path) / "step-00000002+1"
    (final / "dcp" / ".metadata").unlink()
    with pytest.raises(CheckpointError,
                       match=re.escape("dcp/.metadata is listed in the manifest but missing")):
        verify(final)


def test_verify_catches_an_extra_file(saved: Path, tmp_path: Path) -> None:
    final = _copy(saved, tmp_path) / "step-00000002+1"
    (final / "dcp" / "__1_0.distcp").write_bytes(b"planted")
    with pytest.raises(CheckpointError,
                       match=re.escape("files not in the manifest: dcp/__1_0.distcp")):
        verify(final)


def test_verify_catches_a_missing_manifest(saved: Path, tmp_path: Path) -> None:
    final = _copy(saved, tmp_path) / "step-00000002+1"
    (final / "manifest.json").unlink()
    with pytest.raises(CheckpointError,
                       match=re.escape("no manifest.json; the checkpoint is not complete")):
        verify(final)


# --- newest, garbage, retention, re-save -----------------------------------------------------


def test_newest_is_none_without_checkpoints(tmp_path: Path) -> None:
    assert rank0_manager(tmp_path / "empty").newest() is None


def test_newest_orders_emergency_checkpoints_between_steps(tmp_path: Path) -> None:
    mgr = rank0_manager(tmp_path)
    live = _trained(steps=1)
    for position in [Position(6), Position(5), Position(5, 1)]:
        _save(mgr, live, position)
    assert mgr.newest() == "step-00000006"
    shutil.rmtree(tmp_path / "step-00000006")
    assert mgr.newest() == "step-00000005+1"
    shutil.rmtree(tmp_path / "step-00000005+1")
    assert mgr.newest() == "step-00000005"


def test_a_resume_refuses_a_tampered_newest_checkpoint(saved: Path, tmp_path: Path) -> None:
    root = _copy(saved, tmp_path)
    mgr = rank0_manager(root)
    _save(mgr, _trained(steps=1), Position(1))  # an older, intact checkpoint
    shard = _shard(root / "step-00000002+1")
    shard.write_bytes(b"\x00" + shard.read_bytes()[1:])
    assert mgr.newest() == "step-00000002+1"  # the contents are checked as they are read
    with pytest.raises(CheckpointError, match=re.escape(
            f"step-00000002+1 is refused: dcp/{shard.name} fails its BLAKE3 check at chunk 0")):
        mgr.load("step-00000002+1", _template(_live(seed=2)), RankState)


def test_newest_refuses_a_checkpoint_of_another_world_size(saved: Path) -> None:
    mgr = rank0_manager(saved, world_size=2)
    with pytest.raises(CheckpointError,
                       match=re.escape("step-00000002+1 was written by 1 ranks; this leg has 2")):
        mgr.newest()


def test_collect_garbage_removes_staging_leftovers(saved: Path, tmp_path: Path) -> None:
    root = _copy(saved, tmp_path)
    leftover = layout.staging_path(root, Position(3), attempt=0)
    (leftover / "dcp").mkdir(parents=True)
    (leftover / "rank-0.json").write_bytes(b"half written")
    (root / ".trash" / "step-00000001.attempt-0").mkdir(parents=True)
    assert rank0_manager(root, attempt=1).collect_garbage() == ["step-00000003.attempt-0"]
    assert list((root / ".staging").iterdir()) == []
    assert not (root / ".trash").exists()
    assert [p.name for p in layout.committed(root)] == ["step-00000002+1"]
    verify(root / "step-00000002+1")


def test_collect_garbage_is_rank_0_only(saved: Path, tmp_path: Path) -> None:
    root = _copy(saved, tmp_path)
    leftover = layout.staging_path(root, Position(3), attempt=0)
    leftover.mkdir(parents=True)
    mgr = CheckpointManager(FolderRoot(root), rank=1, world_size=2, attempt=1, keep_last=3)
    assert mgr.collect_garbage() == []
    assert leftover.is_dir()


def test_retention_keeps_the_newest_keep_last(tmp_path: Path) -> None:
    mgr = rank0_manager(tmp_path, keep_last=2)
    live = _trained(steps=1)
    for position in [Position(1), Position(2), Position(2, 1), Position(3)]:
        _save(mgr, live, position)
    assert [p.name for p in layout.committed(tmp_path)] == ["step-00000002+1", "step-00000003"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".staging", "step-00000002+1", "step-00000003"]


def test_saving_a_position_again_replaces_it(tmp_path: Path) -> None:
    live = _trained(steps=1)
    first = rank0_manager(tmp_path, attempt=0)
    _save(first, live, Position(1))
    with torch.no_grad():
        _weight(live).add_(1.0)
    live.counters.global_microstep = 99
    again = rank0_manager(tmp_path, attempt=1)
    _save(again, live, Position(1))

    assert sorted(p.name for p in tmp_path.iterdir()) == [".staging", "step-00000001"]
    assert verify(tmp_path / "step-00000001").attempt == 1
    fresh = _live(seed=2)
    loaded = again.load("step-00000001", _template(fresh), RankState)
    assert loaded.rank_state.counters.global_microstep == 99
    assert torch.equal(loaded.tensors["model"]["weight"], _weight(live))


# --- load: strict keys -----------------------------------------------------------------------


def test_load_with_an_extra_template_key_names_it(saved: Path) -> None:
    fresh = _live(seed=2)

    def template(ranks: RankState) -> dict[str, Any]:
        tensors = _template(fresh)(ranks)
        tensors["model"]["extra.weight"] = torch.zeros(2)
        return tensors

    with pytest.raises(CheckpointError,
                       match=re.escape("missing key(s) in checkpoint: model.extra.weight")):
        rank0_manager(saved).load("step-00000002+1", template, RankState)


def test_load_with_a_template_missing_a_saved_key_names_it(saved: Path) -> None:
    fresh = _live(seed=2)

    def template(ranks: RankState) -> dict[str, Any]:
        tensors = _template(fresh)(ranks)
        del tensors["rank_0"]  # the pending gradients were saved
        return tensors

    with pytest.raises(CheckpointError,
                       match=re.escape("unexpected key(s) in checkpoint: rank_0.pending_grads.")):
        rank0_manager(saved).load("step-00000002+1", template, RankState)


def test_load_of_a_name_that_is_not_a_checkpoint(saved: Path) -> None:
    with pytest.raises(CheckpointError, match="not a checkpoint name"):
        rank0_manager(saved).load(".staging", _template(_live(seed=2)), RankState)


# --- round trip ------------------------------------------------------------------------------


def _capture_and_save(root: Path, live: LiveState, position: Position) -> tuple[
    dict[str, Any], tuple[float, float, torch.Tensor]
]:
    """Save ``live``; returns its snapshot and the RNG draws that follow the capture."""
    tensors = tensor_state(live, with_pending_grads=live.counters.microstep > 0)
    ranks = rank_state(live)
    snapshot = _snapshot(live)
    draws = _draw()
    rank0_manager(root).save(position, tensors, ranks)
    return snapshot, draws


def _load_into(root: Path, name: str, omit: frozenset[str]) -> tuple[LiveState, Loaded[RankState]]:
    fresh = _live(seed=2)
    fresh.workload.dataset.next_microbatch()  # a fresh cursor that is not the saved one
    _seed_rngs(777)
    loaded = rank0_manager(root).load(name, _template(fresh), RankState)
    restore(fresh, loaded.tensors, loaded.rank_state, omit, source=name)
    return fresh, loaded


def test_round_trip_restores_every_part(tmp_path: Path) -> None:
    live = _trained(steps=3)
    _seed_rngs(5)
    before, draws = _capture_and_save(tmp_path, live, Position(3))
    assert before["counters"] == (3, 0, 6)

    fresh, loaded = _load_into(tmp_path, "step-00000003", frozenset())
    after_draws = _draw()  # first thing after the restore, like the loop
    after = _snapshot(fresh)

    assert loaded.position == Position(3)
    assert loaded.rank_state.pending_grads == []
    for part in ("params", "optimizer", "scheduler", "data_cursor", "counters", "scaler"):
        assert _same(after[part], before[part]), part
    assert after["scaler"]["scale"] == 2.0**13 and after["scaler"]["_growth_tracker"] == 0
    assert after["optimizer"]["state"][0]["step"] == 3
    assert after["scheduler"]["last_epoch"] == 3
    assert after["data_cursor"] == {"position": 12}
    assert all(g is None for g in after["pending_grads"].values())
    assert after_draws[:2] == draws[:2]
    assert torch.equal(after_draws[2], draws[2])
    assert fresh.workload.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)
    # The restored state trains on exactly like the saved one.
    probe = torch.ones(1, 4)
    assert torch.equal(fresh.workload.model(probe), live.workload.model(probe))


def test_pending_gradients_round_trip_mid_accumulation(tmp_path: Path) -> None:
    live = _trained(steps=2, pending_microbatches=1)
    assert live.counters.as_tuple() == (2, 1, 5)
    before, _ = _capture_and_save(tmp_path, live, Position(2, 1))
    fresh, loaded = _load_into(tmp_path, "step-00000002+1", frozenset())

    assert loaded.rank_state.pending_grads
    assert set(loaded.tensors["rank_0"]["pending_grads"]) == {"weight", "bias"}
    # Rank-keyed in DCP, so no rank ever receives another rank's gradients as "replicated".
    saved_keys = dcp.FileSystemReader(str(tmp_path / "step-00000002+1" / "dcp")).read_metadata()
    assert {k for k in saved_keys.state_dict_metadata if "pending" in k} == {
        "rank_0.pending_grads.weight", "rank_0.pending_grads.bias"}
    after = _snapshot(fresh)
    assert after["counters"] == (2, 1, 5)
    assert all(g is not None for g in before["pending_grads"].values())
    assert _same(after["pending_grads"], before["pending_grads"])
    # The next microbatch accumulates onto the restored gradients exactly as it would have.
    _backward(live)
    _backward(fresh)
    restored_grad, expected_grad = _weight(fresh).grad, _weight(live).grad
    assert restored_grad is not None and expected_grad is not None
    assert torch.equal(restored_grad, expected_grad)


def test_pending_gradients_of_a_parameter_without_grad_still_resume(tmp_path: Path) -> None:
    live = _trained(steps=1, pending_microbatches=1)
    _weight(live).grad = None  # e.g. a parameter the first microbatch did not use
    _capture_and_save(tmp_path, live, Position(1, 1))
    fresh, loaded = _load_into(tmp_path, "step-00000001+1", frozenset())
    assert loaded.rank_state.pending_grads == ["bias"]
    assert _weight(fresh).grad is None
    assert dict(fresh.model.named_parameters())["bias"].grad is not None


# Written out here rather than read from resumequal.train.state, so a wrong table there fails.
EXPECTED_OMITTED: dict[str, set[str]] = {
    "rng": {"rng"},
    "data_cursor": {"data_cursor"},
    "scheduler": {"scheduler"},
    "optimizer": {"optimizer"},
    "model_optimizer_only": {"rng", "data_cursor", "scheduler", "scaler", "pending_grads"},
    "pending_grads": {"pending_grads"},
    "scaler": {"scaler"},
    # This workload reads no StatefulDataLoader: nothing here to leave out (see
    # test_loader_state.py for a workload that does).
    "loader_state": set(),
    # They change how a resized world takes its microbatches; a restore restores everything.
    "rank_cursor": set(),
    "rank_rng": set(),
}
PARTS = ("params", "optimizer", "counters", "scheduler", "data_cursor", "rng", "scaler",
         "pending_grads")


@pytest.fixture(scope="module")
def mid_accumulation(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A checkpoint with every part different from a fresh state, and its snapshot."""
    root = tmp_path_factory.mktemp("mid")
    live = _trained(steps=2, pending_microbatches=1)
    _seed_rngs(5)
    before, _ = _capture_and_save(root, live, Position(2, 1))
    return root, before


def test_every_omission_is_tested() -> None:
    assert set(EXPECTED_OMITTED) == set(OMISSIONS)


@pytest.mark.parametrize("omission", OMISSIONS)
def test_omission_leaves_exactly_its_parts_unrestored(
    omission: str, mid_accumulation: tuple[Path, dict[str, Any]]
) -> None:
    root, saved = mid_accumulation
    # What a fresh process holds just before the restore, for the parts left out.
    reference = _live(seed=2)
    reference.workload.dataset.next_microbatch()
    _seed_rngs(777)
    fresh_state = _snapshot(reference)

    restored, _ = _load_into(root, "step-00000002+1", frozenset({omission}))
    after = _snapshot(restored)

    for part in PARTS:
        assert not _same(saved[part], fresh_state[part]), f"{part} cannot tell the two apart"
        if part in EXPECTED_OMITTED[omission]:
            expected = fresh_state[part]
            if part == "pending_grads":  # a restore always starts from no gradients
                expected = {n: None for n in expected}
            assert _same(after[part], expected), f"{omission}: {part} was restored"
        else:
            assert _same(after[part], saved[part]), f"{omission}: {part} was not restored"


# --- rank state checks -----------------------------------------------------------------------


def test_a_rank_state_is_json_and_is_read_back_strictly(tmp_path: Path) -> None:
    live = _trained(steps=1)
    mgr = rank0_manager(tmp_path)
    name = _save(mgr, live, Position(1))
    path = tmp_path / name / layout.rank_state_file(0)
    state = json.loads(path.read_bytes())
    assert state["format"] == 2 and state["counters"]["step"] == 1
    assert RankState.model_validate_json(path.read_bytes()) == rank_state(live)
    for bad, why in (({k: v for k, v in state.items() if k != "data_cursor"}, "data_cursor"),
                     ({**state, "sampler": {}}, "sampler"), ({**state, "format": 1}, "format")):
        _resign(tmp_path / name, layout.rank_state_file(0), json.dumps(bad).encode())
        with pytest.raises(CheckpointError, match=rf"rank-0\.json: unreadable rank state: "
                                                  rf"(?s:.*){why}"):
            rank0_manager(tmp_path).load(name, _template(_live(seed=2)), RankState)


def _resign(checkpoint: Path, rel: str, data: bytes) -> None:
    """Replace file ``rel`` of a committed checkpoint and sign the manifest anew, with the
    run's key: what the manifest check lets through, for the checks after it."""
    (checkpoint / rel).write_bytes(data)
    manifest = read_manifest(checkpoint)
    files = {**manifest.files, rel: entry_of(data)}
    write_manifest_file(checkpoint, manifest.model_copy(update={"files": files}))


def test_omitted_parts_unions_and_rejects_unknown_names() -> None:
    assert omitted_parts(frozenset()) == frozenset()
    assert omitted_parts(frozenset({"rng", "scheduler"})) == {"rng", "scheduler"}
    with pytest.raises(ValueError,
                       match=re.escape("unknown omission(s) ['optimiser']; allowed: ")) as info:
        omitted_parts(frozenset({"optimiser", "rng"}))
    for name in OMISSIONS:
        assert name in str(info.value)


def test_a_dcp_failure_on_load_is_a_checkpoint_error(tmp_path: Path) -> None:
    # DCP's CheckpointException derives from BaseException; it must not escape unwrapped.
    live = _trained(steps=1)
    mgr = rank0_manager(tmp_path)
    name = _save(mgr, live, Position(1))
    shard = _shard(tmp_path / name)
    _resign(tmp_path / name, f"dcp/{shard.name}", shard.read_bytes()[:16])  # past the check
    with pytest.raises(CheckpointError, match="DCP load of step-00000001 failed"):
        mgr.load(name, _template(_live(seed=2)), RankState)


@pytest.mark.parametrize("failure", [
    OSError(28, "No space left on device"),
    # What torch's zip writer says of the same short write (caffe2 inline_container.cc).
    RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 704 vs 598"),
], ids=["enospc", "unexpected-pos"])
def test_a_save_that_runs_out_of_space_says_so_with_the_free_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: Exception) -> None:
    def full_disk(*_args: object, **_kw: object) -> None:
        raise failure

    live = _trained(steps=1)
    monkeypatch.setattr(torch, "save", full_disk)  # DCP writes each tensor through it
    with pytest.raises(CheckpointError) as info:
        _save(rank0_manager(tmp_path), live, Position(1))
    staging = layout.staging_path(tmp_path, Position(1), 0)
    match = re.search(rf"no space left on device: {re.escape(str(staging))} has (\d+) bytes "
                      r"free: ", str(info.value))
    assert match is not None, str(info.value)
    assert int(match.group(1)) > 0  # this disk is not full: the figure is statvfs's


def test_a_save_that_fails_otherwise_does_not_blame_the_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object, **_kw: object) -> None:
        raise OSError(5, "Input/output error")

    live = _trained(steps=1)
    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(CheckpointError, match="Input/output error") as info:
        _save(rank0_manager(tmp_path), live, Position(1))
    assert "no space" not in str(info.value)

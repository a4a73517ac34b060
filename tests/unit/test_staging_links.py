"""A folder-store writer without the key cannot steer what a save signs.

The staging folder of a folder store is in the store: whoever can write the store can
plant names in it while a rank writes. The races are made deterministic with hooks at the
points a writer would aim for: after the staging folder is made (a link planted at the
rank state's temporary name), and between the rank state's write and the commit (the
staged state swapped for a link, or rewritten). A save never writes through a planted
link, signs the bytes it wrote (never a file read back), and a committed checkpoint never
holds a link: the attacker's state is never loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from resumequal.checkpoint import FolderRoot, Position, layout
from resumequal.errors import CheckpointError
from tests.unit.checkpoint_managers import rank0_manager
from tests.unit.rank_states import Plain

pytestmark = pytest.mark.usefixtures("single_process_group")

STEPS = 8
NAME = Position(STEPS).name
STATE = layout.rank_state_file(0)
# What the attacker wants resumed: the data cursor back at the start.
THEIRS = Plain(step=STEPS, cursor=0).model_dump_json().encode()
OURS = Plain(step=STEPS, cursor=48)


def _template(_: Plain) -> dict[str, Any]:
    return {"x": torch.zeros(3)}


def _staging(root: FolderRoot) -> Path:
    return layout.staging_path(root.root, Position(STEPS), 0)


def _hook(monkeypatch: pytest.MonkeyPatch, method: str,
          attack: Callable[[Path], None]) -> None:
    """Run ``attack`` on the staging folder just before FolderRoot.``method`` runs."""
    original = getattr(FolderRoot, method)

    def hooked(self: FolderRoot, *args: Any, **kwargs: Any) -> Any:
        attack(_staging(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(FolderRoot, method, hooked)


def _resumed(root: FolderRoot) -> Plain:
    mgr = rank0_manager(root)
    name = mgr.newest()
    assert name == NAME
    return mgr.load(name, _template, Plain).rank_state


def _save(root: FolderRoot, background: bool = False) -> str | None:
    mgr = rank0_manager(root, async_save=background)
    name = mgr.save(Position(STEPS), {"x": torch.arange(3.0)}, OURS,
                    info={"leg": "control"}, background=background)
    return mgr.poll(wait=True) if background else name


def test_a_link_planted_at_the_state_s_staging_name_is_never_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fixed name a save once wrote through: planted, it is left alone, and as a link
    in the staging folder it fails the commit."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    root = FolderRoot(tmp_path / "store" / "control" / "checkpoints")
    _hook(monkeypatch, "writer", lambda staging: (staging / f".{STATE}.tmp").symlink_to(victim))
    with pytest.raises(CheckpointError, match=rf"\.{STATE}\.tmp is a symbolic link"):
        _save(root)
    assert victim.read_bytes() == b"precious"
    assert layout.committed(root.root) == []


def test_a_link_planted_at_the_state_s_name_is_replaced_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    root = FolderRoot(tmp_path / "store" / "control" / "checkpoints")
    _hook(monkeypatch, "writer", lambda staging: (staging / STATE).symlink_to(victim))
    assert _save(root) == NAME
    assert victim.read_bytes() == b"precious"
    assert not (root.root / NAME / STATE).is_symlink()
    assert _resumed(root).model_dump() == OURS.model_dump()


@pytest.mark.parametrize("background", [False, True], ids=["sync", "async"])
def test_a_staged_state_swapped_for_a_link_fails_the_commit(
    background: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs = tmp_path / "theirs.json"
    theirs.write_bytes(THEIRS)

    def swap(staging: Path) -> None:
        (staging / STATE).unlink()
        (staging / STATE).symlink_to(theirs)

    root = FolderRoot(tmp_path / "store" / "control" / "checkpoints")
    _hook(monkeypatch, "publish", swap)
    with pytest.raises(CheckpointError, match=rf"{STATE} is a symbolic link"):
        _save(root, background)
    assert layout.committed(root.root) == []


@pytest.mark.parametrize("background", [False, True], ids=["sync", "async"])
def test_a_staged_state_rewritten_before_the_commit_is_refused_at_the_resume(
    background: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def rewrite(staging: Path) -> None:
        (staging / STATE).write_bytes(THEIRS.ljust(len(OURS.model_dump_json())))

    root = FolderRoot(tmp_path / "store" / "control" / "checkpoints")
    _hook(monkeypatch, "publish", rewrite)
    assert _save(root, background) == NAME  # signed: the bytes the rank wrote
    with pytest.raises(CheckpointError, match=rf"{STATE} fails its BLAKE3 check at chunk 0"):
        _resumed(root)


def test_a_committed_checkpoint_replaced_by_a_link_is_refused(tmp_path: Path) -> None:
    root = FolderRoot(tmp_path / "store" / "control" / "checkpoints")
    assert _save(root) == NAME
    elsewhere = tmp_path / "elsewhere"
    (root.root / NAME).rename(elsewhere)
    (root.root / NAME).symlink_to(elsewhere)
    with pytest.raises(CheckpointError, match=rf"{NAME} is a symbolic link"):
        _resumed(root)
    (root.root / NAME).unlink()
    (root.root / NAME).mkdir()
    for entry in elsewhere.iterdir():  # the folder real, one file in it a link
        (root.root / NAME / entry.name).symlink_to(entry)
    with pytest.raises(CheckpointError, match="is a symbolic link"):
        _resumed(root)

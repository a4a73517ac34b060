"""What whoever can write a folder store plants where a run opens a file: a FIFO (whose
open would block for ever) or a link (which would take a read or a write elsewhere).

Every open of a store's file, a checkpoint's file or a key file is non-blocking and
checked as a regular file before a byte is read, and no link below the store's root is
followed: a FIFO is refused at once, naming it, and a link is never read or written
through. (The unit tier's timeout is what a blocked open would meet.)
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from resumequal.checkpoint import FolderRoot, Position, layout
from resumequal.checkpoint.manifest import read_manifest, verify
from resumequal.errors import CheckpointError, StoreError
from resumequal.local import runkey
from resumequal.local.backend import _tail
from resumequal.run.location import RunLocation
from resumequal.run.signing import RunSeal, new_key
from resumequal.spec import QualificationSpec
from resumequal.store import FileStore, StoreNotFound
from tests.unit.checkpoint_managers import rank0_manager
from tests.unit.rank_states import Plain

STEPS = 8
NAME = Position(STEPS).name
SHARD = f"{layout.DCP_DIR}/__0_0.distcp"


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    store = FileStore(str(tmp_path / "store"))
    store.put_bytes("a/k", b"ours")
    return store


def test_a_fifo_object_is_refused_at_once(store: FileStore, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "store" / "a" / "fifo")
    with pytest.raises(StoreNotFound, match=r"fifo is no object: .*is a FIFO, not a regular"):
        store.get_bytes("a/fifo")
    with pytest.raises(StoreError, match="is a FIFO"):
        store.get_range("a/fifo", 0, bytearray(4))
    with pytest.raises(StoreError, match="is a FIFO"):
        store.get_file("a/fifo", tmp_path / "copy")
    assert not store.exists("a/fifo")
    assert [o.key for o in store.list("a")] == ["a/k"]


def test_a_link_in_a_folder_store_is_never_read_nor_written_through(
    store: FileStore, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"not the store's")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "store"
    (root / "a" / "link").symlink_to(secret)
    (root / "dir").symlink_to(elsewhere)
    with pytest.raises(StoreError, match="link is a symbolic link"):
        store.get_bytes("a/link")
    with pytest.raises(StoreError, match="dir is a symbolic link"):
        store.get_bytes("dir/k")
    with pytest.raises(StoreError, match="dir is a symbolic link"):
        store.put_bytes("dir/k", b"x")
    with pytest.raises(StoreError, match="dir is a symbolic link"):
        store.put_new("dir/k", b"x")
    assert list(elsewhere.iterdir()) == []
    assert not store.exists("a/link") and not store.exists("dir/k")
    assert [o.key for o in store.list()] == ["a/k"]
    # A write at a link's name replaces the link, never the file it names.
    store.put_bytes("a/link", b"ours too")
    assert secret.read_bytes() == b"not the store's"
    assert store.get_bytes("a/link") == b"ours too"
    store.delete_prefix("dir")
    assert elsewhere.is_dir() and not (root / "dir").exists()
    with pytest.raises(StoreNotFound):
        store.get_bytes("dir/k")


def test_a_planted_fifo_marker_is_no_marker(tmp_path: Path) -> None:
    loc = RunLocation.open(str(tmp_path), seal=RunSeal(new_key().encode(), "run-a"))
    (tmp_path / "control" / "done").mkdir(parents=True)
    os.mkfifo(tmp_path / "control" / "FAILED.json")
    os.mkfifo(tmp_path / "control" / "done" / "rank-0.json")
    assert loc.leg_failure("control") is None  # no object: only regular files are
    assert loc.ranks_done("control") == set()


def _template(_: Plain) -> dict[str, Any]:
    return {"x": torch.zeros(3)}


@pytest.fixture
def saved(tmp_path: Path, single_process_group: None) -> FolderRoot:
    root = FolderRoot(tmp_path / "checkpoints")
    assert rank0_manager(root).save(Position(STEPS), {"x": torch.arange(3.0)},
                                    Plain(step=STEPS)) == NAME
    return root


def _fifo_in_place_of(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def test_a_manifest_replaced_by_a_fifo_is_refused_at_once(saved: FolderRoot) -> None:
    _fifo_in_place_of(saved.root / NAME / layout.MANIFEST)
    with pytest.raises(CheckpointError, match=r"manifest\.json is a FIFO"):
        read_manifest(saved.root / NAME)
    with pytest.raises(CheckpointError, match=r"manifest\.json is a FIFO"):
        rank0_manager(saved).newest()
    with pytest.raises(CheckpointError, match=r"manifest\.json is a FIFO"):
        saved.final(NAME)


def test_a_shard_replaced_by_a_fifo_after_the_listing_check_is_refused_at_once(
    saved: FolderRoot
) -> None:
    mgr = rank0_manager(saved)
    assert mgr.newest() == NAME  # the listing checked: every file there, with its size
    _fifo_in_place_of(saved.root / NAME / SHARD)
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp is a FIFO"):
        mgr.load(NAME, _template, Plain)
    with pytest.raises(CheckpointError, match=r"__0_0\.distcp is a FIFO"):
        verify(saved.root / NAME)


def test_a_run_key_file_replaced_by_a_fifo_or_a_link_is_refused_at_once(
    tmp_path: Path
) -> None:
    seal = RunSeal(new_key().encode(), "run-a")
    RunLocation.open(str(tmp_path / "run"), seal=seal).claim(QualificationSpec())
    location = RunLocation.open(str(tmp_path / "run"))
    path = runkey.remember(location.uri, seal)
    assert runkey.recall(location) == seal
    # A FIFO in its place is passed over at once (never waited on), as is a link.
    _fifo_in_place_of(path)
    started = time.monotonic()
    assert runkey.recall(location) is None
    assert time.monotonic() - started < 5
    path.unlink()
    kept = tmp_path / "kept.json"
    runkey.remember("file:///other", seal).rename(kept)
    path.symlink_to(kept)
    assert runkey.recall(location) is None


def test_a_leg_log_replaced_by_a_fifo_or_a_link_has_no_lines(tmp_path: Path) -> None:
    log = tmp_path / "preempted.node-9.log"
    os.mkfifo(log)
    assert _tail(log, 10) == []
    log.unlink()
    (tmp_path / "elsewhere").write_text("error: not ours\n")
    log.symlink_to(tmp_path / "elsewhere")
    assert _tail(log, 10) == []
    log.unlink()
    log.write_text("a\nerror: ours\n")
    assert _tail(log, 1) == ["error: ours"]

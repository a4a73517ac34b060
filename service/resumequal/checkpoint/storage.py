"""Where a leg's checkpoints live, and the one choice of how a staged one is committed.

A :class:`CheckpointRoot` is the small commit backend the manager drives: a folder every
rank sees commits with a rename (:mod:`resumequal.checkpoint.folder`); any other store
commits with a ``COMMITTED`` marker written last (:mod:`resumequal.checkpoint.remote`).
The manager keeps the collectives; a root only does rank-local I/O.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch.distributed.checkpoint as dcp

from resumequal.checkpoint.folder import FolderRoot
from resumequal.checkpoint.layout import Position
from resumequal.checkpoint.manifest import CheckpointInfo, FileEntry
from resumequal.checkpoint.reading import VerifiedCheckpoint
from resumequal.checkpoint.remote import RemoteRoot
from resumequal.errors import CheckpointError, StoreError
from resumequal.store import StoreSettings, open_store


class CheckpointRoot(Protocol):
    """One leg's checkpoints: staging, commit, retention, discovery and reading."""

    # Whether staged files must be fsynced (they become the checkpoint) or are scratch.
    durable_staging: bool

    @property
    def scratch(self) -> Path:
        """The local folder staging folders (and an object store's downloads) go under."""
        ...

    def uri(self, name: str = "", rel: str = "") -> str:
        """Where checkpoint ``name`` (or file ``rel`` of it) lives, for messages."""
        ...

    def prepare(self, name: str) -> None:
        """Rank 0, before a save: make room for a new checkpoint called ``name``."""
        ...

    def writer(self, name: str, staging: Path) -> dcp.FileSystemWriter:
        """The DCP writer of this rank's files of checkpoint ``name``, staged in ``staging``
        (or sent on to the store as they are written)."""
        ...

    def publish(self, name: str, staging: Path, rank: int, writer: dcp.FileSystemWriter,
                state: FileEntry) -> dict[str, FileEntry]:
        """Put this rank's files (staged, or sent by ``writer``) where the commit finds
        them; their entries, taken from the bytes written or sent (``state``: the rank
        state's), never from a file read back."""
        ...

    def commit(self, staging: Path, position: Position, files: dict[str, FileEntry], *,
               world_size: int, attempt: int, info: CheckpointInfo) -> None:
        """Rank 0: write the manifest and make the checkpoint exist, atomically."""
        ...

    def retire(self, keep_last: int) -> None:
        """Rank 0: keep the newest ``keep_last`` committed checkpoints."""
        ...

    def collect_garbage(self) -> list[str]:
        """Rank 0, at start: remove what a killed save left; the names removed."""
        ...

    def newest_verified(self, world_size: int | None) -> str | None:
        """The newest committed checkpoint, checked against its manifest; CheckpointError
        saying why it cannot be resumed."""
        ...

    def open(self, name: str, rank: int) -> VerifiedCheckpoint:
        """Checkpoint ``name`` for this rank to load, read through its authenticated
        manifest: every byte checked as it is read."""
        ...

    def final(self, name: str) -> VerifiedCheckpoint:
        """Committed checkpoint ``name`` where it lies, for the comparator: its manifest
        authenticated, its files there with their sizes, every byte checked as it is read.
        CheckpointMissing if it was never committed, CheckpointError if it is refused."""
        ...


def checkpoint_location(
    store: str | None, settings: StoreSettings | None, run_dir: Path, leg: str,
    run: str | None = None, retry_seconds: float = 0.0,
) -> CheckpointRoot:
    """A leg's checkpoint root: ``<store>/<leg>/checkpoints`` (the store defaults to the run
    folder ``run_dir``, which is also where scratch files of an object store go), reached
    with ``settings`` (the spec's ``checkpoint`` settings of its scheme). Its
    manifests must name ``leg`` and run ``run`` (default: this process's run id).
    ``retry_seconds``: see :meth:`resumequal.run.location.RunLocation.open`."""
    try:
        opened = open_store(str(run_dir) if store is None else store, settings, retry_seconds)
    except StoreError as e:
        raise CheckpointError(f"checkpoint.store={store!r}: {e}") from e
    # The one medium question outside the store: the commit backend. DCP writes a folder's
    # checkpoint in place and commits it by a rename, which needs the folder as a path;
    # any other store stages here and commits with a COMMITTED marker written last.
    folder = opened.local_folder()
    if folder is not None:
        return FolderRoot(Path(folder) / leg / "checkpoints", leg=leg, run=run)
    return RemoteRoot(opened, f"{leg}/checkpoints", run_dir / leg / ".ckpt-local", leg=leg,
                      run=run)

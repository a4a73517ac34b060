"""Checkpoints in a folder every rank sees: a rename commits them.

Layout under the leg's checkpoint folder::

    .staging/step-00000004.attempt-<a>/   being written by every rank
    step-00000004/dcp/..., rank-<r>.json,
        manifest.json, manifest.hmac       committed (renamed into place)
    .trash/                                a replaced checkpoint, until retention

Every rank hashes its files as it writes them (:mod:`resumequal.checkpoint.writing`) and
fsyncs them; rank 0 writes the manifest of what every rank reported, signs it, and renames
the staging folder into place; a kill before the rename leaves only a staging folder,
removed at the next start. :mod:`resumequal.checkpoint.manager` runs the collectives
around it.

A checkpoint is loaded where it lies, never copied: each rank reads only the byte ranges
it loads, checks every chunk they touch against the manifest, and hands torch the very
bytes it checked (:mod:`resumequal.checkpoint.reading`), so whoever can write to the
folder cannot change a file between its check and its load.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch.distributed.checkpoint as dcp

from resumequal.checkpoint import layout
from resumequal.checkpoint.layout import Position
from resumequal.checkpoint.manifest import (
    CheckpointInfo,
    FileEntry,
    Manifest,
    Owned,
    check_listing,
    make_manifest,
    read_manifest,
    write_manifest_file,
)
from resumequal.checkpoint.reading import FolderSource, VerifiedCheckpoint
from resumequal.checkpoint.writing import HashingWriter
from resumequal.errors import CheckpointError, CheckpointMissing
from resumequal.store import regular
from resumequal.store.file import fsync_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FolderRoot(Owned):
    """One leg's checkpoint folder; staging lives inside it, so the commit is a rename."""

    root: Path
    # The staged files are the checkpoint itself once renamed: fsync them.
    durable_staging = True

    @property
    def scratch(self) -> Path:
        return self.root

    def uri(self, name: str = "", rel: str = "") -> str:
        return str(Path(self.root, name, rel)) if name else str(self.root)

    def prepare(self, name: str) -> None:
        """Nothing to remove: the commit replaces an earlier checkpoint of that name."""

    def writer(self, name: str, staging: Path) -> HashingWriter:
        """DCP's writer into the staging folder, hashing and fsyncing each file as it is
        written: the files are the checkpoint."""
        return HashingWriter(staging, sync=True)

    def publish(self, name: str, staging: Path, rank: int, writer: dcp.FileSystemWriter,
                state: FileEntry) -> dict[str, FileEntry]:
        """Nothing to send (every rank wrote into the shared staging folder): the entries
        of the files this rank wrote, taken from the bytes as ``writer`` wrote them, and
        ``state``'s, its rank state's. Nothing is read back: whoever can write the folder
        may have changed a file since, and the manifest says what was written."""
        entries = dict(writer.written) if isinstance(writer, HashingWriter) else {}
        entries[layout.rank_state_file(rank)] = state
        return entries

    def commit(self, staging: Path, position: Position, files: dict[str, FileEntry], *,
               world_size: int, attempt: int, info: CheckpointInfo) -> None:
        """Write the manifest of every rank's ``files``, then rename the folder into place."""
        if self.leg is not None:
            info = {**info, "leg": self.leg}  # the manifest names the leg it is filed under
        manifest = make_manifest(position, files, world_size=world_size, attempt=attempt,
                                 info=info, run=self.run)
        # Nothing written that no rank reported, and nothing but regular files: a link
        # planted in the staging folder (or the folder itself a link) fails the commit.
        check_listing(staging, manifest)
        write_manifest_file(staging, manifest)
        # The files are synced; their names in dcp/ are made durable here (the staging
        # folder's own by write_manifest_file), before the rename publishes them.
        fsync_dir(staging / layout.DCP_DIR)
        staged = staging.relative_to(self.root).as_posix()
        if regular.stat_below(self.root, position.name) is not None:
            # Re-saving a position (e.g. after a resume with a planted omission): the new
            # one replaces the old atomically from a reader's point of view.
            regular.make_dirs(self.root, layout.TRASH_DIR)
            regular.rename(self.root, position.name,
                           f"{layout.TRASH_DIR}/{position.name}.attempt-{attempt}")
        regular.rename(self.root, staged, position.name)
        fsync_dir(self.root)

    def retire(self, keep_last: int) -> None:
        """Keep the newest ``keep_last`` committed checkpoints; drop replaced ones."""
        for pos in layout.committed(self.root)[:-keep_last]:
            _remove(self.root, pos.name)
            log.info("retention: removed %s", pos.name)
        _remove(self.root, layout.TRASH_DIR)

    def collect_garbage(self) -> list[str]:
        """Remove uncommitted staging folders and replaced checkpoints; their names."""
        removed: list[str] = []
        staging_root = self.root / layout.STAGING_DIR
        if staging_root.is_dir():
            for child in sorted(staging_root.iterdir()):
                _remove(self.root, f"{layout.STAGING_DIR}/{child.name}")
                removed.append(child.name)
                log.warning("removed uncommitted checkpoint %s", child.name)
        _remove(self.root, layout.TRASH_DIR)
        return removed

    def _manifest(self, name: str) -> Manifest:
        """The authenticated manifest of checkpoint ``name``, filed under its own name."""
        directory = self.root / name
        manifest = read_manifest(directory, leg=self.leg, run=self.run)
        if manifest.name != name:
            raise CheckpointError(
                f"checkpoint {directory} is refused: its manifest is the one of {manifest.name}"
            )
        return manifest

    def newest_verified(self, world_size: int | None) -> str | None:
        """The newest committed checkpoint, its manifest authenticated and its files
        there with their sizes; their contents are checked as they are read."""
        positions = layout.committed(self.root)
        if not positions:
            return None
        newest = positions[-1]
        manifest = self._manifest(newest.name)
        check_listing(self.root / newest.name, manifest)
        if world_size is not None and manifest.world_size != world_size:
            raise CheckpointError(
                f"{newest.name} was written by {manifest.world_size} ranks; this leg has "
                f"{world_size}"
            )
        return newest.name

    def open(self, name: str, rank: int) -> VerifiedCheckpoint:
        """Checkpoint ``name`` where it lies, read through its authenticated manifest."""
        directory = self.root / name
        return VerifiedCheckpoint(FolderSource(directory, str(directory)), self._manifest(name),
                                  str(directory))

    def final(self, name: str) -> VerifiedCheckpoint:
        """Committed checkpoint ``name`` where it lies, its listing checked."""
        directory = self.root / name
        if not directory.is_dir():
            raise CheckpointMissing(f"{directory} is not a committed checkpoint")
        manifest = self._manifest(name)
        check_listing(directory, manifest)
        return VerifiedCheckpoint(FolderSource(directory, str(directory)), manifest,
                                  str(directory))


def _remove(root: Path, rel: str) -> None:
    """Remove folder ``root/rel`` (a link there: the link alone), whatever fails."""
    try:
        regular.remove_tree(root, rel)
    except OSError as e:
        log.warning("could not remove %s: %s", root / rel, e.strerror or e)

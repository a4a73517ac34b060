"""Checkpoints in a folder every rank sees: a rename commits them.

Layout under the leg's checkpoint folder::

    .staging/step-00000004.attempt-<a>/   being written by every rank
    step-00000004/dcp/..., rank-<r>.json,
        manifest.json, manifest.hmac       committed (renamed into place)
    .trash/                                a replaced checkpoint, until retention

Rank 0 hashes every staged file into the manifest, signs it, and renames the staging folder into
place; a kill before the rename leaves only a staging folder, removed at the next start.
:mod:`resumequal.checkpoint.manager` runs the collectives around it.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from resumequal.checkpoint import layout
from resumequal.checkpoint.layout import Position
from resumequal.checkpoint.manifest import (
    CheckpointInfo,
    FileEntry,
    fsync_dir,
    verify,
    write_manifest,
)
from resumequal.errors import CheckpointError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FolderRoot:
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

    def publish(self, name: str, staging: Path, rank: int) -> dict[str, FileEntry]:
        """Nothing to send: every rank wrote into the shared staging folder."""
        return {}

    def commit(self, staging: Path, position: Position, files: dict[str, FileEntry], *,
               world_size: int, attempt: int, info: CheckpointInfo) -> None:
        """Hash the staged files into the manifest, then rename the folder into place."""
        write_manifest(staging, name=position.name, step=position.step,
                       microstep=position.microstep, world_size=world_size, attempt=attempt,
                       info=info)
        final = self.root / position.name
        if final.exists():
            # Re-saving a position (e.g. after a resume with a planted omission): the new
            # one replaces the old atomically from a reader's point of view.
            trash = self.root / layout.TRASH_DIR / f"{position.name}.attempt-{attempt}"
            trash.parent.mkdir(exist_ok=True)
            final.rename(trash)
        staging.rename(final)
        fsync_dir(self.root)

    def retire(self, keep_last: int) -> None:
        """Keep the newest ``keep_last`` committed checkpoints; drop replaced ones."""
        for pos in layout.committed(self.root)[:-keep_last]:
            shutil.rmtree(self.root / pos.name, ignore_errors=True)
            log.info("retention: removed %s", pos.name)
        shutil.rmtree(self.root / layout.TRASH_DIR, ignore_errors=True)

    def collect_garbage(self) -> list[str]:
        """Remove uncommitted staging folders and replaced checkpoints; their names."""
        removed: list[str] = []
        staging_root = self.root / layout.STAGING_DIR
        if staging_root.is_dir():
            for child in sorted(staging_root.iterdir()):
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child.name)
                log.warning("removed uncommitted checkpoint %s", child.name)
        shutil.rmtree(self.root / layout.TRASH_DIR, ignore_errors=True)
        return removed

    def newest_verified(self, world_size: int) -> str | None:
        """The newest committed checkpoint, every file checked against its manifest."""
        positions = layout.committed(self.root)
        if not positions:
            return None
        newest = positions[-1]
        manifest = verify(self.root / newest.name)
        if manifest.world_size != world_size:
            raise CheckpointError(
                f"{newest.name} was written by {manifest.world_size} ranks; this leg has "
                f"{world_size}"
            )
        return newest.name

    def local_copy(self, name: str, rank: int) -> Path:
        """The folder checkpoint ``name`` is loaded from: in place."""
        return self.root / name

    def fetch(self, name: str, rank: int) -> None:
        """Nothing to fetch: the committed folder was verified where it lies."""

    def final_root(self, name: str, dest: Path) -> Path:
        """A local checkpoint root holding ``name``: this folder."""
        return self.root

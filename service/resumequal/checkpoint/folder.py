"""Checkpoints in a folder every rank sees: a rename commits them.

Layout under the leg's checkpoint folder::

    .staging/step-00000004.attempt-<a>/   being written by every rank
    step-00000004/dcp/..., rank-<r>.json,
        manifest.json, manifest.hmac       committed (renamed into place)
    .trash/                                a replaced checkpoint, until retention

Rank 0 hashes every staged file into the manifest, signs it, and renames the staging folder into
place; a kill before the rename leaves only a staging folder, removed at the next start.
:mod:`resumequal.checkpoint.manager` runs the collectives around it.

A checkpoint is never loaded where it lies: whoever can write to the folder could change a
file between its check and its load. Each rank copies it into a private folder of its own,
checking every file as it is copied, and loads the copy.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed.checkpoint as dcp

from resumequal.checkpoint import layout
from resumequal.checkpoint.layout import Position
from resumequal.checkpoint.manifest import (
    CheckpointInfo,
    FileEntry,
    copy_verified,
    fsync_dir,
    verify,
    write_manifest,
)
from resumequal.errors import CheckpointError, CheckpointMissing

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FolderRoot:
    """One leg's checkpoint folder; staging lives inside it, so the commit is a rename."""

    root: Path
    # The leg whose checkpoints these are: a manifest naming another is refused.
    leg: str | None = field(default=None, compare=False)
    # The run they belong to (default: this process's RESUMEQUAL_RUN_ID).
    run: str | None = field(default=None, compare=False)
    # The staged files are the checkpoint itself once renamed: fsync them.
    durable_staging = True
    _copies: list[Path] = field(default_factory=list, compare=False, repr=False)

    def _private(self) -> Path:
        """This process's folder for verified copies: mode 0700, removed at exit."""
        if not self._copies:
            folder = Path(tempfile.mkdtemp(prefix="resumequal-ckpt-"))
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            self._copies.append(folder)
        return self._copies[0]

    @property
    def scratch(self) -> Path:
        return self.root

    def uri(self, name: str = "", rel: str = "") -> str:
        return str(Path(self.root, name, rel)) if name else str(self.root)

    def prepare(self, name: str) -> None:
        """Nothing to remove: the commit replaces an earlier checkpoint of that name."""

    def writer(self, name: str, staging: Path) -> dcp.FileSystemWriter:
        """DCP's own writer into the staging folder, fsyncing: the files are the checkpoint."""
        return dcp.FileSystemWriter(str(staging / layout.DCP_DIR), sync_files=True)

    def publish(self, name: str, staging: Path, rank: int,
                writer: dcp.FileSystemWriter) -> dict[str, FileEntry]:
        """Nothing to send: every rank wrote into the shared staging folder."""
        return {}

    def commit(self, staging: Path, position: Position, files: dict[str, FileEntry], *,
               world_size: int, attempt: int, info: CheckpointInfo) -> None:
        """Hash the staged files into the manifest, then rename the folder into place."""
        if self.leg is not None:
            info = {**info, "leg": self.leg}  # the manifest names the leg it is filed under
        write_manifest(staging, name=position.name, step=position.step,
                       microstep=position.microstep, world_size=world_size, attempt=attempt,
                       info=info, run=self.run)
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

    def newest_verified(self, world_size: int | None) -> str | None:
        """The newest committed checkpoint, every file checked against its manifest."""
        positions = layout.committed(self.root)
        if not positions:
            return None
        newest = positions[-1]
        manifest = verify(self.root / newest.name, leg=self.leg, run=self.run)
        if world_size is not None and manifest.world_size != world_size:
            raise CheckpointError(
                f"{newest.name} was written by {manifest.world_size} ranks; this leg has "
                f"{world_size}"
            )
        return newest.name

    def local_copy(self, name: str, rank: int) -> Path:
        """This rank's private, verified copy of checkpoint ``name``."""
        return self._private() / f"rank-{rank}" / name

    def fetch(self, name: str, rank: int) -> None:
        """Copy ``name`` into this rank's private folder, every file checked on the way."""
        shutil.rmtree(self._private() / f"rank-{rank}", ignore_errors=True)
        copy_verified(self.root / name, self.local_copy(name, rank), leg=self.leg,
                      run=self.run)

    def final_root(self, name: str, dest: Path) -> Path:
        """Copy ``name`` into ``dest``, verified; ``dest`` is then its checkpoint root."""
        if not (self.root / name).is_dir():
            raise CheckpointMissing(f"{self.root / name} is not a committed checkpoint")
        shutil.rmtree(dest / name, ignore_errors=True)
        copy_verified(self.root / name, dest / name, leg=self.leg, run=self.run)
        return dest

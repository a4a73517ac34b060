"""DCP checkpoints with the barrier-guarded atomic commit of DESIGN.md, on a file store.

Save: barrier → every rank writes its DCP shards and its rank state into a staging folder
→ barrier → rank 0 writes the manifest and renames the folder into place (the commit) →
rank 0 tells everyone the outcome (which is also the closing barrier). A kill anywhere in
between leaves the staging folder behind, never a committed name; staging leftovers are
removed at the next start.

Decisions that must agree across ranks (which checkpoint to resume, whether it verified)
are taken by rank 0 and broadcast, so a failure on one rank becomes an error on all ranks
instead of a hang in the next collective.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import flatten_state_dict

from resumequal.checkpoint import layout
from resumequal.checkpoint.layout import Position
from resumequal.checkpoint.manifest import fsync_dir, verify, write_manifest
from resumequal.errors import CheckpointError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Loaded:
    """A verified, loaded checkpoint: where it came from and what it held."""

    name: str
    position: Position
    tensors: dict[str, Any]
    rank_state: dict[str, Any]


def _broadcast(value: Any) -> Any:
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


class CheckpointManager:
    """Saves, finds, verifies, loads and retires the checkpoints of one leg."""

    def __init__(self, root: Path, *, rank: int, world_size: int, attempt: int, keep_last: int):
        self.root = root
        self.rank = rank
        self.world_size = world_size
        self.attempt = attempt
        self.keep_last = keep_last

    # -- save ---------------------------------------------------------------------------

    def save(
        self,
        position: Position,
        tensors: dict[str, Any],
        rank_state: dict[str, Any],
        *,
        info: dict[str, Any] | None = None,
        before_commit: Callable[[], None] | None = None,
    ) -> str:
        """Write and commit one checkpoint on every rank; returns its committed name."""
        staging = layout.staging_path(self.root, position, self.attempt)
        if self.rank == 0:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
        dist.barrier()
        try:
            dcp.save(tensors, storage_writer=dcp.FileSystemWriter(str(staging / layout.DCP_DIR)))
        except Exception as e:  # DCP raises CheckpointException (an Exception) on every rank
            raise CheckpointError(
                f"rank {self.rank}: DCP save of {position.name} failed: {e}"
            ) from e
        _write_durably(staging / layout.rank_state_file(self.rank), pickle.dumps(rank_state))
        if before_commit is not None:
            before_commit()
        dist.barrier()
        error = None
        if self.rank == 0:
            try:
                self._commit(staging, position, info or {})
            except (OSError, CheckpointError) as e:
                error = f"commit of {position.name} failed: {e}"
        error = _broadcast(error)
        if error is not None:
            raise CheckpointError(error)
        if self.rank == 0:
            self._retire()
        log.info("rank %d: committed checkpoint %s", self.rank, position.name)
        return position.name

    def _commit(self, staging: Path, position: Position, info: dict[str, Any]) -> None:
        write_manifest(
            staging,
            name=position.name,
            step=position.step,
            microstep=position.microstep,
            world_size=self.world_size,
            attempt=self.attempt,
            info=info,
        )
        final = self.root / position.name
        if final.exists():
            # Re-saving a position (e.g. after a resume with a planted omission): the new
            # one replaces the old atomically from a reader's point of view.
            trash = self.root / layout.TRASH_DIR / f"{position.name}.attempt-{self.attempt}"
            trash.parent.mkdir(exist_ok=True)
            final.rename(trash)
        staging.rename(final)
        fsync_dir(self.root)

    def _retire(self) -> None:
        """Keep the newest ``keep_last`` committed checkpoints; drop leftovers."""
        for pos in layout.committed(self.root)[: -self.keep_last]:
            shutil.rmtree(self.root / pos.name, ignore_errors=True)
            log.info("retention: removed %s", pos.name)
        shutil.rmtree(self.root / layout.TRASH_DIR, ignore_errors=True)

    # -- resume -------------------------------------------------------------------------

    def collect_garbage(self) -> list[str]:
        """Remove uncommitted staging folders; rank 0 only, before anyone saves."""
        removed: list[str] = []
        if self.rank != 0:
            return removed
        staging_root = self.root / layout.STAGING_DIR
        if staging_root.is_dir():
            for child in sorted(staging_root.iterdir()):
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child.name)
                log.warning("removed uncommitted checkpoint %s", child.name)
        shutil.rmtree(self.root / layout.TRASH_DIR, ignore_errors=True)
        return removed

    def newest(self) -> str | None:
        """The newest committed checkpoint, verified against its manifest (agreed by all)."""
        decision: tuple[str | None, str | None] = (None, None)
        if self.rank == 0:
            decision = self._choose()
        name, error = _broadcast(decision)
        if error is not None:
            raise CheckpointError(error)
        return name  # type: ignore[no-any-return]

    def _choose(self) -> tuple[str | None, str | None]:
        positions = layout.committed(self.root)
        if not positions:
            return None, None
        newest = positions[-1]
        try:
            manifest = verify(self.root / newest.name)
        except CheckpointError as e:
            return None, str(e)
        if manifest.world_size != self.world_size:
            return None, (
                f"{newest.name} was written by {manifest.world_size} ranks; this leg has "
                f"{self.world_size}"
            )
        return newest.name, None

    def load(
        self, name: str, template: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> Loaded:
        """Load this rank's part of checkpoint ``name`` into tensors built by ``template``."""
        directory = self.root / name
        position = Position.parse(name)
        if position is None:
            raise CheckpointError(f"{directory}: not a checkpoint name")
        rank_file = directory / layout.rank_state_file(self.rank)
        try:
            rank_state = pickle.loads(rank_file.read_bytes())
        except FileNotFoundError as e:
            raise CheckpointError(f"{rank_file}: no state for rank {self.rank}") from e
        except (pickle.UnpicklingError, EOFError, AttributeError) as e:
            raise CheckpointError(f"{rank_file}: unreadable rank state: {e}") from e
        if not isinstance(rank_state, dict):
            raise CheckpointError(f"{rank_file}: rank state is not a mapping")
        tensors = template(rank_state)
        reader = dcp.FileSystemReader(str(directory / layout.DCP_DIR))
        self._check_keys(tensors, reader, directory)
        try:
            dcp.load(tensors, storage_reader=reader)
        except Exception as e:  # DCP wraps per-rank failures in CheckpointException
            raise CheckpointError(f"rank {self.rank}: DCP load of {name} failed: {e}") from e
        return Loaded(name=name, position=position, tensors=tensors, rank_state=rank_state)

    def _check_keys(
        self, tensors: dict[str, Any], reader: dcp.FileSystemReader, directory: Path
    ) -> None:
        """Strict restore: every saved key is wanted and every wanted key was saved."""
        wanted = set(flatten_state_dict(tensors)[0])
        saved = {
            k for k in reader.read_metadata().state_dict_metadata
            if not k.startswith("rank_") or k.startswith(f"rank_{self.rank}.")
        }
        missing = sorted(wanted - saved)
        unexpected = sorted(saved - wanted)
        if missing:
            raise CheckpointError(
                f"{directory}: missing key(s) in checkpoint: {', '.join(missing[:5])}"
                + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            )
        if unexpected:
            raise CheckpointError(
                f"{directory}: unexpected key(s) in checkpoint: {', '.join(unexpected[:5])}"
                + (f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else "")
            )


def _write_durably(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(path)

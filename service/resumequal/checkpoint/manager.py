"""DCP checkpoints with the barrier-guarded atomic commit of docs/design.md, on any store.

Save: barrier → every rank writes its DCP shards and its rank state into a staging folder
and publishes them → the ranks gather what each published (the barrier) → rank 0 commits →
rank 0 tells everyone the outcome (which is also the closing barrier).

A rank's own state (counters, RNGs, data cursor...) is a pydantic model written as JSON
(``rank-<r>.json``) and validated against the model on load: nothing of a checkpoint is
unpickled by us. Loading reads only a checkpoint whose manifest was authenticated with
the checkpoint key (:mod:`resumequal.checkpoint.manifest`), and only bytes checked against
it as they are read (:mod:`resumequal.checkpoint.reading`). A kill anywhere in between
leaves an uncommitted checkpoint behind, never a committed one; leftovers are removed at
the next start.

What publishing and committing mean is the checkpoint root's (a small commit backend, see
:mod:`resumequal.checkpoint.storage`). Every rank hashes its files as it writes them and
reports their sizes and chunk digests; in a folder every rank sees, the commit writes them
into the manifest and renames the folder into place; on an object store every rank first
uploads the files it wrote, and the commit uploads the manifest, then a ``COMMITTED``
marker. Loading reads the committed checkpoint where it lies; the ranks of one machine read
and check each chunk once between them (:mod:`resumequal.checkpoint.node`), having met in
the gather that precedes every load.

Decisions that must agree across ranks (which checkpoint to resume, whether it verified)
are taken by rank 0 and broadcast, so a failure on one rank becomes an error on all ranks
instead of a hang in the next collective.

One save path; ``background`` (``checkpoint.async``) splits it in two. The first half:
barrier → ``dcp.async_save`` copies this rank's tensors into fresh CPU memory before it
returns (so later optimizer steps cannot change what is written) and hands the write to a
background thread → the rank state is written into the staging folder at once. Training
goes on. ``poll``, called at microbatch boundaries while a save is pending, is the second
half: every rank says whether its background write has finished, and only when all have
do they publish and commit (as above). A failed write on any rank is an error on every
rank. A synchronous save publishes before ``before_commit``, so a rank held there has
sent its part.

- The commit waits for a collective, never for a local "my write is done": a rank's
  future finishing says nothing about the other ranks' files, and a manifest hashed while
  any rank is still writing lists missing or short files — the checkpoint would be
  committed torn, and refused (or worse, half-loaded) at the resume.
- Two extra gloo groups, each used by one thread only. DCP's background thread runs its
  own collectives (gather the plans, scatter them back, gather the write results,
  broadcast the metadata); on the default group they would interleave with DDP's
  all-reduces and the stop-flag all-reduce of the training thread, and collectives are
  matched by issue order per group, so ranks would pair different operations and hang or
  exchange garbage. The commit's own collectives run on the training thread while a
  slower rank's background thread may still be inside DCP's, so they get a group of their
  own too. gloo, because DCP's background collectives need a CPU backend even when
  training uses NCCL.
- At most one save is in flight: a new save (and every emergency save, which stays
  synchronous) first waits for the pending one and commits it. The training loop also
  waits for it once a whole further step has run, so which checkpoints are committed at
  the start of a step does not depend on timing.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import BlockingAsyncStager

from resumequal.checkpoint import layout
from resumequal.checkpoint.agreement import (
    WriteState,
    broadcast,
    commit_decision,
    failures,
    gather_errors,
    store_failures,
)
from resumequal.checkpoint.layout import Position
from resumequal.checkpoint.manifest import CheckpointInfo, FileEntry, Manifest, entry_of
from resumequal.checkpoint.node import Card, Door, Meeting
from resumequal.checkpoint.reading import VerifiedCheckpoint, VerifiedReader
from resumequal.checkpoint.space import no_space
from resumequal.checkpoint.storage import CheckpointRoot
from resumequal.errors import CheckpointError, StoreError
from resumequal.store import regular

log = logging.getLogger(__name__)

# torch's own default for a gloo group's collectives.
_DEFAULT_TIMEOUT = timedelta(minutes=30)
# DCP's CheckpointException derives from BaseException (torch 2.13), not Exception.
DCP_ERRORS = (Exception, CheckpointException)


# A rank's own state: a pydantic model, stored as JSON.
RankState = TypeVar("RankState", bound=BaseModel)


@dataclass(frozen=True)
class Loaded(Generic[RankState]):
    """A verified, loaded checkpoint: where it came from and what it held."""

    name: str
    position: Position
    tensors: dict[str, Any]
    rank_state: RankState
    # Its authenticated manifest: which run, leg and position it says it is.
    manifest: Manifest


@functools.cache
def staging_copies_cpu_tensors() -> bool:
    """Whether DCP's blocking staging (a FileSystemWriter's) copies a CPU tensor. torch
    2.6's hands the tensor itself to the background write, which would then read it while
    later optimizer steps change it."""
    tensor = torch.zeros(1)
    staged = BlockingAsyncStager().stage({"t": tensor})
    return bool(staged["t"].data_ptr() != tensor.data_ptr())


def _snapshot(obj: Any) -> Any:
    """Nested dicts and lists of tensors, every tensor a detached copy."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _snapshot(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_snapshot(v) for v in obj)
    return obj


@dataclass(frozen=True)
class _Pending:
    """A background save: written (or being written) on this rank, not yet committed."""

    position: Position
    staging: Path
    info: CheckpointInfo
    future: Future[Any]
    writer: dcp.FileSystemWriter
    state: FileEntry  # the rank state's entry, from the bytes written


# One rank's upload: the entries of the files it uploaded, or why it could not.
_Upload = tuple[dict[str, FileEntry], str | None]


class CheckpointManager:
    """Saves, finds, verifies, loads and retires the checkpoints of one leg."""

    def __init__(
        self,
        root: CheckpointRoot,
        *,
        rank: int,
        world_size: int,
        attempt: int,
        keep_last: int,
        async_save: bool = False,
        group_timeout: timedelta | None = None,
        resizable: bool = False,
    ):
        """``resizable``: resume from a checkpoint of any world size (DCP reshards its
        tensors), reading the plain state every rank saved alike from rank 0's file."""
        self.root = root
        self.resizable = resizable
        self._start_error: str | None = None
        self.rank = rank
        self.world_size = world_size
        self.attempt = attempt
        self.keep_last = keep_last
        self._pending: _Pending | None = None
        self._opened: VerifiedCheckpoint | None = None
        # How long a rank waits for the others of its machine at a load (its collectives
        # wait as long as the process group lets them).
        self._group_timeout = group_timeout or _DEFAULT_TIMEOUT
        self._io_group: dist.ProcessGroup | None = None
        self._commit_group: dist.ProcessGroup | None = None
        if async_save:
            # Collective: every rank constructs its manager at the same point.
            self._io_group = dist.new_group(backend="gloo", timeout=group_timeout)
            self._commit_group = dist.new_group(backend="gloo", timeout=group_timeout)

    # -- save ---------------------------------------------------------------------------

    def save(
        self,
        position: Position,
        tensors: dict[str, Any],
        rank_state: BaseModel,
        *,
        info: CheckpointInfo | None = None,
        before_commit: Callable[[], None] | None = None,
        background: bool = False,
    ) -> str | None:
        """Write one checkpoint on every rank and commit it; returns its committed name.

        With ``background``, returns (None) once this rank's tensors are copied to CPU
        memory and its rank state is staged; ``poll`` commits it once every rank has
        written it. A save still pending is committed first, so at most one is in flight.
        ``before_commit`` runs once this rank's part is staged (and, for a synchronous
        save, published: a rank held there has sent its files).
        """
        if background and (self._io_group is None or self._commit_group is None):
            raise CheckpointError("this checkpoint manager was made without async_save")
        self.poll(wait=True)
        try:
            state_json = rank_state.model_dump_json().encode()
        except PydanticSerializationError as e:
            raise CheckpointError(
                f"rank {self.rank}: the rank state of {position.name} is not JSON: {e}"
            ) from e
        group = self._commit_group if background else None
        staging = self._prepare(position, group=group)
        writer = self.root.writer(position.name, staging)
        future = None
        try:
            if background:
                future = self._start_background(tensors, writer)
            else:
                dcp.save(tensors, storage_writer=writer)
        except DCP_ERRORS as e:  # DCP raises CheckpointException on every rank
            failed = store_failures(e)
            if failed:  # a shard sent while written did not make it
                raise CheckpointError(self._upload_failed(position, failed)) from e
            what = "async save" if background else "save"
            full = no_space(e, staging)
            raise CheckpointError(
                f"rank {self.rank}: DCP {what} of {position.name} failed"
                f"{' to start' if background else ''}: {f'{full}: ' if full else ''}{e}"
            ) from e
        state = self._stage_state(staging, state_json)
        if future is not None:
            self._pending = _Pending(position, staging, info or {}, future, writer, state)
            if before_commit is not None:
                before_commit()
            return None
        published = self._publish(staging, position, writer, state)
        if before_commit is not None:
            before_commit()
        return self._commit_everywhere(staging, position, info or {}, group=None,
                                       published=published)

    def _stage_state(self, staging: Path, state_json: bytes) -> FileEntry:
        """Write this rank's state into ``staging``; its manifest entry, from these bytes.

        Under a fresh name created ``O_EXCL|O_NOFOLLOW``, then renamed: the staging folder
        may be one others write (a folder store), and a link planted at a fixed name would
        take the state elsewhere, or a file changed before a read-back be signed."""
        rel = layout.rank_state_file(self.rank)
        try:
            regular.write_file(self.root.scratch, staging.relative_to(self.root.scratch) / rel,
                               state_json, sync=self.root.durable_staging)
        except OSError as e:
            raise CheckpointError(f"rank {self.rank}: cannot stage {rel} in {staging}: "
                                  f"{e.strerror or e}") from e
        return entry_of(state_json)

    def _upload_failed(self, position: Position, failed: Sequence[str]) -> str:
        return (f"upload of checkpoint {position.name} to {self.root.uri(position.name)} "
                f"failed; it stays uncommitted: {'; '.join(failed)}")

    def _start_background(self, tensors: dict[str, Any],
                          writer: dcp.FileSystemWriter) -> Future[Any]:
        # A FileSystemWriter is its own stager: async_save copies every tensor into new
        # CPU memory (CPU tensors too) before it returns; where its staging passes CPU
        # tensors through, the copy is made here.
        if not staging_copies_cpu_tensors():
            tensors = _snapshot(tensors)
        response = dcp.async_save(tensors, storage_writer=writer, process_group=self._io_group)
        # torch < 2.9 returns the write's Future itself and has no AsyncSaveResponse to
        # import; later ones return a Future unless a stager makes the copy asynchronous.
        if isinstance(response, Future):
            return response
        response.staging_completion.result()
        return response.upload_completion

    def _prepare(self, position: Position, group: dist.ProcessGroup | None) -> Path:
        """Rank 0 makes a fresh staging folder and makes room for the checkpoint; then
        every rank may write (the broadcast is the barrier). Returns the folder."""
        staging = layout.staging_path(self.root.scratch, position, self.attempt)
        rel = staging.relative_to(self.root.scratch)
        error = None
        if self.rank == 0:
            try:
                # Below the root without following a link: the staging folder may be in a
                # folder others write.
                regular.remove_tree(self.root.scratch, rel)
                regular.make_dirs(self.root.scratch, rel)
                self.root.prepare(position.name)
            except (StoreError, OSError) as e:
                error = f"cannot save {position.name}: {e}"
        error = broadcast(error, group)
        if error is not None:
            raise CheckpointError(error)
        try:
            regular.make_dirs(self.root.scratch, rel)  # another node's local disk
        except OSError as e:
            raise CheckpointError(f"cannot save {position.name}: {e}") from e
        return staging

    def _publish(self, staging: Path, position: Position, writer: dcp.FileSystemWriter,
                 state: FileEntry) -> _Upload:
        """Publish this rank's files; failures are reported, not raised, so that every
        rank still joins the commit's collectives."""
        try:
            return self.root.publish(position.name, staging, self.rank, writer, state), None
        except (StoreError, OSError) as e:
            log.error("rank %d: upload of %s failed: %s", self.rank, position.name, e)
            return {}, str(e)

    # -- background save ----------------------------------------------------------------

    @property
    def pending(self) -> Position | None:
        """The background save written or being written, not committed yet."""
        return self._pending.position if self._pending is not None else None

    def poll(self, *, wait: bool = False) -> str | None:
        """Commit the pending background save if every rank has written it.

        Collective while a save is pending (ranks agree on that: they save at the same
        steps); nothing at all otherwise. ``wait`` first waits for this rank's write.
        Returns the committed name, or None while a rank is still writing.
        """
        pending = self._pending
        if pending is None:
            return None
        assert self._commit_group is not None
        error: BaseException | None = None
        if wait or pending.future.done():
            error = pending.future.exception()
            state = WriteState.FAILED if error is not None else WriteState.WRITTEN
        else:
            state = WriteState.WRITING
        mine = torch.tensor([int(state)], dtype=torch.int64)
        states = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(states, mine, group=self._commit_group)
        try:
            ready = commit_decision([int(s.item()) for s in states], pending.position.name)
        except CheckpointError as e:
            self._pending = None
            failed = store_failures(error) if error is not None else []
            full = None if error is None else no_space(error, pending.staging)
            cause = (f"; {'; '.join(failed)}" if failed
                     else f"; rank {self.rank}: {f'{full}: ' if full else ''}{error}"
                     if error is not None else "")
            raise CheckpointError(f"{e}{cause}") from error
        if not ready:
            return None
        self._pending = None
        return self._commit_everywhere(
            pending.staging, pending.position, pending.info, group=self._commit_group,
            published=self._publish(pending.staging, pending.position, pending.writer,
                                    pending.state),
        )

    # -- commit -------------------------------------------------------------------------

    def _commit_everywhere(
        self,
        staging: Path,
        position: Position,
        info: CheckpointInfo,
        group: dist.ProcessGroup | None,
        published: _Upload,
    ) -> str:
        """Gather every rank's published files (which waits for every rank), rank 0
        commits, every rank learns the outcome; then retention."""
        gathered: list[_Upload | None] = [None] * self.world_size
        dist.all_gather_object(gathered, published, group=group)
        failed = [f"rank {r}: {g[1]}" for r, g in enumerate(gathered)
                  if g is not None and g[1] is not None]
        error = None
        if failed:
            error = self._upload_failed(position, failed)
        elif self.rank == 0:
            files: dict[str, FileEntry] = {}
            for g in gathered:
                assert g is not None
                files.update(g[0])
            try:
                self.root.commit(staging, position, files, world_size=self.world_size,
                                 attempt=self.attempt, info=info)
            except (StoreError, OSError, CheckpointError) as e:
                error = f"commit of {position.name} failed; it stays uncommitted: {e}"
        error = broadcast(error, group)
        # Committed (a folder renamed away) or garbage either way.
        with contextlib.suppress(OSError):
            regular.remove_tree(self.root.scratch, staging.relative_to(self.root.scratch))
        if error is not None:
            raise CheckpointError(error)
        if self.rank == 0:
            try:
                self.root.retire(self.keep_last)
            except (StoreError, OSError) as e:
                log.warning("retention after %s failed (retried at the next save): %s",
                            position.name, e)
        log.info("rank %d: committed checkpoint %s", self.rank, self.root.uri(position.name))
        return position.name

    # -- resume -------------------------------------------------------------------------

    def collect_garbage(self) -> list[str]:
        """Remove what killed saves left; rank 0 only, before anyone saves."""
        if self.rank != 0:
            return []
        # The leg's first request to the store: its failure is reported to every rank by
        # ``newest``, which all ranks call next.
        try:
            return self.root.collect_garbage()
        except StoreError as e:
            self._start_error = f"checkpoint store {self.root.uri()}: {e}"
            return []

    def newest(self) -> str | None:
        """The newest committed checkpoint, its manifest authenticated (agreed by all);
        every rank then has it open to load."""
        decision: tuple[str | None, str | None] = (None, self._start_error)
        if self.rank == 0 and self._start_error is None:
            try:
                decision = (self.root.newest_verified(
                    None if self.resizable else self.world_size), None)
            except CheckpointError as e:
                decision = (None, str(e))
        name, error = broadcast(decision)
        if error is not None:
            raise CheckpointError(error)
        if name is not None:
            self._open_everywhere(name)
        return name  # type: ignore[no-any-return]

    def _open_everywhere(self, name: str) -> None:
        """Every rank opens ``name``; a failure anywhere fails every rank."""
        error = None
        try:
            self._opened = self.root.open(name, self.rank)
        except (StoreError, CheckpointError, OSError) as e:
            error = str(e)
        errors = gather_errors(error, self.world_size)
        if errors:
            raise CheckpointError(
                f"cannot resume from {self.root.uri(name)}: {'; '.join(errors)}"
            )

    def _checkpoint(self, name: str) -> VerifiedCheckpoint:
        """``name`` as opened by :meth:`newest`, or opened now."""
        if self._opened is None or self._opened.name != name:
            try:
                self._opened = self.root.open(name, self.rank)
            except (StoreError, OSError) as e:
                raise CheckpointError(f"cannot load {self.root.uri(name)}: {e}") from e
        return self._opened

    def load(
        self,
        name: str,
        template: Callable[[RankState], dict[str, Any]],
        state_type: type[RankState],
    ) -> Loaded[RankState]:
        """Load this rank's part of checkpoint ``name`` (opened by :meth:`newest`, or
        here), every byte checked against its manifest as it is read: its rank state
        validated as ``state_type``, its tensors into those ``template`` builds from that
        state. Collective: a failure on any rank fails every rank."""
        position = Position.parse(name)
        if position is None:
            raise CheckpointError(f"{self.root.uri(name)}: not a checkpoint name")
        prepared: tuple[RankState, dict[str, Any], VerifiedReader] | None = None
        manifest: Manifest | None = None
        error = None
        try:
            checkpoint = self._checkpoint(name)
            manifest = checkpoint.manifest
            prepared = self._prepare_load(checkpoint, template, state_type)
        except CheckpointError as e:
            error = str(e)
        finally:
            self._opened = None  # opened for this load only: a later save may replace it
        door = Door.open() if self.world_size > 1 else None
        try:
            errors, meeting = self._meet(error, door)
            if errors:
                raise CheckpointError(
                    f"cannot load {self.root.uri(name)}: {'; '.join(errors)}")
            assert prepared is not None and manifest is not None
            rank_state, tensors, reader = prepared
            reader.meeting = meeting
            try:
                dcp.load(tensors, storage_reader=reader)
            except DCP_ERRORS as e:  # DCP wraps per-rank failures in CheckpointException
                refused = failures(e, CheckpointError)
                raise CheckpointError(f"rank {self.rank}: DCP load of {name} failed: "
                                      f"{'; '.join(refused) if refused else e}") from e
        finally:
            if door is not None:
                door.close()
        return Loaded(name=name, position=position, tensors=tensors, rank_state=rank_state,
                      manifest=manifest)

    def _meet(self, error: str | None,
              door: Door | None) -> tuple[list[str], Meeting | None]:
        """Every rank's error before a load (``"rank N: ..."``, the same list on every
        rank) and, with this rank's ``door``, every rank's card with it: what the ranks of
        a machine need to read and check each chunk once between them
        (:mod:`resumequal.checkpoint.node`). One collective."""
        gathered: list[tuple[str | None, Card | None] | None] = [None] * self.world_size
        dist.all_gather_object(gathered, (error, door.card if door is not None else None))
        errors = [f"rank {r}: {g[0]}" for r, g in enumerate(gathered)
                  if g is not None and g[0] is not None]
        if door is None:
            return errors, None
        cards = tuple(g[1] if g is not None else None for g in gathered)
        return errors, Meeting(door, cards, self.rank, self._group_timeout.total_seconds())

    def _prepare_load(
        self,
        checkpoint: VerifiedCheckpoint,
        template: Callable[[RankState], dict[str, Any]],
        state_type: type[RankState],
    ) -> tuple[RankState, dict[str, Any], VerifiedReader]:
        """This rank's state, the tensors to load into and the reader, once the keys
        agree."""
        rel = layout.rank_state_file(0 if self.resizable else self.rank)
        where = f"{checkpoint.where}/{rel}"
        if rel not in checkpoint.manifest.files:
            raise CheckpointError(f"{where}: no state for rank {self.rank}")
        try:
            rank_state = state_type.model_validate_json(checkpoint.read(rel))
        except ValidationError as e:
            raise CheckpointError(f"{where}: unreadable rank state: {e}") from e
        tensors = template(rank_state)
        reader = checkpoint.reader()
        self._check_keys(tensors, reader, checkpoint.where)
        return rank_state, tensors, reader

    def _check_keys(self, tensors: dict[str, Any], reader: VerifiedReader, where: str) -> None:
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
                f"{where}: missing key(s) in checkpoint: {', '.join(missing[:5])}"
                + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            )
        if unexpected:
            raise CheckpointError(
                f"{where}: unexpected key(s) in checkpoint: {', '.join(unexpected[:5])}"
                + (f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else "")
            )


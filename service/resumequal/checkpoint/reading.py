"""Reading a committed checkpoint: every byte checked against the manifest as it is read.

A resuming rank copies nothing. It reads the bytes DCP asks for into memory (from a folder,
or in ranged reads from an object store: a :class:`Source`), checks every chunk they fall
in against the manifest's BLAKE3 digests, and hands those same bytes to torch:
a file changed before the check is refused, naming the file and the chunk, and one
changed after it is never read again. A rank reads (and checks) only the chunks holding
what it loads. DCP's ``.metadata`` (a pickle) and a rank state are read and checked whole
before they are parsed, and no pickle is run even then: tensor records are read as opcodes
(:mod:`resumequal.checkpoint.records`), the metadata and the optimizer's param groups by
restricted unpicklers (:mod:`resumequal.checkpoint.unpickling`). The manifest itself was
authenticated before (:func:`resumequal.checkpoint.manifest.authenticate`), so nothing is
read before its MAC.

The ranks of one machine loading the same bytes (DDP's replicated state) split that work
when the manager asks (:attr:`VerifiedReader.meeting`): each chunk is read and checked once
per machine, by one of its ranks, into memory they share, and every rank loads from there
(:mod:`resumequal.checkpoint.node`); the chunks are read and checked by the same code
(:meth:`VerifiedCheckpoint.read_checked`) either way.
"""

from __future__ import annotations

import io
import os
from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent import futures
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol, cast

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from resumequal.checkpoint.chunks import HASH_THREADS, chunk_runs, digest
from resumequal.checkpoint.layout import DCP_DIR
from resumequal.checkpoint.manifest import FileEntry, Manifest
from resumequal.checkpoint.node import Meeting, Node
from resumequal.checkpoint.records import Memory, tensor_in_place
from resumequal.checkpoint.unpickling import load_item, load_metadata
from resumequal.errors import CheckpointError
from resumequal.store import regular

__all__ = ["FolderSource", "Opened", "Source", "VerifiedCheckpoint", "VerifiedReader"]

# What one read brings into memory at once (more only for a larger tensor): the ranges a
# rank loads from a file are read in runs of whole chunks up to this size, two at a time
# (one in use, the next read ahead).
WINDOW_BYTES = 32 << 20
# Runs past the one being read that a source is told are read next (Opened.prefetch).
_PREFETCH_RUNS = 2
_METADATA = ".metadata"
# Loads one item of DCP's plan from its checked bytes.
_Load = Callable[[ReadItem, _StorageInfo, memoryview], None]


class Opened(Protocol):
    """One file of a checkpoint, open for reads at any offset (from several threads)."""

    def read_into(self, offset: int, out: memoryview) -> int:
        """Bytes from ``offset`` into ``out``; how many (0 only at the file's end)."""
        ...

    def prefetch(self, offset: int, length: int) -> None:
        """A hint that bytes ``offset``..``offset + length`` are read next (no effect on
        what is read)."""
        ...

    def close(self) -> None:
        ...


class Source(Protocol):
    """Where a checkpoint's files are read from; nothing read is trusted."""

    @property
    def parallel(self) -> int:
        """Chunks fetched at once, each hashed by the thread that fetched it; 1: read in
        order by one thread, which hashes each chunk (its parts in BLAKE3's threads)."""
        ...

    def open(self, rel: str, size: int) -> Opened:
        """File ``rel``, which the manifest says has ``size`` bytes; CheckpointError if it
        is missing (or, where that costs nothing, of another size)."""
        ...


class _LocalFile:
    def __init__(self, f: io.FileIO) -> None:
        self._f = f

    def read_into(self, offset: int, out: memoryview) -> int:
        return os.preadv(self._f.fileno(), [out], offset)

    def prefetch(self, offset: int, length: int) -> None:
        # The kernel reads these in the background while a run is checked and loaded;
        # otherwise the disk idles between one read of a run and the next.
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._f.fileno(), offset, length, os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        self._f.close()


@dataclass(frozen=True)
class FolderSource:
    """A checkpoint's folder on this machine: its files opened from the folder above it
    without following a link, never blocking on a FIFO, regular files only."""

    directory: Path
    where: str
    parallel: int = 1

    def open(self, rel: str, size: int) -> _LocalFile:
        try:
            f = io.FileIO(regular.open_file(self.directory.parent,
                                            f"{self.directory.name}/{rel}"), "rb")
        except FileNotFoundError as e:
            raise CheckpointError(f"checkpoint {self.where} is refused: {rel} is listed in "
                                  "the manifest but missing") from e
        except (regular.NotRegular, NotADirectoryError, IsADirectoryError) as e:
            raise CheckpointError(f"checkpoint {self.where} is refused: "
                                  f"{e.strerror or e}") from e
        found = os.fstat(f.fileno()).st_size
        if found != size:
            f.close()
            raise CheckpointError(f"checkpoint {self.where} is refused: {rel} has {found} "
                                  f"bytes, the manifest says {size}")
        return _LocalFile(f)


@dataclass(frozen=True)
class VerifiedCheckpoint:
    """A committed checkpoint's files and its authenticated manifest; whatever is read
    through it has been checked against the manifest. ``where`` names it in errors."""

    source: Source
    manifest: Manifest
    where: str

    @property
    def name(self) -> str:
        return self.manifest.name

    def entry(self, rel: str) -> FileEntry:
        entry = self.manifest.files.get(rel)
        if entry is None:
            raise CheckpointError(f"checkpoint {self.where} is refused: {rel} is read but "
                                  "not listed in its manifest")
        return entry

    def read(self, rel: str) -> bytes:
        """File ``rel`` whole, once every chunk of it matched the manifest."""
        size = self.entry(rel).size
        with closing(self.read_ranges(rel, [(0, size)])) as views:
            return bytes(next(views))

    def sized(self, rel: str, ranges: Sequence[tuple[int, int]]) -> int:
        """The size of file ``rel``, once every ``(offset, length)`` of ``ranges`` is
        within it."""
        size = self.entry(rel).size
        for offset, length in ranges:
            if offset < 0 or length < 0 or offset + length > size:
                raise CheckpointError(
                    f"checkpoint {self.where} is refused: its metadata reads bytes "
                    f"{offset}-{offset + length} of {rel}, which has {size}")
        return size

    def read_ranges(self, rel: str,
                    ranges: Sequence[tuple[int, int]]) -> Generator[memoryview, None, None]:
        """The bytes of file ``rel`` at each ``(offset, length)`` of ``ranges`` (sorted by
        offset), each once every chunk it touches matched the manifest. A view is valid
        until the next one is taken.

        The file is read in runs of chunks (:func:`~resumequal.checkpoint.chunks.chunk_runs`);
        while the caller uses one run, the next is read and checked in a thread
        (:meth:`_fill`)."""
        entry = self.entry(rel)
        self.sized(rel, ranges)
        chunk = self.manifest.chunk_bytes
        runs = chunk_runs(ranges, chunk, max(1, WINDOW_BYTES // chunk))
        with (closing(self.source.open(rel, entry.size)) as f, ThreadPoolExecutor(1) as ahead,
              ThreadPoolExecutor(self.source.parallel) as hashers):
            buffers = [bytearray(), bytearray()]  # the run in use and the one read ahead

            def fill(n: int, previous: memoryview | None) -> memoryview:
                for later in runs[n + 1:n + 1 + _PREFETCH_RUNS]:
                    f.prefetch(later[0] * chunk, (later[1] + 1 - later[0]) * chunk)
                carry = None
                if previous is not None and runs[n - 1][1] == runs[n][0]:
                    carry = previous[(runs[n - 1][1] - runs[n - 1][0]) * chunk:]
                return self._fill(f, rel, entry, runs[n], carry, buffers, n % 2, hashers)

            ready = ahead.submit(fill, 0, None) if runs else None
            n, view = -1, memoryview(b"")
            try:
                for offset, length in ranges:
                    if length == 0:
                        yield memoryview(b"")
                        continue
                    if n < 0 or not (runs[n][0] * chunk <= offset
                                     and offset + length <= (runs[n][1] + 1) * chunk):
                        assert ready is not None
                        n, view = n + 1, ready.result()
                        # The other buffer held the run before this one: its views are done.
                        ready = (ahead.submit(fill, n + 1, view) if n + 1 < len(runs)
                                 else None)
                    start = offset - runs[n][0] * chunk
                    yield view[start:start + length]
            finally:
                if ready is not None:
                    ready.cancel()

    def _fill(self, f: Opened, rel: str, entry: FileEntry, window: tuple[int, int],
              carry: memoryview | None, buffers: list[bytearray], slot: int,
              hashers: Executor) -> memoryview:
        """Chunks ``window`` (first, last) of file ``f``, read into ``buffers[slot]`` and
        checked (:meth:`read_checked`); the first of them is ``carry`` when the previous
        window ended with it (checked already)."""
        chunk = self.manifest.chunk_bytes
        start, end = window[0] * chunk, min((window[1] + 1) * chunk, entry.size)
        if len(buffers[slot]) < end - start:  # a new one: a caller may still see the old
            buffers[slot] = bytearray(end - start)
        buf = memoryview(buffers[slot])[:end - start]
        first = window[0]
        if carry is not None:  # checked when the previous window was read
            buf[:len(carry)] = carry
            first += 1
        if first <= window[1]:
            self.read_checked(f, rel, first, window[1], buf[(first - window[0]) * chunk:],
                              hashers)
        return buf

    def read_checked(self, f: Opened, rel: str, first: int, last: int, out: memoryview,
                     hashers: Executor) -> None:
        """Chunks ``first``..``last`` of file ``rel`` (open as ``f``) read into ``out``, each
        checked against the manifest where it lies in ``out``. A source read in order is
        read in one call and each chunk hashed here; one fetched in parallel has each chunk
        fetched and hashed in ``hashers``."""
        chunk, entry = self.manifest.chunk_bytes, self.entry(rel)

        def piece(i: int) -> memoryview:
            return out[(i - first) * chunk:(i + 1 - first) * chunk]

        def read(i: int) -> memoryview:
            _read_fully(f, i * chunk, piece(i), self.where, rel, entry.size)
            return piece(i)

        digests: list[tuple[int, futures.Future[str]]] = []
        try:
            if self.source.parallel == 1:  # one read, in order
                end = min((last + 1) * chunk, entry.size)
                _read_fully(f, first * chunk, out[:end - first * chunk], self.where, rel,
                            entry.size)
            for i in range(first, last + 1):
                if self.source.parallel > 1:  # each chunk fetched and hashed in the pool
                    digests.append((i, hashers.submit(lambda i: digest(read(i)), i)))
                else:  # hashed here, each chunk's parts side by side in BLAKE3's threads
                    self._check(rel, entry, i, digest(piece(i), HASH_THREADS))
            for i, digested in digests:
                self._check(rel, entry, i, digested.result())
        except BaseException:
            for _, pending in digests:  # no more reads of a file already refused
                pending.cancel()
            raise

    def _check(self, rel: str, entry: FileEntry, i: int, found: str) -> None:
        chunk = self.manifest.chunk_bytes
        if found != entry.chunks[i]:
            raise CheckpointError(
                f"checkpoint {self.where} is refused: {rel} fails its BLAKE3 check at "
                f"chunk {i} (bytes {i * chunk}-{min((i + 1) * chunk, entry.size)} of "
                f"{entry.size}): it was changed after it was committed")

    def reader(self) -> VerifiedReader:
        """A DCP storage reader of this checkpoint's tensors."""
        return VerifiedReader(self)


def _read_fully(f: Opened, offset: int, out: memoryview, where: str, rel: str,
                size: int) -> None:
    """``len(out)`` bytes of ``f`` from ``offset``; refused if the file ends before."""
    done = 0
    while done < len(out):
        n = f.read_into(offset + done, out[done:])
        if not n:
            raise CheckpointError(f"checkpoint {where} is refused: {rel} ends at byte "
                                  f"{offset + done}, the manifest says {size}")
        done += n


class _Shares:
    """This rank's reads of its shares of a node's restore
    (:class:`resumequal.checkpoint.node.Shares`): each chunk read and checked as a rank
    alone reads and checks it (:meth:`VerifiedCheckpoint.read_checked`), the files kept
    open until the restore ends."""

    def __init__(self, checkpoint: VerifiedCheckpoint) -> None:
        self._checkpoint = checkpoint
        self._opened: dict[str, Opened] = {}
        self._hashers = ThreadPoolExecutor(checkpoint.source.parallel)

    def size(self, rel: str, ranges: Sequence[tuple[int, int]]) -> int:
        return self._checkpoint.sized(rel, ranges)

    def fill(self, rel: str, first: int, last: int, out: memoryview) -> None:
        self._checkpoint.read_checked(self._open(rel), rel, first, last, out, self._hashers)

    def prefetch(self, rel: str, first: int, last: int) -> None:
        chunk = self._checkpoint.manifest.chunk_bytes
        self._open(rel).prefetch(first * chunk, (last + 1 - first) * chunk)

    def _open(self, rel: str) -> Opened:
        if rel not in self._opened:
            self._opened[rel] = self._checkpoint.source.open(rel,
                                                             self._checkpoint.entry(rel).size)
        return self._opened[rel]

    def close(self) -> None:
        self._hashers.shutdown(cancel_futures=True)
        for opened in self._opened.values():
            opened.close()


class VerifiedReader(dcp.FileSystemReader):
    """DCP's file reader, reading only through a :class:`VerifiedCheckpoint`: each rank's
    byte ranges checked chunk by chunk, ``.metadata`` checked whole before it is
    unpickled, and torch given the very bytes that were checked.

    ``meeting``: the ranks of the process group DCP loads with met (their cards gathered,
    see :mod:`resumequal.checkpoint.node`): the ranks of one machine then read and check
    each chunk once between them and load it from the memory it was checked in. None: this
    rank reads and checks its own chunks."""

    def __init__(self, checkpoint: VerifiedCheckpoint, meeting: Meeting | None = None) -> None:
        super().__init__(f"{checkpoint.where}/{DCP_DIR}")  # a name: DCP opens nothing
        self.checkpoint = checkpoint
        self.meeting = meeting
        self._metadata: Metadata | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:  # DCP's fallback when the global one failed
            raise CheckpointError(f"checkpoint {self.checkpoint.where}: a save of ours "
                                  "writes no per-rank DCP metadata")
        if self._metadata is None:  # checked and unpickled once: the manager and DCP ask
            metadata = load_metadata(self.checkpoint.read(f"{DCP_DIR}/{_METADATA}"),
                                     self.checkpoint.where)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            self._metadata = metadata
        assert self._metadata.storage_meta is not None
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[tuple[ReadItem, _StorageInfo]]] = {}
        for item in plan.items:
            info: _StorageInfo = self.storage_data[item.storage_index]
            per_file.setdefault(f"{DCP_DIR}/{info.relative_path}", []).append((item, info))
        for pairs in per_file.values():
            pairs.sort(key=lambda pair: pair[1].offset)

        def load(item: ReadItem, info: _StorageInfo, view: memoryview) -> None:
            self._load(item, info, view, planner)

        node = self.meeting.node() if self.meeting is not None else None
        if node is None:
            self._read_alone(per_file, load)
        else:
            with closing(node):  # whatever fails here, its peers learn it at once
                self._read_shared(per_file, node, load)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _read_alone(self, per_file: dict[str, list[tuple[ReadItem, _StorageInfo]]],
                    load: _Load) -> None:
        """Load each item from its bytes, this rank reading and checking the chunks they
        are in."""
        for rel, pairs in per_file.items():
            ranges = [(info.offset, info.length) for _, info in pairs]
            with closing(self.checkpoint.read_ranges(rel, ranges)) as views:
                for (item, info), view in zip(pairs, views, strict=True):
                    load(item, info, view)

    def _read_shared(self, per_file: dict[str, list[tuple[ReadItem, _StorageInfo]]],
                     node: Node, load: _Load) -> None:
        """Load each item from its bytes in the rounds of this machine's restore: each
        round holds whole ranges, and the rounds of a file come in order of offset."""
        pending: dict[str, deque[tuple[ReadItem, _StorageInfo]]] = {}
        for rel, pairs in per_file.items():
            for item, info in pairs:
                if info.length == 0:  # nothing to read
                    load(item, info, memoryview(b""))
            pending[rel] = deque(pair for pair in pairs if pair[1].length)
        wanted = {rel: [(info.offset, info.length) for _, info in queue]
                  for rel, queue in pending.items()}
        shares = _Shares(self.checkpoint)
        rounds = node.restore(wanted, where=self.checkpoint.where,
                              chunk=self.checkpoint.manifest.chunk_bytes, shares=shares)
        with closing(shares), closing(rounds):
            for rel, base, window in rounds:
                queue = pending.get(rel, deque())
                while queue and queue[0][1].offset + queue[0][1].length <= base + len(window):
                    item, info = queue.popleft()
                    start = info.offset - base
                    load(item, info, window[start:start + info.length])
        assert not any(pending.values()), "a range no round of the node's restore held"

    def _load(self, item: ReadItem, info: _StorageInfo, data: memoryview,
              planner: LoadPlanner) -> None:
        """One item, from its checked bytes, as ``FileSystemReader.read_data`` does."""
        stream: IO[bytes] = cast(IO[bytes], Memory(data))
        # Stream extensions (torch >= 2.7) name themselves in the metadata; ours use none.
        descriptors = getattr(info, "transform_descriptors", None)
        if descriptors:
            stream = self.transforms.transform_load_stream(item, descriptors, stream)
        if item.type == LoadItemType.BYTE_IO:
            load_item(planner, item, stream.read(-1), self.checkpoint.where)
            return
        # The checked bytes viewed as the tensor, copied once into its destination below;
        # torch.load would copy them into a storage first.
        tensor = None if descriptors else tensor_in_place(data)
        if tensor is None:
            seekable = stream if stream.seekable() else io.BytesIO(stream.read(-1))
            tensor = torch.load(seekable, map_location="cpu", weights_only=True)
        tensor = narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)
        target = planner.resolve_tensor(item).detach()
        if target.size() != tensor.size():
            raise CheckpointError(
                f"checkpoint {self.checkpoint.where}: {item.storage_index.fqn} has shape "
                f"{tuple(tensor.size())} where {tuple(target.size())} is loaded")
        target.copy_(tensor)
        planner.commit_tensor(item, target)

"""A DCP writer whose shard files go to the store while DCP writes them, never to disk.

DCP's ``FileSystemWriter`` writes through a small file-system object (its ``fs``), the
extension point torch's own ``FsspecWriter`` uses
(torch/distributed/checkpoint/_fsspec_filesystem.py). :class:`StreamingWriter` swaps in
one whose ``create_stream`` for a shard (``*.distcp``) is an object writer of the store:
the bytes are hashed and sent in parallel parts as DCP serialises the tensors, so the
upload overlaps the serialisation and no second pass reads them for their digests. Everything
else DCP writes (its ``.metadata``, written to a temporary name and renamed) stays in the
local staging folder and is uploaded with the rank state afterwards.

Each shard's chunk digests (:mod:`resumequal.checkpoint.chunks`) are taken as DCP writes
it, and ``torch.save`` writes no zip CRC32 meanwhile, as for a folder
(:mod:`resumequal.checkpoint.writing`).

A shard object exists only once DCP closed its stream (a multipart upload completes at
``close``); a failure or a kill before leaves none, and the checkpoint stays uncommitted
either way: the commit protocol (:mod:`resumequal.checkpoint.remote`) is unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from resumequal.checkpoint.chunks import ChunkHasher
from resumequal.checkpoint.manifest import FileEntry
from resumequal.checkpoint.writing import HashedStream, HashingFiles, HashingWriter
from resumequal.store import Store
from resumequal.store.base import ObjectWriter

log = logging.getLogger(__name__)

SHARD_SUFFIX = ".distcp"


class _ShardStream(HashedStream):
    """What DCP writes a shard to: ``write``, ``tell``, ``flush``, ``close``.

    Not an ``io.IOBase`` on purpose: those close themselves when collected, and a close
    here completes the upload, which only DCP's own ``close`` after its last write may.
    """

    def __init__(self, writer: ObjectWriter, done: Callable[[FileEntry], None],
                 pool: Executor | None) -> None:
        super().__init__(writer, ChunkHasher(), pool)
        self._writer = writer
        self._done = done
        self.closed = False

    def flush(self) -> None:
        """Nothing to flush: full parts are already on their way."""

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._writer.close()
            self._done(FileEntry(size=self._hasher.size, chunks=self._hasher.digests()))


class _StoreShards(HashingFiles):
    """DCP's local file system (its other files hashed as written, as for a folder), but
    shard streams written straight to the store."""

    def __init__(self, staging: Path, store: Store, key: Callable[[str], str]) -> None:
        super().__init__(staging, sync=False)
        self._store = store
        self._key = key
        self.sent: dict[str, FileEntry] = {}

    @contextmanager
    def create_stream(self, path: str | Any, mode: str) -> Iterator[Any]:
        p = Path(path)
        if mode != "wb" or p.suffix != SHARD_SUFFIX:
            with super().create_stream(path, mode) as local:
                yield local
            return
        rel = p.relative_to(self._staging).as_posix()

        def done(entry: FileEntry) -> None:
            with self._lock:  # DCP may write several shards from several threads
                self.sent[rel] = entry

        writer = self._store.writer(self._key(rel))
        stream = _ShardStream(writer, done, self.pool)
        try:
            yield stream
            stream.close()
        except BaseException:
            writer.abort()
            raise


class StreamingWriter(HashingWriter):
    """A ``FileSystemWriter`` into ``staging/dcp`` that sends this rank's shards to the
    store as they are written, under ``key(<path relative to staging>)``.

    ``sent``: the shards that made it, with their manifest entries. ``written``: what went
    into the staging folder (DCP's ``.metadata``); it goes up at the publish.
    """

    def __init__(self, staging: Path, store: Store, key: Callable[[str], str]) -> None:
        self._shards = _StoreShards(staging, store, key)
        # Staged files are scratch (the store holds the checkpoint): no fsync. With
        # sync_files, DCP would call os.sync() on a stream that has no file descriptor.
        super().__init__(staging, sync=False, files=self._shards)

    @property
    def sent(self) -> dict[str, FileEntry]:
        with self._shards._lock:
            return dict(self._shards.sent)

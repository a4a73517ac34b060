"""A DCP writer whose shard files go to the store while DCP writes them, never to disk.

DCP's ``FileSystemWriter`` writes through a small file-system object (its ``fs``), the
extension point torch's own ``FsspecWriter`` uses
(torch/distributed/checkpoint/_fsspec_filesystem.py). :class:`StreamingWriter` swaps in
one whose ``create_stream`` for a shard (``*.distcp``) is an object writer of the store:
the bytes are hashed and sent in parallel parts as DCP serialises the tensors, so the
upload overlaps the serialisation and no second pass reads them for sha256. Everything
else DCP writes (its ``.metadata``, written to a temporary name and renamed) stays in the
local staging folder and is uploaded with the rank state afterwards.

DCP serialises every tensor with ``torch.save``, whose zip records carry a CRC32 of every
byte: a second hash beside the sha256 the manifest keeps (and every reader checks before
anything is loaded), and most of DCP's own CPU time. While shards stream, it is off
(``torch.serialization.set_crc32_options``; ``torch.load`` reads such records, says
torch/serialization.py). The switch is process-wide: a ``torch.save`` elsewhere in the
worker meanwhile writes no CRC either, which ``torch.load`` does not miss.

A shard object exists only once DCP closed its stream (a multipart upload completes at
``close``); a failure or a kill before leaves none, and the checkpoint stays uncommitted
either way: the commit protocol (:mod:`resumequal.checkpoint.remote`) is unchanged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.futures import Future
from typing_extensions import Buffer

from resumequal.checkpoint import layout
from resumequal.checkpoint.manifest import FileEntry
from resumequal.store import Store
from resumequal.store.base import ObjectWriter

log = logging.getLogger(__name__)

SHARD_SUFFIX = ".distcp"

_crc_lock = threading.Lock()
_crc_off = 0  # writes in progress that switched the zip CRC off
_crc_before = True


@contextmanager
def _no_zip_crc() -> Iterator[None]:
    """``torch.save`` writes no CRC32 meanwhile; the setting before is restored after the
    last of overlapping writes."""
    global _crc_off, _crc_before
    ser = torch.serialization
    if not hasattr(ser, "set_crc32_options"):  # a torch before the option: CRCs stay on
        yield
        return
    with _crc_lock:
        if _crc_off == 0:
            _crc_before = ser.get_crc32_options()
            ser.set_crc32_options(False)
        _crc_off += 1
    try:
        yield
    finally:
        with _crc_lock:
            _crc_off -= 1
            if _crc_off == 0:
                ser.set_crc32_options(_crc_before)


class _ShardStream:
    """What DCP writes a shard to: ``write``, ``tell``, ``flush``, ``close``.

    Not an ``io.IOBase`` on purpose: those close themselves when collected, and a close
    here completes the upload, which only DCP's own ``close`` after its last write may.
    """

    def __init__(self, writer: ObjectWriter, done: Callable[[FileEntry], None]) -> None:
        self._writer = writer
        self._done = done
        self.closed = False

    def writable(self) -> bool:
        return True

    def write(self, data: Buffer) -> int:
        return self._writer.write(data)

    def tell(self) -> int:
        return self._writer.tell()

    def flush(self) -> None:
        """Nothing to flush: full parts are already on their way."""

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            size = self._writer.tell()
            self._done(FileEntry(size=size, sha256=self._writer.close()))


class _StoreShards(FileSystem):
    """DCP's local file system, but shard streams written straight to the store."""

    def __init__(self, staging: Path, store: Store, key: Callable[[str], str]) -> None:
        super().__init__()
        self._staging = staging
        self._store = store
        self._key = key
        self._lock = threading.Lock()
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
        stream = _ShardStream(writer, done)
        try:
            yield stream
            stream.close()
        except BaseException:
            writer.abort()
            raise


class StreamingWriter(dcp.FileSystemWriter):
    """A ``FileSystemWriter`` into ``staging/dcp`` that sends this rank's shards to the
    store as they are written, under ``key(<path relative to staging>)``.

    ``sent``: the shards that made it, with their sizes and sha256s, for the manifest.
    """

    def __init__(self, staging: Path, store: Store, key: Callable[[str], str]) -> None:
        # Staged files are scratch (the store holds the checkpoint): no fsync. With
        # sync_files, DCP would call os.sync() on a stream that has no file descriptor.
        super().__init__(str(staging / layout.DCP_DIR), sync_files=False)
        self.fs: _StoreShards = _StoreShards(staging, store, key)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[Any]:
        # FileSystemWriter writes everything before it returns (a completed future).
        with _no_zip_crc():
            return super().write_data(plan, planner)

    @property
    def sent(self) -> dict[str, FileEntry]:
        with self.fs._lock:
            return dict(self.fs.sent)

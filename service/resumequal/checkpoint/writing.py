"""A DCP writer that hashes every file as it writes it, for the manifest: no second pass.

DCP's ``FileSystemWriter`` writes through a small file-system object (its ``fs``);
:class:`HashingWriter` swaps in one whose streams take each chunk's BLAKE3 digest
(:mod:`resumequal.checkpoint.chunks`) on the way to the file and fsync it once it is
whole, so the commit has every digest and every byte durable without reading a file
back. DCP's own fsync is off: it syncs without flushing the stream's buffer first.

Whoever can write the folder the files are staged in (a folder store) can plant links
there: every file is created ``O_CREAT|O_EXCL|O_NOFOLLOW`` (:class:`HashingFiles`), and
the manifest takes the digests of the bytes as written, never of what a file holds later.

DCP serialises every tensor with ``torch.save``, whose zip records carry a CRC32 of every
byte: a second checksum beside the BLAKE3 digests of the manifest (which every reader checks
before anything is loaded), and most of DCP's own CPU time. While a writer of ours
writes, it is off (:func:`no_zip_crc`).
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Protocol

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.futures import Future
from typing_extensions import Buffer

from resumequal.checkpoint import layout
from resumequal.checkpoint.chunks import HASH_THREADS, ChunkHasher
from resumequal.checkpoint.manifest import FileEntry
from resumequal.store import regular
from resumequal.store.base import TMP_SUFFIX

__all__ = ["HashedStream", "HashingFiles", "HashingWriter", "hashing_writes", "no_zip_crc"]

_crc_lock = threading.Lock()
_crc_off = 0  # writes in progress that switched the zip CRC off
_crc_before = True


@contextmanager
def no_zip_crc() -> Iterator[None]:
    """``torch.save`` writes no CRC32 meanwhile (``torch.load`` reads such records, says
    torch/serialization.py); the setting before is restored after the last of
    overlapping writes. The switch is process-wide: a ``torch.save`` elsewhere in the
    worker meanwhile writes no CRC either, which ``torch.load`` does not miss."""
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


class _Hashing(Protocol):
    pool: Executor | None


@contextmanager
def hashing_writes(fs: _Hashing) -> Iterator[None]:
    """While DCP writes: ``fs.pool`` hashes whole chunks side by side, and ``torch.save``
    writes no zip CRC (:func:`no_zip_crc`)."""
    with no_zip_crc(), ThreadPoolExecutor(HASH_THREADS) as pool:
        fs.pool = pool
        try:
            yield
        finally:
            fs.pool = None


class _Sink(Protocol):
    def write(self, data: Buffer, /) -> int: ...

    def tell(self) -> int: ...


class HashedStream:
    """Writes on to ``sink``, every byte hashed as it goes (the whole chunks of a large
    write in ``pool``, while it is written)."""

    def __init__(self, sink: _Sink, hasher: ChunkHasher, pool: Executor | None) -> None:
        self._sink = sink
        self._hasher = hasher
        self._pool = pool

    def writable(self) -> bool:
        return True

    def write(self, data: Buffer) -> int:
        # Within the call: ``data`` may be torch's own buffer, valid only until we return.
        # Its whole chunks are hashed in the pool while this thread writes it.
        finish = self._hasher.start(data, self._pool)
        try:
            return self._sink.write(data)
        finally:
            finish()

    def tell(self) -> int:
        return self._sink.tell()


class _HashedFile(HashedStream):
    """What DCP writes a file through: every byte hashed and written to the file."""

    def __init__(self, file: IO[bytes], hasher: ChunkHasher, pool: Executor | None) -> None:
        super().__init__(file, hasher, pool)
        self._file = file

    def flush(self) -> None:
        self._file.flush()

    def fileno(self) -> int:
        return self._file.fileno()

    def close(self) -> None:
        """DCP closes its streams itself; the file is closed (and synced) once whole."""


class HashingFiles(FileSystem):
    """DCP's local file system, every file it writes hashed (and fsynced, with ``sync``).

    The staging folder may be one others write (a folder store), so every file is created
    ``O_CREAT|O_EXCL|O_NOFOLLOW`` below it, never through a link (a name planted first
    fails the save), and DCP's fixed temporary name for its ``.metadata`` becomes a fresh
    random one (:mod:`resumequal.store.regular`)."""

    def __init__(self, staging: Path, sync: bool) -> None:
        super().__init__()
        self._staging = staging
        self._sync = sync
        self._lock = threading.Lock()
        self.written: dict[str, FileEntry] = {}
        self.pool: Executor | None = None  # hashes whole chunks side by side, while set
        self._fresh: dict[str, str] = {}  # DCP's temporary name -> the one written

    def _rel(self, path: str | os.PathLike[str]) -> str:
        return Path(path).relative_to(self._staging).as_posix()

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        regular.make_dirs(self._staging, self._rel(path))

    def _create(self, rel: str) -> str:
        """The name file ``rel`` is created under: a fresh one for a temporary name."""
        if not rel.endswith(".tmp"):
            return rel
        parent, _, name = rel.rpartition("/")
        fresh = f"{parent}/.{name}.{secrets.token_hex(8)}{TMP_SUFFIX}".lstrip("/")
        with self._lock:
            self._fresh[rel] = fresh
        return fresh

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        hasher = ChunkHasher()
        fd = regular.create_file(self._staging, self._create(self._rel(path)))
        with os.fdopen(fd, "wb") as f:
            yield _HashedFile(f, hasher, self.pool)
            f.flush()
            if self._sync:  # the staged files become the checkpoint at the commit's rename
                os.fsync(f.fileno())
        entry = FileEntry(size=hasher.size, chunks=hasher.digests())
        with self._lock:  # DCP may write several files from several threads
            self.written[self._rel(path)] = entry

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        # DCP's .metadata, written to a temporary name
        with self._lock:
            src = self._fresh.pop(self._rel(path), self._rel(path))
        regular.rename(self._staging, src, self._rel(new_path))
        with self._lock:
            entry = self.written.pop(self._rel(path), None)
            if entry is not None:
                self.written[self._rel(new_path)] = entry

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        with self._lock:
            src = self._fresh.pop(self._rel(path), self._rel(path))
            self.written.pop(self._rel(path), None)
        regular.unlink(self._staging, src)


class HashingWriter(dcp.FileSystemWriter):
    """A ``FileSystemWriter`` into ``staging/dcp`` that hashes what it writes.

    ``written``: every file it wrote, relative to ``staging``, with its manifest entry.
    ``sync``: fsync each file once written (it becomes the checkpoint). ``files``: the file
    system it writes through, where not a plain :class:`HashingFiles` of ``staging``.
    """

    def __init__(self, staging: Path, *, sync: bool, files: HashingFiles | None = None) -> None:
        super().__init__(str(staging / layout.DCP_DIR), sync_files=False)
        self.fs: HashingFiles = files if files is not None else HashingFiles(staging, sync)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[Any]:
        # FileSystemWriter writes everything before it returns (a completed future).
        with hashing_writes(self.fs):
            return super().write_data(plan, planner)

    @property
    def written(self) -> dict[str, FileEntry]:
        """The files written into the staging folder, with their entries from the bytes as
        written."""
        with self.fs._lock:
            return dict(self.fs.written)

"""Per-chunk BLAKE3 digests of a checkpoint's files: taken as they are written, checked as
they are read.

A file is cut into fixed chunks (the manifest's ``chunk_bytes``, the last one shorter) and
the manifest keeps one digest per chunk, so a reader that needs a few tensors of a file
verifies just the chunks holding them. Imports no torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future

import blake3
from typing_extensions import Buffer

__all__ = ["CHUNK_BYTES", "HASH_THREADS", "ChunkHasher", "chunk_count", "chunk_digests",
           "chunk_runs", "digest"]

# Large enough that a chunk's own costs (a digest, a task) vanish and a manifest stays small
# (a 1 GB file: 256 digests), small enough that a rank reading one tensor reads little
# beyond it.
CHUNK_BYTES = 4 << 20
# Threads hashing chunks side by side: hashing is most of what a save or restore adds.
HASH_THREADS = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                   else os.cpu_count() or 1)


def chunk_count(size: int, chunk_bytes: int) -> int:
    """How many chunks a file of ``size`` bytes has (none when it is empty)."""
    return -(-size // chunk_bytes)


class ChunkHasher:
    """The chunk digests of bytes written one piece after another."""

    def __init__(self, chunk_bytes: int = CHUNK_BYTES) -> None:
        self._chunk_bytes = chunk_bytes
        self._hash = blake3.blake3()
        self._filled = 0
        self.size = 0
        self._digests: list[str] = []

    def update(self, data: Buffer, pool: Executor | None = None) -> None:
        """Hash ``data``, next in the file; ``pool`` hashes its whole chunks side by side
        (hashlib lets go of the GIL) before this returns."""
        self.start(data, pool)()

    def start(self, data: Buffer, pool: Executor | None = None) -> Callable[[], None]:
        """Begin hashing ``data``, next in the file, its whole chunks in ``pool``; what to
        call (before anything else of this hasher, with ``data`` unchanged) to finish."""
        view = memoryview(data).cast("B")
        if self._filled:  # the rest of the chunk under way
            view = self._add(view[:self._chunk_bytes - self._filled], view)
        whole = len(view) - len(view) % self._chunk_bytes
        pending: list[Future[str]] = []
        if pool is not None and whole >= 2 * self._chunk_bytes:
            pending = [pool.submit(digest, view[i:i + self._chunk_bytes])
                       for i in range(0, whole, self._chunk_bytes)]
            self.size += whole
            view = view[whole:]
        while view:  # a tail starts the next chunk: its digest comes after these
            view = self._add(view[:self._chunk_bytes - self._filled], view)

        def finish() -> None:
            self._digests[len(self._digests):] = [p.result() for p in pending]

        return finish

    def _add(self, piece: memoryview, view: memoryview) -> memoryview:
        """Hash ``piece`` (the start of ``view``) into the chunk under way; the rest."""
        self._hash.update(piece)
        self._filled += len(piece)
        self.size += len(piece)
        if self._filled == self._chunk_bytes:
            self._digests.append(self._hash.hexdigest())
            self._hash, self._filled = blake3.blake3(), 0
        return view[len(piece):]

    def digests(self) -> list[str]:
        """Every chunk's digest, the last (partial) one included; call once writing ended."""
        if self._filled:
            return [*self._digests, self._hash.hexdigest()]
        return list(self._digests)


def chunk_digests(data: Buffer, chunk_bytes: int = CHUNK_BYTES) -> list[str]:
    """The chunk digests of ``data``, whole in memory."""
    hasher = ChunkHasher(chunk_bytes)
    hasher.update(data)
    return hasher.digests()


def digest(data: Buffer, threads: int = 1) -> str:
    """The BLAKE3 digest of one chunk, hex; ``threads`` > 1 hashes its parts side by side
    (in BLAKE3's own threads, outside the GIL)."""
    if threads > 1:
        return blake3.blake3(data, max_threads=threads).hexdigest()
    return blake3.blake3(data).hexdigest()


def chunk_runs(ranges: Sequence[tuple[int, int]], chunk: int,
               most: int) -> list[tuple[int, int]]:
    """Runs of chunks (first, last) to read for ``ranges``, in order: each holds whole
    ranges, spans at most ``most`` chunks unless one range is longer, and skips chunks
    no range touches. Consecutive runs may share their boundary chunk."""
    runs: list[tuple[int, int]] = []
    for offset, length in ranges:
        if length == 0:
            continue
        first, last = offset // chunk, (offset + length - 1) // chunk
        if runs and first <= runs[-1][1] + 1 and max(last, runs[-1][1]) - runs[-1][0] < most:
            runs[-1] = (runs[-1][0], max(last, runs[-1][1]))
        elif runs and first >= runs[-1][0] and last <= runs[-1][1]:
            continue
        else:
            runs.append((first, last))
    return runs

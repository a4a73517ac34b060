"""Append-only logs of lines (traces) as immutable segment objects, on any store.

No store is asked to append: a writer puts immutable segment objects
``<prefix>/<seq>.jsonl`` (by default one per line), each ending in a trailer line with its
line count and sha256, so a segment is whole or absent after a SIGKILL, and a corrupted or
missing one is reported by name. This is the one trace format of a run location.

Written with a :class:`Sealer` (the run's, see ``resumequal.run.signing.RunSeal``), the trailer
also holds the MAC of the records under the segment's name: a reader with the seal
refuses a segment written without it, changed since, or copied from another run, leg,
rank, attempt or place in the sequence, before it parses a byte of it.

:class:`FileSink` appends lines to one plain file instead: the shape of an exported trace
(``rank-<r>.jsonl``, see ``RunLocation.materialize``), for benches and tests that write a
trace outside any run location. A line torn by a kill mid-write is cut when the file is
opened again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO, Protocol

from resumequal.errors import TraceError, TraceNotAuthentic
from resumequal.store.base import Store

log = logging.getLogger(__name__)

_TRAILER_KEY = "segment"
# The MAC as the trailer holds it, read without parsing the trailer (nothing of a segment is
# parsed before it is authenticated).
_TRAILER_MAC = re.compile(rb'"mac":"([0-9a-f]{64})"')

__all__ = ["FileSink", "LineSink", "Sealer", "SegmentSink", "parse_segment", "segment_bytes"]


class Sealer(Protocol):
    """What MACs a segment under its name: the run's seal."""

    def mac(self, name: str, data: bytes) -> str: ...

    def authentic(self, name: str, data: bytes, mac: bytes) -> bool: ...


class LineSink(Protocol):
    """Where a writer's lines go; :class:`FileSink` and :class:`SegmentSink` are two."""

    def append(self, line: bytes) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def _drop_torn_tail(path: Path) -> None:
    """Cut a partial last line left by a writer killed mid-write, so appends start clean.

    Only one process writes a rank's trace at a time (the elastic launcher restarts a rank
    after its previous process is gone), so truncating here races with nobody.
    """
    try:
        f = path.open("r+b")
    except FileNotFoundError:
        return
    with f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        end = size
        keep = 0
        while end > 0:
            start = max(0, end - 65536)
            f.seek(start)
            cut = f.read(end - start).rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                break
            end = start
        log.warning(
            "%s: dropping %d bytes of a partial last line (a writer was killed mid-line)",
            path,
            size - keep,
        )
        f.truncate(keep)


class FileSink:
    """Appends lines to a file on this machine; each is handed to the OS at once.

    A line torn by a writer killed mid-write is cut when the file is opened again.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _drop_torn_tail(self.path)
        self._file: BinaryIO = self.path.open("ab")

    def append(self, line: bytes) -> None:
        if self._file.closed:
            raise ValueError("write to a closed trace")
        self._file.write(line if line.endswith(b"\n") else line + b"\n")
        # flush() puts the line in the kernel's page cache, which outlives a SIGKILL of this
        # process; fsync would only matter for a machine crash, which a preemption test
        # does not simulate, and it would cost milliseconds per step.
        self._file.flush()

    def flush(self) -> None:
        """Nothing to do: every line was handed to the OS when appended."""

    def close(self) -> None:
        self._file.close()


def segment_bytes(lines: Sequence[bytes], seq: int, seal: Sealer | None = None,
                  name: str = "") -> bytes:
    """One trace segment: the record lines, then a trailer with their count and sha256 (and,
    with ``seal``, their MAC as object ``name``)."""
    body = b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines)
    fields: dict[str, object] = {"seq": seq, "records": len(lines),
                                 "sha256": hashlib.sha256(body).hexdigest()}
    if seal is not None:
        fields["mac"] = seal.mac(name, body)
    trailer = {_TRAILER_KEY: fields}
    return body + json.dumps(trailer, separators=(",", ":")).encode() + b"\n"


def parse_segment(data: bytes, where: str, seal: Sealer | None = None,
                  name: str = "") -> list[bytes]:
    """The record lines of a segment, checked against its trailer (and, with ``seal``,
    authenticated as object ``name`` first); TraceError naming ``where`` if it is truncated,
    corrupted, not a segment, or not this run's."""
    if not data.endswith(b"\n"):
        raise TraceError(f"{where}: truncated trace segment (no final newline)")
    lines = data[:-1].split(b"\n")
    records = lines[:-1]
    body = b"".join(line + b"\n" for line in records)
    if seal is not None:
        found = _TRAILER_MAC.search(lines[-1])
        if found is None:
            raise TraceNotAuthentic(f"{where}: trace segment refused: it carries no MAC, so it "
                             "cannot be authenticated as this run's")
        if not seal.authentic(name, body, found.group(1)):
            raise TraceNotAuthentic(
                f"{where}: trace segment refused: its MAC does not hold for this run and this "
                "name (written without this run's key, changed since, or copied from another "
                "run, leg, rank or attempt)")
    try:
        trailer = json.loads(lines[-1])[_TRAILER_KEY]
        count, digest = int(trailer["records"]), str(trailer["sha256"])
    except (ValueError, KeyError, TypeError, IndexError, RecursionError) as e:
        raise TraceError(f"{where}: corrupted trace segment (no valid trailer)") from e
    if len(records) != count or hashlib.sha256(body).hexdigest() != digest:
        raise TraceError(
            f"{where}: corrupted trace segment ({len(records)} line(s), sha256 "
            f"{hashlib.sha256(body).hexdigest()[:16]}…; its trailer says {count}, "
            f"{digest[:16]}…)"
        )
    return [line + b"\n" for line in records]


class SegmentSink:
    """Writes one rank's trace of one attempt as segment objects, ``every`` records each.

    Each segment is uploaded before :meth:`append` (or :meth:`flush`) returns, so what a
    SIGKILL can lose is at most the records not yet flushed: none with ``every=1``.
    """

    def __init__(self, store: Store, prefix: str, *, every: int = 1,
                 seal: Sealer | None = None) -> None:
        if every < 1:
            raise ValueError("every must be >= 1")
        self.store = store
        self.prefix = prefix
        self.every = every
        self.seal = seal
        self._buffer: list[bytes] = []
        # A re-run of the same attempt (a rescheduled pod) continues after what is there.
        taken = [_seq_of(o.key) for o in store.list(prefix)]
        self.seq = max((s for s in taken if s is not None), default=-1) + 1

    def key(self, seq: int) -> str:
        return f"{self.prefix}/{seq:08d}.jsonl"

    def append(self, line: bytes) -> None:
        self._buffer.append(line)
        if len(self._buffer) >= self.every:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        data = segment_bytes(self._buffer, self.seq, self.seal, self.key(self.seq))
        # A segment must outlive a SIGKILL of its writer, not a crash of the machine (which
        # a preemption test does not simulate): no fsync per record.
        self.store.put_bytes(self.key(self.seq), data, sync=False)
        self._buffer = []
        self.seq += 1

    def close(self) -> None:
        self.flush()


def _seq_of(key: str) -> int | None:
    name = key.rsplit("/", 1)[-1]
    if not name.endswith(".jsonl"):
        return None
    try:
        return int(name.removesuffix(".jsonl"))
    except ValueError:
        return None



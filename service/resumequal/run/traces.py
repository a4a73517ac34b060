"""A leg's trace in its run location: written as segments, read back as trace records.

A trace is immutable segment objects ``<leg>/trace/rank-<r>/attempt-<a>/<seq>.jsonl`` (by
default one per record), each ending in a trailer line with its record count and sha256
(:mod:`resumequal.store.log`), so a segment is whole or absent after a SIGKILL, and a
corrupted or missing one is reported by name. With the run's seal each segment carries its
MAC and one that does not hold for this run is refused.

:class:`LegTraces` is the one reader of traces: everything that reads one (the comparator,
the backends' progress, the timeline, the report, zoom) gets the record models of
:mod:`resumequal.trace.records` from it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from resumequal.errors import TraceError
from resumequal.run.layout import SEGMENT_BYTES, SEGMENT_NAME, count
from resumequal.run.signing import RunSeal
from resumequal.store import Store, StoreNotFound, StoreObjectTooLarge
from resumequal.store.log import SegmentSink, parse_segment
from resumequal.trace.records import TraceRecord, parse_records, records_in

log = logging.getLogger(__name__)

__all__ = ["LegTraces", "Segment", "verified_lines"]


@dataclass(frozen=True, order=True)
class Segment:
    """One trace segment object: ``<leg>/trace/rank-<r>/attempt-<a>/<seq>.jsonl``."""

    rank: int
    attempt: int
    seq: int
    key: str


def verified_lines(store: Store, segments: Sequence[Segment], seal: RunSeal | None = None,
                   within: str = "") -> list[bytes]:
    """The record lines of one rank's segments (sorted), each authenticated with ``seal``
    (when given) and checked against its trailer, and the sequence checked for gaps;
    TraceError naming a corrupted, missing or foreign segment. ``within``: the sub-run
    folder (``seed-11/``) the segments' names are taken relative to, as the seal's are."""
    lines: list[bytes] = []
    expected: tuple[int, int] | None = None
    for s in segments:
        if expected is not None and expected[0] == s.attempt and s.seq != expected[1]:
            missing = s.key.rsplit("/", 1)[0] + f"/{expected[1]:08d}.jsonl"
            raise TraceError(f"{store.uri(missing)}: trace segment missing (the "
                             f"next one present is {s.seq:08d})")
        if (expected is None or expected[0] != s.attempt) and s.seq != 0:
            missing = s.key.rsplit("/", 1)[0] + "/00000000.jsonl"
            raise TraceError(f"{store.uri(missing)}: trace segment missing (the "
                             f"first one present is {s.seq:08d})")
        lines += parse_segment(store.get_bytes(s.key, SEGMENT_BYTES), store.uri(s.key),
                               seal, s.key.removeprefix(within))
        expected = (s.attempt, s.seq + 1)
    return lines


@dataclass
class LegTraces:
    """One leg's trace under ``<prefix>`` (``<leg>/trace``), the one format on every store.

    Workers write through :meth:`sink`; the comparator reads a rank's whole trace with
    :meth:`records` (strict), the backends, the timeline and the report read what the ranks
    wrote so far with :meth:`records_so_far` (lenient).
    """

    store: Store
    prefix: str
    seal: RunSeal | None = field(default=None, repr=False, compare=False)
    # Segments are immutable once written: each one is parsed once per run location.
    cache: dict[str, list[TraceRecord]] = field(default_factory=dict, repr=False,
                                                compare=False)

    def rank_prefix(self, rank: int) -> str:
        """The store prefix of one rank's segments."""
        return f"{self.prefix}/rank-{rank}"

    def uri(self, rank: int) -> str:
        """Where one rank's segments are, for messages."""
        return self.store.uri(self.rank_prefix(rank))

    def sink(self, rank: int, attempt: int, every: int = 1) -> SegmentSink:
        """Where one rank of one attempt writes: a segment every ``every`` records."""
        return SegmentSink(self.store, f"{self.rank_prefix(rank)}/attempt-{attempt}",
                           every=every, seal=self.seal)

    def segments(self, rank: int | None = None) -> list[Segment]:
        """Every segment of the leg (or of one rank), in write order: one LIST."""
        base = self.prefix if rank is None else self.rank_prefix(rank)
        found = []
        for obj in self.store.list(base):
            m = SEGMENT_NAME.match(obj.key[len(self.prefix) + 1:])
            # A rank or attempt beyond int32 is no worker's: a name someone else chose.
            if m is not None and count(int(m.group(1))) is not None \
                    and count(int(m.group(2))) is not None:
                found.append(Segment(int(m.group(1)), int(m.group(2)), int(m.group(3)),
                                     obj.key))
        return sorted(found)

    def records(self, rank: int) -> list[TraceRecord]:
        """One rank's whole trace, every attempt in order, each segment verified;
        StoreNotFound when the rank wrote none, TraceError naming a damaged or missing
        segment, or a line that is no trace record."""
        segments = self.segments(rank)
        if not segments:
            raise StoreNotFound(f"{self.uri(rank)}: no trace segments")
        return parse_records(verified_lines(self.store, segments, self.seal), self.uri(rank))

    def records_so_far(self, world_size: int) -> dict[int, list[TraceRecord]]:
        """Each rank's trace records so far, leniently: a segment that cannot be read (being
        damaged, or gone) is skipped with a warning, and a line that is no trace record
        left out. A rank that wrote nothing is absent."""
        out: dict[int, list[TraceRecord]] = {}
        for s in self.segments():
            if s.rank >= world_size:
                continue
            records = self.cache.get(s.key)
            if records is None:
                try:
                    data = self.store.get_bytes(s.key, SEGMENT_BYTES)
                    lines = parse_segment(data, self.store.uri(s.key), self.seal, s.key)
                except (TraceError, StoreObjectTooLarge) as e:
                    # Immutable once written: said once, and never counted as progress.
                    log.warning("progress: skipping %s: %s", self.store.uri(s.key), e)
                    self.cache[s.key] = []
                    continue
                except StoreNotFound as e:
                    log.warning("progress: skipping %s: %s", self.store.uri(s.key), e)
                    continue
                records = self.cache[s.key] = records_in(lines)
            out.setdefault(s.rank, []).extend(records)
        return out

    def attempts_started(self) -> int:
        """How many attempts have written (the attempt is in every segment's name)."""
        return max((s.attempt for s in self.segments()), default=-1) + 1

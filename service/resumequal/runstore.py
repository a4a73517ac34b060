"""The run location: where everything of one qualification lives, a folder or ``s3://``.

A run location is a local folder (a path or ``file://`` URI) or an object-store prefix
``s3://bucket/prefix/<namespace>/<run>/<uid>``. The layout relative to it is the same on
both::

    run.json                         the spec and its digest (written once, by the first leg)
    spec.json                        the qualification's spec
    legs/<leg>.spec.json             a leg's own spec and omissions (what its workers read)
    <leg>/trace/...                  per-rank trace records (see below)
    <leg>/beacons/attempt-<a>-rank-<r>.json    an armed worker: who to kill
    <leg>/beacons/kill-attempt-<a>-rank-<r>.json    a kill order for that worker
    <leg>/done/rank-<r>.json         the rank finished: trace closed, final checkpoint committed
    <leg>/FAILED.json                the leg failed for good, and why
    <leg>/checkpoints/...            committed checkpoints
    verdict.json, report.json, report.html, metrics.prom

Everything goes through the location's :class:`~resumequal.store.Store`, the same way on
every store. With the run's seal (:class:`~resumequal.signing.RunSeal`) every JSON object
here carries its MAC in a ``mac`` field and every result file a ``<name>.mac`` beside it;
a reader with the seal acts only on what holds for this run and name. A trace is immutable
segment objects ``<leg>/trace/rank-<r>/attempt-<a>/<seq>.jsonl`` (by default one per
record), each ending in a trailer line with its record count and sha256, so a segment is
whole or absent after a SIGKILL, and a corrupted or missing one is reported by name
(:class:`LegTraces`). :meth:`RunLocation.materialize` exports a copy of a run with each
rank's trace joined into ``<leg>/trace/rank-<r>.jsonl``, for people.

Beacons, kill orders and pod kill records are read and written through their models
(:mod:`resumequal.runfiles`), trace records through theirs (:mod:`resumequal.trace.records`).

This module is shared with the operator: it must import neither torch nor numpy, nor the
worker side (``train``, ``checkpoint``, the trace's digests), nor ``report``.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import math
import os
import re
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, ValidationError

from resumequal.errors import NotAuthentic, ReportError, StoreError, TraceError, TrainingError
from resumequal.runfiles import MAX_EPOCH_SECONDS, Beacon, InvalidBeacon, KillOrder, PodKill
from resumequal.signing import MAC_FIELD, RunSeal
from resumequal.spec import (
    OMISSIONS,
    QualificationSpec,
    SpecError,
    check_leg_name,
    format_validation_error,
)
from resumequal.store import (
    Store,
    StoreIntegrityError,
    StoreNotFound,
    StoreObjectTooLarge,
    StoreSettings,
    open_store,
)
from resumequal.store.log import (
    SegmentSink,
    parse_segment,
    segment_bytes,
)
from resumequal.trace.records import StepRecord, TraceRecord, records_in
from resumequal.words import clip

if TYPE_CHECKING:
    # The verdict's models load only where one is read: a worker never reads one.
    from resumequal.verdict import Verdict, Zoom

log = logging.getLogger(__name__)
_M = TypeVar("_M", bound=BaseModel)
_R = TypeVar("_R")

RUN_FILE = "run.json"
SPEC_FILE = "spec.json"
FAILED_MARKER = "FAILED.json"
VERDICT_JSON = "verdict.json"
REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
METRICS_PROM = "metrics.prom"
# Written by ``resumequal zoom`` beside the results: the replay of a divergent step.
ZOOM_JSON = "zoom.json"
RESULT_FILES = (VERDICT_JSON, REPORT_JSON, REPORT_HTML, METRICS_PROM)
# A result file's MAC sits beside it: ``verdict.json.mac``.
RESULT_MAC_SUFFIX = ".mac"
# How much a reader takes of an object before it refuses it (a planted 150 MiB marker must
# not cost the operator its memory): markers, beacons, kill orders and spec files hold a
# few KiB, a trace segment one batch of records, results and reports a run's steps.
SMALL_OBJECT_BYTES = 1 << 20
# How much of a failure's reason a FAILED.json keeps (a traceback's worth).
FAILURE_REASON_BYTES = 64 << 10
SEGMENT_BYTES = 16 << 20
RESULT_BYTES = 64 << 20

_SEGMENT = re.compile(r"^rank-(\d+)/attempt-(\d+)/(\d{8,})\.jsonl$")
# Any trace segment under the location, seed-matrix sub-runs (seed-N/<leg>/...) included.
_ANY_SEGMENT = re.compile(r"^(.+)/trace/rank-(\d+)/attempt-(\d+)/(\d{8,})\.jsonl$")
_DONE = re.compile(r"^rank-(\d+)\.json$")

__all__ = [
    "FAILED_MARKER",
    "RESULT_FILES",
    "RUN_FILE",
    "LegFiles",
    "LegProgress",
    "LegSpecFile",
    "RunLocation",
    "SegmentSink",
    "parse_segment",
    "segment_bytes",
]


@dataclass(frozen=True)
class LegProgress:
    """How far a leg got: steps every rank finished, attempts seen, and when the resume
    completed (the latest rank's first finished step of an attempt >= 1)."""

    steps_done: int = 0
    attempts: int = 0
    resumed_at: float | None = None


class LegSpecFile(BaseModel):
    """``legs/<leg>.spec.json``: what a leg's workers run, read by ``resumequal leg``."""

    model_config = ConfigDict(extra="forbid")
    leg: str
    spec: QualificationSpec
    omit: list[str] = []


# --------------------------------------------------------------------------- segments


def _loads(data: bytes) -> Any:
    """JSON from the store; ValueError for anything that is not JSON this reader takes
    (too deep a nesting included: whoever writes to the store chooses it)."""
    try:
        return json.loads(data)
    except RecursionError as e:
        raise ValueError("nested too deeply") from e


def _seal(seal: RunSeal | None, key: str, body: dict[str, Any]) -> bytes:
    """``body`` as stored under ``key``: sealed with the run's MAC where the writer holds
    the run's seal (every process of a run does; a bare folder in a test may not)."""
    return json.dumps(body).encode() if seal is None else seal.seal_json(key, body)


def _unseal(seal: RunSeal | None, key: str, data: bytes, uri: str, what: str) -> Any:
    """The JSON stored under ``key``; with ``seal``, only an object whose MAC holds for this
    run and this name: NotAuthentic otherwise, whatever its form (not JSON, nested too
    deeply, a number no parser takes: nothing a sealing writer wrote; a bucket writer's
    object, one copied from another run or another name). Without a seal, ValueError for
    what is not JSON."""
    if seal is None:
        value = _loads(data)
        if isinstance(value, dict):
            value.pop(MAC_FIELD, None)
        return value
    try:
        body = seal.open_json(key, _loads(data))
    except ValueError as e:
        raise NotAuthentic(f"{uri}: not {what} of this run: not JSON a sealing writer "
                           f"writes ({e})") from e
    if body is None:
        raise NotAuthentic(f"{uri}: not {what} of this run: its MAC is missing or does not "
                           f"hold for run {seal.run} (written by someone without the run's "
                           "key, or copied from another run or another name)")
    return body


# What was said of objects that are not this run's: each once per process, and a bounded
# number of them (whoever writes the store chooses how many there are).
_WARNED: set[str] = set()
_MAX_WARNED = 256


def _warn_once(message: str) -> None:
    if message not in _WARNED and len(_WARNED) < _MAX_WARNED:
        _WARNED.add(message)
        log.warning("%s", message)


def _json_lines(lines: Iterable[bytes]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        try:
            value = _loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def _count(value: Any) -> int | None:
    """``value`` if it is a step or attempt number a status can hold (int32), else None."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31
    return value if ok else None


def _epoch(value: Any) -> float | None:
    """``value`` if it is a time a status can hold (epoch seconds), else None."""
    ok = (isinstance(value, int | float) and not isinstance(value, bool)
          and math.isfinite(value) and 0 <= value <= MAX_EPOCH_SECONDS)
    return float(value) if ok else None


def progress_of(per_rank: dict[int, list[TraceRecord]], world_size: int) -> LegProgress:
    """Progress from each rank's trace records (in write order)."""
    per_rank_steps: list[int] = []
    attempts = 0
    resumed: list[float] = []
    for r in range(world_size):
        done = 0
        first_resumed: float | None = None
        for rec in per_rank.get(r, []):
            # Records come from the store: a number no status holds is no progress (the
            # comparator reads the trace strictly and names it).
            attempt = _count(rec.attempt)
            if attempt is None:
                continue
            attempts = max(attempts, attempt + 1)
            if not isinstance(rec, StepRecord):
                continue
            step = _count(rec.step)
            if step is None:
                continue
            done = max(done, step)
            # Whoever writes the store writes these: 1e300 would overflow every
            # timestamp made of it (the operator's status, on every reconcile).
            at = _epoch(rec.finished_at)
            if attempt >= 1 and first_resumed is None and at is not None:
                first_resumed = at
        per_rank_steps.append(done)
        if first_resumed is not None:
            resumed.append(first_resumed)
    resumed_at = max(resumed) if len(resumed) == world_size else None
    return LegProgress(min(per_rank_steps, default=0), attempts, resumed_at)


# A beacon's ``at`` when rank 0 of a world shrunk by a resize waits for a node to join.
GROW = "grow"


# --------------------------------------------------------------------------- one leg


@dataclass
class LegFiles:
    """One leg's beacons, kill orders, completion and failure markers under a store prefix
    (``""``: the store root)."""

    store: Store
    prefix: str = ""
    # Parsed trace segments, shared by every LegFiles of one run location.
    trace_cache: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False,
                                                         compare=False)
    # The same segments' trace records (as their models): what progress reads.
    record_cache: dict[str, list[TraceRecord]] = field(default_factory=dict, repr=False,
                                                       compare=False)
    # The run's seal: with it, trace segments are written with their MAC and refused
    # without a valid one.
    seal: RunSeal | None = field(default=None, repr=False, compare=False)

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def traces(self) -> LegTraces:
        """The leg's trace (``<leg>/trace``): how workers write it and how it is read."""
        return LegTraces(self.store, self.key("trace"), self.trace_cache, self.seal,
                         record_cache=self.record_cache)

    @classmethod
    def folder(cls, leg_dir: Path) -> LegFiles:
        """A leg folder on this machine."""
        return cls(open_store(str(leg_dir)))

    def beacon_key(self, rank: int, attempt: int) -> str:
        return self.key(f"beacons/attempt-{attempt}-rank-{rank}.json")

    def kill_order_key(self, rank: int, attempt: int) -> str:
        return self.key(f"beacons/kill-attempt-{attempt}-rank-{rank}.json")

    def pod_kill_key(self, rank: int, attempt: int) -> str:
        return self.key(f"beacons/pod-kill-attempt-{attempt}-rank-{rank}.json")

    def done_key(self, rank: int) -> str:
        return self.key(f"done/rank-{rank}.json")

    def write_beacon(self, rank: int, attempt: int, step: int, microstep: int,
                     where: str) -> str:
        """Publish (atomically) that this process is armed, with the pid to kill; its URI."""
        beacon = Beacon(pid=os.getpid(), host=socket.gethostname(),
                        pod=os.environ.get("POD_NAME") or os.environ.get("HOSTNAME"),
                        pod_uid=os.environ.get("POD_UID"), rank=rank, attempt=attempt,
                        step=step, microstep=microstep, at=where, armed_at=time.time())
        return self._put_model(self.beacon_key(rank, attempt), beacon)

    def read_beacon(self, rank: int, attempt: int = 0) -> Beacon | None:
        """The beacon, or None while there is none; NotAuthentic for one this run's workers
        did not write, InvalidBeacon naming the field of one that is no beacon."""
        return self._get_model(self.beacon_key(rank, attempt), Beacon, "a beacon",
                               invalid=InvalidBeacon)

    def _put_model(self, key: str, body: BaseModel) -> str:
        """Seal ``body`` (camelCase where its model says so) and write it at ``key``; its URI."""
        self.store.put_bytes(key, _seal(self.seal, key,
                                        body.model_dump(mode="json", by_alias=True)))
        return self.store.uri(key)

    def _get_model(self, key: str, model: type[_M], what: str,
                   invalid: type[StoreError] = StoreError) -> _M | None:
        """``key`` authenticated and validated as ``model``; None while absent. StoreError
        naming ``what`` for what is no JSON object, ``invalid`` naming the field for an
        object that is no ``model`` (NotAuthentic for one this run did not write)."""
        try:
            data = self.store.get_bytes(key, SMALL_OBJECT_BYTES)
        except StoreNotFound:
            return None
        where = self.store.uri(key)
        try:
            body = _unseal(self.seal, key, data, where, what)
        except ValueError as e:  # not JSON
            raise StoreError(f"{where}: not {what}: {e}") from e
        if not isinstance(body, dict):
            raise StoreError(f"{where}: not {what}")
        try:
            return model.model_validate(body)
        except ValidationError as e:
            first = e.errors()[0]
            name = ".".join(str(p) for p in first["loc"]) or "(root)"
            raise invalid(f"{where}: not {what}: {name}: {first['msg']}") from e

    def write_kill_order(self, order: KillOrder) -> str:
        """Publish a kill order for the worker it names; its URI."""
        return self._put_model(self.kill_order_key(order.rank, order.attempt), order)

    def read_kill_order(self, rank: int, attempt: int) -> KillOrder | None:
        """The kill order for this rank and attempt, or None while there is none."""
        return self._get_model(self.kill_order_key(rank, attempt), KillOrder, "a kill order")

    def write_pod_kill(self, kill: PodKill) -> str:
        """Record that the pod of the rank ``kill`` names was deleted; its URI."""
        return self._put_model(self.pod_kill_key(kill.rank, kill.attempt), kill)

    def read_pod_kill(self, rank: int, attempt: int) -> PodKill | None:
        """The record of this rank's pod deletion, or None when its pod was not deleted."""
        return self._get_model(self.pod_kill_key(rank, attempt), PodKill, "a pod kill record")

    def mark_rank_done(self, rank: int, attempt: int, steps: int) -> str:
        """Say this rank finished the leg (its trace closed, its final checkpoint
        committed); its URI. A leg is done when every rank said so."""
        body = {"rank": rank, "attempt": attempt, "steps": steps, "at": time.time()}
        key = self.done_key(rank)
        self.store.put_bytes(key, _seal(self.seal, key, body))
        return self.store.uri(key)

    def rank_done(self, rank: int) -> bool:
        """Whether ``rank`` said it finished the leg, in a marker this run wrote (one that
        is not is said once, and never counts)."""
        key = self.done_key(rank)
        try:
            data = self.store.get_bytes(key, SMALL_OBJECT_BYTES)
            body = _unseal(self.seal, key, data, self.store.uri(key), "a completion marker")
        except StoreNotFound:
            return False
        except (NotAuthentic, StoreObjectTooLarge, ValueError) as e:
            _warn_once(f"done: {self.store.uri(key)}: {e}")
            return False
        return isinstance(body, dict) and body.get("rank") == rank

    def mark_failed(self, reason: str) -> None:
        """Fail the leg for every later attempt too (the launcher would otherwise restart it)."""
        # Bounded here: the marker must fit what its readers take (SMALL_OBJECT_BYTES);
        # statuses and Events show 1 KiB of it anyway.
        body = {"reason": clip(reason, FAILURE_REASON_BYTES), "at": time.time()}
        key = self.key(FAILED_MARKER)
        self.store.put_bytes(key, _seal(self.seal, key, body))

    def failure(self) -> str | None:
        """Why the leg failed for good, or None. Without the run's seal an unreadable
        marker still counts; with it, only a marker of this run does: anything else
        (unsealed, too large, not JSON, not a marker) is said once, and ignored."""
        key = self.key(FAILED_MARKER)
        try:
            data = self.store.get_bytes(key, SMALL_OBJECT_BYTES)
        except StoreNotFound:
            return None
        except StoreObjectTooLarge:
            if self.seal is not None:
                _warn_once(f"{self.store.uri(key)}: too large to be this run's failure marker")
                return None
            return "unreadable failure marker (too large to read)"
        try:
            body = _unseal(self.seal, key, data, self.store.uri(key), "a failure marker")
        except NotAuthentic as e:
            _warn_once(str(e))
            return None
        except ValueError:
            return "unreadable failure marker"
        reason = body.get("reason") if isinstance(body, dict) else None
        if isinstance(reason, str):
            return reason
        if self.seal is not None:  # sealed by this run, yet no marker: ours never is
            _warn_once(f"{self.store.uri(key)}: not a failure marker (no reason)")
            return None
        return "unreadable failure marker"


# --------------------------------------------------------------------------- traces


@dataclass(frozen=True, order=True)
class Segment:
    """One trace segment object: ``<leg>/trace/rank-<r>/attempt-<a>/<seq>.jsonl``."""

    rank: int
    attempt: int
    seq: int
    key: str


def _verified(store: Store, segments: Sequence[Segment], seal: RunSeal | None = None,
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
    """One leg's trace, the one format on every store: immutable segment objects
    ``<prefix>/rank-<r>/attempt-<a>/<seq>.jsonl``, each ending in a trailer with its record
    count and sha256 (:mod:`resumequal.store.log`), so a segment is whole or absent after a
    SIGKILL, and a corrupted or missing one is reported by name.

    Workers write through :meth:`sink`; the comparator reads a rank's whole trace with
    :meth:`lines` (strict), the backend polls progress with :meth:`trace_records` (lenient),
    and the report reads the legs' JSON objects with :meth:`records` (lenient).
    """

    store: Store
    prefix: str
    # Segments are immutable once written: each one is parsed once per run location.
    cache: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False,
                                                   compare=False)
    seal: RunSeal | None = field(default=None, repr=False, compare=False)
    record_cache: dict[str, list[TraceRecord]] = field(default_factory=dict, repr=False,
                                                       compare=False)

    def rank_prefix(self, rank: int) -> str:
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
            m = _SEGMENT.match(obj.key[len(self.prefix) + 1:])
            # A rank or attempt beyond int32 is no worker's: a name someone else chose.
            if m is not None and _count(int(m.group(1))) is not None \
                    and _count(int(m.group(2))) is not None:
                found.append(Segment(int(m.group(1)), int(m.group(2)), int(m.group(3)),
                                     obj.key))
        return sorted(found)

    def lines(self, rank: int) -> list[bytes]:
        """One rank's whole trace, every attempt in order, each segment verified;
        StoreNotFound when the rank wrote none, TraceError naming a damaged or missing
        segment."""
        segments = self.segments(rank)
        if not segments:
            raise StoreNotFound(f"{self.uri(rank)}: no trace segments")
        return _verified(self.store, segments, self.seal)

    def records(self, world_size: int) -> dict[int, list[dict[str, Any]]]:
        """Each rank's records so far as JSON objects, leniently: a segment that cannot be
        read (being damaged, or gone) is skipped with a warning."""
        return self._each_rank(world_size, self.cache, _json_lines)

    def trace_records(self, world_size: int) -> dict[int, list[TraceRecord]]:
        """Each rank's trace records so far, leniently: a segment that cannot be read is
        skipped with a warning, and a line that is no trace record left out."""
        return self._each_rank(world_size, self.record_cache, records_in)

    def _each_rank(self, world_size: int, cache: dict[str, list[_R]],
                   parse: Callable[[list[bytes]], list[_R]]) -> dict[int, list[_R]]:
        out: dict[int, list[_R]] = {}
        for s in self.segments():
            if s.rank >= world_size:
                continue
            records = cache.get(s.key)
            if records is None:
                try:
                    data = self.store.get_bytes(s.key, SEGMENT_BYTES)
                    lines = parse_segment(data, self.store.uri(s.key), self.seal, s.key)
                except (TraceError, StoreObjectTooLarge) as e:
                    # Immutable once written: said once, and never counted as progress.
                    log.warning("progress: skipping %s: %s", self.store.uri(s.key), e)
                    cache[s.key] = []
                    continue
                except StoreNotFound as e:
                    log.warning("progress: skipping %s: %s", self.store.uri(s.key), e)
                    continue
                records = cache[s.key] = parse(lines)
            out.setdefault(s.rank, []).extend(records)
        return out

    def attempts_started(self) -> int:
        """How many attempts have written (the attempt is in every segment's name)."""
        return max((s.attempt for s in self.segments()), default=-1) + 1


# --------------------------------------------------------------------------- the run


@dataclass
class RunLocation:
    """Everything of one qualification, under one store (a folder or an object store).

    Open one with :meth:`open`. The operator uses it (without torch) to write leg specs
    and read beacons, progress, failures and the verdict; workers and the comparator use
    it to publish what they produce.
    """

    uri: str
    store: Store
    settings: StoreSettings | None = None
    _trace_cache: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False)
    _record_cache: dict[str, list[TraceRecord]] = field(default_factory=dict, repr=False)
    # Completion markers read and found authentic (they are never rewritten).
    _done_seen: set[str] = field(default_factory=set, repr=False)
    # The run's seal (key and run id): whoever holds it writes trace segments with their MAC
    # and reads only segments whose MAC holds for this run.
    seal: RunSeal | None = field(default=None, repr=False)

    @classmethod
    def open(cls, uri: str, settings: StoreSettings | None = None,
             seal: RunSeal | None = None, retry_seconds: float = 0.0) -> RunLocation:
        """A path, ``file:///abs/path`` or an object store's URI (``s3://bucket/prefix/...``);
        nothing is created.

        ``settings`` say how to reach the store (the spec's ``checkpoint`` settings; those
        of another scheme are ignored); without them the store's own environment applies
        (:meth:`resumequal.store.StoreSettings.environment`). ``seal`` binds what is
        written and read to the run (see :mod:`resumequal.signing`). ``retry_seconds``: how
        long a request to an endpoint that cannot serve it is made again (a worker's
        ``timeouts.backendErrorSeconds``).
        """
        parsed = urlparse(uri)
        if parsed.netloc and not parsed.path.strip("/"):
            raise StoreError(f"run location {uri!r}: name a prefix under the bucket "
                             "(s3://bucket/prefix/<namespace>/<run>/<uid>)")
        store = open_store(uri, settings, retry_seconds)
        return cls(store.uri(), store, settings, seal=seal)

    def patient(self, retry_seconds: float) -> RunLocation:
        """This location, its requests made again for ``retry_seconds`` while the endpoint
        cannot serve them (see :meth:`open`)."""
        return RunLocation.open(self.uri, self.settings, seal=self.seal,
                                retry_seconds=retry_seconds)

    def scratch(self) -> Path:
        """A local folder for what is not kept (checkpoint staging, downloaded copies of an
        object store's checkpoints), one per run location, shared by the ranks of this
        machine."""
        return default_scratch(self.uri)

    def url(self, name: str) -> str:
        """The full URI (or path, for a folder given as a path) of an artifact."""
        return self.store.uri(name)

    def leg(self, leg: str) -> LegFiles:
        return LegFiles(self.store, check_leg_name(leg), trace_cache=self._trace_cache,
                        record_cache=self._record_cache, seal=self.seal)

    # -- specs ------------------------------------------------------------------------------

    def leg_spec(self, spec: QualificationSpec) -> QualificationSpec:
        """``spec`` as the legs of this location run it: in a shared store (one that workers
        on other machines reach), checkpoints live under the run location
        (``<run>/<leg>/checkpoints``) whatever store the spec named, so that workers
        anywhere reach them; a folder keeps the spec's own (by default the folder)."""
        if not self.store.shared():
            return spec
        # The spec's settings if they are this store's, else the ones it was opened with.
        fits = [s for s in (spec.checkpoint.store_settings, self.settings)
                if s is not None and self.uri.startswith(f"{s.scheme}://")]
        ckpt = spec.checkpoint.with_store(self.uri, fits[0] if fits else None)
        return spec.model_copy(update={"checkpoint": ckpt})

    def write_spec(self, spec: QualificationSpec) -> None:
        """``spec.json``: the qualification's spec, for people and the comparator."""
        self.store.put_bytes(SPEC_FILE, _seal(self.seal, SPEC_FILE,
                                              self.leg_spec(spec).model_dump(mode="json")))

    def has_spec(self) -> bool:
        """Whether a runner or the operator has written the qualification's spec here."""
        return self.store.exists(SPEC_FILE)

    def read_spec(self) -> QualificationSpec:
        """The qualification's spec: ``spec.json``, else the spec in ``run.json``; with the
        run's seal, only one this run wrote (NotAuthentic otherwise: the comparator's
        tolerances and the workers' module come from it)."""
        for key, pick in ((SPEC_FILE, False), (RUN_FILE, True)):
            try:
                raw = self.store.get_bytes(key, SMALL_OBJECT_BYTES)
            except StoreNotFound:
                continue
            try:
                data = _unseal(self.seal, key, raw, self.url(key), "the run's spec")
            except ValueError as e:
                raise SpecError(f"{self.url(key)}: not JSON: {e}") from e
            except NotAuthentic as e:
                # No spec to judge by: as one that does not parse (nothing is judged).
                raise SpecError(str(e)) from e
            try:
                return QualificationSpec.model_validate(data["spec"] if pick else data)
            except (KeyError, TypeError) as e:
                raise SpecError(f"{self.url(key)}: unreadable run file: {e}") from e
            except ValidationError as e:
                raise SpecError(format_validation_error(e, self.url(key))) from e
        raise SpecError(f"{self.uri} is not a run directory (no {SPEC_FILE} or {RUN_FILE})")

    def write_leg_spec(self, leg: str, spec: QualificationSpec, omit: Sequence[str]) -> None:
        """``legs/<leg>.spec.json``: the leg's spec (see :meth:`leg_spec`) and omissions."""
        bad = sorted(set(omit) - set(OMISSIONS))
        if bad:
            raise SpecError(f"omit: unknown omission(s) {', '.join(bad)}; allowed: "
                            f"{', '.join(OMISSIONS)}")
        body = LegSpecFile(leg=check_leg_name(leg), spec=self.leg_spec(spec), omit=list(omit))
        key = f"legs/{leg}.spec.json"
        self.store.put_bytes(key, _seal(self.seal, key, body.model_dump(mode="json")))

    def read_leg_spec(self, leg: str) -> LegSpecFile | None:
        """The leg's spec file, or None if there is none; SpecError naming it if invalid,
        NotAuthentic (with the run's seal) if this run did not write it."""
        key = f"legs/{check_leg_name(leg)}.spec.json"
        try:
            data = self.store.get_bytes(key, SMALL_OBJECT_BYTES)
        except StoreNotFound:
            return None
        try:
            body = _unseal(self.seal, key, data, self.url(key), "a leg spec")
        except ValueError as e:
            raise SpecError(f"{self.url(key)}: not JSON: {e}") from e
        try:
            return LegSpecFile.model_validate(body)
        except ValidationError as e:
            raise SpecError(format_validation_error(e, self.url(key), LegSpecFile)) from e

    # -- run.json ---------------------------------------------------------------------------

    def claim(self, spec: QualificationSpec) -> bool:
        """Tie a new location to ``spec`` by writing ``run.json`` if absent; True if written.

        The create is exclusive (see :meth:`Store.put_new`): of two runs racing for one
        location, one gets it. Legs of one run all claim it (the first one wins) and
        :meth:`check_claim` refuses a different spec.
        """
        body = {"spec_digest": spec.digest(), "spec": spec.model_dump(mode="json"),
                "created_at": time.time()}
        return self.store.put_new(RUN_FILE, _seal(self.seal, RUN_FILE, body))

    def check_started(self) -> None:
        """StoreNotFound naming ``run.json`` unless a leg has claimed this location."""
        if not self.store.exists(RUN_FILE):
            raise StoreNotFound(f"{self.store.uri(RUN_FILE)} does not exist: "
                                f"{self.store.uri()} is not a run location (or no leg has "
                                "started)")

    def check_claim(self, spec: QualificationSpec) -> None:
        """TrainingError when this location was made for a different spec (or for none)."""
        where = self.url(RUN_FILE)
        try:
            theirs = _unseal(self.seal, RUN_FILE,
                             self.store.get_bytes(RUN_FILE, SMALL_OBJECT_BYTES), where,
                             "a run file")["spec_digest"]
        except StoreNotFound as e:
            raise TrainingError(f"{self.uri} is not a run directory (no {RUN_FILE})") from e
        except NotAuthentic as e:
            raise TrainingError(str(e)) from e
        except (ValueError, KeyError, TypeError) as e:
            raise TrainingError(f"{where}: unreadable run file: {e}") from e
        if not isinstance(theirs, str):
            raise TrainingError(f"{where}: unreadable run file: spec_digest is no string")
        if theirs != spec.digest():
            raise TrainingError(
                f"run directory {self.uri} belongs to another run (its spec digest "
                f"{theirs[:12]}…, this spec {spec.digest()[:12]}…); use a new --run-dir"
            )

    # -- what the backend observes ----------------------------------------------------------

    def read_beacon(self, leg: str, rank: int, attempt: int = 0) -> Beacon | None:
        """The beacon of an armed worker, or None while it has not armed (InvalidBeacon
        naming the field of one that is no beacon)."""
        return self.leg(leg).read_beacon(rank, attempt)

    def write_kill_order(self, leg: str, order: KillOrder) -> str:
        """Order the armed worker of ``leg`` named in ``order`` to kill itself; its URI."""
        return self.leg(leg).write_kill_order(order)

    def ranks_done(self, leg: str) -> set[int]:
        """The ranks that have finished ``leg``: one LIST of ``<leg>/done``, and with the
        run's seal a read of each marker not yet seen authentic (markers are final)."""
        base = f"{check_leg_name(leg)}/done"
        files = self.leg(leg)
        done = set()
        for obj in self.store.list(base):
            m = _DONE.match(obj.key[len(base) + 1:])
            if m is None or _count(int(m.group(1))) is None:
                continue
            rank = int(m.group(1))
            if self.seal is None or obj.key in self._done_seen:
                done.add(rank)
            elif files.rank_done(rank):
                self._done_seen.add(obj.key)
                done.add(rank)
        return done

    def leg_failure(self, leg: str) -> str | None:
        """The reason in ``<leg>/FAILED.json``, or None."""
        return self.leg(leg).failure()

    def trace_records(self, leg: str, rank: int) -> list[dict[str, Any]]:
        """One rank's trace records so far, as JSON objects in write order (lenient: a torn
        last line or an unreadable segment is skipped with a warning; see materialize)."""
        return self._trace_records(leg, world_size=rank + 1).get(rank, [])

    def leg_records(self, leg: str, world_size: int) -> dict[int, list[TraceRecord]]:
        """Each rank's trace records so far (lenient: an unreadable segment is skipped with a
        warning, a line that is no trace record left out)."""
        return self.leg(leg).traces().trace_records(world_size)

    def leg_progress(self, leg: str, world_size: int) -> LegProgress:
        """Steps every rank has finished, attempts seen, and when the resume completed."""
        return progress_of(self.leg_records(leg, world_size), world_size)

    def _trace_records(self, leg: str, world_size: int) -> dict[int, list[dict[str, Any]]]:
        return self.leg(leg).traces().records(world_size)

    def attempts_started(self, leg: str) -> int:
        """How many attempts of ``leg`` have written to its trace (the next one's number)."""
        return self.leg(leg).traces().attempts_started()

    def child(self, name: str) -> RunLocation:
        """A sub-run under this location (e.g. ``seed-11`` of a seed matrix)."""
        return RunLocation(self.store.uri(name), self.store.child(name), self.settings,
                           seal=None if self.seal is None else self.seal.child(name))

    def trace_sink(self, leg: str, rank: int, attempt: int, every: int = 1) -> SegmentSink:
        """Where a worker writes its trace: a segment every ``every`` records."""
        return self.leg(leg).traces().sink(rank, attempt, every)

    # -- results ----------------------------------------------------------------------------

    def publish(self, files: dict[str, Path]) -> dict[str, str]:
        """Put local result files (name -> path) into the location; name -> their URI.

        A file already in place (a folder run's own) is left as is. With the run's seal
        each gets its ``<name>.mac`` (see :meth:`read_result`).
        """
        out = {}
        for name, path in files.items():
            self._put_result_mac(name, self.store.put_file(name, path))
            out[name] = self.url(name)
        return out

    def put_result(self, name: str, data: bytes) -> str:
        """Put result file ``name`` (``zoom.json``) with its ``.mac``; its URI."""
        self.store.put_bytes(name, data)
        digest = hashlib.sha256(data).hexdigest()
        self._put_result_mac(name, digest)
        log.debug("published %s (%d bytes, sha256 %s)", self.url(name), len(data), digest)
        return self.url(name)

    def _put_result_mac(self, name: str, sha256_hex: str) -> None:
        # Beside the file, not in it: result files keep the schema people read. Written
        # after it: a reader looks only once the writer has ended (its Job, its process).
        if self.seal is not None:
            self.store.put_bytes(f"{name}{RESULT_MAC_SUFFIX}",
                                 self.seal.digest_mac(name, sha256_hex).encode())

    def read_result(self, name: str) -> bytes:
        """Result file ``name`` (at most RESULT_BYTES); StoreNotFound while it is absent.
        With the run's seal, only a file whose ``.mac`` holds for this run and name:
        NotAuthentic otherwise (a verdict a bucket writer wrote, or one of another run)."""
        data = self.store.get_bytes(name, RESULT_BYTES)
        if self.seal is None:
            return data
        try:
            mac = self.store.get_bytes(f"{name}{RESULT_MAC_SUFFIX}", SMALL_OBJECT_BYTES)
        except StoreNotFound:
            mac = b""
        expected = self.seal.digest_mac(name, hashlib.sha256(data).hexdigest())
        if not hmac.compare_digest(expected.encode(), mac.strip()):
            raise NotAuthentic(f"{self.url(name)}: not this run's: its "
                               f"{name}{RESULT_MAC_SUFFIX} is missing or does not hold for "
                               f"run {self.seal.run}")
        return data

    def read_verdict(self) -> Verdict | None:
        """``verdict.json``, or None while the comparator has not written it.

        ReportError naming the URI if it is not a verdict of a schema this code reads.
        """
        from resumequal.verdict import SCHEMA_VERSION, Verdict

        where = self.url(VERDICT_JSON)
        try:
            raw = self.read_result(VERDICT_JSON)
        except StoreNotFound:
            return None
        except NotAuthentic as e:  # written once: reading it again changes nothing
            raise ReportError(str(e)) from e
        try:
            data = _loads(raw)
        except ValueError as e:
            raise ReportError(f"{where}: not JSON: {e}") from e
        if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
            version = data.get("schema_version") if isinstance(data, dict) else None
            raise ReportError(f"{where}: unknown schema_version {version!r} (this resumequal "
                              f"reads: {SCHEMA_VERSION})")
        try:
            return Verdict.model_validate(data)
        except ValidationError as e:
            raise ReportError(f"{where}: not a valid Verdict: {e.errors()[0]['msg']}") from e

    def read_zoom(self) -> Zoom | None:
        """``zoom.json``, authenticated as every result file is, or None before ``resumequal
        zoom`` has written it; ReportError naming the URI for one that is not a zoom."""
        from resumequal.verdict import Zoom

        where = self.url(ZOOM_JSON)
        try:
            raw = self.read_result(ZOOM_JSON)
        except StoreNotFound:
            return None
        except NotAuthentic as e:
            raise ReportError(str(e)) from e
        try:
            return Zoom.model_validate_json(raw)
        except ValidationError as e:
            raise ReportError(f"{where}: not a valid zoom: {e.errors()[0]['msg']}") from e

    # -- the comparator's copy --------------------------------------------------------------

    def materialize(self, dest: Path | None = None) -> Path:
        """An export for people: a copy of the run in the folder ``dest`` (default: a new
        temporary folder), each rank's trace joined into ``<leg>/trace/rank-<r>.jsonl``.

        Every object but checkpoints is copied and checked against its listed size; each
        rank's trace segments are verified (trailer count and sha256, no gap in the
        sequence) and concatenated in order. A corrupted, truncated or missing segment is
        a TraceError naming it. Nothing of resumequal reads the copy back: the comparator
        reads the location itself (:meth:`LegFiles.traces`).
        """
        self.check_started()
        if dest is None:
            dest = Path(tempfile.mkdtemp(prefix="resumequal-run-"))
        dest.mkdir(parents=True, exist_ok=True)
        objects = self.store.list()
        traces: dict[tuple[str, int], list[Segment]] = {}
        for obj in objects:
            if "/checkpoints/" in f"/{obj.key}":
                continue
            m = _ANY_SEGMENT.match(obj.key)
            if m is not None:
                segment = Segment(int(m.group(2)), int(m.group(3)), int(m.group(4)), obj.key)
                traces.setdefault((m.group(1), segment.rank), []).append(segment)
                continue
            if "/trace/" in f"/{obj.key}":
                raise TraceError(f"{self.store.uri(obj.key)}: not a trace segment name")
            data = self.store.get_bytes(obj.key, RESULT_BYTES)
            if len(data) != obj.size:
                raise StoreIntegrityError(f"{self.store.uri(obj.key)}: read {len(data)} bytes, "
                                          f"listed with {obj.size}")
            _write_file(dest / obj.key, data)
        for (leg, rank), segments in sorted(traces.items()):
            _write_file(dest / leg / "trace" / f"rank-{rank}.jsonl",
                        b"".join(_verified(self.store, sorted(segments), self._seal_of(leg),
                                           within=leg.rpartition("/")[0] + "/"
                                           if "/" in leg else "")))
        return dest

    def _seal_of(self, path: str) -> RunSeal | None:
        """The seal of the run whose legs live at ``path`` (``<leg>`` or ``seed-N/<leg>``)."""
        seal = self.seal
        if seal is not None:
            for part in path.split("/")[:-1]:
                seal = seal.child(part)
        return seal

    # -- retention --------------------------------------------------------------------------

    def delete_all(self) -> int:
        """Remove the whole run location; returns how many objects (files) there were."""
        return self.store.delete_all()


def _write_file(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.materialize")
    tmp.write_bytes(data)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    tmp.rename(path)


def default_scratch(uri: str) -> Path:
    """A local working folder for one run location, shared by the ranks of this machine:
    ``<tmp>/resumequal-<uid>/<digest of the URI>``, in a folder only this user can enter
    (checkpoints are staged and downloaded there; another user must not plant them)."""
    digest = hashlib.sha256(uri.encode()).hexdigest()[:12]
    return _private_folder(Path(tempfile.gettempdir()) / f"resumequal-{os.getuid()}") / digest


def _private_folder(path: Path) -> Path:
    """``path``, made with mode 0700 if absent; StoreError if it is not a folder of this
    user that only this user can enter (a name in a shared /tmp anyone can take first)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() \
            or stat.S_IMODE(info.st_mode) & 0o077:
        raise StoreError(f"scratch folder {path} is not a private folder of this user (owner "
                         f"uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}, "
                         f"{'a folder' if stat.S_ISDIR(info.st_mode) else 'not a folder'}); "
                         "remove it, or set TMPDIR elsewhere")
    return path

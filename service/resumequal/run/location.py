"""The run location: where everything of one qualification lives, a folder or ``s3://``.

Everything goes through the location's :class:`~resumequal.store.Store`, the same way on
every store, in the layout of :mod:`.layout`. :class:`RunLocation` opens one, writes and
reads the qualification's and the legs' specs and the claim on the location
(``run.json``), and hands out each leg's files (:mod:`.legfiles`), its trace
(:mod:`.traces`) and the run's results (:mod:`.results`). With the run's seal
(:class:`~resumequal.run.signing.RunSeal`) every object it writes is bound to the run, and
a reader with the seal acts only on what holds for this run and name.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, ValidationError

from resumequal.errors import NotAuthentic, StoreError, TrainingError
from resumequal.run.beacons import Beacon, KillOrder
from resumequal.run.layout import DONE_NAME, RUN_FILE, SMALL_OBJECT_BYTES, SPEC_FILE, count
from resumequal.run.legfiles import LegFiles
from resumequal.run.progress import LegProgress, progress_of
from resumequal.run.results import RunResults
from resumequal.run.seal import sealed, unsealed
from resumequal.run.signing import RunSeal
from resumequal.run.traces import LegTraces
from resumequal.spec import (
    OMISSIONS,
    QualificationSpec,
    SpecError,
    check_leg_name,
    format_validation_error,
)
from resumequal.store import Store, StoreNotFound, StoreSettings, open_store
from resumequal.store.log import SegmentSink
from resumequal.trace.records import TraceRecord

__all__ = ["LegSpecFile", "RunLocation", "default_scratch"]


class LegSpecFile(BaseModel):
    """``legs/<leg>.spec.json``: what a leg's workers run, read by ``resumequal leg``."""

    model_config = ConfigDict(extra="forbid")
    leg: str
    spec: QualificationSpec
    omit: list[str] = []


@dataclass
class RunLocation(RunResults):
    """Everything of one qualification, under one store (a folder or an object store).

    Open one with :meth:`open`. The operator uses it (without torch) to write leg specs
    and read beacons, progress, failures and the verdict; workers and the comparator use
    it to publish what they produce (its results: :class:`~resumequal.run.results.RunResults`).
    """

    uri: str
    store: Store
    settings: StoreSettings | None = None
    # Parsed trace segments, shared by every leg's LegTraces (segments never change).
    _trace_cache: dict[str, list[TraceRecord]] = field(default_factory=dict, repr=False)
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
        written and read to the run (see :mod:`resumequal.run.signing`). ``retry_seconds``:
        how long a request to an endpoint that cannot serve it is made again (a worker's
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
        """The files of ``leg`` (a checked leg name)."""
        return LegFiles(self.store, check_leg_name(leg), trace_cache=self._trace_cache,
                        seal=self.seal)

    def child(self, name: str) -> RunLocation:
        """A sub-run under this location (e.g. ``seed-11`` of a seed matrix)."""
        return RunLocation(self.store.uri(name), self.store.child(name), self.settings,
                           seal=None if self.seal is None else self.seal.child(name))

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
        self.store.put_bytes(SPEC_FILE, sealed(self.seal, SPEC_FILE,
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
                data = unsealed(self.seal, key, raw, self.url(key), "the run's spec")
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
        self.store.put_bytes(key, sealed(self.seal, key, body.model_dump(mode="json")))

    def read_leg_spec(self, leg: str) -> LegSpecFile | None:
        """The leg's spec file, or None if there is none; SpecError naming it if invalid,
        NotAuthentic (with the run's seal) if this run did not write it."""
        key = f"legs/{check_leg_name(leg)}.spec.json"
        try:
            data = self.store.get_bytes(key, SMALL_OBJECT_BYTES)
        except StoreNotFound:
            return None
        try:
            body = unsealed(self.seal, key, data, self.url(key), "a leg spec")
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
        return self.store.put_new(RUN_FILE, sealed(self.seal, RUN_FILE, body))

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
            theirs = unsealed(self.seal, RUN_FILE,
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
            m = DONE_NAME.match(obj.key[len(base) + 1:])
            if m is None or count(int(m.group(1))) is None:
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

    def traces(self, leg: str) -> LegTraces:
        """The trace of ``leg``: how its workers write it and how everything reads it."""
        return self.leg(leg).traces()

    def leg_progress(self, leg: str, world_size: int) -> LegProgress:
        """Steps every rank has finished, attempts seen, and when the resume completed."""
        return progress_of(self.traces(leg).records_so_far(world_size), world_size)

    def attempts_started(self, leg: str) -> int:
        """How many attempts of ``leg`` have written to its trace (the next one's number)."""
        return self.traces(leg).attempts_started()

    def trace_sink(self, leg: str, rank: int, attempt: int, every: int = 1) -> SegmentSink:
        """Where a worker writes its trace: a segment every ``every`` records."""
        return self.traces(leg).sink(rank, attempt, every)


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

"""The reconcile of one QualificationRun: level-triggered, from its stored status.

Each reconcile takes the run from the watch-fed cache (:mod:`.cache`; no request),
validates its spec (an invalid one ends as Failed with Ready=False naming the field, and
nothing is started), judges it against the operator's allowlists (a refused one ends the
same way, naming the rule, before any object is created or any store request sent),
restores the qualification machine from ``status.machine``, ticks it once through a
:class:`KubernetesBackend`, and writes the status through the status subresource when it
changed (the answer goes into the cache). A run that has concluded is not looked at again
until its object changes (a new generation, a deletion): its status and metrics are
written once. The finalizer ``resumequal.dev/cleanup`` lets a deleted run take its jobs,
its metric series and (with ``retention.policy: Delete``) its store artifacts with it; a
store it cannot clean up (a bucket deleted or unreachable) is given up on
``cleanup_seconds`` after the deletion, with a Warning Event naming what is left, so that
deletion never blocks for ever. Transient errors (API, store) propagate to the caller,
which retries with backoff; a tick's progress is written before its error is raised, so
nothing done (a kill in particular) is done twice.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from resumequal.errors import ClusterError, ReportError, ResumequalError, StoreError
from resumequal.qualify.machine import (
    Phase,
    Qualification,
    QualificationStatus,
    Reason,
    failed_verdict,
)
from resumequal.qualify.plan import Plan, qualification_plan
from resumequal.qualify.timeline import Timeline
from resumequal.redact import redact
from resumequal.results.assembly import build_report
from resumequal.results.verdict import Result, Zoom
from resumequal.run.layout import ZOOM_JSON
from resumequal.run.location import RunLocation
from resumequal.run.name import run_uri
from resumequal.spec import QualificationSpec
from resumequal.words import clip
from resumequal_operator import pytorchjob
from resumequal_operator.allowlist import Allowlist
from resumequal_operator.backend import (
    ComparatorFailed,
    KillRefused,
    KubernetesBackend,
    Notice,
    RunRef,
    delete_run_jobs,
    observe_zoom,
)
from resumequal_operator.events import EventRecorder
from resumequal_operator.kube import QUALIFICATION_RUNS, Conflict, Kube, Obj
from resumequal_operator.legjobs import TrainerSettings, job_kinds, leg_jobs
from resumequal_operator.opmetrics import OperatorMetrics
from resumequal_operator.resource import Backend, QualificationRunSpec
from resumequal_operator.runkeys import MasterKey
from resumequal_operator.runstatus import QualificationRunStatus, ZoomStatus
from resumequal_operator.runtime import fanout
from resumequal_operator.runtime.cache import CachedReads, ObjectCache, key_of
from resumequal_operator.status import (
    INVALID_SPEC,
    NOT_ALLOWED,
    NOT_SUPPORTED,
    invalid_status,
    machine_of,
    pinned_spec,
    read_status,
    run_status,
    stored_machine,
)
from resumequal_operator.support import unsupported
from resumequal_operator.validation import RunSpecError, parse_run_spec, qualification_spec

log = logging.getLogger(__name__)

FINALIZER = "resumequal.dev/cleanup"
STATUS_RETRIES = 5


@dataclass
class _Run:
    """What one reconcile works with."""

    obj: Obj
    ref: RunRef
    spec: QualificationRunSpec
    qspec: QualificationSpec
    uri: str  # the run location
    pinned: dict[str, Any] | None  # the spec it started with, once started
    raw: dict[str, Any]  # the spec it runs: pinned, or the object's with its backend filled
    key_secret: str | None = None  # its checkpoint key Secret, once recorded


def _key_secret(ref: RunRef, previous: QualificationRunStatus | None,
                machine: QualificationStatus | None) -> str | None:
    """The run's checkpoint key Secret: as its status records it; for a run started by an
    operator that named the Secret after the run and recorded no name, that name (its
    Secret exists: its legs were launched after it); else None (a new one is made)."""
    if previous is not None and previous.checkpoint_key_secret is not None:
        return previous.checkpoint_key_secret
    if machine is not None and any(leg.launched_at is not None
                                   for leg in machine.legs.values()):
        return pytorchjob.checkpoint_key_secret_name(ref.name, ref.uid)
    return None


def _tick(q: Qualification) -> ResumequalError | None:
    """One tick of the machine: a failed comparator or a refused kill fails the run; API or
    store trouble is returned, to be raised once the progress is written."""
    try:
        q.tick()
    except (ComparatorFailed, KillRefused) as e:
        q.fail(Reason.ERROR, str(e))
    except ResumequalError as e:  # API or store trouble: write progress, then retry
        return e
    return None


class Reconciler:
    """Reconciles QualificationRuns by key (``namespace/name``); safe for one key per thread."""

    def __init__(self, kube: Kube, metrics: OperatorMetrics, events: EventRecorder, *,
                 cache: ObjectCache, reads: CachedReads | None = None,
                 poll_seconds: float = 2.0, cleanup_seconds: float = 300.0,
                 clock: Callable[[], float] = time.time,
                 allowlist: Allowlist | None = None, default_backend: Backend = "pytorchjob",
                 trainer: TrainerSettings | None = None, network_policies: bool = True,
                 master_key: MasterKey | None = None) -> None:
        self.kube, self.metrics, self.events = kube, metrics, events
        # Makes each run's key and seal (:mod:`.runkeys`).
        self.master_key = master_key or MasterKey.generated()
        self.network_policies = network_policies
        self.default_backend = default_backend
        self.trainer = trainer  # None: TrainJobs are not run here
        self.kinds = job_kinds(trainer)
        self.cache = cache
        self.reads = reads or CachedReads(kube, {})
        self.allowlist = allowlist or Allowlist()
        self.poll_seconds = poll_seconds
        self.cleanup_seconds = cleanup_seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._locations: dict[str, RunLocation] = {}
        # key -> (uid, pin, zoom recorded) of the metrics recorded
        self._recorded: dict[str, tuple[str, str, bool]] = {}
        # key -> resourceVersion of a run with nothing left to do at that version
        # (concluded, or refused): its status and metrics are written.
        self._settled: dict[str, str] = {}

    # -- entry ---------------------------------------------------------------------------

    def reconcile(self, key: str) -> float | None:
        """One reconcile; returns when to look again (seconds) or None (on the next event)."""
        obj = self.cache.get(key)
        if obj is None:  # deleted: the watch has dropped it
            self._forget(key)
            return None
        meta = obj["metadata"]
        if self._settled.get(key) == meta.get("resourceVersion"):
            return None
        if meta.get("deletionTimestamp"):
            self._finalize(key, obj)
            return None
        adding: Future[Obj] | None = None
        if FINALIZER not in (meta.get("finalizers") or []):
            if read_status(obj) is None:
                # A new run, nothing of it stored yet: its finalizer goes on while it starts
                # (its key Secret is created meanwhile); whatever writes the object, or the
                # store, waits for it first.
                adding = fanout.submit(self._add_finalizer, obj)
            else:
                obj = self._add_finalizer(obj)

        def finalized() -> Obj:
            """The object as it is with the finalizer on (the PATCH's answer)."""
            return obj if adding is None else adding.result()

        previous = read_status(obj)
        generation = meta.get("generation")
        pinned = pinned_spec(previous)
        if pinned is not None and pinned.get("backend") is None:
            pinned = {**pinned, "backend": "pytorchjob"}  # started before there were two
        raw = pinned if pinned is not None else self._with_backend(obj.get("spec"))
        try:
            spec = parse_run_spec(raw)
        except RunSpecError as e:
            self._invalid(finalized(), previous, generation, str(e))
            return None
        if self._refused(obj, spec, previous, generation, pinned, finalized):
            return None
        if previous is not None and previous.phase in (Phase.SUCCEEDED, Phase.FAILED) \
                and not previous.machine:
            # Failed before it started (an invalid spec, since corrected): start afresh.
            previous = None
        if pinned is not None and pinned != obj.get("spec") and previous is not None \
                and previous.observed_generation != generation:
            self.events.record(obj, "SpecChangeIgnored", (
                f"generation {generation}: the spec of a started qualification does not "
                "change; create a new QualificationRun to qualify another spec"),
                warning=True)
        run = self._run(obj, spec, pinned, raw)
        return self._drive(key, run, previous, generation,
                           finalized=finalized if adding is not None else None)

    def _refused(self, obj: Obj, spec: QualificationRunSpec,
                 previous: QualificationRunStatus | None, generation: int | None,
                 pinned: dict[str, Any] | None, finalized: Callable[[], Obj]) -> bool:
        """Whether this operator may not or cannot run ``spec`` (a backend it does not run,
        the allowlist, its image's torch); a refused run's status is written."""
        if spec.backend == "trainjob" and self.trainer is None:
            self._invalid(finalized(), previous, generation, (
                "spec.backend: trainjob: this operator does not run TrainJobs (enable it "
                "with the chart value trainjob.enabled, which installs the runtime legs "
                "need)"), reason=NOT_ALLOWED)
            return True
        refused = self.allowlist.refusals(spec)
        if refused:
            # Judged on every reconcile, before anything is created or the store is asked
            # anything: a run started under a wider allowlist stops too. One that concluded
            # under it keeps its status (its metrics wait: they would read the store).
            machine = machine_of(previous)
            if machine is not None and machine.done:
                self._settle(finalized())
                return True
            message = "\n".join(map(str, refused))
            if machine is not None:
                # Stopped for good: a wider allowlist later must not start it again over
                # what it already wrote in its run location.
                delete_run_jobs(self.kube, RunRef.of(obj), self.kinds)
                machine.stop(Reason.INVALID, message, self.clock())
            self._invalid(finalized(), previous, generation, message, reason=NOT_ALLOWED,
                          machine=None if machine is None else stored_machine(
                              machine, pinned if pinned is not None else obj["spec"]))
            return True
        missing = unsupported(spec) if machine_of(previous) is None else []
        if missing:
            # Its image's torch lacks a feature the spec needs: refused before anything is
            # created, rather than legs that each fail on it.
            self._invalid(finalized(), previous, generation, "\n".join(map(str, missing)),
                          reason=NOT_SUPPORTED)
            return True
        return False

    def _with_backend(self, raw: Any) -> Any:
        """A new run's spec with its backend (the operator's default when unset): part of
        the spec the run is pinned to, so a changed default never moves a started run."""
        if isinstance(raw, dict) and raw.get("backend") is None:
            return {**raw, "backend": self.default_backend}
        return raw

    # -- one tick ------------------------------------------------------------------------

    def _run(self, obj: Obj, spec: QualificationRunSpec,
             pinned: dict[str, Any] | None = None, raw: Any = None) -> _Run:
        ref = RunRef.of(obj)
        uri = run_uri(spec.store.uri, ref.namespace, ref.name, ref.uid)
        body = pinned if pinned is not None else (raw if isinstance(raw, dict) else obj["spec"])
        return _Run(obj, ref, spec, qualification_spec(spec, uri), uri, pinned, body)

    def _location(self, run: _Run) -> RunLocation:
        """The run's location, opened once per run while it is running (a store client, and
        the trace segments already read)."""
        with self._lock:
            location = self._locations.get(run.ref.uid)
            if location is None:
                location = RunLocation.open(run.uri, run.spec.store.settings(),
                                            seal=self.master_key.seal(run.ref.uid))
                self._locations[run.ref.uid] = location
            return location

    def _drive(self, key: str, run: _Run, previous: QualificationRunStatus | None,
               generation: int | None, *,
               finalized: Callable[[], Obj] | None = None) -> float | None:
        """One tick of the run's machine and its status written; with ``finalized``, a new
        run's finalizer PATCH in flight, waited for before the store or the object is
        written (its answer is the object the status is written on)."""
        plan = qualification_plan(run.qspec)
        machine = machine_of(previous)
        run.key_secret = _key_secret(run.ref, previous, machine)
        if machine is not None and machine.done:
            # Finished: only the status (a new generation), the zoom of a FAIL and the
            # metrics may need writing.
            zoom = self._zoom(run, machine, previous)
            obj = self._write_status(run.obj, self._status(run, plan, machine, previous,
                                                            generation, zoom))
            return self._concluded(key, run, machine, zoom, obj)

        def record_key_secret(name: str) -> None:
            """Write the new key Secret's name into the status before any pod names it
            (on the object with its finalizer, which is then this reconcile's)."""
            nonlocal finalized
            if finalized is not None:
                run.obj, finalized = finalized(), None
            status = (previous or QualificationRunStatus()).model_copy(
                update={"checkpoint_key_secret": name})
            run.obj = self._write_status(run.obj, status)
            run.key_secret = name

        backend = self._backend(run, plan, finalized, record_key_secret)
        q = Qualification(run.qspec, backend, plan=plan, status=machine, side_by_side=True,
                          clock=self.clock)
        seen = len(q.status.history)
        prior_error = q.status.errors.message if q.status.errors is not None else None
        killed = {n for n, leg in q.status.legs.items() if leg.killed_at is not None}
        error = _tick(q)
        if finalized is not None:
            run.obj = finalized()  # its error, if it failed, is this reconcile's
        self._announce(run, plan, q.status, seen, killed, backend.notices)
        self._announce_backend_error(run, q.status, prior_error)
        zoom = self._zoom(run, q.status, previous) if error is None and q.status.done else None
        try:
            obj = self._write_status(run.obj, self._status(run, plan, q.status, previous,
                                                            generation, zoom))
        finally:
            backend.wait_side_writes()  # nothing of this reconcile is left running
        if error is not None:
            raise error
        if q.status.done:
            return self._concluded(key, run, q.status, zoom, obj)
        return self.poll_seconds

    def _backend(self, run: _Run, plan: Plan, finalized: Callable[[], Obj] | None,
                 record_key_secret: Callable[[str], None]) -> KubernetesBackend:
        """The backend one tick of ``run`` drives its legs through."""
        return KubernetesBackend(self.kube, run.ref, run.spec, run.qspec, plan,
                                 self._location(run), reads=self.reads,
                                 legs=leg_jobs(run.spec.backend or self.default_backend,
                                               self.trainer),
                                 kinds=self.kinds, store_ready=finalized,
                                 key_secret=run.key_secret,
                                 record_key_secret=record_key_secret,
                                 network_policies=self.network_policies)

    def _announce_backend_error(self, run: _Run, machine: QualificationStatus,
                                prior: str | None) -> None:
        """An Event for the machine's backend error streak, unless it says what ``prior``
        (the message before this tick) said."""
        streak = machine.errors
        if streak is not None and streak.message != prior:
            # Once per streak and per new message, not once per retry.
            self.events.record(run.obj, "BackendError", (
                f"{streak.message}; retrying until timeouts.backendErrorSeconds="
                f"{run.qspec.timeouts.backend_error_seconds:g} have passed"), warning=True)

    def _concluded(self, key: str, run: _Run, machine: QualificationStatus,
                   zoom: ZoomStatus | None, obj: Obj) -> float | None:
        """Record a finished run's metrics; look again only while its zoom Job runs."""
        zooming = zoom is not None and zoom.state == "Running"
        self._record(key, run, machine, zoomed=zoom is not None and zoom.state == "Succeeded")
        if zooming:
            return self.poll_seconds  # not settled: the Job is followed until it ends
        with self._lock:
            self._locations.pop(run.ref.uid, None)  # its trace cache is not needed again
        self._settle(obj)
        return None

    def _zoom(self, run: _Run, machine: QualificationStatus,
              previous: QualificationRunStatus | None) -> ZoomStatus | None:
        """The zoom Job of a FAIL with ``spec.zoom: onFail``: started, followed, concluded."""
        # A finished run's stored machine has no verdict (it lives in the store); its
        # status has the result.
        result = machine.verdict.result if machine.verdict is not None else (
            previous.verdict.result if previous is not None and previous.verdict else None)
        if run.spec.zoom != "onFail" or result is not Result.FAIL:
            return None
        before = previous.zoom if previous is not None else None
        notices: list[Notice] = []
        try:
            zoom = observe_zoom(self.kube, run.ref, run.spec, self._location(run), before,
                                notices, key_secret=run.key_secret,
                                network_policies=self.network_policies)
        except ResumequalError as e:  # API trouble: the next look tries again
            log.warning("%s: the zoom Job: %s", run.ref.name, e)
            return before or ZoomStatus(
                job=pytorchjob.zoom_job_name(run.ref.name, run.ref.uid), state="Running")
        for n in notices:
            self.events.record(run.obj, n.reason, n.message, warning=n.reason == "ZoomFailed")
        return zoom

    def _status(self, run: _Run, plan: Plan, machine: QualificationStatus,
                previous: QualificationRunStatus | None,
                generation: int | None, zoom: ZoomStatus | None = None) -> QualificationRunStatus:
        ref = run.ref
        compared = machine.phase in (Phase.COMPARING, Phase.SUCCEEDED) or (
            previous is not None and previous.comparator_job is not None)
        return run_status(
            machine, previous=previous, generation=generation,
            pin=run.spec.stack.effective_pin, run_uri=run.uri,
            report_url=f"{run.uri}/report.html" if machine.verdict is not None else
            (previous.report_url if previous else None),
            leg_jobs={p.name: pytorchjob.leg_job_name(ref.name, ref.uid, p.name)
                      for p in plan.legs},
            comparator_job=pytorchjob.comparator_job_name(ref.name, ref.uid) if compared
            else None,
            preemption_mode=run.spec.preemption.mode,
            run_spec=run.raw,
            zoom=zoom,
            backend=run.spec.backend,
            launcher=run.spec.world.launcher,
            checkpoint_key_secret=run.key_secret,
        )

    def _announce(self, run: _Run, plan: Plan, machine: QualificationStatus, seen: int,
                  killed: set[str], notices: list[Notice]) -> None:
        for event in machine.history[seen:]:
            warning = event.phase == Phase.FAILED.value
            self.events.record(run.obj, event.phase, event.message or f"phase {event.phase}",
                               warning=warning)
        for notice in notices:  # a resize's replica changes, each made once
            self.events.record(run.obj, notice.reason, notice.message)
        for name, leg in machine.legs.items():
            if leg.killed_at is not None and name not in killed and leg.beacon is not None:
                b = leg.beacon
                p = plan.leg(name).spec.preemption
                grace = f", grace {p.grace_seconds:g}s" if p.mode == "graceful" else ""
                what = (f"ordered the kill of pid {b.pid} in pod {b.pod}"
                        if p.target == "process" else f"deleted pod {b.pod}")
                self.events.record(run.obj, "PreemptionInjected", (
                    f"{name} leg: {what} (rank {b.rank}, attempt {b.attempt}) at step "
                    f"{b.step} microstep {b.microstep}; {p.mode} {p.target} kill{grace}"))

    # -- status --------------------------------------------------------------------------

    def _write_status(self, obj: Obj, status: QualificationRunStatus) -> Obj:
        """PUT the status, unless it is unchanged, with the object's resourceVersion; on
        409 re-read and retry while nobody else changed the status meanwhile. The object
        as it is now (what the PUT or the re-read answered also goes into the cache)."""
        body = status.to_k8s()
        read = obj.get("status")
        if read == body:
            return obj
        meta = obj["metadata"]
        for _ in range(STATUS_RETRIES):
            try:
                written = self.kube.replace(QUALIFICATION_RUNS, meta["namespace"],
                                            {**obj, "status": body}, sub="status")
                self.cache.written(written)
                return written
            except Conflict:
                obj = self.kube.get(QUALIFICATION_RUNS, meta["namespace"], meta["name"])
                self.cache.written(obj)
                if obj.get("status") != read:
                    raise  # another writer moved the status: reconcile again from it
        raise ClusterError(f"status of {meta['namespace']}/{meta['name']}: still conflicting "
                           f"after {STATUS_RETRIES} attempts", status=409, reason="Conflict")

    def _invalid(self, obj: Obj, previous: QualificationRunStatus | None,
                 generation: int | None, message: str, reason: str = INVALID_SPEC,
                 machine: dict[str, Any] | None = None) -> None:
        """Failed before it started (or stopped: ``machine``, its ended machine): a spec
        that cannot run (InvalidSpec), that the allowlists refuse (NotAllowed) or that
        its image's torch cannot run (NotSupported); the condition and a Warning Event say
        why."""
        status = invalid_status(previous, generation, message, reason=reason)
        if machine is not None:
            status = status.model_copy(update={"machine": machine})
        ready = next((c for c in previous.conditions if c.type == "Ready"), None) \
            if previous else None
        if ready is None or ready.reason != reason or ready.message != clip(redact(message)):
            self.events.record(obj, reason, message, warning=True)
            log.warning("%s/%s: %s: %s", obj["metadata"]["namespace"],
                        obj["metadata"]["name"], reason, message.replace("\n", "; "))
        self._settle(self._write_status(obj, status))

    def _settle(self, obj: Obj) -> None:
        """Nothing is left to do for ``obj`` until it changes (see ``reconcile``)."""
        rv = obj["metadata"].get("resourceVersion")
        if rv:
            with self._lock:
                self._settled[key_of(obj)] = str(rv)

    # -- metrics -------------------------------------------------------------------------

    def _record(self, key: str, run: _Run, machine: QualificationStatus, *,
                zoomed: bool = False) -> None:
        pin = run.spec.stack.effective_pin
        if self._recorded.get(key) == (run.ref.uid, pin, zoomed):
            return
        try:
            stored = None if machine.verdict is not None else self._location(run).read_verdict()
        except ReportError:
            stored = None  # the run failed on it already (see KubernetesBackend.compare)
        verdict = machine.verdict or stored or failed_verdict(run.qspec, machine)
        report = build_report(run.qspec, verdict, Timeline.of(machine), run=run.ref.name,
                              pin=pin)
        if zoomed:
            report = report.model_copy(update={"zoom": self._read_zoom(run)})
        with self._lock:
            old = self._recorded.get(key)
            if old is not None and old[1] != pin:
                self.metrics.qualification.forget(run.ref.namespace, run.ref.name, pin=old[1])
            self.metrics.qualification.record(report, namespace=run.ref.namespace)
            self._recorded[key] = (run.ref.uid, pin, zoomed)

    def _read_zoom(self, run: _Run) -> Zoom | None:
        """``zoom.json`` of a run whose zoom Job succeeded; None if it cannot be read."""
        try:
            return Zoom.model_validate_json(self._location(run).read_result(ZOOM_JSON))
        except (ResumequalError, ValidationError) as e:
            log.warning("%s: zoom.json: %s", run.ref.name, type(e).__name__)
            return None

    def _forget(self, key: str) -> None:
        namespace, name = key.split("/", 1)
        with self._lock:
            self._settled.pop(key, None)
            if self._recorded.pop(key, None) is not None:
                self.metrics.qualification.forget(namespace, name)

    # -- finalizer -----------------------------------------------------------------------

    def _add_finalizer(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        patch = {"metadata": {"finalizers": [*(meta.get("finalizers") or []), FINALIZER],
                              "resourceVersion": meta["resourceVersion"]}}
        patched = self.kube.patch(QUALIFICATION_RUNS, meta["namespace"], meta["name"], patch)
        self.cache.written(patched)
        return patched

    def _finalize(self, key: str, obj: Obj) -> None:
        meta = obj["metadata"]
        if FINALIZER not in (meta.get("finalizers") or []):
            return
        ref = RunRef.of(obj)
        delete_run_jobs(self.kube, ref, self.kinds)
        pinned = pinned_spec(read_status(obj))
        try:
            spec: QualificationRunSpec | None = parse_run_spec(
                pinned if pinned is not None else obj.get("spec"))
        except RunSpecError:
            spec = None  # never started: nothing in the store
        if spec is not None and spec.retention.policy == "Delete" \
                and self.allowlist.allows_store(spec):  # else nothing of it was stored
            self._delete_artifacts(key, self._run(obj, spec))
        with self._lock:
            self._locations.pop(ref.uid, None)
        self._forget(key)
        rest = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
        self.kube.patch(QUALIFICATION_RUNS, meta["namespace"], meta["name"],
                        {"metadata": {"finalizers": rest,
                                      "resourceVersion": meta["resourceVersion"]}})
        log.info("%s: cleaned up; finalizer removed", key)

    def _delete_artifacts(self, key: str, run: _Run) -> None:
        """Retention Delete: remove the run location. A store error is raised for a retry
        until ``cleanup_seconds`` have passed since the deletion; then the artifacts are
        left where they are, said in a Warning Event."""
        try:
            removed = self._location(run).delete_all()
        except StoreError as e:
            waited = self._since_deletion(run.obj)
            if waited < self.cleanup_seconds:
                raise
            message = (f"gave up deleting the run's artifacts under {run.uri} after "
                       f"{waited:.0f}s (cleanupSeconds={self.cleanup_seconds:g}): {e}; "
                       "they are left in the store")
            self.events.record(run.obj, "CleanupAbandoned", message, warning=True)
            log.warning("%s: %s", key, redact(message))
            return
        log.info("%s: retention Delete: removed %d object(s) under %s", key, removed, run.uri)

    def _since_deletion(self, obj: Obj) -> float:
        """Seconds since the run's deletionTimestamp (infinite if it cannot be read)."""
        stamp = obj["metadata"].get("deletionTimestamp") or ""
        try:
            at = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        except ValueError:
            return math.inf
        return self.clock() - at.timestamp()

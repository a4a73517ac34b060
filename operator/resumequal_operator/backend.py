"""KubernetesBackend: the legs of one QualificationRun as PyTorchJobs or TrainJobs
(``spec.backend``, :mod:`.legjobs`), its comparator a Job.

The same interface as the local torchrun backend, so
:class:`resumequal.qualify.machine.Qualification` drives both. The backend keeps no memory
of its own: every answer is read from the cluster
(job conditions, from the operator's watch of its jobs where it holds them; pods) and from
the run location (progress, beacons, failure markers, verdict), so a backend built afresh
on every reconcile, or by a restarted operator, sees what the previous one saw. Launching
is idempotent (an existing job is the leg already launched); kills and deletions are
checked against what this run owns.

A resize leg (:mod:`.resize`) is shrunk by lowering its PyTorchJob's Worker replicas to
``toNodes`` just before the armed pod is deleted (so the training operator does not
recreate it), and grown by raising them back to ``world.nnodes`` once rank 0 of the shrunk
world says it waits for the grow; both are read back from the job, so each happens once.
What the backend did that the run's Events should say is left in :attr:`KubernetesBackend.
notices`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial

from pydantic import ValidationError

from resumequal.errors import ClusterError, ReportError, ResumequalError, StoreError
from resumequal.qualify.machine import LegObservation, LegState, kill_order
from resumequal.qualify.plan import LegPlan, Plan
from resumequal.results.verdict import Verdict, Zoom
from resumequal.run.beacons import GROW, Beacon, InvalidBeacon, PodKill
from resumequal.run.layout import ZOOM_JSON
from resumequal.run.location import RunLocation
from resumequal.spec import PreemptionSpec, QualificationSpec
from resumequal.store import StoreNotFound
from resumequal.words import clip
from resumequal_operator import netpolicy, pytorchjob, resize
from resumequal_operator.kube import (
    JOBS,
    NETWORK_POLICIES,
    PODS,
    PYTORCHJOBS,
    SECRETS,
    Conflict,
    Kind,
    Kube,
    NotFound,
    Obj,
)
from resumequal_operator.legjobs import LegJobs, PyTorchJobLegs, job_kinds
from resumequal_operator.resource import QualificationRunSpec, is_object_name
from resumequal_operator.runstatus import ZoomStatus
from resumequal_operator.runtime import fanout
from resumequal_operator.runtime.cache import CachedReads

log = logging.getLogger(__name__)


class ComparatorFailed(ResumequalError):
    """The comparator Job failed without writing a verdict: the run cannot conclude."""


class KillRefused(ResumequalError):
    """The beacon names a pod this run must not delete (not its leg's, worker-0, or in a
    resize another pod than the last, which lowering the replicas deletes)."""


@dataclass(frozen=True)
class Notice:
    """Something the backend did to a leg that an Event about the run should say."""

    reason: str
    message: str


@dataclass(frozen=True)
class RunRef:
    """The QualificationRun a backend works for: what owner references need."""

    namespace: str
    name: str
    uid: str
    api_version: str = "resumequal.dev/v1alpha1"
    kind: str = "QualificationRun"

    @classmethod
    def of(cls, obj: Obj) -> RunRef:
        m = obj["metadata"]
        return cls(m["namespace"], m["name"], m["uid"], obj.get("apiVersion", cls.api_version),
                   obj.get("kind", cls.kind))

    def owns(self, obj: Obj) -> bool:
        return any(r.get("uid") == self.uid and r.get("controller")
                   for r in obj.get("metadata", {}).get("ownerReferences") or [])


def _condition(obj: Obj, type_: str) -> Obj | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return dict(c)
    return None


class KubernetesBackend:
    """Backend of one QualificationRun (see the module docstring)."""

    def __init__(self, kube: Kube, run: RunRef, run_spec: QualificationRunSpec,
                 spec: QualificationSpec, plan: Plan, location: RunLocation, *,
                 reads: CachedReads | None = None, legs: LegJobs | None = None,
                 kinds: tuple[Kind, ...] = job_kinds(None),
                 store_ready: Callable[[], object] | None = None,
                 key_secret: str | None = None,
                 record_key_secret: Callable[[str], object] | None = None,
                 network_policies: bool = True) -> None:
        self.kube, self.run, self.run_spec = kube, run, run_spec
        # Called before the first write to the store: a new run's finalizer is added while
        # its key Secret is created, and its cleanup must cover whatever is stored.
        self.store_ready = store_ready
        # The run's key Secret as its status records it (None: none yet), and how a new
        # one's name is recorded before any pod names it (see ensure_checkpoint_key).
        self.key_secret = key_secret
        self.record_key_secret = record_key_secret
        self.network_policies = network_policies  # one per leg (and zoom): netpolicy
        self.legs: LegJobs = legs or PyTorchJobLegs()
        self.kinds = kinds  # every kind of job a run can own here (cleanup lists them)
        # The legs' and the comparator's jobs as watched (a GET when not cached).
        self.reads = reads or CachedReads(kube, {})
        self.spec, self.plan, self.location = spec, plan, location
        self.notices: list[Notice] = []
        # Store writes of this tick that the run's status does not record (a pod kill's
        # record for the comparator's timeline): they go while the status is written,
        # one round trip rather than two after a kill; :meth:`wait_side_writes` ends them.
        self.side_writes: list[Future[None]] = []
        self._prepared = False  # the spec and the key Secret: once per tick for all legs

    # -- names ---------------------------------------------------------------------------

    def job_name(self, leg: str) -> str:
        return pytorchjob.leg_job_name(self.run.name, self.run.uid, leg)

    @property
    def comparator_name(self) -> str:
        return pytorchjob.comparator_job_name(self.run.name, self.run.uid)

    # -- Backend -------------------------------------------------------------------------

    def ensure_checkpoint_key(self) -> str:
        """The name of the run's Secret holding its checkpoint key: the one its status
        records, else a new one, recorded before anything names it."""
        if self.key_secret is None:
            self._record_key_secret(self._create_key_secret())
        assert self.key_secret is not None
        return self.key_secret

    def _create_key_secret(self) -> str:
        """Create a Secret with a fresh random checkpoint key under a name the API server
        generates; its name. Never one found under a name of the run's: whoever may create
        Secrets in the namespace could have made that one, and chosen its key. The key is
        never logged, nor read back: only the pods read it; it is the run's key made from the
        operator's master key, which the location's seal holds (:mod:`.runkeys`)."""
        r = self.run
        seal = self.location.seal
        if seal is None or seal.run != r.uid:
            raise ClusterError(f"{r.namespace}/{r.name}: its run location is not sealed for "
                               "this run; no key Secret is made")
        body = pytorchjob.checkpoint_key_secret(r.name, r.namespace, r.uid, seal.key.decode())
        name = str(self.kube.create(SECRETS, r.namespace, body)["metadata"]["name"])
        log.info("%s/%s: created the checkpoint key Secret %s", r.namespace, r.name, name)
        return name

    def _record_key_secret(self, name: str) -> None:
        """Record ``name`` (the run's status) before any job names it. A crash before the
        record leaves a Secret that nothing names and the run owns (it goes with the run);
        the next reconcile makes another, so each Secret is named by all of the run's pods
        or by none."""
        if self.record_key_secret is not None:
            self.record_key_secret(name)
        self.key_secret = name

    def launch_legs(self, plans: Sequence[LegPlan]) -> None:
        """Create the jobs of ``plans``, side by side; a 409 is a leg launched before.

        Before any job: the run's spec and these legs' specs are in the store, its key
        Secret exists and each leg's NetworkPolicy too (their POSTs go while the store is
        written: none needs another), so a launch waits for three requests in a row (these,
        the Secret's record, the jobs) rather than four."""
        if not plans:
            return
        # The Secret's POST is a leaf; its record (a status write) waits for both.
        key = None if self.key_secret is not None else fanout.submit(self._create_key_secret)
        try:
            if self.store_ready is not None:
                self.store_ready()
            writes: list[Callable[[], object]] = [
                partial(self.location.write_leg_spec, p.name, p.spec, p.omit) for p in plans]
            if not self._prepared:
                writes.append(partial(self.location.write_spec, self.spec))
            if self.network_policies:
                # Before the jobs: none of their pods is ever up without its policy.
                r = self.run
                writes += [partial(create_network_policy, self.kube, netpolicy.leg_network_policy(
                    r.name, r.namespace, r.uid, p.name)) for p in plans]
            fanout.together(writes)
        finally:
            created = key.result() if key is not None else None
            if created is not None:
                # Recorded even when a store write failed: the retry uses this Secret
                # rather than make one more each time.
                self._record_key_secret(created)
        self._prepared = True
        # One request's latency rather than one per leg (side by side: the control leg and
        # the preempted one start together).
        fanout.together([partial(self._create_leg, plan) for plan in plans])

    def _create_leg(self, plan: LegPlan) -> None:
        r, label = self.run, self.legs.label
        body = self.legs.manifest(r.name, r.namespace, r.uid, self.run_spec, plan,
                                  self.location.uri, key_secret=self.key_secret)
        try:
            self.kube.create(self.legs.kind, r.namespace, body)
        except Conflict:
            log.debug("%s: %s %s exists already", r.name, label, self.job_name(plan.name))
            return
        log.info("%s/%s: launched the %s leg (%s %s)", r.namespace, r.name, plan.name, label,
                 self.job_name(plan.name))

    def observe_leg(self, leg: str) -> LegObservation:
        """A leg is done when every rank has marked it done in the store: an elastic
        PyTorchJob is Succeeded as soon as its first worker succeeds, while other ranks
        may still be writing their last trace segments and checkpoint (a TrainJob is
        Complete only once every node's pod succeeded; the markers serve both)."""
        name, label = self.job_name(leg), self.legs.label
        try:
            job = self.reads.get(self.legs.kind, self.run.namespace, name)
        except NotFound:
            return LegObservation(state=LegState.FAILED,
                                  message=f"its {label} {name} no longer exists")
        plan = self.plan.leg(leg)
        # Markers first: progress read after them includes every rank's last step.
        done = self.location.ranks_done(leg) >= set(range(plan.final_world_size))
        progress = self.location.leg_progress(leg, plan.resumed_world_size)
        failed = _condition(job, "Failed")
        if failed is None and done:
            state = LegState.SUCCEEDED
        elif failed is not None:
            state = LegState.FAILED
        else:
            state = LegState.RUNNING
        if state == LegState.RUNNING and self.legs.kind == PYTORCHJOBS:
            self._maybe_grow(plan, job)
        message = None
        if state == LegState.FAILED:
            why = self.location.leg_failure(leg)
            detail = (failed or {}).get("message") or (failed or {}).get("reason")
            message = why or f"{label} {name} failed: {detail or 'no detail'}"
        return LegObservation(state=state, steps_done=progress.steps_done,
                              attempts=progress.attempts, resumed_at=progress.resumed_at,
                              message=message)

    def read_beacon(self, leg: str, rank: int) -> Beacon | None:
        beacon = self.location.read_beacon(leg, rank, 0)
        if beacon is None:
            return None
        if beacon.pod is not None and not is_object_name(beacon.pod):
            # The name goes into API paths (get, delete): only a pod name does.
            raise InvalidBeacon(f"the beacon of rank {beacon.rank} in {self.location.url(leg)} "
                                f"names pod {beacon.pod[:80]!r}, which is no pod name "
                                "(DNS-1123 subdomain); no request is made for it")
        return beacon

    def deliver_kill(self, leg: str, beacon: Beacon, preemption: PreemptionSpec) -> None:
        """A process kill is an order in the store that the armed worker obeys; a pod kill
        deletes the pod, preconditioned on the armed pod's uid, so a kill replayed after
        a lost status write never hits the replacement pod, which has the same name."""
        if preemption.target == "process":
            order = kill_order(beacon, preemption)
            uri = self.location.write_kill_order(leg, order)
            log.info("%s: ordered a %s kill of rank %d (pid %d in pod %s): %s", self.run.name,
                     preemption.mode, beacon.rank, beacon.pid, beacon.pod, uri)
            return
        if not beacon.pod:
            raise KillRefused(f"the beacon of rank {beacon.rank} names no pod (POD_NAME unset "
                              "in the worker)")
        try:
            pod = self.kube.get(PODS, self.run.namespace, beacon.pod)
        except NotFound:
            log.warning("%s: pod %s is gone already; counting it as killed", self.run.name,
                        beacon.pod)
            return
        plan = self.plan.leg(leg)
        self._check_target(pod, plan)
        uid = pod["metadata"]["uid"]
        if self._replaced(pod, beacon):
            log.warning("%s: pod %s (uid %s) replaces the armed one (uid %s), which is gone: "
                        "not killing again", self.run.name, beacon.pod, uid, beacon.pod_uid)
            return
        shrink = plan.resize
        if shrink is not None:
            # Before the deletion: with the replicas still at nnodes the training operator
            # would recreate the pod (common/pod.go ReconcilePods); lowered, it deletes it too.
            self._set_replicas(plan, shrink.to_nodes, "Resized", (
                f"before deleting pod {beacon.pod} (rank {beacon.rank}): the world shrinks "
                f"to preemption.resize.toNodes={shrink.to_nodes} node(s)"))
        grace = 0 if preemption.mode == "hard" else max(1, math.ceil(preemption.grace_seconds))
        issued_at = time.time()
        try:
            self.kube.delete(PODS, self.run.namespace, beacon.pod, grace_seconds=grace,
                             uid=beacon.pod_uid or uid)
        except NotFound:
            return
        except Conflict:
            # The uid precondition failed: the pod was replaced between the read and the
            # delete. The armed pod is gone, which is what the kill was for.
            log.warning("%s: pod %s was replaced before the delete; not killing the "
                        "replacement", self.run.name, beacon.pod)
            return
        log.info("%s: deleted pod %s (rank %d, %s, grace %ds)", self.run.name, beacon.pod,
                 beacon.rank, preemption.mode, grace)
        record = PodKill(rank=beacon.rank, attempt=beacon.attempt, pod=beacon.pod,
                         pod_uid=beacon.pod_uid or uid, mode=preemption.mode,
                         grace_seconds=grace, issued_at=issued_at)
        # The status records the kill (a replay finds the pod gone or replaced), not this
        # record: the two are written side by side (see ``side_writes``).
        self.side_writes.append(fanout.submit(self._record_pod_kill, leg, record))

    def _record_pod_kill(self, leg: str, record: PodKill) -> None:
        try:
            self.location.leg(leg).write_pod_kill(record)
        except StoreError as e:
            # The kill happened; only the comparator's timeline misses its time.
            log.warning("%s: could not record the pod deletion: %s", self.run.name, e)

    def wait_side_writes(self) -> None:
        """Wait for the writes of this tick that the status does not record."""
        pending, self.side_writes = self.side_writes, []
        wait(pending)
        for future in pending:
            future.result()

    @staticmethod
    def _replaced(pod: Obj, beacon: Beacon) -> bool:
        """Whether ``pod`` is the training operator's replacement of the armed pod (same
        name, another uid). A beacon without a uid (a worker that has no POD_UID) falls
        back to the creation time: creationTimestamp has whole seconds, and node clocks
        drift a little, so a 2 s margin."""
        if beacon.pod_uid:
            return bool(pod["metadata"].get("uid") != beacon.pod_uid)
        created = (pod["metadata"].get("creationTimestamp") or "")
        try:
            at = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        except ValueError:
            return False
        return at.timestamp() > beacon.armed_at + 2

    def _check_target(self, pod: Obj, plan: LegPlan) -> None:
        meta = pod["metadata"]
        jobs = {self.job_name(p.name) for p in self.plan.legs}
        if self.legs.job_of(pod) not in jobs:
            raise KillRefused(f"pod {meta['name']} does not belong to a leg of "
                              f"{self.run.namespace}/{self.run.name}; not deleting it")
        index = self.legs.node_index(pod)
        if index == "0" and not self.run_spec.allow_rendezvous_host_kill:
            node = "worker-0" if self.legs.kind == PYTORCHJOBS else "node 0"
            raise KillRefused(f"pod {meta['name']} is {node}, which hosts the c10d "
                              "rendezvous; set allow_rendezvous_host_kill to cut there")
        last = str(plan.spec.world.nnodes - 1)
        if plan.resize is not None and index is not None and index != last:
            raise KillRefused(f"pod {meta['name']} is worker-{index}, but lowering the Worker "
                              f"replicas for the resize deletes worker-{last}; not deleting "
                              "it")

    def _maybe_grow(self, plan: LegPlan, job: Obj) -> None:
        """Raise a shrunk leg's Worker replicas back to nnodes once rank 0 of its latest
        attempt waits for the grow (its beacon at ``grow``), as the local backend starts a
        node then; the training operator creates the missing pod under its old name."""
        grow = plan.resize
        nnodes = plan.spec.world.nnodes
        if (grow is None or grow.grow_after_step is None
                or resize.worker_replicas(job) >= nnodes):
            return
        attempt = self.location.attempts_started(plan.name) - 1
        if attempt < 1:
            return
        beacon = self.location.read_beacon(plan.name, 0, attempt)
        if beacon is None or beacon.at != GROW:
            return
        self._set_replicas(plan, nnodes, "Grown", (
            f"rank 0 of attempt {attempt} waits at step {beacon.step} for the world to grow "
            f"(preemption.resize.growAfterStep={grow.grow_after_step})"), job=job)

    def _set_replicas(self, plan: LegPlan, replicas: int, reason: str, why: str, *,
                      job: Obj | None = None) -> None:
        """Patch the leg's Worker replicas to ``replicas`` unless they are (``job``: the
        PyTorchJob as just read), with a notice of the change."""
        name = self.job_name(plan.name)
        if job is None:
            job = self.kube.get(PYTORCHJOBS, self.run.namespace, name)
        before = resize.worker_replicas(job)
        if before == replicas:
            return
        patched = self.kube.patch(PYTORCHJOBS, self.run.namespace, name,
                                  resize.replicas_patch(replicas))
        self.reads.written(PYTORCHJOBS, patched)  # a later tick must not patch it again
        message = (f"{plan.name} leg: Worker replicas of PyTorchJob {name} {before} -> "
                   f"{replicas} {why}")
        log.info("%s: %s", self.run.name, message)
        self.notices.append(Notice(reason, message))

    def compare(self) -> Verdict | None:
        name = self.comparator_name
        job = self.reads.cached(JOBS, self.run.namespace, name)
        if job is None:
            # Not in the watch's cache: almost always not started yet. Where the run's Jobs
            # are watched it is created without a GET first; a 409 says it exists (the
            # watch has not delivered it yet), and only then is it read.
            if self.reads.watches(JOBS) and self._start_comparator():
                return None
            try:
                job = self.kube.get(JOBS, self.run.namespace, name)
            except NotFound:
                self._start_comparator()
                return None
        complete, failed = _condition(job, "Complete"), _condition(job, "Failed")
        if complete is None and failed is None:
            return None
        # The comparator exits 1, 3 or 4 (FAIL, INVALID, NONDETERMINISTIC) after its verdict: a
        # failed Job with a verdict concluded; without one, it broke.
        try:
            verdict = self.location.read_verdict()
        except ReportError as e:  # written once: reading it again changes nothing
            raise ComparatorFailed(f"the comparator Job {name} left no readable verdict: "
                                   f"{e}") from e
        if verdict is not None:
            return verdict
        if complete is not None:
            raise ComparatorFailed(f"the comparator Job {name} completed without writing "
                                   f"{self.location.url('verdict.json')}")
        detail = (failed or {}).get("message") or (failed or {}).get("reason") or "no detail"
        raise ComparatorFailed(f"the comparator Job {name} failed without a verdict: {detail}")

    def _start_comparator(self) -> bool:
        """Create the comparator Job; whether it was created (False: it existed). Its pod
        reads the run's key Secret, recorded since the legs started."""
        r = self.run
        body = pytorchjob.comparator_job(r.name, r.namespace, r.uid, self.run_spec,
                                         self.location.uri,
                                         key_secret=self.ensure_checkpoint_key())
        try:
            self.kube.create(JOBS, r.namespace, body)
        except Conflict:
            return False
        log.info("%s: started the comparator Job %s", r.name, self.comparator_name)
        return True

    def cleanup(self) -> None:
        """Delete every job this run started (pods go with them: Background propagation).
        When the watch holds every job the run can have (its legs' and its comparator's),
        they are deleted by name, each on the uid seen; else the run's jobs are listed."""
        wanted = [*((self.legs.kind, self.job_name(p.name)) for p in self.plan.legs),
                  (JOBS, self.comparator_name)]
        held: list[tuple[Kind, Obj]] = []
        for kind, name in wanted:
            obj = self.reads.cached(kind, self.run.namespace, name)
            if obj is not None:
                held.append((kind, obj))
        deleted = None
        if len(held) == len(wanted):
            try:
                deleted = _delete_owned(self.kube, self.run, held)
            except Conflict:  # a job replaced under the same name since it was seen
                deleted = None
        if deleted is None:
            deleted = delete_run_jobs(self.kube, self.run, self.kinds)
        if deleted:
            log.info("%s/%s: deleted %d job(s)", self.run.namespace, self.run.name, deleted)


def _zoom_concluded(location: RunLocation, name: str) -> ZoomStatus:
    """The status of a zoom Job that completed: what its ``zoom.json`` says."""
    where = location.url(ZOOM_JSON)
    try:
        zoom = Zoom.model_validate_json(location.read_result(ZOOM_JSON))
    except StoreNotFound:
        return ZoomStatus(job=name, state="Failed",
                          summary=f"the zoom Job {name} completed without writing {where}")
    except (ValidationError, StoreError) as e:
        return ZoomStatus(job=name, state="Failed",
                          summary=clip(f"{where} is unreadable: {type(e).__name__}"))
    return ZoomStatus(job=name, state="Succeeded", origin_kind=zoom.origin_kind,
                      origins=[clip(o, 253) for o in zoom.origins[:8]],
                      summary=clip(zoom.summary), url=where)


def observe_zoom(kube: Kube, run: RunRef, run_spec: QualificationRunSpec,
                 location: RunLocation, previous: ZoomStatus | None,
                 notices: list[Notice], *, key_secret: str | None = None,
                 network_policies: bool = True) -> ZoomStatus:
    """Start the zoom Job of a FAIL (``spec.zoom: onFail``) or follow it to its end.

    A concluded zoom is not looked at again; the Job's own conditions say when it ended,
    and ``zoom.json`` what it found. Events are appended to ``notices``. Its pod reads the
    checkpoint key from the run's Secret ``key_secret``; with ``network_policies`` it
    admits connections only from itself, as a leg's pods (:mod:`.netpolicy`).
    """
    if previous is not None and previous.state != "Running":
        return previous
    name = pytorchjob.zoom_job_name(run.name, run.uid)
    try:
        job = kube.get(JOBS, run.namespace, name)
    except NotFound:
        body = pytorchjob.zoom_job(run.name, run.namespace, run.uid, run_spec, location.uri,
                                   key_secret=key_secret)
        if network_policies:
            create_network_policy(kube, netpolicy.zoom_network_policy(
                run.name, run.namespace, run.uid))
        try:
            kube.create(JOBS, run.namespace, body)
            log.info("%s: started the zoom Job %s", run.name, name)
            notices.append(Notice("ZoomStarted", f"replaying the first divergent step "
                                                 f"of both legs in Job {name}"))
        except Conflict:
            pass
        return ZoomStatus(job=name, state="Running")
    complete, failed = _condition(job, "Complete"), _condition(job, "Failed")
    if complete is None and failed is None:
        return ZoomStatus(job=name, state="Running")
    if complete is not None:
        status = _zoom_concluded(location, name)
    else:
        detail = (failed or {}).get("reason") or (failed or {}).get("message") or "no detail"
        status = ZoomStatus(job=name, state="Failed", summary=clip(
            f"the zoom Job {name} failed ({detail}); its pod's log says why"))
    if status.state == "Succeeded":
        notices.append(Notice("Zoomed", status.summary or ""))
        # Done with, as the comparator's is; a failed one stays for its pod's log (the run's
        # deletion takes it).
        with contextlib.suppress(NotFound):
            kube.delete(JOBS, run.namespace, name, propagation="Background")
    else:
        notices.append(Notice("ZoomFailed", status.summary or ""))
    return status


def create_network_policy(kube: Kube, body: Obj) -> None:
    """Create a NetworkPolicy of :mod:`.netpolicy`; one of its name is one made before
    (policies only add what they admit: whoever could have made it first may admit any
    traffic with a policy of their own anyway)."""
    meta = body["metadata"]
    try:
        kube.create(NETWORK_POLICIES, meta["namespace"], body)
    except Conflict:
        return
    log.debug("%s: created NetworkPolicy %s", meta["namespace"], meta["name"])


def delete_run_jobs(kube: Kube, ref: RunRef, kinds: tuple[Kind, ...] = job_kinds(None)) -> int:
    """Delete the jobs of ``kinds`` (PyTorchJobs, TrainJobs, Jobs) a run owns (Background:
    pods follow); how many."""
    selector = f"{pytorchjob.UID_LABEL}={ref.uid},{pytorchjob.MANAGED_BY}={pytorchjob.OPERATOR}"
    return _delete_owned(kube, ref, [
        (kind, obj) for kind in kinds
        for obj in kube.list(kind, ref.namespace, labels=selector).get("items") or []],
        precondition=False)


def _delete_owned(kube: Kube, ref: RunRef, objs: list[tuple[Kind, Obj]], *,
                  precondition: bool = True) -> int:
    """Delete those of ``objs`` the run owns and that are not being deleted (on the uid
    seen, with ``precondition``), all at once; how many. The first error is raised once
    every deletion has been tried."""
    doomed = [(kind, obj) for kind, obj in objs
              if ref.owns(obj) and not obj["metadata"].get("deletionTimestamp")]

    def delete(kind: Kind, obj: Obj) -> int:
        try:
            kube.delete(kind, ref.namespace, obj["metadata"]["name"],
                        propagation="Background",
                        uid=obj["metadata"].get("uid") if precondition else None)
        except NotFound:
            return 0
        return 1

    if not doomed:
        return 0
    # One request's latency rather than one per job: a run has a job per leg and one more.
    return sum(fanout.together([partial(delete, kind, obj) for kind, obj in doomed]))


__all__ = [
    "ClusterError", "ComparatorFailed", "KillRefused", "KubernetesBackend", "RunRef",
    "delete_run_jobs", "observe_zoom",
]

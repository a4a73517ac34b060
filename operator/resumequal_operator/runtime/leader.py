"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does.

A candidate acquires the Lease when it is free, released, or expired, and then renews it
every ``retry_seconds``; a leader that cannot renew within ``renew_deadline_seconds``
stops leading. Expiry is judged on this replica's own monotonic clock from when it last
saw the Lease *change*, never from the renewTime written by another machine, so clock
skew between nodes cannot hand the Lease to two replicas. Writes carry the Lease's
resourceVersion: of two candidates racing for it, one gets 409 and stays a follower.
On shutdown a leader releases the Lease (empty holder) so a standby takes over at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from resumequal.errors import ClusterError
from resumequal_operator.kube import LEASES, Kube, NotFound, Obj

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseSettings:
    """Timing of the election. Defaults are client-go's (15 s lease, 10 s renew deadline,
    2 s retry): a crashed leader is replaced within ~17 s, and a renewal can miss a few
    retries on a slow API server before leadership is given up."""

    name: str = "resumequal-operator"
    namespace: str = "default"
    lease_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 2.0


def _now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Runs the election in a thread; :attr:`is_leader` says whether this replica leads."""

    def __init__(self, kube: Kube, identity: str, settings: LeaseSettings,
                 on_change: Callable[[bool], None] | None = None) -> None:
        self.kube, self.identity, self.settings = kube, identity, settings
        self.on_change = on_change
        self._leading = threading.Event()
        self.known = threading.Event()  # set after the first attempt: leader state known
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._observed: tuple[str, float] | None = None  # (resourceVersion, monotonic)
        self._last_renew = 0.0
        self._lost_to_other = False  # the last attempt saw another live holder

    @property
    def is_leader(self) -> bool:
        return self._leading.is_set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        """Stop campaigning; a leader releases the Lease unless ``release`` is false."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.settings.retry_seconds + 5)
        if release and self.is_leader:
            self._release()
        self._set(False)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                ok = self._try_acquire_or_renew()
            except ClusterError as e:
                log.warning("lease %s: %s", self.settings.name, e)
                ok = False
            now = time.monotonic()
            if ok:
                self._last_renew = now
                self._set(True)
            elif self.is_leader and now - self._last_renew > self.settings.renew_deadline_seconds:
                log.error("lease %s: could not renew within %gs; no longer leading",
                          self.settings.name, self.settings.renew_deadline_seconds)
                self._set(False)
            elif self.is_leader and self._lost_to_other:
                self._set(False)
            self.known.set()
            self._stop.wait(self.settings.retry_seconds)

    def _set(self, leading: bool) -> None:
        if leading == self.is_leader:
            return
        if leading:
            self._leading.set()
        else:
            self._leading.clear()
        log.info("lease %s/%s: %s", self.settings.namespace, self.settings.name,
                 "leading" if leading else "following")
        if self.on_change is not None:
            self.on_change(leading)

    def _spec(self, transitions: int, acquire: str | None) -> Obj:
        now = _now_micro()
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.settings.lease_seconds)),
            "acquireTime": acquire or now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    def _try_acquire_or_renew(self) -> bool:
        s = self.settings
        self._lost_to_other = False
        try:
            lease = self.kube.get(LEASES, s.namespace, s.name)
        except NotFound:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": s.name, "namespace": s.namespace},
                    "spec": self._spec(0, None)}
            try:
                created = self.kube.create(LEASES, s.namespace, body)
            except ClusterError as e:
                if e.status == 409:
                    return False  # another candidate created it first
                raise
            self._observe(created)
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        rv = lease["metadata"]["resourceVersion"]
        self._observe(lease)
        if holder and holder != self.identity:
            assert self._observed is not None
            duration = float(spec.get("leaseDurationSeconds") or s.lease_seconds)
            if time.monotonic() - self._observed[1] <= duration:
                self._lost_to_other = True
                return False
            log.info("lease %s: holder %s expired; taking over", s.name, holder)
        transitions = int(spec.get("leaseTransitions") or 0)
        mine = holder == self.identity
        new = {**lease, "spec": self._spec(transitions if mine else transitions + 1,
                                           spec.get("acquireTime") if mine else None)}
        new["metadata"] = {**lease["metadata"], "resourceVersion": rv}
        try:
            updated = self.kube.replace(LEASES, s.namespace, new)
        except ClusterError as e:
            if e.status == 409:
                return False
            raise
        self._observe(updated)
        return True

    def _observe(self, lease: Obj) -> None:
        rv = lease["metadata"]["resourceVersion"]
        if self._observed is None or self._observed[0] != rv:
            self._observed = (rv, time.monotonic())

    def _release(self) -> None:
        s = self.settings
        try:
            lease = self.kube.get(LEASES, s.namespace, s.name)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            spec = {**lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1,
                    "renewTime": _now_micro()}
            self.kube.replace(LEASES, s.namespace, {**lease, "spec": spec})
            log.info("lease %s: released", s.name)
        except ClusterError as e:
            log.warning("lease %s: release failed: %s", s.name, e)

"""One leg's files in a run location: beacons, kill orders, pod kill records, completion
and failure markers, and its trace (:mod:`.traces`).

Every JSON object here is sealed with the run's seal where the writer holds it
(:mod:`.seal`), and read back through its model (:mod:`.beacons`): a reader with the seal
acts only on what this run wrote under this name.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from resumequal.errors import NotAuthentic, StoreError
from resumequal.run.beacons import Beacon, InvalidBeacon, KillOrder, PodKill
from resumequal.run.layout import FAILED_MARKER, FAILURE_REASON_BYTES, SMALL_OBJECT_BYTES
from resumequal.run.seal import sealed, unsealed, warn_once
from resumequal.run.signing import RunSeal
from resumequal.run.traces import LegTraces
from resumequal.store import Store, StoreNotFound, StoreObjectTooLarge, open_store
from resumequal.trace.records import TraceRecord
from resumequal.words import clip

_M = TypeVar("_M", bound=BaseModel)

__all__ = ["LegFiles"]


@dataclass
class LegFiles:
    """One leg's beacons, kill orders, completion and failure markers under a store prefix
    (``""``: the store root)."""

    store: Store
    prefix: str = ""
    # Parsed trace segments (as their records' models), shared by every LegFiles of one
    # run location.
    trace_cache: dict[str, list[TraceRecord]] = field(default_factory=dict, repr=False,
                                                      compare=False)
    # The run's seal: with it, trace segments are written with their MAC and refused
    # without a valid one.
    seal: RunSeal | None = field(default=None, repr=False, compare=False)

    def key(self, name: str) -> str:
        """The store key of ``name`` under the leg's prefix."""
        return f"{self.prefix}/{name}" if self.prefix else name

    def traces(self) -> LegTraces:
        """The leg's trace (``<leg>/trace``): how workers write it and how it is read."""
        return LegTraces(self.store, self.key("trace"), self.seal, self.trace_cache)

    @classmethod
    def folder(cls, leg_dir: Path) -> LegFiles:
        """A leg folder on this machine."""
        return cls(open_store(str(leg_dir)))

    def beacon_key(self, rank: int, attempt: int) -> str:
        """Where the armed worker of ``rank`` in ``attempt`` publishes its beacon."""
        return self.key(f"beacons/attempt-{attempt}-rank-{rank}.json")

    def kill_order_key(self, rank: int, attempt: int) -> str:
        """Where the order to kill that worker is written."""
        return self.key(f"beacons/kill-attempt-{attempt}-rank-{rank}.json")

    def pod_kill_key(self, rank: int, attempt: int) -> str:
        """Where the record of that worker's pod deletion is written."""
        return self.key(f"beacons/pod-kill-attempt-{attempt}-rank-{rank}.json")

    def done_key(self, rank: int) -> str:
        """Where ``rank`` says it finished the leg."""
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
        self.store.put_bytes(key, sealed(self.seal, key,
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
            body = unsealed(self.seal, key, data, where, what)
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
        self.store.put_bytes(key, sealed(self.seal, key, body))
        return self.store.uri(key)

    def rank_done(self, rank: int) -> bool:
        """Whether ``rank`` said it finished the leg, in a marker this run wrote (one that
        is not is said once, and never counts)."""
        key = self.done_key(rank)
        try:
            data = self.store.get_bytes(key, SMALL_OBJECT_BYTES)
            body = unsealed(self.seal, key, data, self.store.uri(key), "a completion marker")
        except StoreNotFound:
            return False
        except (NotAuthentic, StoreObjectTooLarge, ValueError) as e:
            warn_once(f"done: {self.store.uri(key)}: {e}")
            return False
        return isinstance(body, dict) and body.get("rank") == rank

    def mark_failed(self, reason: str) -> None:
        """Fail the leg for every later attempt too (the launcher would otherwise restart it)."""
        # Bounded here: the marker must fit what its readers take (SMALL_OBJECT_BYTES);
        # statuses and Events show 1 KiB of it anyway.
        body = {"reason": clip(reason, FAILURE_REASON_BYTES), "at": time.time()}
        key = self.key(FAILED_MARKER)
        self.store.put_bytes(key, sealed(self.seal, key, body))

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
                warn_once(f"{self.store.uri(key)}: too large to be this run's failure marker")
                return None
            return "unreadable failure marker (too large to read)"
        try:
            body = unsealed(self.seal, key, data, self.store.uri(key), "a failure marker")
        except NotAuthentic as e:
            warn_once(str(e))
            return None
        except ValueError:
            return "unreadable failure marker"
        reason = body.get("reason") if isinstance(body, dict) else None
        if isinstance(reason, str):
            return reason
        if self.seal is not None:  # sealed by this run, yet no marker: ours never is
            warn_once(f"{self.store.uri(key)}: not a failure marker (no reason)")
            return None
        return "unreadable failure marker"

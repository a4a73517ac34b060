"""The small JSON files of a run location, one model each: beacons, kill orders and pod
kill records (camelCase on disk and on S3).

The run location (:mod:`.legfiles`) seals, writes, reads, authenticates and validates them
through these models; the qualification machine and the backends act on them. Pure data:
imports nothing of ours but the error tree (no store, no torch).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from resumequal.errors import StoreError

__all__ = ["GROW", "MAX_EPOCH_SECONDS", "Beacon", "Count", "InvalidBeacon", "KillOrder",
           "PodKill"]

# A beacon's ``at`` when rank 0 of a world shrunk by a resize waits for a node to join.
GROW = "grow"

# The last second a status timestamp can hold (9999-12-31T23:59:59Z, RFC 3339's last year
# and datetime's): a time past it is no time a worker recorded.
MAX_EPOCH_SECONDS = 253402300799.0

# A beacon is read from the store, and its numbers go into a run's status: bounded as the
# status holds them (int32 counts, a finite time a timestamp can hold), so that whoever can
# write the store gets a refused beacon naming the field, not a status that no longer
# writes (1e30 is no int64; Infinity is no JSON) on every reconcile after.
Count = Annotated[int, Field(ge=0, lt=2**31)]


class Beacon(BaseModel):
    """``<leg>/beacons/attempt-<a>-rank-<r>.json``: what an armed worker publishes, who to
    kill and where it stands."""

    model_config = ConfigDict(extra="ignore", alias_generator=to_camel, validate_by_name=True,
                              validate_by_alias=True)
    pid: Count
    host: str
    pod: str | None = None
    # From the downward API (metadata.uid): a kill order names it, so that an order
    # replayed after the pod was replaced is ignored by the new pod.
    pod_uid: str | None = None
    rank: Count
    attempt: Count
    step: Count
    microstep: Count
    at: str = "microbatch"
    armed_at: float = Field(ge=0, le=MAX_EPOCH_SECONDS, allow_inf_nan=False)


class InvalidBeacon(StoreError):
    """A beacon in the store that is not one, or names what must not be acted on (a pod
    name that is no name): it is written once, so the run cannot go on."""


class _Kill(BaseModel):
    """What every kill of an armed rank says: whose, how, and when it was issued."""

    model_config = ConfigDict(extra="ignore", alias_generator=to_camel, validate_by_name=True,
                              validate_by_alias=True, serialize_by_alias=True)
    rank: int
    attempt: int
    pod_uid: str | None = None
    mode: Literal["hard", "graceful"]
    grace_seconds: float
    issued_at: float


class KillOrder(_Kill):
    """``<leg>/beacons/kill-attempt-<a>-rank-<r>.json``: an order to an armed worker to kill
    itself, written to the store by whoever kills.

    The worker obeys only an order naming its own pid and, when ``podUid`` is set, its
    pod's uid: a replayed order never hits a replacement pod (same name, same pids).
    """

    pid: int


class PodKill(_Kill):
    """``<leg>/beacons/pod-kill-attempt-<a>-rank-<r>.json``: a record, written by whoever
    deleted the armed worker's pod, of when and how: the pod deletion leaves no kill order,
    and the comparator's timeline needs the kill time."""

    pod: str

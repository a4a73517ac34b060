"""core/v1 Events about a QualificationRun: one per phase change and one per preemption.

An Event is a notice for ``kubectl describe``, not state: failing to write one is logged
and never fails a reconcile, and writing one never holds a reconcile up. As client-go's
recorder does (``tools/record/event.go``: ``recorderImpl.generateEvent`` puts the event on
the channel of a ``watch.Broadcaster`` of ``maxQueuedEvents`` = 1000, ``DropIfChannelFull``,
and a goroutine of ``StartRecordingToSink`` writes them one by one), :meth:`EventRecorder.
record` builds the Event (its name and timestamps say when it happened) and queues it; a
thread of the recorder's own writes the queue in order. What differs from client-go, and
why:

- **A full queue** drops the new Event, logs it (reason and object, never the message)
  and counts it in ``resumequal_operator_events_dropped_total{cause="queue-full"}``, as
  client-go logs "too many queued events, dropped event". The reconcile goes on.
- **Retries**: an Event the API server did not answer (no response, 5xx, 429) is tried
  again after ``retry_seconds`` (the first wait drawn at random below it, so that
  replicas do not retry in step), ``tries`` times in all, as ``recordToSink`` does with
  ``maxTriesPerEvent`` = 12 every 10 s; one it refused (any other 4xx) is not retried
  (``recordEvent``: "Server rejected event ... will not retry"). Either way it is logged
  and counted (``cause="write-failed"``).
- **Stopping** writes every Event still queued, each tried once (client-go's
  ``Shutdown`` still distributes what is queued and then gives up retrying), so a clean
  stop loses none; a stop bounded by ``timeout`` counts what it could not write.
- **No aggregation** (``events_cache.go``'s ``EventCorrelator``: similar Events folded into
  one with a count, a token bucket per object): the operator records an Event once per
  phase change, per preemption and per new error message, never once per reconcile, so
  there is nothing to fold.

Logs name the Event's reason and object and the bounded error of :mod:`.kube` (status,
reason, at most 300 characters of the Status message), never an Event's body or an
answer's; the message was redacted when the Event was built.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime

from resumequal.errors import ClusterError
from resumequal.redact import redact
from resumequal.words import clip
from resumequal_operator.kube import EVENTS, Kube, Obj

log = logging.getLogger(__name__)

COMPONENT = "resumequal-operator"
# client-go's maxQueuedEvents: far more than the Events of the runs a replica reconciles
# at once (a handful each), so only an API server that stopped answering fills it.
QUEUE_SIZE = 1000
# client-go's maxTriesPerEvent; 1 s apart (client-go waits 10 s): an Event is about a
# phase that may last seconds, and stopping waits for no retry.
TRIES = 12
RETRY_SECONDS = 1.0
QUEUE_FULL, WRITE_FAILED = "queue-full", "write-failed"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _transient(e: ClusterError) -> bool:
    """Whether trying again may write it: no answer, or the server was busy or failing."""
    status = e.status or 0
    return status == 0 or status == 429 or status >= 500


class EventRecorder:
    """Queues Events for objects, as ``resumequal-operator`` on ``instance``, and writes
    them from a thread of its own (see the module docstring). ``dropped(cause)`` is
    called for every Event not written. :meth:`start` before the first :meth:`record`
    is not needed: the thread starts with the first Event."""

    def __init__(self, kube: Kube, instance: str, *, queue_size: int = QUEUE_SIZE,
                 tries: int = TRIES, retry_seconds: float = RETRY_SECONDS,
                 dropped: Callable[[str], None] | None = None) -> None:
        self.kube, self.instance = kube, instance
        self.queue_size, self.tries, self.retry_seconds = queue_size, tries, retry_seconds
        self._dropped = dropped or (lambda cause: None)
        self._cond = threading.Condition()
        self._queue: deque[Obj] = deque()
        self._sending = 0  # taken off the queue, not yet written or given up on
        self._stopping = False
        self._stopped = threading.Event()  # wakes a retry's wait when stopping
        self._thread: threading.Thread | None = None

    # -- the reconcile's side ------------------------------------------------------------

    def record(self, obj: Obj, reason: str, message: str, *, warning: bool = False) -> None:
        """Queue an Event about ``obj``; never waits for the API server."""
        event = self._event(obj, reason, message, warning)
        with self._cond:
            if self._stopping:
                log.warning("event %s for %s/%s not recorded: the recorder has stopped",
                            reason, obj["metadata"]["namespace"], obj["metadata"]["name"])
                self._dropped(WRITE_FAILED)
                return
            if len(self._queue) >= self.queue_size:
                log.error("event %s for %s/%s dropped: %d Events queued already", reason,
                          obj["metadata"]["namespace"], obj["metadata"]["name"],
                          len(self._queue))
                self._dropped(QUEUE_FULL)
                return
            self._queue.append(event)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="event-recorder",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _event(self, obj: Obj, reason: str, message: str, warning: bool) -> Obj:
        meta = obj["metadata"]
        now = _now()
        return {
            "apiVersion": "v1",
            "kind": "Event",
            # Named like client-go's recorder (record/event.go: "<name>.<UnixNano in hex>"),
            # so a list by name, as `kubectl describe` shows it, is in the order they happened.
            "metadata": {"name": f"{meta['name']}.{time.time_ns():x}",
                         "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": obj["apiVersion"], "kind": obj["kind"],
                               "name": meta["name"], "namespace": meta["namespace"],
                               "uid": meta["uid"]},
            "reason": reason,
            "message": clip(redact(message)),
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Events queued or being written."""
        with self._cond:
            return len(self._queue) + self._sending

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every Event recorded so far is written or given up on; whether that
        happened within ``timeout`` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._sending,
                                       timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued (each Event tried once, no retry waits), then stop; Events
        recorded after this are dropped. What is still queued after ``timeout`` seconds
        is counted as dropped."""
        with self._cond:
            self._stopping = True
            self._stopped.set()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        with self._cond:
            left = len(self._queue)
            self._queue.clear()
        if left:
            log.warning("%d Event(s) not written: the recorder stopped before them", left)
            for _ in range(left):
                self._dropped(WRITE_FAILED)

    # -- the writer's side ---------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._stopping)
                if not self._queue:
                    return  # stopping, and everything is written
                event = self._queue.popleft()
                self._sending += 1
            try:
                self._write(event)
            except Exception:  # a bug must not end the thread: later Events still go out
                log.exception("event %s for %s/%s not recorded", event["reason"],
                              event["involvedObject"]["namespace"],
                              event["involvedObject"]["name"])
                self._dropped(WRITE_FAILED)
            finally:
                with self._cond:
                    self._sending -= 1
                    self._cond.notify_all()

    def _write(self, event: Obj) -> None:
        what = (f"event {event['reason']} for {event['involvedObject']['namespace']}/"
                f"{event['involvedObject']['name']}")
        for attempt in range(1, self.tries + 1):
            try:
                self.kube.create(EVENTS, event["metadata"]["namespace"], event)
                return
            except ClusterError as e:
                last_try = (attempt == self.tries or not _transient(e)
                            or self._stopped.is_set())
                if last_try:
                    log.warning("%s not recorded: %s", what, e)
                    self._dropped(WRITE_FAILED)
                    return
                # The first wait drawn at random, as recordToSink does, so that replicas
                # that lost the API server together do not come back together.
                delay = self.retry_seconds * (random.random() if attempt == 1 else 1.0)
                log.info("%s not recorded yet (%s); trying again in %.1fs", what, e, delay)
                if self._stopped.wait(delay):
                    log.warning("%s not recorded: stopping (%s)", what, e)
                    self._dropped(WRITE_FAILED)
                    return

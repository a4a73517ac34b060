"""A work queue of object keys: de-duplicated, delayed, rate-limited, one worker per key.

The semantics of client-go's queue: a key added while waiting is queued once; a key added
while a worker processes it is queued again after :meth:`WorkQueue.done`, so two workers
never reconcile the same run at once and no change is lost. Failures back off
exponentially per key until :meth:`WorkQueue.forget`. How long each key waited, from its
add (or its delay coming due) to a worker taking it, goes to ``on_wait``, as client-go's
``workqueue_queue_duration_seconds`` measures it.

Two priorities, as controller-runtime's priority queue has them
(pkg/controller/priorityqueue, designs/priorityqueue.md): keys added at low priority (every
run of a listing at start-up, of a resync, of a new leadership) are handed out only when no
key of normal priority waits, and a key added at both has the higher. A restarted operator
holding thousands of finished runs, or a resync of them, then does not delay the run that
just changed (a leg to launch, a kill to deliver) behind all of them.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable


class ShutDown(Exception):
    """The queue was shut down while a worker waited for a key."""


class WorkQueue:
    """Keys to reconcile; thread-safe."""

    def __init__(self, base_delay: float = 0.05, max_delay: float = 60.0,
                 clock: Callable[[], float] = time.monotonic,
                 on_wait: Callable[[float, bool], None] | None = None) -> None:
        # Backoff from 50 ms doubling to 1 min: a transient API error retries at once, a
        # broken store stops hammering within a dozen attempts, and a run whose errors
        # persist is failed at most a minute after timeouts.backendErrorSeconds.
        self.base_delay, self.max_delay = base_delay, max_delay
        self.clock = clock
        self._cond = threading.Condition()
        self._queue: deque[str] = deque()
        # Keys waiting at low priority, in order (a dict as an ordered set: a key added at
        # normal priority meanwhile leaves it for ``_queue``).
        self._low: dict[str, None] = {}
        self._dirty: set[str] = set()
        self._dirty_low: set[str] = set()  # dirty keys added at low priority only
        self._processing: set[str] = set()
        self._waiting: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []
        self._failures: dict[str, int] = {}
        # When each dirty key was added (due, for a delayed one): what get() hands
        # ``on_wait`` (with whether it was taken at low priority), as client-go's queue
        # metrics time an item from Add to Get.
        self._added: dict[str, float] = {}
        self.on_wait = on_wait
        self._shutdown = False

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue) + len(self._low)

    def add(self, key: str, *, low: bool = False) -> None:
        """Queue ``key`` (``low``: behind every key of normal priority)."""
        with self._cond:
            self._add(key, low=low)

    def add_low(self, key: str) -> None:
        """Queue ``key`` at low priority (a listing's, a resync's)."""
        self.add(key, low=True)

    def _add(self, key: str, at: float | None = None, low: bool = False) -> None:
        if self._shutdown:
            return
        if key in self._dirty:
            if not low and key in self._dirty_low:  # raised to normal priority
                self._dirty_low.discard(key)
                if key in self._low:  # else it is being processed: done() queues it
                    del self._low[key]
                    self._queue.append(key)
                    self._cond.notify()
            return
        self._dirty.add(key)
        if low:
            self._dirty_low.add(key)
        self._added[key] = self.clock() if at is None else at
        self._waiting.pop(key, None)
        if key not in self._processing:
            self._enqueue(key)

    def _enqueue(self, key: str) -> None:
        if key in self._dirty_low:
            self._low[key] = None
        else:
            self._queue.append(key)
        self._cond.notify()

    def add_after(self, key: str, delay: float) -> None:
        """Add ``key`` after ``delay`` seconds; an earlier pending time for it wins."""
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            if self._shutdown:
                return
            due = self.clock() + delay
            if key in self._waiting and self._waiting[key] <= due:
                return
            self._waiting[key] = due
            heapq.heappush(self._heap, (due, key))
            self._cond.notify()

    def add_rate_limited(self, key: str) -> float:
        """Add ``key`` after its backoff (base * 2^failures, capped); returns the delay."""
        with self._cond:
            n = self._failures.get(key, 0)
            self._failures[key] = n + 1
        delay = min(self.max_delay, self.base_delay * 2.0**n)
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        with self._cond:
            self._failures.pop(key, None)

    def failures(self, key: str) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    def get(self, timeout: float | None = None) -> str | None:
        """The next key (now owned by the caller until :meth:`done`); None on timeout."""
        deadline = None if timeout is None else self.clock() + timeout
        with self._cond:
            while True:
                if self._shutdown:
                    raise ShutDown
                self._promote()
                if self._queue or self._low:
                    low = not self._queue
                    if low:
                        key = next(iter(self._low))
                        del self._low[key]
                    else:
                        key = self._queue.popleft()
                    self._processing.add(key)
                    self._dirty.discard(key)
                    self._dirty_low.discard(key)
                    added = self._added.pop(key, None)
                    if self.on_wait is not None and added is not None:
                        self.on_wait(max(0.0, self.clock() - added), low)
                    return key
                wait = None if not self._heap else max(0.0, self._heap[0][0] - self.clock())
                if deadline is not None:
                    left = deadline - self.clock()
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self._cond.wait(wait)

    def _promote(self) -> None:
        now = self.clock()
        while self._heap and self._heap[0][0] <= now:
            due, key = heapq.heappop(self._heap)
            if self._waiting.get(key) == due:
                del self._waiting[key]
                self._add(key, at=due)  # promoted late (on a get): it waited since due

    def done(self, key: str) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._enqueue(key)

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

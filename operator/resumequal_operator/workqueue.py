"""A work queue of object keys: de-duplicated, delayed, rate-limited, one worker per key.

The semantics of client-go's queue: a key added while waiting is queued once; a key added
while a worker processes it is queued again after :meth:`WorkQueue.done`, so two workers
never reconcile the same run at once and no change is lost. Failures back off
exponentially per key until :meth:`WorkQueue.forget`.
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
                 clock: Callable[[], float] = time.monotonic) -> None:
        # Backoff from 50 ms doubling to 1 min: a transient API error retries at once, a
        # broken store stops hammering within a dozen attempts, and a run whose errors
        # persist is failed at most a minute after timeouts.backendErrorSeconds.
        self.base_delay, self.max_delay = base_delay, max_delay
        self.clock = clock
        self._cond = threading.Condition()
        self._queue: deque[str] = deque()
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._waiting: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []
        self._failures: dict[str, int] = {}
        self._shutdown = False

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue)

    def add(self, key: str) -> None:
        with self._cond:
            self._add(key)

    def _add(self, key: str) -> None:
        if self._shutdown or key in self._dirty:
            return
        self._dirty.add(key)
        self._waiting.pop(key, None)
        if key not in self._processing:
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
                if self._queue:
                    key = self._queue.popleft()
                    self._processing.add(key)
                    self._dirty.discard(key)
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
                self._add(key)

    def done(self, key: str) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify()

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

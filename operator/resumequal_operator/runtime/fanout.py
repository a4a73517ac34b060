"""The threads the operator sends requests on side by side (a run's legs created together,
its jobs deleted together, its finalizer PATCH beside its key Secret): one pool for the
process, kept between reconciles.

A pool per call costs a thread start and a join each time, which under load (several
workers sharing one interpreter) was a quarter of a reconcile's wall time. What runs here
must be a leaf: a request or a store write that waits on nothing else in the pool, so a
full pool only queues work and never deadlocks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

# Enough for the largest fan-out (a job per leg of a seed matrix, and the comparator) of
# several workers at once; threads are started as needed and then kept.
THREADS = 32

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="fanout")
        return _pool


def submit(fn: Callable[..., T], /, *args: object) -> Future[T]:
    """``fn(*args)`` on a pool thread; its future."""
    return _executor().submit(fn, *args)


def together(calls: Sequence[Callable[[], T]]) -> list[T]:
    """Run ``calls`` at once and wait for all of them; their results in order. The first
    error is raised once every call has ended (none is left running behind it)."""
    if len(calls) == 1:
        return [calls[0]()]
    futures = [submit(call) for call in calls]
    errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error
    return [f.result() for f in futures]


__all__ = ["THREADS", "submit", "together"]

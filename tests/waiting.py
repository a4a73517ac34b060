"""``eventually``: the one way tests wait for what nothing signals (files, metrics, pods)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T], timeout: float = 10.0, what: str = "condition", *,
               interval: float = 0.02, abort: Callable[[], str | None] | None = None) -> T:
    """Poll ``check`` until it returns something truthy and return that. AssertionError
    naming ``what`` after ``timeout`` s, or at once with ``abort``'s message when it has one
    (say, the process that should get there exited)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        reason = abort() if abort is not None else None
        if reason:
            raise AssertionError(f"gave up waiting for {what}: {reason}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)

"""The operator's shared request threads: calls run together, results come back in order,
and an error is raised only once every call has ended."""

from __future__ import annotations

import threading
import time

import pytest

from resumequal_operator.runtime import fanout


def test_calls_run_together_and_results_keep_their_order() -> None:
    # Each call waits for the other two: this passes only if all three run at once.
    barrier = threading.Barrier(3, timeout=10)

    def call(i: int) -> int:
        barrier.wait()
        return i * i

    assert fanout.together([lambda i=i: call(i) for i in range(3)]) == [0, 1, 4]


def test_a_single_call_runs_on_the_callers_thread() -> None:
    assert fanout.together([threading.get_ident]) == [threading.get_ident()]


def test_the_first_error_waits_for_every_call() -> None:
    release, finished = threading.Event(), threading.Event()

    def fails() -> None:
        raise ValueError("first")

    def slow() -> None:
        release.wait(10)
        time.sleep(0.05)
        finished.set()

    def fails_later() -> None:
        release.set()
        raise KeyError("second")

    with pytest.raises(ValueError, match="first"):
        fanout.together([fails, slow, fails_later])
    # Nothing the fan-out started is left running behind the error.
    assert finished.is_set()


def test_a_fan_out_wider_than_the_pool_queues_and_completes() -> None:
    running, peak, lock = 0, 0, threading.Lock()

    def call(i: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.01)
        with lock:
            running -= 1
        return i

    wide = fanout.THREADS + 8
    assert fanout.together([lambda i=i: call(i) for i in range(wide)]) == list(range(wide))
    assert 1 < peak <= fanout.THREADS


def test_submit_returns_the_calls_future() -> None:
    assert fanout.submit(sum, [1, 2, 3]).result(timeout=10) == 6

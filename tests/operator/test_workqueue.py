"""The work queue: de-duplication, one worker per key, delays, backoff (a fake clock)."""

from __future__ import annotations

import threading

import pytest

from resumequal_operator.workqueue import ShutDown, WorkQueue


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_key_added_twice_is_queued_once() -> None:
    q = WorkQueue()
    q.add("ns/a")
    q.add("ns/a")
    q.add("ns/b")
    assert len(q) == 2
    assert [q.get(0), q.get(0), q.get(0)] == ["ns/a", "ns/b", None]


def test_a_key_added_while_processed_comes_back_after_done_only() -> None:
    q = WorkQueue()
    q.add("ns/a")
    key = q.get(0)
    q.add("ns/a")
    assert q.get(0) is None  # a second worker must not get it meanwhile
    q.done(key or "")
    assert q.get(0) == "ns/a"


def test_add_after_waits_and_the_earliest_time_wins() -> None:
    clock = Clock()
    q = WorkQueue(clock=clock)
    q.add_after("ns/a", 10)
    q.add_after("ns/a", 5)
    q.add_after("ns/a", 20)
    assert q.get(0) is None
    clock.now += 5
    assert q.get(0) == "ns/a"
    q.done("ns/a")
    clock.now += 30
    assert q.get(0) is None  # the later duplicates were folded into the first


def test_backoff_doubles_per_failure_up_to_the_cap_and_forget_resets_it() -> None:
    q = WorkQueue(base_delay=0.5, max_delay=3.0, clock=Clock())
    assert [q.add_rate_limited("ns/a") for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert q.failures("ns/a") == 5
    q.forget("ns/a")
    assert q.add_rate_limited("ns/a") == 0.5


def test_get_blocks_until_a_delayed_key_is_due() -> None:
    q = WorkQueue()
    q.add_after("ns/a", 0.05)
    assert q.get(timeout=2) == "ns/a"


def test_shutdown_wakes_waiting_workers() -> None:
    q = WorkQueue()
    raised = threading.Event()

    def worker() -> None:
        with pytest.raises(ShutDown):
            q.get()
        raised.set()

    t = threading.Thread(target=worker)
    t.start()
    q.shutdown()
    t.join(timeout=2)
    assert raised.is_set()

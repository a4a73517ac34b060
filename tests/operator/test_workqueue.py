"""The work queue: de-duplication, one worker per key, delays, backoff (a fake clock)."""

from __future__ import annotations

import threading

import pytest

from resumequal_operator.runtime.workqueue import ShutDown, WorkQueue


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


def test_each_get_reports_how_long_its_key_waited_from_its_first_add() -> None:
    clock, waits = Clock(), []
    q = WorkQueue(clock=clock, on_wait=lambda seconds, low: waits.append(seconds))
    q.add("ns/a")
    clock.now += 0.25
    q.add("ns/a")  # already queued: still timed from the first add
    clock.now += 0.5
    assert q.get(0) == "ns/a"
    # Added again while processed: it waits for done() too, and that counts.
    q.add("ns/a")
    clock.now += 2.0
    q.done("ns/a")
    clock.now += 0.125
    assert q.get(0) == "ns/a"
    q.done("ns/a")
    # A delayed key is timed from when it came due, not from the add_after.
    q.add_after("ns/b", 10.0)
    clock.now += 10.5
    assert q.get(0) == "ns/b"
    assert waits == [0.75, 2.125, 0.5]


def test_low_priority_keys_wait_behind_every_normal_one() -> None:
    clock, waits = Clock(), []
    q = WorkQueue(clock=clock, on_wait=lambda seconds, low: waits.append((seconds, low)))
    for name in ("held-1", "held-2", "held-3"):
        q.add_low(f"ns/{name}")  # a start-up listing of finished runs
    q.add("ns/new")
    q.add_after("ns/polled", 1.0)
    clock.now += 1.0
    assert len(q) == 4
    # A low key added again at normal priority is raised, and keeps its place's time.
    q.add("ns/held-2")
    q.add_low("ns/new")  # a normal key stays normal
    assert [q.get(0) for _ in range(6)] == [
        "ns/new", "ns/held-2", "ns/polled", "ns/held-1", "ns/held-3", None]
    assert waits == [(1.0, False), (1.0, False), (0.0, False), (1.0, True), (1.0, True)]


def test_a_low_key_re_added_while_processed_comes_back_at_the_priority_asked() -> None:
    q = WorkQueue()
    q.add_low("ns/a")
    assert q.get(0) == "ns/a"
    q.add_low("ns/a")
    q.add_low("ns/b")
    q.add("ns/c")
    q.done("ns/a")
    assert [q.get(0), q.get(0), q.get(0)] == ["ns/c", "ns/b", "ns/a"]
    for key in ("ns/a", "ns/b", "ns/c"):
        q.done(key)
    q.add_low("ns/a")
    assert q.get(0) == "ns/a"
    q.add_low("ns/a")
    q.add("ns/a")  # raised while processed: back at normal priority after done()
    q.add_low("ns/b")
    q.done("ns/a")
    assert [q.get(0), q.get(0)] == ["ns/a", "ns/b"]

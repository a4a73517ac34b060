"""The run cache alone: which version of a run it keeps, and what a listing drops."""

from __future__ import annotations

from typing import Any

from resumequal_operator.runtime.cache import ObjectCache, newer


def run(name: str, rv: str, namespace: str = "quals", **status: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name, "resourceVersion": rv},
            "status": status}


def test_versions_compare_as_integers_and_other_versions_not_at_all() -> None:
    assert newer(run("a", "10"), run("a", "9")) is True  # not as strings: "10" < "9"
    assert newer(run("a", "9"), run("a", "10")) is False
    assert newer(run("a", "7"), run("a", "7")) is False
    assert newer(run("a", "abc"), run("a", "9")) is None
    assert newer(run("a", ""), run("a", "9")) is None


def test_a_watch_event_older_than_the_operators_own_write_is_not_taken() -> None:
    cache = ObjectCache()
    assert cache.observe(run("a", "10")) == (True, None)
    cache.written(run("a", "12", phase="Armed"))  # the status PUT's answer
    taken, held = cache.observe(run("a", "11"))  # the watch catches up from behind
    assert not taken and held is not None and held["status"] == {"phase": "Armed"}
    assert cache.get("quals/a") == run("a", "12", phase="Armed")
    taken, _ = cache.observe(run("a", "12", phase="Armed"))  # the write's own event
    assert taken
    assert cache.observe(run("a", "13", phase="Preempted"))[0]
    assert cache.get("quals/a") == run("a", "13", phase="Preempted")


def test_a_write_answer_older_than_the_watch_or_for_a_run_not_held_is_dropped() -> None:
    cache = ObjectCache()
    cache.observe(run("a", "20"))
    cache.written(run("a", "19", phase="Armed"))
    assert cache.get("quals/a") == run("a", "20")
    cache.written(run("gone", "30"))  # the watch has dropped it: deleted
    assert cache.get("quals/gone") is None


def test_incomparable_versions_let_the_watch_win() -> None:
    cache = ObjectCache()
    cache.observe(run("a", "x1"))
    cache.written(run("a", "x2", phase="Armed"))
    assert cache.get("quals/a") == run("a", "x1")  # the write waits for its event
    assert cache.observe(run("a", "x0"))[0]


def test_a_listing_drops_the_runs_it_lacks_in_its_namespace_and_keeps_newer_writes() -> None:
    cache = ObjectCache()
    for obj in (run("a", "5"), run("b", "6"), run("c", "7", namespace="other")):
        cache.observe(obj)
    cache.written(run("a", "9", phase="Armed"))  # written after the listing's snapshot
    gone = cache.replace("quals", [run("a", "8"), run("d", "8")])
    assert gone == {"quals/b"}
    assert cache.get("quals/a") == run("a", "9", phase="Armed")
    assert sorted(cache.keys()) == ["other/c", "quals/a", "quals/d"]
    assert cache.keys("quals") == ["quals/a", "quals/d"]
    assert cache.replace(None, [run("d", "10")]) == {"quals/a", "other/c"}
    assert len(cache) == 1


def test_a_deleted_run_is_forgotten() -> None:
    cache = ObjectCache()
    cache.observe(run("a", "5"))
    cache.forget("quals/a")
    assert cache.get("quals/a") is None and cache.keys() == []

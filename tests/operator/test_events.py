"""The Event recorder: queued, written in order by a thread of its own, dropped when full,
retried when unanswered, flushed on stop (a fake API server: no HTTP)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from resumequal.errors import ClusterError
from resumequal_operator.events import QUEUE_FULL, WRITE_FAILED, EventRecorder
from resumequal_operator.kube import EVENTS, Kind

Obj = dict[str, Any]
RUN: Obj = {"apiVersion": "resumequal.dev/v1alpha1", "kind": "QualificationRun",
            "metadata": {"name": "r", "namespace": "ns", "uid": "u"}}


class Kube:
    """Creates Events, each after ``gate`` opens; ``failures[reason]`` are raised first, in
    turn, for the Event of that reason."""

    def __init__(self, failures: dict[str, list[ClusterError]] | None = None) -> None:
        self.created: list[Obj] = []
        self.attempts = 0
        self.gate = threading.Event()
        self.gate.set()
        self.failures = {k: list(v) for k, v in (failures or {}).items()}
        self.entered = threading.Event()  # a write is under way

    def create(self, kind: Kind, namespace: str, obj: Obj) -> Obj:
        assert kind == EVENTS and namespace == "ns"
        self.entered.set()
        self.gate.wait(10)
        self.attempts += 1
        failures = self.failures.get(obj["reason"])
        if failures:
            raise failures.pop(0)
        self.created.append(obj)
        return obj


def _recorder(kube: Kube, drops: list[str], **kwargs: Any) -> EventRecorder:
    return EventRecorder(kube, "op-0", dropped=drops.append, **kwargs)  # type: ignore[arg-type]


def test_record_returns_at_once_and_the_events_are_written_in_order() -> None:
    kube, drops = Kube(), []
    kube.gate.clear()  # the API server does not answer yet
    recorder = _recorder(kube, drops)
    start = time.monotonic()
    for i in range(20):
        recorder.record(RUN, f"Reason{i}", f"message {i}", warning=i == 3)
    assert time.monotonic() - start < 0.5  # no reconcile waits for the API server
    assert kube.created == [] and recorder.pending == 20
    kube.gate.set()
    assert recorder.flush(5)
    assert [e["reason"] for e in kube.created] == [f"Reason{i}" for i in range(20)]
    assert [e["type"] for e in kube.created][2:4] == ["Normal", "Warning"]
    # Named and stamped when recorded: the names sort in the order they happened.
    names = [e["metadata"]["name"] for e in kube.created]
    assert names == sorted(names, key=lambda n: int(n.rsplit(".", 1)[1], 16))
    assert all(e["involvedObject"]["uid"] == "u" for e in kube.created)
    assert recorder.pending == 0 and drops == []
    recorder.stop()


def test_a_full_queue_drops_the_new_event_counts_it_and_keeps_the_rest() -> None:
    kube, drops = Kube(), []
    kube.gate.clear()
    recorder = _recorder(kube, drops, queue_size=2)
    recorder.record(RUN, "First", "taken by the writer")
    assert kube.entered.wait(5)  # the writer holds it; the queue is empty again
    recorder.record(RUN, "Second", "queued")
    recorder.record(RUN, "Third", "queued")
    recorder.record(RUN, "Fourth", "no room")
    assert drops == [QUEUE_FULL]
    kube.gate.set()
    assert recorder.flush(5)
    assert [e["reason"] for e in kube.created] == ["First", "Second", "Third"]
    recorder.stop()


def test_stop_writes_every_event_still_queued() -> None:
    kube, drops = Kube(), []
    kube.gate.clear()
    recorder = _recorder(kube, drops)
    for i in range(50):
        recorder.record(RUN, f"Reason{i}", "m")
    threading.Timer(0.2, kube.gate.set).start()  # the API server answers while it stops
    recorder.stop()
    assert [e["reason"] for e in kube.created] == [f"Reason{i}" for i in range(50)]
    assert drops == []
    recorder.record(RUN, "Late", "after the stop")
    assert drops == [WRITE_FAILED] and len(kube.created) == 50


def test_an_unanswered_event_is_retried_and_a_refused_one_is_not() -> None:
    kube, drops = Kube(failures={
        "Retried": [ClusterError("create events r.1: no answer from the API server (OSError)"),
                    ClusterError("create events r.1: HTTP 503 ServiceUnavailable", status=503)],
        "Refused": [ClusterError("create events r.2: HTTP 422 Invalid", status=422)]}), []
    recorder = _recorder(kube, drops, retry_seconds=0.01)
    recorder.record(RUN, "Retried", "m")
    recorder.record(RUN, "Refused", "m")
    recorder.record(RUN, "Written", "m")
    assert recorder.flush(5)
    assert [e["reason"] for e in kube.created] == ["Retried", "Written"]
    assert kube.attempts == 5 and drops == [WRITE_FAILED]
    recorder.stop()


def test_retries_end_after_the_last_try_and_at_stop() -> None:
    down = ClusterError("create events r.1: HTTP 500 InternalError", status=500)
    kube, drops = Kube(failures={"GivenUp": [down] * 3}), []
    recorder = _recorder(kube, drops, tries=3, retry_seconds=0.01)
    recorder.record(RUN, "GivenUp", "m")
    assert recorder.flush(5)
    assert kube.attempts == 3 and kube.created == [] and drops == [WRITE_FAILED]

    kube, drops = Kube(failures={"Waiting": [down] * 100, "Queued": [down] * 100}), []
    recorder = _recorder(kube, drops, retry_seconds=30)
    recorder.record(RUN, "Waiting", "m")
    recorder.record(RUN, "Queued", "m")
    assert kube.entered.wait(5)
    start = time.monotonic()
    recorder.stop()  # no retry wait: what is queued is tried once
    assert time.monotonic() - start < 5
    assert kube.attempts == 2 and drops == [WRITE_FAILED, WRITE_FAILED]


def test_logs_name_the_event_never_its_message(caplog: pytest.LogCaptureFixture) -> None:
    kube, drops = Kube(failures={"Refused": [
        ClusterError("create events r.1: HTTP 403 Forbidden", status=403)]}), []
    recorder = _recorder(kube, drops, queue_size=1)
    kube.gate.clear()
    with caplog.at_level(logging.DEBUG, logger="resumequal_operator.events"):
        recorder.record(RUN, "Refused", "token=s3cr3t at http://user:s3cr3t@minio:9000")
        assert kube.entered.wait(5)
        recorder.record(RUN, "Queued", "s3cr3t")
        recorder.record(RUN, "Dropped", "s3cr3t")
        kube.gate.set()
        recorder.stop()
    assert "Refused" in caplog.text and "Dropped" in caplog.text
    assert "HTTP 403 Forbidden" in caplog.text
    assert "s3cr3t" not in caplog.text
    assert [e["message"] for e in kube.created] == ["s3cr3t"]


def test_an_unexpected_error_loses_that_event_only() -> None:
    kube, drops = Kube(), []
    original = kube.create

    def create(kind: Kind, namespace: str, obj: Obj) -> Obj:
        if obj["reason"] == "Broken":
            raise RuntimeError("a bug")
        return original(kind, namespace, obj)

    kube.create = create  # type: ignore[method-assign]
    recorder = _recorder(kube, drops)
    recorder.record(RUN, "Broken", "m")
    recorder.record(RUN, "Written", "m")
    assert recorder.flush(5)
    assert [e["reason"] for e in kube.created] == ["Written"] and drops == [WRITE_FAILED]
    recorder.stop()

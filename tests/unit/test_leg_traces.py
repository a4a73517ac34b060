"""A leg's trace in a folder: the same segments as in an object store, read the same way."""

from __future__ import annotations

from pathlib import Path

import pytest

from resumequal.errors import TraceError
from resumequal.run.layout import SEGMENT_BYTES
from resumequal.run.location import RunLocation
from resumequal.store import StoreNotFound, StoreObjectTooLarge
from testing.trace_records import step_record, trace_line


def _step(rank: int, attempt: int, step: int) -> bytes:
    return trace_line(step_record(rank, attempt, step))


@pytest.fixture
def location(tmp_path: Path) -> RunLocation:
    location = RunLocation.open(str(tmp_path / "run"))
    for attempt, steps in ((0, (1, 2, 3)), (1, (3, 4))):
        sink = location.trace_sink("control", 0, attempt)
        for step in steps:
            sink.append(_step(0, attempt, step))
        sink.close()
    return location


def test_a_folder_holds_segments_read_back_in_order(location: RunLocation,
                                                    tmp_path: Path) -> None:
    assert (tmp_path / "run" / "control" / "trace" / "rank-0" / "attempt-1" /
            "00000001.jsonl").is_file()
    traces = location.traces("control")
    assert traces.records(0) == [step_record(0, 0, 1), step_record(0, 0, 2),
                                 step_record(0, 0, 3), step_record(0, 1, 3),
                                 step_record(0, 1, 4)]
    assert traces.attempts_started() == 2
    assert location.leg_progress("control", 1).steps_done == 4
    with pytest.raises(StoreNotFound, match="rank-1: no trace segments"):
        traces.records(1)


def test_a_missing_segment_in_a_folder_is_named(location: RunLocation) -> None:
    location.store.delete("control/trace/rank-0/attempt-0/00000001.jsonl")
    with pytest.raises(TraceError, match=r"attempt-0/00000001.jsonl: trace segment missing"):
        location.traces("control").records(0)


def test_a_damaged_segment_in_a_folder_is_named_and_skipped_by_progress(
        location: RunLocation) -> None:
    key = "control/trace/rank-0/attempt-1/00000001.jsonl"
    location.store.put_bytes(key, location.store.get_bytes(key).replace(b'"step": 4',
                                                                        b'"step": 5'))
    with pytest.raises(TraceError, match=f"{key}: corrupted trace segment"):
        location.traces("control").records(0)
    assert location.leg_progress("control", 1).steps_done == 3


def test_a_segment_over_the_cap_is_refused_unread(location: RunLocation) -> None:
    key = "control/trace/rank-0/attempt-0/00000000.jsonl"
    location.store.put_bytes(key, b"x" * (SEGMENT_BYTES + 1))
    with pytest.raises(StoreObjectTooLarge):
        location.traces("control").records(0)

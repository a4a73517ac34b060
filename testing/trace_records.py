"""Whole trace records for tests that write a leg's trace by hand: progress and the timeline
read a trace through its records' models (:mod:`resumequal.trace.records`), as workers
write them."""

from __future__ import annotations

import json

from resumequal.trace.records import StartupRecord, StepRecord, TraceRecord


def step_record(rank: int, attempt: int, step: int, finished_at: float = 1.0) -> StepRecord:
    """A step of ``rank``: nothing in it but where the leg stands and when it finished."""
    return StepRecord(rank=rank, attempt=attempt, step=step, microsteps=[], rng={},
                      local_grads="", reduced_grads="", grad_norm=0.0, lr=[], params="",
                      optimizer_state="", started_at=0.0, finished_at=finished_at)


def startup_record(rank: int, attempt: int) -> StartupRecord:
    """A worker process of ``rank`` started."""
    return StartupRecord(rank=rank, attempt=attempt, pid=1000 + rank, process_started_at=0.0,
                         group_joined_at=0.0, built_at=0.0)


def trace_line(record: TraceRecord) -> bytes:
    """One trace line, in json.dumps's spacing (tests that damage a segment edit its bytes)."""
    return json.dumps(record.model_dump(mode="json")).encode() + b"\n"

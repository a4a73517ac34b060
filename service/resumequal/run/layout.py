"""The layout of a run location: the names of its objects and how much of each is read.

A run location is a local folder (a path or ``file://`` URI) or an object-store prefix
``s3://bucket/prefix/<namespace>/<run>/<uid>``. The layout relative to it is the same on
both::

    run.json                         the spec and its digest (written once, by the first leg)
    spec.json                        the qualification's spec
    legs/<leg>.spec.json             a leg's own spec and omissions (what its workers read)
    <leg>/trace/rank-<r>/attempt-<a>/<seq>.jsonl    trace segments (:mod:`.traces`)
    <leg>/beacons/attempt-<a>-rank-<r>.json    an armed worker: who to kill
    <leg>/beacons/kill-attempt-<a>-rank-<r>.json    a kill order for that worker
    <leg>/beacons/pod-kill-attempt-<a>-rank-<r>.json    the record of its pod's deletion
    <leg>/done/rank-<r>.json         the rank finished: trace closed, final checkpoint committed
    <leg>/FAILED.json                the leg failed for good, and why
    <leg>/checkpoints/...            committed checkpoints
    verdict.json, report.json, report.html, metrics.prom, zoom.json    results

Existing runs are read by these names: they are a contract, not a detail.
"""

from __future__ import annotations

import re
from typing import Any

RUN_FILE = "run.json"
SPEC_FILE = "spec.json"
FAILED_MARKER = "FAILED.json"
VERDICT_JSON = "verdict.json"
REPORT_JSON = "report.json"
METRICS_PROM = "metrics.prom"
# Written by ``resumequal zoom`` beside the results: the replay of a divergent step.
ZOOM_JSON = "zoom.json"
# A result file's MAC sits beside it: ``verdict.json.mac``.
RESULT_MAC_SUFFIX = ".mac"

# How much a reader takes of an object before it refuses it (a planted 150 MiB marker must
# not cost the operator its memory): markers, beacons, kill orders and spec files hold a
# few KiB, a trace segment one batch of records, results and reports a run's steps.
SMALL_OBJECT_BYTES = 1 << 20
# How much of a failure's reason a FAILED.json keeps (a traceback's worth).
FAILURE_REASON_BYTES = 64 << 10
SEGMENT_BYTES = 16 << 20
RESULT_BYTES = 64 << 20

# A trace segment's name under its leg's ``trace`` prefix.
SEGMENT_NAME = re.compile(r"^rank-(\d+)/attempt-(\d+)/(\d{8,})\.jsonl$")
# Any trace segment under the location, seed-matrix sub-runs (seed-N/<leg>/...) included.
ANY_SEGMENT_NAME = re.compile(r"^(.+)/trace/rank-(\d+)/attempt-(\d+)/(\d{8,})\.jsonl$")
# A completion marker's name under its leg's ``done`` prefix.
DONE_NAME = re.compile(r"^rank-(\d+)\.json$")

__all__ = [
    "ANY_SEGMENT_NAME",
    "DONE_NAME",
    "FAILED_MARKER",
    "FAILURE_REASON_BYTES",
    "METRICS_PROM",
    "REPORT_JSON",
    "RESULT_BYTES",
    "RESULT_MAC_SUFFIX",
    "RUN_FILE",
    "SEGMENT_BYTES",
    "SEGMENT_NAME",
    "SMALL_OBJECT_BYTES",
    "SPEC_FILE",
    "VERDICT_JSON",
    "ZOOM_JSON",
    "count",
]


def count(value: Any) -> int | None:
    """``value`` if it is a rank, step or attempt number a status can hold (int32), else
    None: names and records come from the store, whoever writes it chooses them."""
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31
    return value if ok else None

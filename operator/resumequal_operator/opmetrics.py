"""The operator's own metric families, next to the qualification families it records.

Both live in one explicit registry that ``/metrics`` serves; tests build a fresh one.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from resumequal.results.metrics import QualificationMetrics

# A reconcile is a few API calls and store reads (milliseconds), up to a status write
# retried after conflicts on a slow API server (seconds). Bounds at 35 and 75 ms either
# side of the 50 ms a reconcile's p99 is held to: with 25, 50 and 100 ms alone,
# histogram_quantile spread a tail between 50 and 100 ms evenly over that bucket and read a
# p99 of 66-74 ms (timed) as 94-97 ms.
RECONCILE_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.035, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
)  # fmt: skip
RESULTS: tuple[str, ...] = ("success", "requeue", "error")
PRIORITIES: tuple[str, ...] = ("normal", "low")  # of a key in the work queue
# Why an Event was not written (see events.EventRecorder).
EVENT_DROP_CAUSES: tuple[str, ...] = ("queue-full", "write-failed")


def build_version() -> str:
    try:
        return version("resumequal")
    except PackageNotFoundError:
        return "unknown"


class OperatorMetrics:
    """Operator families plus :class:`QualificationMetrics`, in one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.qualification = QualificationMetrics(registry)
        self.reconcile = Counter(
            "resumequal_operator_reconcile", "Reconciles of QualificationRuns, by result.",
            ["result"], registry=registry,
        )
        for result in RESULTS:
            self.reconcile.labels(result=result)
        self.errors = Counter(
            "resumequal_operator_reconcile_errors",
            "Reconciles that failed with an error and were retried with backoff.",
            registry=registry,
        )
        self.queue_depth = Gauge(
            "resumequal_operator_queue_depth", "QualificationRuns waiting to be reconciled.",
            registry=registry,
        )
        self.duration = Histogram(
            "resumequal_operator_reconcile_duration_seconds", "Time one reconcile took.",
            buckets=RECONCILE_BUCKETS, registry=registry,
        )
        # What the API server makes a reconcile (and the Event recorder) wait: by verb and
        # resource, as client-go's rest_client_request_duration_seconds is by verb.
        self.api_request = Histogram(
            "resumequal_operator_api_request_duration_seconds",
            "Time one request to the Kubernetes API took (watches aside), answered or not, "
            "by verb and resource.",
            ["verb", "resource"], buckets=RECONCILE_BUCKETS, registry=registry,
        )
        self.queue_wait = Histogram(
            "resumequal_operator_queue_wait_seconds",
            "Time a QualificationRun waited in the work queue for a worker: from the change "
            "that queued it (or its requeue coming due) to its reconcile starting; by "
            "priority: normal (a change, a requeue) or low (a listing's, a resync's).",
            ["priority"], buckets=RECONCILE_BUCKETS, registry=registry,
        )
        for priority in PRIORITIES:
            self.queue_wait.labels(priority=priority)
        self.events_dropped = Counter(
            "resumequal_operator_events_dropped",
            "Events about QualificationRuns not written, by cause: queue-full (more queued "
            "than the recorder holds), write-failed (refused, or unanswered after retries).",
            ["cause"], registry=registry,
        )
        for cause in EVENT_DROP_CAUSES:
            self.events_dropped.labels(cause=cause)
        self.leader = Gauge(
            "resumequal_operator_leader", "1 when this replica holds the leader Lease.",
            registry=registry,
        )
        self.build_info = Gauge(
            "resumequal_operator_build_info", "The operator's version (always 1).",
            ["version"], registry=registry,
        )
        self.build_info.labels(version=build_version()).set(1)

    def api_requested(self, verb: str, resource: str, seconds: float) -> None:
        """One request to the API server took ``seconds``."""
        self.api_request.labels(verb=verb, resource=resource).observe(seconds)

    def queue_waited(self, seconds: float, low: bool) -> None:
        """A key waited ``seconds`` in the work queue (``low``: at low priority)."""
        self.queue_wait.labels(priority="low" if low else "normal").observe(seconds)

    def watch_queue(self, depth: Callable[[], int]) -> None:
        self.queue_depth.set_function(lambda: float(depth()))

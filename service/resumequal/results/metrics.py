"""The Prometheus metric families of a qualification, shared by the CLI and the operator.

The CLI records one Report into a fresh registry and writes a node-exporter textfile or
pushes to a Pushgateway; the operator keeps one registry for every QualificationRun it
serves and calls :meth:`QualificationMetrics.forget` when a run is deleted, so the number
of series stays bounded by the runs that exist. Must not import torch.

Per-run gauges carry the labels ``namespace``, ``run``, ``pin`` and ``scenario``.
A figure the report does not have (no drift because the final checkpoints were not
compared, no restart time, no loss deltas) is *absent*: its series is removed rather than
set to NaN, so ``max()``/``avg()`` over runs are not poisoned and ``absent()`` can alert.

Negative controls: ``resumequal_negative_controls_detected`` / ``_total`` are read from the
verdict's controls (``total`` leaves out controls that were not applicable, e.g. pending
gradients when there is no mid-accumulation cut); a run without controls reports 0 / 0, so
``detected < total`` alerts on a blind or invalid control and ``total == 0`` on none run.

The seed matrix: a report with a matrix adds, next to the main comparison's series
(``scenario`` = the ``scenario`` argument, "resume" by default), one series per matrix
scenario whose ``scenario`` label is that scenario's name (``boundary-hard``,
``mid-graceful``, ...), in three families only:

- ``resumequal_qualification_passed``: 1 when every seed of the scenario was exact (its
  summary row has ``exact == total > 0``), else 0;
- ``resumequal_qualification_valid``: 0 when any seed of the scenario was INVALID, else 1;
- ``resumequal_first_divergent_step``: the earliest first divergent step over its seeds,
  -1 when none diverged.

Forensics: ``resumequal_first_divergence_differing_tensors`` counts the tensors that differ
at the first divergent boundary (absent without a divergence or per-tensor digests), and
``resumequal_zoom_origin_info`` (always 1) carries, once ``resumequal zoom`` has replayed
the step, ``origin_kind`` (input, loss_fn, module, reduction, clipping, optimizer, state,
none) and ``origin``: the first origin module or stage, cut to 120 characters. One series per run:
recording the run again replaces it, so the cardinality is that of the runs.

Drift, loss, restart, control and completion figures describe the main comparison only and
have no matrix-scenario series. ``min(resumequal_qualification_passed) by (run)`` is thus
1 only when the main comparison and every matrix scenario passed. The matrix adds at most
one series per scenario (a closed set of four) per family and run; recording a run again
drops the scenarios its new report no longer has, and :meth:`QualificationMetrics.forget`
removes them with the run's other series. A matrix scenario named like the main scenario
label is skipped (the main comparison's series wins).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import NamedTuple
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import (
    basic_auth_handler,
    default_handler,
    generate_latest,
    push_to_gateway,
)

from resumequal.errors import MetricsError
from resumequal.results.verdict import Matrix, Report, Result
from resumequal.store import regular

RUN_LABELS: tuple[str, ...] = ("namespace", "run", "pin", "scenario")
ORIGIN_LABELS: tuple[str, ...] = ("origin_kind", "origin")
# A module path can be long; the label keeps its start (the dashboard links the report).
ORIGIN_CHARS = 120
# Phases last from about a second (validation, compare on tiny models) to the arm/leg
# timeouts of large stacks (hours).
PHASE_BUCKETS: tuple[float, ...] = (
    1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200,
)  # fmt: skip


class _Family(NamedTuple):
    name: str
    doc: str
    labels: tuple[str, ...] = RUN_LABELS


# The per-run gauges by key, in the order they are registered (and exposed).
_GAUGES: dict[str, _Family] = {
    "passed": _Family(
        "resumequal_qualification_passed", "1 when the qualification passed, else 0."
    ),
    "valid": _Family(
        "resumequal_qualification_valid",
        "1 when the experiment tested what it claims (verdict not INVALID), else 0.",
    ),
    "first_divergent_step": _Family(
        "resumequal_first_divergent_step",
        "Optimizer step of the first divergence between the legs; -1 when none.",
    ),
    "param_max_abs_diff": _Family(
        "resumequal_param_max_abs_diff",
        "Largest element-wise |difference| of the final model parameters.",
    ),
    "param_rel_l2_diff": _Family(
        "resumequal_param_rel_l2_diff",
        "Relative L2 distance of the final model parameters (||a-b|| / ||a||).",
    ),
    "param_mismatch_fraction": _Family(
        "resumequal_param_mismatch_fraction",
        "Fraction of final model parameter elements that differ in bits.",
    ),
    "loss_max_abs_diff": _Family(
        "resumequal_loss_max_abs_diff",
        "Largest per-step |loss difference| between the legs (+Inf if any is not finite).",
    ),
    "restart_seconds": _Family(
        "resumequal_restart_seconds", "Seconds from the kill to the first resumed step."
    ),
    "negative_controls_detected": _Family(
        "resumequal_negative_controls_detected",
        "Negative controls (planted resume omissions) the comparator detected.",
    ),
    "negative_controls_total": _Family(
        "resumequal_negative_controls_total",
        "Negative controls that had to be detected (not applicable ones excluded).",
    ),
    "differing_tensors": _Family(
        "resumequal_first_divergence_differing_tensors",
        "Tensors that differ at the first divergent boundary (per-tensor digests).",
    ),
    "zoom_origin": _Family(
        "resumequal_zoom_origin_info",
        "Where resumequal zoom found the first divergence to start (always 1).",
        (*RUN_LABELS, *ORIGIN_LABELS),
    ),
    "last_completion": _Family(
        "resumequal_last_completion_timestamp_seconds",
        "Unix time at which the qualification completed.",
    ),
}
# The families a seed-matrix scenario adds its own series to.
_PER_MATRIX_SCENARIO: tuple[str, ...] = ("passed", "valid", "first_divergent_step")


class QualificationMetrics:
    """Every resumequal metric family, registered in an explicit registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        # Keyed as _GAUGES; forget() removes a run's series from every one of them.
        self.gauges: dict[str, Gauge] = {
            key: Gauge(f.name, f.doc, f.labels, registry=registry) for key, f in _GAUGES.items()
        }
        # prometheus_client appends _total: exposed as resumequal_runs_total.
        self.runs = Counter(
            "resumequal_runs",
            "Qualifications completed, by result.",
            ["result"],
            registry=registry,
        )
        for result in Result:
            self.runs.labels(result=result.value)
        # (namespace, run, pin, main scenario) -> the matrix scenarios recorded with it.
        self._matrix_scenarios: dict[tuple[str, ...], set[str]] = {}
        self.phase_duration = Histogram(
            "resumequal_phase_duration_seconds",
            "Time spent in each phase of a qualification.",
            ["phase"],
            buckets=PHASE_BUCKETS,
            registry=registry,
        )

    def record(self, report: Report, *, namespace: str, scenario: str = "resume") -> None:
        """Set every family from one finished qualification's Report.

        The main comparison's series carry ``scenario``; each seed-matrix scenario adds
        its own series (see the module docstring). Counts the run once in
        ``resumequal_runs_total`` and observes each phase's duration (from one PhaseEvent
        to the next; the last phase has no end).
        """
        v = report.verdict
        labels = {
            "namespace": namespace,
            "run": report.run,
            "pin": report.pin,
            "scenario": scenario,
        }

        def put(key: str, value: float | None) -> None:
            if value is None:
                _remove(self.gauges[key], labels)
            else:
                self.gauges[key].labels(**labels).set(value)

        put("passed", 1.0 if v.result is Result.PASS else 0.0)
        put("valid", 0.0 if v.result is Result.INVALID else 1.0)
        put(
            "first_divergent_step",
            -1.0 if v.first_divergence is None else float(v.first_divergence.step),
        )
        model = next((d for d in v.drift if d.group == "model"), None)
        put("param_max_abs_diff", None if model is None else model.max_abs_diff)
        put("param_rel_l2_diff", None if model is None else model.rel_l2)
        put("param_mismatch_fraction", None if model is None else model.mismatch_fraction)
        put("loss_max_abs_diff", _max_abs_diff([d.abs_diff for d in v.loss_deltas]))
        put("restart_seconds", report.restart_seconds)
        put("negative_controls_detected", float(v.controls_detected))
        put("negative_controls_total", float(v.controls_total))
        tensors = None if v.first_divergence is None else v.first_divergence.tensors
        put("differing_tensors", None if tensors is None else float(tensors.differ))
        self.gauges["zoom_origin"].remove_by_labels(labels)
        if report.zoom is not None:
            z = report.zoom
            origin = (z.origins[0] if z.origins else z.origin_kind)[:ORIGIN_CHARS]
            zoom = self.gauges["zoom_origin"]
            zoom.labels(**labels, origin_kind=z.origin_kind, origin=origin).set(1)
        put("last_completion", report.phases[-1].at if report.phases else time.time())
        self._record_matrix(report.matrix, labels)

        self.runs.labels(result=v.result.value).inc()
        for event, following in pairwise(report.phases):
            duration = following.at - event.at
            if duration >= 0:
                self.phase_duration.labels(phase=event.phase).observe(duration)

    def _record_matrix(self, matrix: Matrix | None, labels: dict[str, str]) -> None:
        key = tuple(labels[name] for name in RUN_LABELS)
        previous = self._matrix_scenarios.pop(key, set())
        figures = {} if matrix is None else _matrix_figures(matrix)
        figures.pop(labels["scenario"], None)
        for stale in previous - figures.keys():
            self._remove_matrix_scenario(labels, stale)
        for name, values in figures.items():
            series = {**labels, "scenario": name}
            for family, value in zip(_PER_MATRIX_SCENARIO, values, strict=True):
                self.gauges[family].labels(**series).set(value)
        if figures:
            self._matrix_scenarios[key] = set(figures)

    def _remove_matrix_scenario(self, labels: dict[str, str], scenario: str) -> None:
        for family in _PER_MATRIX_SCENARIO:
            _remove(self.gauges[family], {**labels, "scenario": scenario})

    def forget(
        self, namespace: str, run: str, pin: str | None = None, scenario: str | None = None
    ) -> None:
        """Remove a run's per-run series; ``None`` for pin or scenario matches any.

        Forgetting a main comparison's scenario also removes the matrix-scenario series
        recorded with it.
        """
        labels = {"namespace": namespace, "run": run}
        if pin is not None:
            labels["pin"] = pin
        if scenario is not None:
            labels["scenario"] = scenario
        for g in self.gauges.values():
            g.remove_by_labels(labels)
        for key in [k for k in self._matrix_scenarios if k[:2] == (namespace, run)]:
            if pin is not None and key[2] != pin:
                continue
            names = self._matrix_scenarios[key]
            if scenario is None or scenario == key[3]:
                # The main comparison goes, and the matrix recorded with it.
                main = dict(zip(RUN_LABELS, key, strict=True))
                for name in names:
                    self._remove_matrix_scenario(main, name)
                del self._matrix_scenarios[key]
            else:
                names.discard(scenario)


def write_textfile(registry: CollectorRegistry, path: Path) -> bytes:
    """Write the registry for node-exporter's textfile collector; the bytes written.

    Under a fresh name created ``O_EXCL|O_NOFOLLOW``, then renamed: the folder may be the
    run folder, which others may write (prometheus_client's own writer takes a name made
    of the pid and follows a link planted there)."""
    data = generate_latest(registry)
    try:
        regular.write_file(path.parent, path.name, data, create=False)
    except OSError as e:
        raise MetricsError(f"cannot write metrics to {path}: {e.strerror or e}") from e
    return data


def push(
    registry: CollectorRegistry,
    gateway_url: str,
    job: str,
    *,
    grouping_key: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> None:
    """Push the registry to a Pushgateway (PUT: replaces the job's group).

    Credentials may be given in the URL (``https://user:pass@gateway``); they are sent as
    HTTP basic auth and never appear in an error message.
    """
    try:
        parts = urlsplit(gateway_url if "://" in gateway_url else f"http://{gateway_url}")
        shown = urlunsplit(_without_credentials(parts))
    except ValueError as e:  # a bad port; the message names no part of the URL
        raise MetricsError(f"not a valid Pushgateway URL: {e}") from e
    handler: Callable[..., Callable[[], None]] = default_handler
    if parts.username is not None:
        handler = partial(
            basic_auth_handler,
            username=unquote(parts.username),
            password=unquote(parts.password or ""),
        )

    try:
        push_to_gateway(
            shown,
            job=job,
            registry=registry,
            grouping_key=grouping_key,
            timeout=timeout,
            handler=handler,
        )
    except (OSError, ValueError) as e:
        # urllib's errors carry reasons, not URLs; str(e) holds no credentials.
        reason = getattr(e, "reason", None) or e
        raise MetricsError(
            f"cannot push metrics to {shown} (job {job!r}): {type(e).__name__}: {reason}"
        ) from e


def _without_credentials(parts: SplitResult) -> SplitResult:
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return parts._replace(netloc=netloc)


def _max_abs_diff(values: list[float]) -> float | None:
    if not values:
        return None
    if any(not math.isfinite(x) for x in values):
        return math.inf
    return max(values)


def _matrix_figures(matrix: Matrix) -> dict[str, tuple[float, float, float]]:
    """Per matrix scenario: (passed, valid, first divergent step or -1)."""
    summary = {row.scenario: row for row in matrix.summary}
    names = dict.fromkeys([*matrix.scenarios, *summary, *(c.scenario for c in matrix.cells)])
    figures: dict[str, tuple[float, float, float]] = {}
    for name in names:
        cells = [c for c in matrix.cells if c.scenario == name]
        row = summary.get(name)
        if row is not None:
            passed = row.total > 0 and row.exact == row.total
        else:  # no summary row: every cell exact (PASS without a divergence)
            passed = bool(cells) and all(
                c.result is Result.PASS and c.first_divergent_step is None for c in cells
            )
        valid = bool(cells or row) and all(c.result is not Result.INVALID for c in cells)
        steps = [c.first_divergent_step for c in cells if c.first_divergent_step is not None]
        figures[name] = (float(passed), float(valid), float(min(steps)) if steps else -1.0)
    return figures


def _remove(g: Gauge, labels: dict[str, str]) -> None:
    g.remove(*(labels[name] for name in RUN_LABELS))

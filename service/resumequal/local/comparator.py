"""``resumequal compare``: judge a finished run location, and optionally publish the result.

This is what the cluster's comparator Job runs. A folder is read in place; an ``s3://``
location is first materialized into a temporary folder (every object verified, trace
segments checked and joined), its final checkpoints downloaded verified as the
comparator always does. The comparison includes the negative controls, as
``resumequal run`` does. With ``write``, ``verdict.json``, ``report.json``,
``report.html`` and ``metrics.prom`` are written into the run location.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from prometheus_client import CollectorRegistry

from resumequal.compare import compare_qualification
from resumequal.local.runner import inventory, leg_summary
from resumequal.metrics import QualificationMetrics, write_textfile
from resumequal.report.files import write_reports
from resumequal.runstore import METRICS_PROM, RunLocation
from resumequal.verdict import Report, Verdict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Judged:
    """The verdict of a run location and, when written, where its result files are."""

    verdict: Verdict
    files: dict[str, str]


def default_names(uri: str) -> tuple[str, str]:
    """(namespace, run) from ``.../<namespace>/<run>/<uid>`` in an object store (a URI
    with a bucket); ("local", folder name) for a folder."""
    parsed = urlparse(uri)
    if parsed.netloc:
        parts = [p for p in parsed.path.split("/") if p]
        if len(parts) >= 3:
            return parts[-3], parts[-2]
        return "default", parts[-1] if parts else "run"
    return "local", Path(urlparse(uri).path if "://" in uri else uri).name


def compare_location(
    uri: str,
    *,
    write: bool,
    pin: str,
    namespace: str | None = None,
    name: str | None = None,
) -> Judged:
    """Compare the legs at ``uri`` (with the negative controls); publish results if ``write``."""
    location = RunLocation.open(uri)
    ns, run = default_names(uri)
    namespace, name = namespace or ns, name or run
    work = Path(tempfile.mkdtemp(prefix="resumequal-compare-"))
    try:
        local = location.materialize(work)
        spec = location.read_spec()
        verdict = compare_qualification(local, spec)
        if not write:
            return Judged(verdict, {})
        report = Report(
            run=name,
            pin=pin,
            verdict=verdict,
            spec=spec.model_dump(mode="json"),
            legs=[leg_summary(local, leg, spec) for leg in ("control", "preempted")],
            inventory=inventory(local),
        )
        # Written aside, then published: into a folder too, each file atomically.
        out = work / "results"
        files = write_reports(report, out)
        registry = CollectorRegistry()
        QualificationMetrics(registry).record(report, namespace=namespace)
        write_textfile(registry, out / METRICS_PROM)
        files[METRICS_PROM] = out / METRICS_PROM
        published = location.publish(files)
        log.info("published %s", ", ".join(published.values()))
        return Judged(verdict, published)
    finally:
        shutil.rmtree(work, ignore_errors=True)

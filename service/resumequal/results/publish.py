"""Publishing a qualification's results: the result files, the metrics, the upload.

One order everywhere (the local runner, the comparator, ``zoom``): ``verdict.json``,
``report.json``, ``report.html`` (atomically), then ``metrics.prom``, the push to a
Pushgateway, and the upload into the run location with each file's MAC.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from resumequal.report.files import report_files, write_reports
from resumequal.results.metrics import QualificationMetrics, push, write_textfile
from resumequal.results.verdict import Report
from resumequal.run.layout import METRICS_PROM
from resumequal.run.location import RunLocation

__all__ = ["publish", "upload", "write_results"]


def publish(report: Report, location: RunLocation, out: Path, *, namespace: str,
            metrics_file: Path | None = None, pushgateway: str | None = None) -> dict[str, str]:
    """Write the result files into ``out`` and put them into ``location``; name -> URI.

    One order everywhere: ``verdict.json``, ``report.json``, ``report.html`` (atomically),
    then ``metrics.prom`` (to ``metrics_file`` when given), the push, and the upload.
    """
    contents = write_results(report, out, namespace=namespace, metrics_file=metrics_file,
                             pushgateway=pushgateway)
    return upload(contents, location, metrics_file=metrics_file)


def write_results(report: Report, out: Path, *, namespace: str,
                  metrics_file: Path | None = None,
                  pushgateway: str | None = None) -> dict[str, bytes]:
    """The result files written into ``out`` (``metrics.prom`` to ``metrics_file`` when
    given) and the metrics pushed; name -> the bytes written."""
    contents = report_files(report)
    write_reports(report, out, contents)
    registry = CollectorRegistry()
    QualificationMetrics(registry).record(report, namespace=namespace)
    metrics = metrics_file or out / METRICS_PROM
    contents[METRICS_PROM] = write_textfile(registry, metrics)
    if pushgateway:
        push(registry, pushgateway, job="resumequal")
    return contents


def upload(contents: dict[str, bytes], location: RunLocation, *,
           metrics_file: Path | None = None) -> dict[str, str]:
    """Put the result files into ``location``; name -> URI (``metrics_file`` for the
    metrics when one was asked for: it stays there, and the location gets a copy)."""
    # Each goes in with its MAC from the bytes made here, never from a file read back (the
    # out folder may be the run folder, which others may write).
    published = {name: location.put_result(name, data) for name, data in contents.items()}
    if metrics_file is not None:
        published[METRICS_PROM] = str(metrics_file)
    return published

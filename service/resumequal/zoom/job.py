"""``resumequal zoom``: replay a divergent step of a run location's legs; this is what the
cluster's zoom Job runs.

The replays and their comparison are :func:`resumequal.zoom.replays.zoom_of`'s. ``zoom.json``
is written into the run location and, when the run has a report, ``report.json`` and
``report.html`` gain a zoom section. Checkpoints are authenticated as the legs' are: the
run's checkpoint key must be set.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from pydantic import ValidationError

from resumequal.errors import ReportError
from resumequal.jobs.location import open_run, publish_aside
from resumequal.results.verdict import Report, Zoom
from resumequal.run.layout import REPORT_JSON, ZOOM_JSON
from resumequal.run.location import RunLocation
from resumequal.run.name import run_names
from resumequal.store import StoreNotFound
from resumequal.zoom.replays import MAIN_LEG, write_zoom, zoom_of


@dataclass(frozen=True)
class Zoomed:
    """What ``resumequal zoom`` found and where it wrote it."""

    zoom: Zoom
    files: dict[str, str]


def read_report(location: RunLocation) -> Report | None:
    """``report.json`` of the location, or None before the comparator has written it."""
    try:
        raw = location.read_result(REPORT_JSON)
    except StoreNotFound:
        return None
    try:
        return Report.model_validate_json(raw)
    except ValidationError as e:
        raise ReportError(f"{location.url(REPORT_JSON)}: not a valid report: "
                          f"{e.errors()[0]['msg']}") from e


def zoom_location(uri: str, *, step: int | None = None, leg: str = MAIN_LEG,
                  write: bool = True, namespace: str | None = None,
                  python: str = sys.executable) -> Zoomed:
    """Zoom into ``step`` (default: the verdict's first divergence) of the run at ``uri``;
    with ``write``, put ``zoom.json`` (and the report with its zoom section) into it."""
    location, spec = open_run(uri, "zoomed")
    zoom = zoom_of(location, spec, location.read_verdict(), step=step, leg=leg, python=python)
    if not write:
        return Zoomed(zoom, {})
    files = {ZOOM_JSON: write_zoom(location, zoom)}
    report = read_report(location)
    if report is not None:
        files.update(publish_aside(report.model_copy(update={"zoom": zoom}), location,
                                   namespace=namespace or run_names(uri)[0]))
    return Zoomed(zoom, files)

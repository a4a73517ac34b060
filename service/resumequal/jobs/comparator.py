"""``resumequal compare``: judge a finished run location, and optionally publish the result.

This is what the cluster's comparator Job runs. The location is read in place through its
store, whatever the store: trace segments verified as they are read, final checkpoints
read where they lie, each chunk checked against the manifest as it is read. The
comparison includes the negative controls, as ``resumequal run`` does. With ``write``,
``verdict.json``, ``report.json``, ``report.html`` and ``metrics.prom`` are written into
the run location, with the zoom section of a ``zoom.json`` already there; the report's
phases, kill time and restart time come from what the legs left there
(:func:`resumequal.qualify.timeline.read_timeline`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from resumequal.compare import compare_qualification
from resumequal.jobs.location import open_run, publish_aside
from resumequal.qualify.timeline import read_timeline
from resumequal.results.assembly import build_report
from resumequal.results.verdict import Verdict
from resumequal.run.name import run_names

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Judged:
    """The verdict of a run location and, when written, where its result files are."""

    verdict: Verdict
    files: dict[str, str]


def compare_location(
    uri: str,
    *,
    write: bool,
    pin: str,
    namespace: str | None = None,
    name: str | None = None,
) -> Judged:
    """Compare the legs at ``uri`` (with the negative controls); publish results if ``write``.

    The run is judged with its seal (:func:`resumequal.jobs.location.open_run`): without its
    key and id nothing is judged, and a finished verdict is never replaced by one that could
    not authenticate the run."""
    location, spec = open_run(uri, "judged")
    ns, run = run_names(uri)
    namespace, name = namespace or ns, name or run
    compared_at = time.time()
    verdict = compare_qualification(location, spec)
    if not write:
        return Judged(verdict, {})
    # The legs' records in the store date the phases, the kill and the resume.
    timeline = read_timeline(location, spec, compared_at=compared_at,
                             verdict=verdict, concluded_at=time.time())
    report = build_report(spec, verdict, timeline, run=name, pin=pin, location=location)
    # A zoom already written stays part of the report: its evidence is the run's.
    zoom = location.read_zoom()
    if zoom is not None:
        report = report.model_copy(update={"zoom": zoom})
    published = publish_aside(report, location, namespace=namespace)
    log.info("published %s", ", ".join(published.values()))
    return Judged(verdict, published)

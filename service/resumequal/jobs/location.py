"""A Job's run location: opened as its run's own, and given what the Job found."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from resumequal.local import runkey
from resumequal.results.publish import publish
from resumequal.results.verdict import Report
from resumequal.run.location import RunLocation
from resumequal.spec import QualificationSpec


def open_run(uri: str, doing: str) -> tuple[RunLocation, QualificationSpec]:
    """The run location at ``uri``, sealed with its run's key and id, and its spec.

    Without the key and id nothing is ``doing`` ("judged", "zoomed":
    :func:`resumequal.local.runkey.check_seal`), and a location no leg started is refused."""
    unsealed = RunLocation.open(uri)
    # "No run here" before "no key for it": a wrong path is not an authentication problem.
    unsealed.check_started()
    seal = runkey.seal_for(unsealed)
    # What the Job starts or loads (replays, checkpoints) authenticates with them too.
    runkey.export(seal)
    location = RunLocation.open(uri, seal=seal)
    runkey.check_seal(location, doing)
    location.check_started()
    return location, location.read_spec()


def publish_aside(report: Report, location: RunLocation, *, namespace: str) -> dict[str, str]:
    """Put ``report``'s files into ``location``; name -> URI. They are written into a
    temporary folder first, as :func:`resumequal.results.publish.publish` writes into a folder."""
    work = Path(tempfile.mkdtemp(prefix="resumequal-results-"))
    try:
        return publish(report, location, work / "results", namespace=namespace)
    finally:
        shutil.rmtree(work, ignore_errors=True)

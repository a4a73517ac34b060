"""``resumequal compare RUN --write`` on a zoomed run keeps the zoom's evidence: the report's
zoom, its HTML section and its metrics series come from the ``zoom.json`` already there."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

from resumequal.jobs.comparator import compare_location
from resumequal.run.layout import ZOOM_JSON
from tests.unit.report_samples import make_zoom
from tests.unit.test_compare import SyntheticRun, make_spec


def test_compare_write_keeps_the_zoom_already_written(tmp_path: Path) -> None:
    run = SyntheticRun(tmp_path / "run", spec=make_spec(controls={"enabled": False}))
    location = run.written()
    zoom = make_zoom(step=3)
    location.put_result(ZOOM_JSON, zoom.model_dump_json().encode())
    judged = compare_location(location.uri, write=True, pin="torch==2.13.0")
    assert "report.json" in judged.files
    report = json.loads((run.root / "report.json").read_text())
    assert report["zoom"] is not None and report["zoom"]["summary"] == zoom.summary
    assert escape(zoom.summary) in (run.root / "report.html").read_text()
    assert "resumequal_zoom_origin_info{" in (run.root / "metrics.prom").read_text()


def test_compare_write_without_a_zoom_has_none(tmp_path: Path) -> None:
    run = SyntheticRun(tmp_path / "run", spec=make_spec(controls={"enabled": False}))
    compare_location(run.written().uri, write=True, pin="torch==2.13.0")
    assert json.loads((run.root / "report.json").read_text())["zoom"] is None

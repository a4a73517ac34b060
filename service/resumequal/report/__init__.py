"""Reports: rendering a :class:`~resumequal.results.verdict.Report` for files, browsers and
terminals.

This package owns the presentation of a finished qualification: ``report.json`` and
``verdict.json`` (the versioned schema, written atomically), ``report.html`` (one
self-contained file with inline SVG plots) and the terminal summary and progress display.

It must not compute verdicts (that is ``compare``'s job: everything shown here is read from
the Report) and must not import torch: it only needs the schema, the stdlib and rich.
"""

from resumequal.report.files import (
    REPORT_HTML,
    REPORT_JSON,
    VERDICT_JSON,
    read_report,
    read_verdict,
    write_reports,
)
from resumequal.report.html import render_html
from resumequal.report.terminal import ProgressDisplay, print_summary

__all__ = [
    "REPORT_HTML",
    "REPORT_JSON",
    "VERDICT_JSON",
    "ProgressDisplay",
    "print_summary",
    "read_report",
    "read_verdict",
    "render_html",
    "write_reports",
]

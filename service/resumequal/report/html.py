"""``report.html``: one self-contained page a person can open from a CI artifact or a bucket.

No network at all: inline CSS, inline SVG drawn by :mod:`resumequal.report.svg`, no
script, no web font. Every piece of text from the report is escaped. The page shows what
the Report says and computes nothing beyond layout (the restore step for the chart marker
is read from the boundary table's attempt numbers or the checkpoint name). This module is
the page itself: its style, its order of sections and the loss charts; the header, the
divergence and the other sections are laid out by their own modules.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from html import escape

from resumequal.report import svg
from resumequal.report.divergence import boundary_table
from resumequal.report.header import verdict_header
from resumequal.report.markup import seconds_text
from resumequal.report.resize import resize_markers, resize_section
from resumequal.report.sections import (
    checks_section,
    controls_section,
    drift_section,
    inventory_section,
    legs_section,
    matrix_section,
    phases_section,
    spec_section,
)
from resumequal.report.zoom import zoom_section
from resumequal.results.verdict import Report, Result, Verdict
from resumequal.spec import REFERENCE_LEG

VERDICT_COLORS: dict[Result, str] = {
    Result.PASS: "#1a7f37",
    Result.FAIL: "#cf222e",
    Result.NONDETERMINISTIC: "#d97706",
    Result.INVALID: "#6e7781",
}
LEG_COLORS = {REFERENCE_LEG: "#0969da", "preempted": "#e36209"}
KILL_COLOR = "#cf222e"
RESUME_COLOR = "#8250df"
_CHECKPOINT_STEP = re.compile(r"step[-_]?0*(\d+)")

_CSS = """
:root { color-scheme: light; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0;
  color: #24292f; background: #f6f8fa; }
main { max-width: 1100px; margin: 0 auto; padding: 16px 24px 48px; }
header.verdict { border-left: 10px solid var(--vc); background: #fff; padding: 16px 20px;
  border-radius: 6px; box-shadow: 0 1px 2px rgba(0,0,0,.08); }
.badge { display: inline-block; background: var(--vc); color: #fff; font-weight: 700;
  font-size: 22px; letter-spacing: .04em; padding: 4px 14px; border-radius: 4px; }
.reason { font-size: 17px; margin: 10px 0 12px; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 4px 16px; margin: 0; }
dl.facts dt { color: #57606a; } dl.facts dd { margin: 0; font-family: ui-monospace, monospace;
  word-break: break-all; }
section { background: #fff; margin-top: 18px; padding: 12px 20px 16px; border-radius: 6px;
  box-shadow: 0 1px 2px rgba(0,0,0,.08); overflow-x: auto; }
h2 { font-size: 18px; margin: 6px 0 10px; }
h3 { font-size: 15px; margin: 14px 0 6px; }
p.note { color: #57606a; margin: 4px 0 8px; font-size: 13px; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; }
td.num { text-align: right; font-family: ui-monospace, monospace; }
td code, dd code { font-family: ui-monospace, monospace; white-space: pre-wrap;
  word-break: break-all; }
table.boundaries td.cell { text-align: center; width: 64px; font-weight: 700; }
table.boundaries th.b { font-size: 11px; }
.s-equal { background: #dafbe1; color: #1a7f37; }
.s-within_tolerance { background: #fff8c5; color: #7d4e00; }
.s-differs { background: #ffebe9; color: #cf222e; }
.s-missing { background: #eaeef2; color: #6e7781; }
.s-not_compared { background: repeating-linear-gradient(45deg, #f6f8fa, #f6f8fa 4px,
  #eaeef2 4px, #eaeef2 8px); }
td.first { outline: 3px solid #cf222e; outline-offset: -3px; background: #cf222e;
  color: #fff; }
tr.killrow th, tr.killrow td.step { background: #ffebe9; }
.tag { display: inline-block; font-size: 10px; padding: 0 4px; border-radius: 3px;
  margin-left: 4px; color: #fff; vertical-align: middle; }
.tag.kill { background: #cf222e; } .tag.resume { background: #8250df; }
.tag.grow { background: #1a7f37; }
ul.checks { list-style: none; padding: 0; margin: 0; }
ul.checks li { padding: 3px 0; } .ok { color: #1a7f37; } .bad { color: #cf222e; }
.legend span { display: inline-block; margin-right: 14px; font-size: 12px; }
.legend b { display: inline-block; width: 22px; text-align: center; border-radius: 3px; }
.diverge { border: 1px solid #cf222e; background: #fff5f5; border-radius: 6px;
  padding: 8px 12px; margin-top: 12px; }
.cs { display: inline-block; color: #fff; font-weight: 600; font-size: 12px;
  padding: 1px 8px; border-radius: 10px; white-space: nowrap; }
.cs-detected { background: #1a7f37; } .cs-blind { background: #cf222e; }
.cs-not_applicable { background: #6e7781; } .cs-invalid { background: #d97706; }
.cs-not_judged { background: #6e7781; }
.blind { border: 2px solid #cf222e; background: #ffebe9; color: #cf222e; border-radius: 6px;
  padding: 8px 12px; margin: 8px 0 12px; }
.blind strong { display: block; font-size: 16px; }
span.leg { font-weight: 400; color: #57606a; font-size: 12px; }
table.matrix td.m { text-align: center; white-space: nowrap; font-family: ui-monospace,
  monospace; }
.m-exact { background: #dafbe1; color: #1a7f37; }
.m-tolerance { background: #fff8c5; color: #7d4e00; }
.m-fail { background: #ffebe9; color: #cf222e; font-weight: 700; }
.m-nondeterministic { background: #fff1e5; color: #bc4c00; font-weight: 700; }
.m-invalid, .m-none { background: #eaeef2; color: #6e7781; }
footer { color: #57606a; font-size: 12px; margin-top: 24px; }
pre { background: #f6f8fa; padding: 8px; overflow-x: auto; font-size: 12px; }
"""


def render_html(report: Report) -> str:
    """The whole report as one HTML document."""
    v = report.verdict
    color = VERDICT_COLORS[v.result]
    resume_step = _resume_step(v)
    steps = svg.XAxis(domain=svg.step_domain(_all_steps(report, resume_step)),
                      label="optimizer step", markers=_markers(report, resume_step))
    title = f"resumequal {v.result.value}: {report.run} ({report.pin})"
    body = [
        verdict_header(report, color, resume_step),
        _section(
            "Loss per step",
            [
                _loss_chart(report, steps),
                _delta_chart(report, steps),
            ],
        ),
        *(
            [_section("Resize", [resize_section(v.resize)], anchor="resize")]
            if v.resize is not None
            else []
        ),
        *(
            [_section(f"Zoom: step {report.zoom.step} replayed", [zoom_section(report.zoom)],
                      anchor="zoom")]
            if report.zoom is not None
            else []
        ),
        _section("Boundary table", [boundary_table(v, resume_step)], anchor="boundaries"),
        _section("Drift between the final checkpoints", [drift_section(v.drift)], anchor="drift"),
        _section("Negative controls", [controls_section(v)], anchor="controls"),
        *(
            [_section("Seed matrix", [matrix_section(report.matrix)], anchor="matrix")]
            if report.matrix is not None
            else []
        ),
        _section("Validity checks", [checks_section(v)], anchor="checks"),
        _section("Legs", [legs_section(report)], anchor="legs"),
        _section("Phase timeline", [phases_section(report)], anchor="phases"),
        _section("Runtime inventory", [inventory_section(report)], anchor="inventory"),
        _section("Spec", [spec_section(report)], anchor="spec"),
        f"<footer>resumequal report · schema {escape(report.schema_version)}</footer>",
    ]
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head>"
        f'<body style="--vc:{color}"><main>{"".join(body)}</main></body></html>\n'
    )


def _section(title: str, parts: Sequence[str], anchor: str | None = None) -> str:
    ident = f' id="{anchor}"' if anchor else ""
    return f"<section{ident}><h2>{escape(title)}</h2>{''.join(parts)}</section>"


def _loss_chart(report: Report, steps: svg.XAxis) -> str:
    series = []
    for leg in sorted(report.legs, key=lambda leg: leg.name != REFERENCE_LEG):
        preempted = leg.name == "preempted"
        series.append(
            svg.Series(
                name=leg.name,
                # losses[i] is the loss of optimizer step i + 1.
                points=[(float(i + 1), loss) for i, loss in enumerate(leg.losses)],
                color=LEG_COLORS[leg.name],
                width=1.8 if preempted else 3.0,
                dash="7 4" if preempted else None,
            )
        )
    return svg.line_chart(
        title="Per-step training loss of the control and the preempted leg",
        series=series,
        x_axis=steps,
        y_label="loss (mean over ranks and microbatches)",
        chart_id="loss-chart",
        empty_text="no per-step losses recorded",
    )


def _delta_chart(report: Report, steps: svg.XAxis) -> str:
    points = [(float(d.step), d.abs_diff) for d in report.verdict.loss_deltas]
    return svg.delta_chart(
        title="Per-step |loss difference| between the legs (log scale; exact zeros below)",
        points=points,
        x_axis=steps,
        y_label="|Δ loss|",
        chart_id="delta-chart",
    )


def _markers(report: Report, resume_step: int | None) -> list[svg.Marker]:
    v = report.verdict
    cut = v.cut
    markers = [
        svg.Marker(
            x=float(cut.step),
            label=f"kill (step {cut.step}, microbatch {cut.microstep}, rank {cut.rank})",
            color=KILL_COLOR,
            row=0,
            detail=f"{cut.mode} kill during step {cut.step} at {cut.at.replace('_', ' ')}",
        )
    ]
    if v.resize is not None:
        # The resize is the resume: one marker for it, one for the grow.
        return markers + resize_markers(v.resize)
    if resume_step is not None or v.resumed_from is not None:
        name = (v.resumed_from or "").rstrip("/").rsplit("/", 1)[-1] or "?"
        restart = (
            f", restart {seconds_text(report.restart_seconds)}"
            if report.restart_seconds is not None
            else ""
        )
        x = float(resume_step) if resume_step is not None else float(cut.step)
        markers.append(
            svg.Marker(
                x=x,
                label=f"resumed from {name}{restart}",
                color=RESUME_COLOR,
                row=1,
                detail=f"resumed from {v.resumed_from or '?'}",
                side="left",
            )
        )
    return markers


def _resume_step(v: Verdict) -> int | None:
    """The step whose state the resumed attempt restored, if the report says."""
    if v.resumed_from is not None:
        found = _CHECKPOINT_STEP.findall(v.resumed_from)
        if found:
            return int(found[-1])
    rows = sorted(v.boundary_table, key=lambda r: r.step)
    if rows:
        first_attempt = rows[0].attempt
        for row in rows:
            if row.attempt != first_attempt:
                return row.step - 1
    return None


def _all_steps(report: Report, resume_step: int | None) -> list[float]:
    steps: list[float] = [float(report.verdict.cut.step)]
    if resume_step is not None:
        steps.append(float(resume_step))
    if report.verdict.resize is not None and report.verdict.resize.grow_step is not None:
        steps.append(float(report.verdict.resize.grow_step))
    for leg in report.legs:
        if leg.losses:
            steps += [1.0, float(len(leg.losses))]
    steps += [float(d.step) for d in report.verdict.loss_deltas]
    steps += [float(r.step) for r in report.verdict.boundary_table]
    return steps

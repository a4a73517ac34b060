"""``report.html``: one self-contained page a person can open from a CI artifact or a bucket.

No network at all: inline CSS, inline SVG drawn by :mod:`resumequal.report.svg`, no
script, no web font. Every piece of text from the report is escaped. The page shows what
the Report says and computes nothing beyond layout (the restore step for the chart marker
is read from the boundary table's attempt numbers or the checkpoint name).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any, TypeVar

from resumequal.built import BuiltOptimizer
from resumequal.report import svg
from resumequal.report.markup import check_items, opt
from resumequal.report.resize import resize_markers, resize_section
from resumequal.report.zoom import zoom_section
from resumequal.spec import REFERENCE_LEG
from resumequal.spec.boundaries import BOUNDARIES
from resumequal.verdict import (
    BoundaryRow,
    ControlOutcome,
    Divergence,
    DriftSummary,
    Matrix,
    MatrixCell,
    Report,
    Result,
    Verdict,
)
from resumequal.words import count

VERDICT_COLORS: dict[Result, str] = {
    Result.PASS: "#1a7f37",
    Result.FAIL: "#cf222e",
    Result.NONDETERMINISTIC: "#d97706",
    Result.INVALID: "#6e7781",
}
LEG_COLORS = {REFERENCE_LEG: "#0969da", "preempted": "#e36209"}
KILL_COLOR = "#cf222e"
RESUME_COLOR = "#8250df"
FIRST_DIVERGENCE_ID = "first-divergence"

_STATUS_SYMBOL = {
    "equal": "=",
    "within_tolerance": "≈",
    "differs": "≠",
    "missing": "·",
    "not_compared": " ",
}
CONTROL_STATUS_LABELS = {
    "detected": "detected",
    "blind": "blind",
    "not_applicable": "not applicable",
    "invalid": "invalid",
    "not_judged": "not judged",
}
_CHECKPOINT_STEP = re.compile(r"step[-_]?0*(\d+)")
_T = TypeVar("_T")

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
        _header(report, color, resume_step),
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
        _section("Boundary table", [_boundary_table(v, resume_step)], anchor="boundaries"),
        _section("Drift between the final checkpoints", [_drift(v.drift)], anchor="drift"),
        _section("Negative controls", [_controls(v)], anchor="controls"),
        *(
            [_section("Seed matrix", [_matrix(report.matrix)], anchor="matrix")]
            if report.matrix is not None
            else []
        ),
        _section("Validity checks", [_checks(v)], anchor="checks"),
        _section("Legs", [_legs(report)], anchor="legs"),
        _section("Phase timeline", [_phases(report)], anchor="phases"),
        _section("Runtime inventory", [_inventory(report)], anchor="inventory"),
        _section("Spec", [_spec(report)], anchor="spec"),
        f"<footer>resumequal report · schema {escape(report.schema_version)}</footer>",
    ]
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head>"
        f'<body style="--vc:{color}"><main>{"".join(body)}</main></body></html>\n'
    )


def _launcher_words(launcher: str) -> str:
    """The launcher, with how it started the workers."""
    how = {"torchrun": "stock torchrun: every worker a fresh interpreter",
           "forked": "workers forked from one warm process"}
    return f"{launcher} ({how[launcher]})" if launcher in how else launcher


def _header(report: Report, color: str, resume_step: int | None) -> str:
    v = report.verdict
    cut = v.cut
    facts: list[tuple[str, str]] = [
        ("run", escape(report.run)),
        ("pin", escape(report.pin)),
        (
            "cut point",
            escape(
                f"step {cut.step}, microbatch {cut.microstep}, rank {cut.rank} "
                f"({cut.mode} kill at {cut.at.replace('_', ' ')})"
            ),
        ),
        (
            "resumed from",
            escape(v.resumed_from or "—")
            + (escape(f" (state after step {resume_step})") if resume_step is not None else ""),
        ),
        ("restart", escape(_seconds(report.restart_seconds) + " (kill → first resumed step)")),
        ("launcher", escape(_launcher_words(report.launcher))
         + "".join(f'<br><span class="bad">{escape(c)}</span>' for c in report.caveats)),
        *([("optimizer", escape(report.built.words()))] if report.built is not None else []),
        ("exact through step", escape(str(v.exact_through_step))),
        ("compared", escape(f"{count(v.steps_compared, 'step')} on "
                            f"{count(v.ranks_compared, 'rank')}")),
    ]
    if v.first_divergence is not None:
        d = v.first_divergence
        facts.append(
            (
                "first divergence",
                f'<a href="#{FIRST_DIVERGENCE_ID}">'
                f"{escape(f'step {d.step} · {d.boundary} · rank {d.rank} ({d.when_words()})')}"
                "</a>",
            )
        )
    if v.controls:
        blind = [c.omission for c in v.controls if c.status == "blind"]
        facts.append(
            (
                "negative controls",
                f'<a href="#controls">{escape(v.control_counts.words())}</a>'
                + (
                    f' <span class="bad">— comparator blind to {escape(", ".join(blind))}</span>'
                    if blind
                    else ""
                ),
            )
        )
    m = report.matrix
    if m is not None and m.summary:
        exact = sum(row.exact for row in m.summary)
        total = sum(row.total for row in m.summary)
        facts.append(
            (
                "seed matrix",
                f'<a href="#matrix">{escape(f"{exact}/{total} exact")}</a>'
                + escape(f" ({len(m.scenarios)} scenarios x {len(m.seeds)} seeds)"),
            )
        )
    rows = "".join(f"<dt>{k}</dt><dd>{val}</dd>" for k, val in facts)
    return (
        f'<header class="verdict" style="--vc:{color}">'
        f'<span class="badge">{escape(v.result.value)}</span>'
        f'<p class="reason">{escape(v.reason)}</p><dl class="facts">{rows}</dl>'
        f"{_divergence_box(v)}</header>"
    )


def _divergence_box(v: Verdict) -> str:
    d = v.first_divergence
    if d is None:
        return ""
    # The anchor lives on the table cell when the table has one for it, else here.
    # A difference at the restore has no cell: the table holds the steps the legs ran.
    in_table = not d.at_restore and any(row.step == d.step and d.boundary in row.status
                                        for row in v.boundary_table)
    anchor = "" if in_table else f' id="{FIRST_DIVERGENCE_ID}"'
    where = " (at the restore: the state restored against the state saved)" \
        if d.at_restore else ""
    return (
        f'<div class="diverge"{anchor}><strong>First divergence</strong>: step {d.step}, '
        f"boundary <code>{escape(d.boundary)}</code>, rank {d.rank}{escape(where)}"
        f"<table><tr><th>control</th><td><code>{escape(_value(d.control))}</code></td></tr>"
        f"<tr><th>preempted</th><td><code>{escape(_value(d.preempted))}</code></td></tr>"
        f"</table>{_cause(d)}{_tensor_difference(d)}</div>"
    )


def _cause(d: Divergence) -> str:
    """Why the first divergence happened and what fixes it, where the comparator knows."""
    rows = "".join(f"<tr><th>{label}</th><td>{escape(text)}</td></tr>"
                   for label, text in (("cause", d.cause), ("fix", d.fix)) if text)
    restored = "".join(
        f"<tr><td><code>{escape(t.name)}</code></td><td>{escape(t.kind)}</td>"
        f"<td>{escape(', '.join(map(str, t.ranks)))}</td><td>{escape(t.cause)}</td>"
        f"<td>{'' if t.kept_rank is None else t.kept_rank}</td></tr>" for t in d.restored)
    table = ("<table><tr><th>tensor</th><th>kind</th><th>ranks</th><th>cause</th>"
             f"<th>copy restored</th></tr>{restored}</table>") if restored else ""
    return (f"<table>{rows}</table>" if rows else "") + table


def _tensor_difference(d: Divergence) -> str:
    return _first_tensors(d) + _step_tensors(d) + _buckets(d)


def _step_tensors(d: Divergence) -> str:
    """Every per-tensor boundary of the divergent step: where it starts, how far it goes."""
    if not d.step_tensors:
        return ""
    rows = "".join(
        f"<tr><td><code>{escape(b)}</code></td>{_num_td(t.differ)}{_num_td(t.total)}"
        f"<td><code>{escape(t.first or '')}</code></td></tr>"
        for b, t in d.step_tensors.items())
    return ("<details><summary>every tensor boundary of this step</summary><table><tr>"
            "<th>boundary</th><th>differ</th><th>tensors</th><th>first</th></tr>"
            f"{rows}</table></details>")


def _buckets(d: Divergence) -> str:
    """Both legs' DDP bucket layouts, when they differ."""
    if d.buckets is None:
        return ""
    parts = []
    for leg, buckets in d.buckets.items():
        rows = "".join(f"<tr>{_num_td(b.index)}{_num_td(len(b.params))}{_num_td(b.numel)}"
                       f"<td><code>{escape(', '.join(b.params[:3]))}"
                       f"{' …' if len(b.params) > 3 else ''}</code></td></tr>" for b in buckets)
        parts.append(f"<h4>{escape(leg)}: {count(len(buckets), 'bucket')}</h4><table><tr>"
                     "<th>bucket</th><th>params</th><th>elements</th><th>first params</th>"
                     f"</tr>{rows}</table>")
    return f"<details><summary>DDP bucket layouts</summary>{''.join(parts)}</details>"


def _first_tensors(d: Divergence) -> str:
    """Which tensors differ, per module, with the full list folded away."""
    t = d.tensors
    if t is None:
        return ""
    modules = "".join(
        f"<tr><td><code>{escape(m.module)}</code></td>{_num_td(m.differ)}{_num_td(m.total)}</tr>"
        for m in t.modules if m.differ)
    listed = "".join(f"<li><code>{escape(n)}</code></li>" for n in t.differing)
    more = (f"<p>and {t.differ - len(t.differing)} more</p>"
            if t.differ > len(t.differing) else "")
    return (
        f"<p class=\"tensors\">{escape(d.tensor_words())}</p>"
        f"<details><summary>by module ({len([m for m in t.modules if m.differ])} with "
        f"differences)</summary><table><tr><th>module</th><th>differ</th><th>tensors</th>"
        f"</tr>{modules}</table></details>"
        f"<details><summary>the {t.differ} differing tensors, in {t.order} order</summary>"
        f"<ol>{listed}</ol>{more}</details>"
    )


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


def _boundary_table(v: Verdict, resume_step: int | None) -> str:
    if not v.boundary_table:
        return '<p class="note">No boundary table: no steps were compared.</p>'
    d = v.first_divergence
    legend = "".join(
        f'<span><b class="s-{status}">{symbol}</b> {status.replace("_", " ")}</span>'
        for status, symbol in _STATUS_SYMBOL.items()
    )
    head = "".join(f'<th class="b" scope="col">{escape(b)}</th>' for b in BOUNDARIES)
    rows: list[str] = []
    for row in sorted(v.boundary_table, key=lambda r: r.step):
        rows.append(_boundary_row(row, v, resume_step, d is not None and d.step == row.step))
    note = (
        "Rows are optimizer steps, columns the comparison boundaries in execution order; "
        "a cell is the worst status over all ranks."
    )
    skipped = _not_compared(v)
    if skipped:
        note += (
            " Not compared (the spec's comparison.boundaries leaves them out, so a fault "
            f"that first shows there is not seen at its step): {', '.join(skipped)}."
        )
    return (
        f'<p class="note">{escape(note)}</p><p class="legend">{legend}</p>'
        f'<table class="boundaries"><thead><tr><th scope="col">step</th>'
        f'<th scope="col">attempt</th>{head}</tr></thead><tbody>{"".join(rows)}</tbody>'
        "</table>"
    )


def _boundary_row(row: BoundaryRow, v: Verdict, resume_step: int | None, first: bool) -> str:
    d = v.first_divergence
    tags = ""
    if row.step == v.cut.step:
        tags += '<span class="tag kill">kill</span>'
    if resume_step is not None and row.step == resume_step + 1:
        tags += '<span class="tag resume">resumed</span>'
    cls = ' class="killrow"' if row.step == v.cut.step else ""
    cells: list[str] = []
    for b in BOUNDARIES:
        status = row.status.get(b, "missing")
        classes = f"cell s-{status}"
        extra = ""
        if first and d is not None and d.boundary == b:
            classes += " first"
            extra = f' id="{FIRST_DIVERGENCE_ID}"'
        label = f"step {row.step}, {b}: {status.replace('_', ' ')}"
        cells.append(
            f'<td class="{classes}"{extra} title="{escape(label)}">{_STATUS_SYMBOL[status]}</td>'
        )
    return (
        f'<tr id="step-{row.step}"{cls}><td class="step num">{row.step}{tags}</td>'
        f'<td class="num">{row.attempt}</td>{"".join(cells)}</tr>'
    )


def _drift(drift: Sequence[DriftSummary]) -> str:
    if not drift:
        return '<p class="note">No drift figures: the final checkpoints were not compared.</p>'
    summary = "".join(
        f"<tr><th>{escape(g.group)}</th><td class='num'>{g.tensors}</td>"
        f"<td class='num'>{g.numel}</td>{_num_td(g.max_abs_diff)}{_num_td(g.rel_l2)}"
        f"{_num_td(g.mismatch_fraction)}</tr>"
        for g in drift
    )
    parts = [
        "<table><thead><tr><th>group</th><th>tensors</th><th>elements</th>"
        "<th>max |a&minus;b|</th><th>rel L2</th><th>mismatch fraction</th></tr></thead>"
        f"<tbody>{summary}</tbody></table>"
    ]
    for g in drift:
        if not g.worst:
            continue
        worst = "".join(
            f"<tr><td><code>{escape(t.name)}</code></td><td class='num'>{t.numel}</td>"
            f"{_num_td(t.max_abs_diff)}{_num_td(t.rel_l2)}{_num_td(t.mismatch_fraction)}</tr>"
            for t in g.worst
        )
        parts.append(
            f"<h3>Worst tensors: {escape(g.group)}</h3>"
            "<table><thead><tr><th>tensor</th><th>elements</th><th>max |a&minus;b|</th>"
            f"<th>rel L2</th><th>mismatch fraction</th></tr></thead><tbody>{worst}</tbody>"
            "</table>"
        )
    return "".join(parts)


def _controls(v: Verdict) -> str:
    if not v.controls:
        return (
            '<p class="note">No negative controls were run: nothing shows that this '
            "comparator would see a broken resume.</p>"
        )
    blind = [c for c in v.controls if c.status == "blind"]
    parts = [f'<p class="reason">{escape(v.control_counts.words())}</p>']
    if blind:
        lines = "".join(f"<strong>comparator blind to {escape(c.omission)}</strong>" for c in blind)
        parts.append(
            f'<div class="blind">{lines}A resume that left that state out was not told '
            "apart from an exact one, so a PASS from this comparator would not mean the "
            "resume is exact: the verdict is INVALID.</div>"
        )
    rows = "".join(_control_row(c) for c in v.controls)
    parts.append(
        '<table class="controls"><thead><tr><th>omission</th><th>method</th>'
        "<th>status</th><th>first divergence</th><th>max param diff</th>"
        f"<th>mechanism</th><th>evidence</th></tr></thead><tbody>{rows}</tbody></table>"
    )
    return "".join(parts)


def _control_row(c: ControlOutcome) -> str:
    d = c.first_divergence
    where = "—" if d is None else f"step {d.step} · {d.boundary} · rank {d.rank}"
    leg = f'<br><span class="leg">leg {escape(c.leg)}</span>' if c.leg else ""
    # Neutral: a detected control is expected to drift, so red/green would read backwards.
    diff = "—" if c.max_param_diff is None else svg.fmt(c.max_param_diff)
    label = CONTROL_STATUS_LABELS[c.status]
    return (
        f'<tr id="control-{escape(c.omission)}"><th><code>{escape(c.omission)}</code>{leg}</th>'
        f"<td>{escape(c.method)}</td>"
        f'<td><span class="cs cs-{c.status}" title="expected: {escape(c.expected)}">'
        f"{escape(label)}</span></td>"
        f"<td>{escape(where)}</td><td class='num'>{escape(diff)}</td>"
        f"<td>{escape(c.mechanism)}</td>"
        f"<td>{escape(c.evidence or '')}</td></tr>"
    )


def _matrix(m: Matrix) -> str:
    scenarios = _unique([*m.scenarios, *(c.scenario for c in m.cells)])
    seeds = _unique([*m.seeds, *(c.seed for c in m.cells)])
    cells = {(c.scenario, c.seed): c for c in m.cells}
    summary = {row.scenario: row for row in m.summary}
    head = "".join(f'<th scope="col">seed {s}</th>' for s in seeds)
    rows: list[str] = []
    for scenario in scenarios:
        tds = "".join(_matrix_cell(cells.get((scenario, seed)), scenario, seed) for seed in seeds)
        row = summary.get(scenario)
        if row is None:
            total = "<td class='num'>—</td>"
        else:
            cls = "ok" if row.exact == row.total else "bad"
            total = f"<td class='num {cls}'>{row.exact}/{row.total}</td>"
        rows.append(f'<tr><th scope="row">{escape(scenario)}</th>{tds}{total}</tr>')
    note = (
        "Positive scenarios repeated with other seeds: each cell is one preempted-and-resumed "
        "leg against its control; it names the first divergent step and boundary when not "
        "exact (hover for the reason)."
    )
    return (
        f'<p class="note">{note}</p><table class="matrix"><thead><tr>'
        f'<th scope="col">scenario</th>{head}<th scope="col">exact/total</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _matrix_cell(cell: MatrixCell | None, scenario: str, seed: int) -> str:
    if cell is None:
        return f'<td class="m m-none" title="{escape(f"{scenario}, seed {seed}: not run")}">—</td>'
    where = (
        None
        if cell.first_divergent_step is None
        else " · ".join(
            [f"step {cell.first_divergent_step}"]
            + ([cell.first_divergent_boundary] if cell.first_divergent_boundary else [])
        )
    )
    if cell.result is Result.PASS:
        cls, text = ("m-exact", "exact") if where is None else ("m-tolerance", f"≈ {where}")
    elif cell.result is Result.INVALID:
        cls, text = "m-invalid", "INVALID"
    elif cell.result is Result.NONDETERMINISTIC:
        cls, text = "m-nondeterministic", where or "NONDETERMINISTIC"
    else:
        cls, text = "m-fail", where or "FAIL"
    title = f"{scenario}, seed {seed}: {cell.result.value} — {cell.reason}"
    return f'<td class="m {cls}" title="{escape(title)}">{escape(text)}</td>'


def _checks(v: Verdict) -> str:
    if not v.checks:
        return '<p class="note">No validity checks were recorded.</p>'
    items = check_items((c.ok, c.name, c.detail) for c in v.checks)
    return f'<ul class="checks">{items}</ul>'


def _legs(report: Report) -> str:
    if not report.legs:
        return '<p class="note">No leg summaries were recorded.</p>'
    rows = []
    for leg in report.legs:
        duration = (
            leg.finished_at - leg.started_at
            if leg.started_at is not None and leg.finished_at is not None
            else None
        )
        final = leg.losses[-1] if leg.losses else None
        rows.append(
            f"<tr><th>{escape(leg.name)}</th><td class='num'>{leg.attempts}</td>"
            f"<td class='num'>{escape(opt(leg.exit_code))}</td>"
            f"<td>{escape(_when(leg.started_at))}</td><td>{escape(_when(leg.finished_at))}</td>"
            f"<td class='num'>{escape(_seconds(duration))}</td>"
            f"<td class='num'>{len(leg.losses)}</td>"
            f"<td class='num'>{escape(svg.fmt(final) if final is not None else '—')}</td></tr>"
        )
    return (
        "<table><thead><tr><th>leg</th><th>attempts</th><th>exit code</th><th>started</th>"
        "<th>finished</th><th>duration</th><th>steps</th><th>final loss</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>" + _compiles(report)
    )


def _compiles(report: Report) -> str:
    """torch.compile per leg attempt, where the model compiled: time, cache, autotuning."""
    rows = [
        f"<tr><th>{escape(leg.name)}</th><td class='num'>{c.attempt}</td>"
        f"<td class='num'>{escape(_seconds(c.seconds))}</td>"
        f"<td class='num'>{c.fx_cache_hits}</td><td class='num'>{c.fx_cache_misses}</td>"
        f"<td class='num'>{c.autotuned}</td></tr>"
        for leg in report.legs for c in leg.compiled
    ]
    if not rows:
        return ""
    return (
        "<h3>torch.compile</h3><table><thead><tr><th>leg</th><th>attempt</th>"
        "<th>compile (slowest rank)</th><th>FX cache hits</th><th>FX cache misses</th>"
        "<th>autotuned kernels</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _phases(report: Report) -> str:
    if not report.phases:
        return '<p class="note">No phase events were recorded.</p>'
    start = report.phases[0].at
    rows = []
    for i, p in enumerate(report.phases):
        nxt = report.phases[i + 1].at if i + 1 < len(report.phases) else None
        rows.append(
            f"<tr><th>{escape(p.phase)}</th><td>{escape(_when(p.at))}</td>"
            f"<td class='num'>+{escape(_seconds(p.at - start))}</td>"
            f"<td class='num'>{escape(_seconds(nxt - p.at if nxt is not None else None))}</td>"
            f"<td>{escape(p.reason or '')}</td><td>{escape(p.message or '')}</td></tr>"
        )
    return (
        "<table><thead><tr><th>phase</th><th>at (UTC)</th><th>since start</th>"
        "<th>duration</th><th>reason</th><th>message</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _inventory(report: Report) -> str:
    parts: list[str] = []
    if report.inventory_differences:
        parts.append(
            '<h3 class="bad">The legs\' runtime inventories differ</h3>'
            + _kv_table(report.inventory_differences.items(), diff=True)
        )
    if report.inventory:
        if parts:
            parts.append("<h3>Recorded inventory</h3>")
        parts.append(_kv_table(report.inventory.items()))
    else:
        parts.append('<p class="note">No runtime inventory was recorded.</p>')
    if report.built is not None:
        parts.append(_built(report.built))
    return "".join(parts)


def _built(b: BuiltOptimizer) -> str:
    """The optimizer and scheduler the workload built, every hyperparameter of the first
    param group."""
    return (f"<h3>Optimizer and schedule, as the workload built them</h3>"
            f"<p>{escape(b.optimizer)}, {escape(count(b.groups, 'param group'))}; scheduler "
            f"{escape(b.scheduler or 'none')}</p>" + _kv_table(b.hyperparameters.items()))


def _kv_table(items: Iterable[tuple[str, Any]], *, diff: bool = False) -> str:
    rows = []
    for key, value in sorted(items, key=lambda kv: kv[0]):
        if diff and isinstance(value, dict) and {"control", "preempted"} <= value.keys():
            cells = (
                f"<td><code>{escape(_value(value['control']))}</code></td>"
                f"<td><code>{escape(_value(value['preempted']))}</code></td>"
            )
        elif diff:
            cells = f'<td colspan="2"><code>{escape(_value(value))}</code></td>'
        else:
            cells = f"<td><code>{escape(_value(value))}</code></td>"
        rows.append(f"<tr><th>{escape(str(key))}</th>{cells}</tr>")
    head = (
        "<tr><th>key</th><th>control</th><th>preempted</th></tr>"
        if diff
        else "<tr><th>key</th><th>value</th></tr>"
    )
    return f"<table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"


def _spec(report: Report) -> str:
    text = json.dumps(report.spec, indent=2, sort_keys=True, default=str)
    b = report.built
    left_out = [] if b is None else [
        f"training.{name}" for name, used in (("optimizer", b.optimizer_from_spec),
                                              ("schedule", b.schedule_from_spec)) if not used]
    note = (f'<p class="note">{escape(" and ".join(left_out))} left out: the workload built '
            "its own (Runtime inventory).</p>" if left_out else "")
    return (
        f"{note}<details><summary>the spec this run qualified</summary>"
        f"<pre>{escape(text)}</pre></details>"
    )


def _section(title: str, parts: Sequence[str], anchor: str | None = None) -> str:
    ident = f' id="{anchor}"' if anchor else ""
    return f"<section{ident}><h2>{escape(title)}</h2>{''.join(parts)}</section>"


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
            f", restart {_seconds(report.restart_seconds)}"
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


def _not_compared(v: Verdict) -> list[str]:
    """Boundaries some row of the table marks "not_compared", in execution order."""
    seen = {b for row in v.boundary_table for b, s in row.status.items() if s == "not_compared"}
    return [b for b in BOUNDARIES if b in seen]


def _unique(items: Iterable[_T]) -> list[_T]:
    return list(dict.fromkeys(items))


def _num_td(value: float) -> str:
    cls = "num ok" if value == 0 else "num bad"
    return f"<td class='{cls}'>{escape(svg.fmt(value))}</td>"


def _value(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def _seconds(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:.1f} s" if value < 120 else f"{value / 60:.1f} min"


def _when(ts: float | None) -> str:
    if ts is None or not math.isfinite(ts):
        return "—"
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")

"""The resize parts of the reports: the HTML section, the chart markers, the terminal lines.

Reads :class:`~resumequal.results.verdict.ResizeOutcome` and lays it out; computes nothing.
Every piece of text from the report is escaped.
"""

from __future__ import annotations

from html import escape
from typing import Final

from resumequal.report import svg
from resumequal.report.markup import check_items, opt
from resumequal.results.verdict import ResizeOutcome, ResizeStepRow

RESIZE_COLOR: Final = "#8250df"
GROW_COLOR: Final = "#1a7f37"
# Longer per-step tables fold away behind a summary line.
_OPEN_ROWS: Final = 24


def resize_markers(r: ResizeOutcome) -> list[svg.Marker]:
    """The resize and the grow, at the steps whose checkpoints the new worlds restored."""
    small = r.world_sizes[1] if len(r.world_sizes) > 1 else None
    markers = [svg.Marker(
        x=float(r.resize_step), label=f"resized to {small} rank(s) from step {r.resize_step}",
        color=RESIZE_COLOR, row=1, side="left",
        detail=f"the smaller world resumed from the checkpoint of step {r.resize_step}")]
    if r.grow_step is not None:
        markers.append(svg.Marker(
            x=float(r.grow_step), label=f"grown to {r.world_sizes[-1]} ranks from step "
                                        f"{r.grow_step}",
            color=GROW_COLOR, row=2, side="left",
            detail=f"the grown world resumed from the checkpoint of step {r.grow_step}"))
    return markers


def resize_section(r: ResizeOutcome) -> str:
    """The four parts, the handoffs and the per-step table with each step's world size."""
    worlds = " → ".join(str(w) for w in r.world_sizes)
    grow = f", grown from step {r.grow_step}" if r.grow_step is not None else ""
    parts = check_items(resize_lines(r))
    return (
        f'<p class="note">{escape(f"ranks {worlds}: resized from step {r.resize_step}{grow}.")}'
        " After the resize the reduction order differs, so bitwise equality is not expected: "
        "the handoff and the data ledger must be exact, the drift within the tolerances.</p>"
        f'<ul class="checks resize-parts">{parts}</ul>'
        f"<h3>Handoffs</h3>{_handoffs(r)}<h3>Steps</h3>{_steps(r)}"
    )


def _mark(value: bool | None, yes: str = "equal", no: str = "differs") -> str:
    if value is None:
        return "<td>—</td>"
    return f'<td class="{"ok" if value else "bad"}">{yes if value else no}</td>'


def _handoffs(r: ResizeOutcome) -> str:
    if not r.handoffs:
        return '<p class="note">No restores were recorded.</p>'
    rows = "".join(
        f"<tr><td class='num'>{h.attempt}</td><td><code>{escape(h.checkpoint)}</code></td>"
        f"<td class='num'>{opt(h.saved_world_size)}</td><td class='num'>{opt(h.world_size)}"
        f"</td>{_mark(h.equal_to_saved)}{_mark(h.equal_to_control)}</tr>"
        for h in r.handoffs)
    return (
        '<table class="handoffs"><thead><tr><th>attempt</th><th>checkpoint</th>'
        "<th>saved by (ranks)</th><th>restored on (ranks)</th><th>vs saved</th>"
        f"<th>vs control</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _step_row(s: ResizeStepRow, r: ResizeOutcome) -> str:
    tags = ""
    if s.step == r.resize_step + 1:
        tags += '<span class="tag resume">resized</span>'
    if r.grow_step is not None and s.step == r.grow_step + 1:
        tags += '<span class="tag grow">grown</span>'
    return (
        f'<tr id="resize-step-{s.step}"><td class="num">{s.step}{tags}</td>'
        f"<td class='num'>{s.world_size}</td><td class='num'>{s.attempt}</td>"
        f"{_mark(s.ledger_ok, 'exact', 'wrong')}"
        f"{_diff(s.loss_max_abs_diff)}{_diff(s.grad_norm_abs_diff)}"
        f"{_mark(s.within_tolerance, 'yes', 'no')}</tr>"
    )


def _steps(r: ResizeOutcome) -> str:
    if not r.steps:
        return '<p class="note">No steps were compared.</p>'
    rows = "".join(_step_row(s, r) for s in r.steps)
    table = (
        '<table class="resize-steps"><thead><tr><th>step</th><th>world size</th>'
        "<th>attempt</th><th>data ledger</th><th>max |Δ loss|</th><th>|Δ grad norm|</th>"
        f"<th>within tolerance</th></tr></thead><tbody>{rows}</tbody></table>"
    )
    if len(r.steps) <= _OPEN_ROWS:
        return table
    bad = sum(not (s.ledger_ok and s.within_tolerance) for s in r.steps)
    return (f"<details><summary>{len(r.steps)} steps, {bad} with a wrong ledger or over a "
            f"tolerance</summary>{table}</details>")


def _diff(value: float | None) -> str:
    return "<td class='num'>—</td>" if value is None else f"<td class='num'>{svg.fmt(value)}</td>"


def resize_lines(r: ResizeOutcome) -> list[tuple[bool, str, str]]:
    """One (ok, label, detail) per part, for the terminal and the HTML check list."""
    return [(p.ok, p.label(), p.detail) for p in r.parts]

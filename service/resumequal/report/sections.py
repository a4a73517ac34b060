"""The sections of ``report.html`` after the boundary table: drift, negative controls, the
seed matrix, validity checks, legs, phases, the runtime inventory and the spec.

Each lays out what the Report holds and computes nothing. Every piece of text is escaped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any, TypeVar

from resumequal.built import BuiltOptimizer
from resumequal.report import svg
from resumequal.report.markup import check_items, num_td, opt, seconds_text, utc_text, value_text
from resumequal.results.verdict import (
    ControlOutcome,
    DriftSummary,
    Matrix,
    MatrixCell,
    Report,
    Result,
    Verdict,
)
from resumequal.words import count

CONTROL_STATUS_LABELS = {
    "detected": "detected",
    "blind": "blind",
    "not_applicable": "not applicable",
    "invalid": "invalid",
    "not_judged": "not judged",
}
_T = TypeVar("_T")


def drift_section(drift: Sequence[DriftSummary]) -> str:
    """Drift between the final checkpoints per group, then each group's worst tensors."""
    if not drift:
        return '<p class="note">No drift figures: the final checkpoints were not compared.</p>'
    summary = "".join(
        f"<tr><th>{escape(g.group)}</th><td class='num'>{g.tensors}</td>"
        f"<td class='num'>{g.numel}</td>{num_td(g.max_abs_diff)}{num_td(g.rel_l2)}"
        f"{num_td(g.mismatch_fraction)}</tr>"
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
            f"{num_td(t.max_abs_diff)}{num_td(t.rel_l2)}{num_td(t.mismatch_fraction)}</tr>"
            for t in g.worst
        )
        parts.append(
            f"<h3>Worst tensors: {escape(g.group)}</h3>"
            "<table><thead><tr><th>tensor</th><th>elements</th><th>max |a&minus;b|</th>"
            f"<th>rel L2</th><th>mismatch fraction</th></tr></thead><tbody>{worst}</tbody>"
            "</table>"
        )
    return "".join(parts)


def controls_section(v: Verdict) -> str:
    """The negative controls: counted, the blind ones called out, one row per control."""
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


def matrix_section(m: Matrix) -> str:
    """Scenarios by seeds, each cell exact or the first divergent step; exact/total per row."""
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


def checks_section(v: Verdict) -> str:
    """The validity checks, each ✓ or ✗ with its detail."""
    if not v.checks:
        return '<p class="note">No validity checks were recorded.</p>'
    items = check_items((c.ok, c.name, c.detail) for c in v.checks)
    return f'<ul class="checks">{items}</ul>'


def legs_section(report: Report) -> str:
    """One row per leg (attempts, exit code, times, steps, final loss), then torch.compile."""
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
            f"<td>{escape(utc_text(leg.started_at))}</td><td>{escape(utc_text(leg.finished_at))}</td>"
            f"<td class='num'>{escape(seconds_text(duration))}</td>"
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
        f"<td class='num'>{escape(seconds_text(c.seconds))}</td>"
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


def phases_section(report: Report) -> str:
    """The qualification's phases: when each began and how long it lasted."""
    if not report.phases:
        return '<p class="note">No phase events were recorded.</p>'
    start = report.phases[0].at
    rows = []
    for i, p in enumerate(report.phases):
        nxt = report.phases[i + 1].at if i + 1 < len(report.phases) else None
        rows.append(
            f"<tr><th>{escape(p.phase)}</th><td>{escape(utc_text(p.at))}</td>"
            f"<td class='num'>+{escape(seconds_text(p.at - start))}</td>"
            f"<td class='num'>{escape(seconds_text(nxt - p.at if nxt is not None else None))}</td>"
            f"<td>{escape(p.reason or '')}</td><td>{escape(p.message or '')}</td></tr>"
        )
    return (
        "<table><thead><tr><th>phase</th><th>at (UTC)</th><th>since start</th>"
        "<th>duration</th><th>reason</th><th>message</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def inventory_section(report: Report) -> str:
    """The runtime inventory (and how the legs' differ), and the optimizer the workload built."""
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
                f"<td><code>{escape(value_text(value['control']))}</code></td>"
                f"<td><code>{escape(value_text(value['preempted']))}</code></td>"
            )
        elif diff:
            cells = f'<td colspan="2"><code>{escape(value_text(value))}</code></td>'
        else:
            cells = f"<td><code>{escape(value_text(value))}</code></td>"
        rows.append(f"<tr><th>{escape(str(key))}</th>{cells}</tr>")
    head = (
        "<tr><th>key</th><th>control</th><th>preempted</th></tr>"
        if diff
        else "<tr><th>key</th><th>value</th></tr>"
    )
    return f"<table><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"


def spec_section(report: Report) -> str:
    """The spec this run qualified, folded away; which training sections the workload overrode."""
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


def _unique(items: Iterable[_T]) -> list[_T]:
    return list(dict.fromkeys(items))

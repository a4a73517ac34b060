"""Where the legs part, in ``report.html``: the first-divergence box and the boundary table.

Both point at one element, the first divergent cell (or the box, when the table has no
cell for it), so the header's link lands there. Every piece of text is escaped.
"""

from __future__ import annotations

from html import escape

from resumequal.report.markup import num_td, value_text
from resumequal.results.verdict import BoundaryRow, Divergence, Verdict
from resumequal.spec.boundaries import BOUNDARIES
from resumequal.words import count

FIRST_DIVERGENCE_ID = "first-divergence"
_STATUS_SYMBOL = {
    "equal": "=",
    "within_tolerance": "≈",
    "differs": "≠",
    "missing": "·",
    "not_compared": " ",
}


def divergence_box(v: Verdict) -> str:
    """The first divergence: where, both legs' values, its cause and the tensors that differ."""
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
        f"<table><tr><th>control</th><td><code>{escape(value_text(d.control))}</code></td></tr>"
        f"<tr><th>preempted</th><td><code>{escape(value_text(d.preempted))}</code></td></tr>"
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
        f"<tr><td><code>{escape(b)}</code></td>{num_td(t.differ)}{num_td(t.total)}"
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
        rows = "".join(f"<tr>{num_td(b.index)}{num_td(len(b.params))}{num_td(b.numel)}"
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
        f"<tr><td><code>{escape(m.module)}</code></td>{num_td(m.differ)}{num_td(m.total)}</tr>"
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


def boundary_table(v: Verdict, resume_step: int | None) -> str:
    """Steps by boundaries, each cell the worst status over the ranks; kill, resume and the
    first divergence marked."""
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


def _not_compared(v: Verdict) -> list[str]:
    """Boundaries some row of the table marks "not_compared", in execution order."""
    seen = {b for row in v.boundary_table for b, s in row.status.items() if s == "not_compared"}
    return [b for b in BOUNDARIES if b in seen]

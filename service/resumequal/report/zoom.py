"""The zoom parts of the reports: the HTML section and the terminal lines.

Reads :class:`~resumequal.results.verdict.Zoom` and lays it out; computes nothing. Every piece of
text from the report is escaped.
"""

from __future__ import annotations

from html import escape
from typing import Final

from resumequal.results.verdict import Bucket, Zoom, ZoomTensor
from resumequal.words import count

KIND_LABELS: Final = {"origin": "origin", "propagation": "propagation",
                      "encloses_origin": "encloses the origin", "state": "differing state"}
# The terminal lists this many modules; the HTML all of them, folded.
_TERMINAL_MODULES: Final = 8


# What "max |diff|" shows where no number can say it: nothing differs, or a tensor's shape
# or dtype (or its presence) differs, so no element-wise difference exists.
EQUAL: Final = "—"
SHAPES: Final = "shape/dtype"
LEGEND: Final = (f"max |diff|: {EQUAL} where nothing differs; {SHAPES} where a tensor's "
                 "shape or dtype differs (or one replay lacks it), so no element-wise "
                 "difference exists.")


def _diff(value: float | None, differ: int = 1) -> str:
    if not differ:
        return EQUAL
    return SHAPES if value is None else f"{value:.3g}"


def zoom_lines(z: Zoom) -> list[str]:
    """What ``resumequal zoom`` prints: the summary, the replays, the modules, the stages."""
    lines = [f"zoom of step {z.step}: {z.summary}"]
    for r in z.replays:
        mark = "reproduced" if r.reproduced else "NOT reproduced"
        lines.append(f"  {r.leg}: attempt {r.attempt} from {r.start or 'the beginning'}, "
                     f"{count(r.world_size, 'rank')}: {mark}")
    for m in z.modules[:_TERMINAL_MODULES]:
        lines.append(f"  {KIND_LABELS[m.kind]:<20} {m.module} ({m.phase}, max |diff| "
                     f"{_diff(m.max_abs_diff)})")
    if len(z.modules) > _TERMINAL_MODULES:
        lines.append(f"  ... and {len(z.modules) - _TERMINAL_MODULES} more modules")
    stages = ", ".join(f"{s.name} {s.differ}/{s.total}" for s in z.stages)
    lines.append(f"  stages (differing/captured): {stages}")
    if any(m.max_abs_diff is None for m in z.modules[:_TERMINAL_MODULES]):
        lines.append(f"  {LEGEND}")
    return lines


def _tensor_rows(tensors: list[ZoomTensor]) -> str:
    return "".join(
        f"<tr><td><code>{escape(t.name)}</code></td><td class=\"num\">{t.rank}</td>"
        f"<td class=\"num\">{t.differ}</td><td class=\"num\">{t.numel}</td>"
        f"<td class=\"num\">{escape(_diff(t.max_abs_diff, t.differ))}</td></tr>"
        for t in tensors)


_TENSOR_HEAD: Final = ("<tr><th>tensor</th><th>rank</th><th>elements differ</th>"
                       "<th>elements</th><th>max |diff|</th></tr>")


def _buckets(buckets: dict[str, list[Bucket]] | None) -> str:
    if buckets is None:
        return "<p>The replays' DDP bucket layouts are the same.</p>"
    parts = []
    for leg, layout in buckets.items():
        rows = "".join(f"<tr><td class=\"num\">{b.index}</td><td class=\"num\">"
                       f"{len(b.params)}</td><td class=\"num\">{b.numel}</td></tr>"
                       for b in layout)
        parts.append(f"<h4>{escape(leg)}: {count(len(layout), 'bucket')}</h4><table><tr>"
                     f"<th>bucket</th><th>params</th><th>elements</th></tr>{rows}</table>")
    return f"<details><summary>DDP bucket layouts differ</summary>{''.join(parts)}</details>"


def zoom_section(z: Zoom) -> str:
    """The report's zoom section: summary, replays, modules by kind, stages, runtime."""
    replays = "".join(
        f"<tr><td>{escape(r.leg)}</td><td class=\"num\">{r.attempt}</td>"
        f"<td><code>{escape(r.start or 'the beginning')}</code></td>"
        f"<td class=\"num\">{r.world_size}</td>"
        f"<td>{'yes' if r.reproduced else 'NO'}</td><td>{escape(r.detail)}</td></tr>"
        for r in z.replays)
    modules = "".join(
        f"<tr class=\"{escape(m.kind)}\"><td><code>{escape(m.module)}</code></td>"
        f"<td>{escape(KIND_LABELS[m.kind])}</td><td>{escape(m.phase)}</td>"
        f"<td>{'differ' if m.inputs_differ else 'equal'}</td>"
        f"<td>{'differ' if m.outputs_differ else 'equal'}</td>"
        f"<td>{'differ' if m.grads_out_differ else 'equal'}</td>"
        f"<td class=\"num\">{escape(_diff(m.max_abs_diff))}</td>"
        f"<td>{escape(', '.join(map(str, m.ranks)))}</td></tr>"
        for m in z.modules)
    details = "".join(
        f"<details><summary><code>{escape(m.module)}</code>: "
        f"{count(len(m.tensors), 'differing tensor')}</summary><table>{_TENSOR_HEAD}"
        f"{_tensor_rows(m.tensors)}</table></details>" for m in z.modules if m.tensors)
    stages = "".join(
        f"<tr><td><code>{escape(s.name)}</code></td><td class=\"num\">{s.differ}</td>"
        f"<td class=\"num\">{s.total}</td>"
        f"<td class=\"num\">{escape(_diff(s.max_abs_diff, s.differ))}</td></tr>"
        for s in z.stages)
    stage_details = "".join(
        f"<details><summary><code>{escape(s.name)}</code>: differing tensors</summary>"
        f"<table>{_TENSOR_HEAD}{_tensor_rows(s.tensors)}</table></details>"
        for s in z.stages if s.tensors)
    inventory = "".join(
        f"<tr><td><code>{escape(k)}</code></td><td>{escape(str(v.get('control')))}</td>"
        f"<td>{escape(str(v.get('preempted')))}</td></tr>"
        for k, v in z.inventory_differences.items() if isinstance(v, dict))
    inventory_html = (f"<table><tr><th>item</th><th>control</th><th>preempted</th></tr>"
                      f"{inventory}</table>" if inventory
                      else "<p>The attempts that ran the step have the same runtime "
                           "inventory.</p>")
    return (
        f"<p class=\"zoom-summary\"><strong>{escape(z.summary)}</strong></p>"
        f"<table><tr><th>leg</th><th>attempt</th><th>replayed from</th><th>ranks</th>"
        f"<th>reproduced</th><th>detail</th></tr>{replays}</table>"
        f"<h3>Modules that differ ({len(z.modules)} of {z.modules_total})</h3>"
        + (f"<details open><summary>in execution order</summary><table><tr><th>module</th>"
           "<th>kind</th><th>first differs in</th><th>inputs</th><th>outputs</th>"
           f"<th>gradients sent</th><th>max |diff|</th><th>ranks</th></tr>{modules}</table>"
           f"</details>{details}" if z.modules else "<p>Every module is equal.</p>")
        + f"<h3>Stages</h3><table><tr><th>stage</th><th>differ</th><th>tensors</th>"
        f"<th>max |diff|</th></tr>{stages}</table>{stage_details}"
        f"<p class=\"legend\">{escape(LEGEND)}</p>"
        f"<h3>Runtime</h3>{_buckets(z.buckets)}{inventory_html}"
    )

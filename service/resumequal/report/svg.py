"""Inline SVG charts for the HTML report, drawn by hand: no plotting library, no script.

Two charts: a line chart (per-step losses of both legs) and a per-step difference chart
whose y axis is logarithmic for positive values, with its own rows for values that are
exactly 0 (the common case: nothing to take a logarithm of) and for non-finite ones.
Both take vertical markers (the kill, the restore point). Every text is escaped; every
chart is one ``<svg role="img">`` with a ``<title>``, valid as XML on its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Literal

SVG_NS = "http://www.w3.org/2000/svg"
WIDTH = 960
HEIGHT = 340
_LEFT, _RIGHT, _TOP, _BOTTOM = 76, 24, 40, 48
_CHAR_PX = 6.4  # rough width of one character at font-size 11, to keep labels inside
_AXIS = "#57606a"
_GRID = "#eaeef2"
_FONT = 'font-family="system-ui, sans-serif" font-size="11"'
_HALO = 'paint-order="stroke" stroke="#ffffff" stroke-width="3" stroke-linejoin="round"'


@dataclass(frozen=True)
class XAxis:
    """The x axis of a chart: its domain, its label and the vertical markers along it."""

    domain: tuple[float, float]
    label: str
    markers: Sequence[Marker]


@dataclass(frozen=True)
class Series:
    """One line: ``points`` as (x, y); a non-finite y leaves a gap."""

    name: str
    points: Sequence[tuple[float, float]]
    color: str
    width: float = 2.0
    dash: str | None = None


@dataclass(frozen=True)
class Marker:
    """A vertical line at ``x`` labelled at the top of the plot; ``row`` picks the line."""

    x: float
    label: str
    color: str
    row: int = 0
    detail: str = ""
    side: Literal["right", "left"] = "right"


@dataclass(frozen=True)
class _Frame:
    x0: float
    x1: float
    width: int = WIDTH
    height: int = HEIGHT

    @property
    def plot_w(self) -> float:
        return float(self.width - _LEFT - _RIGHT)

    @property
    def bottom(self) -> float:
        return float(self.height - _BOTTOM)

    def px(self, x: float) -> float:
        return _LEFT + (x - self.x0) / (self.x1 - self.x0) * self.plot_w


def nice_ticks(lo: float, hi: float, count: int = 6, *, integer: bool = False) -> list[float]:
    """Round tick values covering [lo, hi] (at most about ``count`` + 1 of them)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi < lo:
        return []
    if hi == lo:
        return [lo]
    # d3's rule: a power of ten times 1, 2, 5 or 10, whichever lands nearest ``count`` ticks.
    raw = (hi - lo) / max(count, 1)
    step = 10.0 ** math.floor(math.log10(raw))
    error = raw / step
    if error >= math.sqrt(50):
        step *= 10
    elif error >= math.sqrt(10):
        step *= 5
    elif error >= math.sqrt(2):
        step *= 2
    if integer:
        step = max(1.0, math.ceil(step))
    first = math.ceil(lo / step - 1e-9)
    last = math.floor(hi / step + 1e-9)
    return [_clean(i * step) for i in range(first, last + 1)]


def step_domain(steps: Sequence[float]) -> tuple[float, float]:
    """An x domain for optimizer steps: half a step of room at each end."""
    finite = [s for s in steps if math.isfinite(s)]
    if not finite:
        return (0.5, 1.5)
    return (min(finite) - 0.5, max(finite) + 0.5)


def fmt(value: float) -> str:
    """A short, exact-enough rendering of a number for labels and tables."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    if value == 0:
        return "0"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


def line_chart(
    *,
    title: str,
    series: Sequence[Series],
    x_axis: XAxis,
    y_label: str,
    chart_id: str,
    empty_text: str = "no data",
) -> str:
    """A line chart with a legend, ticked axes and vertical markers."""
    frame = _Frame(*x_axis.domain)
    ys = [y for s in series for _, y in s.points if math.isfinite(y)]
    parts = [_open(chart_id, title, frame)]
    if not ys:
        parts += _x_axis(frame, x_axis.label)
        parts.append(_center_text(frame, empty_text))
        parts += _markers(frame, x_axis.markers)
        parts.append("</svg>")
        return "".join(parts)

    lo, hi = min(ys), max(ys)
    if hi == lo:
        pad = abs(hi) * 0.05 or 1.0
        lo, hi = lo - pad, hi + pad
    ticks = nice_ticks(lo, hi, 5)
    if len(ticks) > 1:  # let the axis start and end on a labelled tick
        step = ticks[1] - ticks[0]
        if ticks[0] > lo:
            ticks.insert(0, _clean(ticks[0] - step))
        if ticks[-1] < hi:
            ticks.append(_clean(ticks[-1] + step))
    lo, hi = min(lo, ticks[0]), max(hi, ticks[-1])

    def py(y: float) -> float:
        return frame.bottom - (y - lo) / (hi - lo) * (frame.bottom - _TOP)

    for t in ticks:
        y = py(t)
        parts.append(_y_tick(frame, y, fmt(t)))
    parts += _axes(frame, x_axis, y_label)
    for s in series:
        parts.append(_series_path(frame, s, py))
    parts += _legend(frame, series)
    parts.append("</svg>")
    return "".join(parts)


def delta_chart(
    *,
    title: str,
    points: Sequence[tuple[float, float]],
    x_axis: XAxis,
    y_label: str,
    chart_id: str,
) -> str:
    """Per-step non-negative differences: log scale above a row for exact zeros.

    Zeros sit on their own row (log(0) does not exist, and "exactly equal" is the answer
    most runs should give); NaN and infinite differences get a row at the top.
    """
    frame = _Frame(*x_axis.domain)
    positive = [v for _, v in points if math.isfinite(v) and v > 0]
    has_nonfinite = any(not math.isfinite(v) for _, v in points)
    zero_row = frame.bottom - 12.0
    log_bottom = frame.bottom - 28.0
    nonfinite_row = _TOP + 8.0
    log_top = _TOP + (24.0 if has_nonfinite else 4.0)

    parts = [_open(chart_id, title, frame)]
    parts.append(
        f'<line x1="{_LEFT}" y1="{log_bottom + 6:.1f}" x2="{frame.width - _RIGHT}" '
        f'y2="{log_bottom + 6:.1f}" stroke="{_AXIS}" stroke-dasharray="2 3"/>'
        f'<text x="{_LEFT - 6}" y="{zero_row + 4:.1f}" text-anchor="end" {_FONT} '
        f'fill="#1a7f37">0 (exact)</text>'
    )
    if has_nonfinite:
        parts.append(
            f'<text x="{_LEFT - 6}" y="{nonfinite_row + 4:.1f}" text-anchor="end" {_FONT} '
            f'fill="#82071e">NaN / ∞</text>'
        )

    d0, d1 = _decades(positive)
    if positive:
        stride = max(1, math.ceil((d1 - d0) / 6))
        for d in range(d0, d1 + 1, stride):
            y = log_bottom - (d - d0) / (d1 - d0) * (log_bottom - log_top)
            parts.append(_y_tick(frame, y, f"1e{d}"))
    elif points and not has_nonfinite:
        parts.append(_center_text(frame, "every compared step: |Δ| is exactly 0", fill="#1a7f37"))
    elif not points:
        parts.append(_center_text(frame, "no steps compared"))

    parts += _axes(frame, x_axis, y_label)

    rows = {"zero": zero_row, "nonfinite": nonfinite_row, "bottom": log_bottom, "top": log_top}
    parts += [_delta_point(frame, x, v, y_label, rows, d0, d1) for x, v in points]
    parts.append("</svg>")
    return "".join(parts)


def _decades(positive: Sequence[float]) -> tuple[int, int]:
    """The powers of ten the log scale spans (at least one decade; 0, 0 without values)."""
    if not positive:
        return 0, 0
    d0 = math.floor(math.log10(min(positive)))
    d1 = math.ceil(math.log10(max(positive)))
    return d0, d1 + 1 if d1 == d0 else d1


def _delta_point(frame: _Frame, x: float, v: float, y_label: str, rows: dict[str, float],
                 d0: int, d1: int) -> str:
    """One step's difference: on the zero row, the NaN row, or a stem on the log scale."""
    cx, stem = frame.px(x), ""
    if not math.isfinite(v):
        cy, color = rows["nonfinite"], "#82071e"
    elif v == 0:
        cy, color = rows["zero"], "#1a7f37"
    else:
        bottom, top = rows["bottom"], rows["top"]
        cy = bottom - (math.log10(v) - d0) / (d1 - d0) * (bottom - top)
        color = "#cf222e"
        stem = (f'<line x1="{cx:.1f}" y1="{bottom + 6:.1f}" x2="{cx:.1f}" y2="{cy:.1f}" '
                f'stroke="{color}" stroke-width="1.5"/>')
    return (f'{stem}<circle class="delta" cx="{cx:.1f}" cy="{cy:.1f}" r="3" fill="{color}">'
            f"<title>step {escape(fmt(x))}: {escape(y_label)} = {escape(fmt(v))}</title>"
            "</circle>")


def _open(chart_id: str, title: str, frame: _Frame) -> str:
    cid = escape(chart_id)
    return (
        f'<svg xmlns="{SVG_NS}" id="{cid}" role="img" aria-labelledby="{cid}-title" '
        f'viewBox="0 0 {frame.width} {frame.height}" width="100%" '
        f'style="max-width:{frame.width}px">'
        f'<title id="{cid}-title">{escape(title)}</title>'
        f'<rect x="0" y="0" width="{frame.width}" height="{frame.height}" fill="#ffffff"/>'
    )


def _x_axis(frame: _Frame, label: str) -> list[str]:
    bottom = frame.bottom
    parts = [
        f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{bottom}" stroke="{_AXIS}"/>'
        f'<line x1="{_LEFT}" y1="{bottom}" x2="{frame.width - _RIGHT}" y2="{bottom}" '
        f'stroke="{_AXIS}"/>'
    ]
    lo, hi = math.ceil(frame.x0), math.floor(frame.x1)
    for t in nice_ticks(lo, hi, 10, integer=True):
        x = frame.px(t)
        parts.append(
            f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 5}" stroke="{_AXIS}"/>'
            f'<text x="{x:.1f}" y="{bottom + 18}" text-anchor="middle" {_FONT} '
            f'fill="{_AXIS}">{escape(fmt(t))}</text>'
        )
    parts.append(
        f'<text x="{_LEFT + frame.plot_w / 2:.1f}" y="{frame.height - 8}" text-anchor="middle" '
        f'{_FONT} fill="#24292f">{escape(label)}</text>'
    )
    return parts


def _axes(frame: _Frame, x_axis: XAxis, y_label: str) -> list[str]:
    """Both axes' lines and labels, the x ticks and the markers."""
    return [*_x_axis(frame, x_axis.label), _y_label(frame, y_label),
            *_markers(frame, x_axis.markers)]


def _y_tick(frame: _Frame, y: float, label: str) -> str:
    """A grid line across the plot at ``y``, labelled left of the axis."""
    return (
        f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{frame.width - _RIGHT}" y2="{y:.1f}" '
        f'stroke="{_GRID}"/>'
        f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" {_FONT} '
        f'fill="{_AXIS}">{escape(label)}</text>'
    )


def _y_label(frame: _Frame, label: str) -> str:
    cy = (_TOP + frame.bottom) / 2
    return (
        f'<text x="16" y="{cy:.1f}" transform="rotate(-90 16 {cy:.1f})" text-anchor="middle" '
        f'{_FONT} fill="#24292f">{escape(label)}</text>'
    )


def _center_text(frame: _Frame, text: str, fill: str = _AXIS) -> str:
    return (
        f'<text x="{_LEFT + frame.plot_w / 2:.1f}" y="{(_TOP + frame.bottom) / 2:.1f}" '
        f'text-anchor="middle" font-family="system-ui, sans-serif" font-size="14" '
        f'fill="{fill}">{escape(text)}</text>'
    )


def _markers(frame: _Frame, markers: Sequence[Marker]) -> list[str]:
    parts: list[str] = []
    right_edge = frame.width - _RIGHT
    for m in markers:
        if not frame.x0 <= m.x <= frame.x1:
            continue
        x = frame.px(m.x)
        text_w = len(m.label) * _CHAR_PX
        # Labels go on their preferred side of the line, or the other when they would
        # overflow the plot there.
        fits_right = x + 4 + text_w <= right_edge
        fits_left = x - 4 - text_w >= _LEFT
        if (m.side == "right" and fits_right) or (m.side == "left" and not fits_left):
            tx, anchor = min(x + 4, right_edge - text_w), "start"
        else:
            tx, anchor = max(x - 4, _LEFT + text_w), "end"
        ty = _TOP + 12 + 14 * m.row
        tooltip = f"<title>{escape(m.detail)}</title>" if m.detail else ""
        parts.append(
            f'<g class="marker">{tooltip}'
            f'<line x1="{x:.1f}" y1="{_TOP}" x2="{x:.1f}" y2="{frame.bottom}" '
            f'stroke="{m.color}" stroke-width="1.5" stroke-dasharray="4 3"/>'
            f'<text x="{tx:.1f}" y="{ty:.1f}" text-anchor="{anchor}" {_FONT} {_HALO} '
            f'font-weight="600" fill="{m.color}">{escape(m.label)}</text></g>'
        )
    return parts


def _series_path(frame: _Frame, s: Series, py: Callable[[float], float]) -> str:
    commands: list[str] = []
    dots: list[str] = []
    pen_down = False
    for x, y in s.points:
        if not math.isfinite(y):
            pen_down = False
            continue
        cmd = "L" if pen_down else "M"
        commands.append(f"{cmd}{frame.px(x):.1f},{py(y):.1f}")
        pen_down = True
        if len(s.points) <= 80:
            dots.append(
                f'<circle cx="{frame.px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{s.color}">'
                f"<title>{escape(s.name)} step {escape(fmt(x))}: {escape(fmt(y))}</title>"
                "</circle>"
            )
    name = escape(s.name)
    return (
        f'<g class="leg-{name}"><path class="series series-{name}" d="{" ".join(commands)}" '
        f'fill="none" {_pen(s)} stroke-linejoin="round"/>{"".join(dots)}</g>'
    )


def _pen(s: Series) -> str:
    """How ``s``'s line is drawn, in its path and in its legend alike."""
    dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
    return f'stroke="{s.color}" stroke-width="{s.width}"{dash}'


def _legend(frame: _Frame, series: Sequence[Series]) -> list[str]:
    parts: list[str] = []
    x = frame.width - _RIGHT - sum(40 + len(s.name) * _CHAR_PX + 16 for s in series)
    for s in series:
        parts.append(
            f'<line x1="{x:.1f}" y1="{_TOP - 18}" x2="{x + 32:.1f}" y2="{_TOP - 18}" {_pen(s)}/>'
            f'<text x="{x + 38:.1f}" y="{_TOP - 14}" {_FONT} fill="#24292f">'
            f"{escape(s.name)}</text>"
        )
        x += 40 + len(s.name) * _CHAR_PX + 16
    return parts


def _clean(value: float) -> float:
    """Drop floating-point dust from tick arithmetic (0.30000000000000004 -> 0.3)."""
    return float(f"{value:.12g}")

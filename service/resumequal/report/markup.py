"""HTML pieces more than one section of ``report.html`` lays out: check lists, empty cells,
number cells, values, durations and times.

Every piece of text is escaped here; callers pass the report's text as it is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from datetime import UTC, datetime
from html import escape
from typing import Any

from resumequal.report import svg


def check_items(checks: Iterable[tuple[bool, str, str]]) -> str:
    """One ``<li>`` per (ok, name, detail): ✓ or ✗, the name in bold, then the detail."""
    return "".join(
        f'<li class="{"ok" if ok else "bad"}">{"✓" if ok else "✗"} '
        f"<strong>{escape(name)}</strong> — <span>{escape(detail)}</span></li>"
        for ok, name, detail in checks
    )


def opt(value: int | None) -> str:
    """``value``, or a dash where there is none."""
    return "—" if value is None else str(value)


def num_td(value: float) -> str:
    """A number cell, green where the value is zero and red elsewhere."""
    cls = "num ok" if value == 0 else "num bad"
    return f"<td class='{cls}'>{escape(svg.fmt(value))}</td>"


def value_text(value: Any) -> str:
    """A string as it is; anything else as sorted JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def seconds_text(value: float | None) -> str:
    """A duration in seconds (minutes from two on), or a dash where there is none."""
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:.1f} s" if value < 120 else f"{value / 60:.1f} min"


def utc_text(ts: float | None) -> str:
    """A unix time as UTC date and time, or a dash where there is none."""
    if ts is None or not math.isfinite(ts):
        return "—"
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")

"""HTML pieces more than one section of ``report.html`` lays out: check lists, empty cells.

Every piece of text is escaped here; callers pass the report's text as it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from html import escape


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

"""``bisect.html``: the result as one self-contained page (no script, no network).

A plot of the probes in inline SVG: one column per probe in the order they ran; in changes
mode one row per change, a filled cell where the probe took the bad pin's version; in
ordered mode one row per pin, a cell where the probe qualified that pin. Under each column
the probe's outcome: green as the good pin, red as the bad pin, grey unresolved. Then a
table of every probe. Every piece of text is escaped.
"""

from __future__ import annotations

from html import escape

from resumequal.bisect.result import BisectResult, PinChange, Probe

COLOURS = {"same": "#2e7d32", "flip": "#c62828", "unresolved": "#9e9e9e"}
CELL, LABEL_W, TOP = 22, 260, 30
_CSS = """body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ccc;padding:.3em .5em;
vertical-align:top;text-align:left}.same{color:#2e7d32}.flip{color:#c62828}
.unresolved{color:#757575}code{font-size:.9em}.banner{font-size:1.2em;padding:.5em;
border-left:.4em solid #888}"""


def render(result: BisectResult) -> str:
    """The page."""
    culprits = "".join(f"<li><code>{escape(c.label)}</code></li>" for c in result.culprits)
    colour = {"flip": "#c62828", "no-flip": "#2e7d32"}.get(result.conclusion, "#757575")
    facts = [("mode", result.mode), ("pins", ", ".join(result.pins)),
             ("assumed", ", ".join(result.assumed) or "none: both ends qualified"),
             ("spec", result.spec or "the defaults"), ("--set", " ".join(result.sets) or "—"),
             ("packages alike", str(result.common_packages) + (
                 "" if result.common_build_seconds is None
                 else f" (their layer built or found in {result.common_build_seconds:.1f} s)")),
             ("probes", f"{len(result.probes)} ({result.qualifications} qualifications, "
                        f"{result.unresolvable} unresolvable)"),
             ("took", f"{result.seconds:.0f} s, from {result.started}")]
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in facts)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>resumequal bisect: "
            f"{escape(result.conclusion)}</title><style>{_CSS}</style></head><body>"
            f"<h1>resumequal bisect</h1><p class='banner' style='border-color:{colour}'>"
            f"<strong>{escape(result.conclusion.upper())}</strong> — "
            f"{escape(result.summary)}</p>"
            + (f"<h2>Culprits</h2><ul>{culprits}</ul>" if culprits else "")
            + f"<table>{rows}</table><h2>Probes</h2>{plot(result)}{_table(result.probes)}"
            "</body></html>\n")


def plot(result: BisectResult) -> str:
    """The probes as an SVG grid: rows are changes (or pins), columns probes."""
    if result.mode == "ordered":
        labels = [p.rsplit("/", 1)[-1] for p in result.pins]
        marks = [{p.pin_index} if p.pin_index is not None else set() for p in result.probes]
        rows = list(range(len(labels)))
    else:
        labels = [c.label for c in _all_changes(result)]
        names = [c.package for c in _all_changes(result)]
        marks = [{names.index(n) for n in p.applied if n in names} if p.role != "bad"
                 else set(range(len(names))) for p in result.probes]
        rows = list(range(len(labels)))
    width = LABEL_W + CELL * max(len(result.probes), 1) + 10
    height = TOP + CELL * (len(rows) + 1) + 10
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
           "role='img' aria-label='probes'>"]
    for j, probe in enumerate(result.probes):
        x = LABEL_W + CELL * j
        out.append(f"<text x='{x + CELL / 2}' y='{TOP - 8}' font-size='11' "
                   f"text-anchor='middle'>{probe.number}</text>")
        for i in rows:
            fill = "#455a64" if i in marks[j] else "#eceff1"
            out.append(f"<rect x='{x + 1}' y='{TOP + CELL * i + 1}' width='{CELL - 2}' "
                       f"height='{CELL - 2}' fill='{fill}'><title>{escape(probe.label)}"
                       "</title></rect>")
        y = TOP + CELL * len(rows) + 1
        out.append(f"<rect x='{x + 1}' y='{y}' width='{CELL - 2}' height='{CELL - 2}' "
                   f"fill='{COLOURS[probe.outcome]}'><title>{escape(probe.why)}</title></rect>")
    for i, label in enumerate(labels):
        out.append(f"<text x='{LABEL_W - 6}' y='{TOP + CELL * i + 15}' font-size='12' "
                   f"text-anchor='end'>{escape(label[:40])}</text>")
    out.append(f"<text x='{LABEL_W - 6}' y='{TOP + CELL * len(rows) + 15}' font-size='12' "
               "text-anchor='end' font-weight='bold'>outcome</text></svg>")
    return "".join(out)


def _all_changes(result: BisectResult) -> list[PinChange]:
    return list(result.changes)


def _table(probes: list[Probe]) -> str:
    head = ("<tr><th>#</th><th>probe</th><th>venv or run</th><th>outcome</th><th>verdict, first "
            "divergence</th><th>time</th></tr>")
    body = []
    for p in probes:
        verdicts = "<br>".join(
            escape(f"{a.result or 'no verdict'}"
                   + (f" at step {a.first_divergence.step}, {a.first_divergence.boundary}, "
                      f"rank {a.first_divergence.rank}" if a.first_divergence else "")
                   + f" ({a.seconds:.0f} s) — {a.reason[:200]}") for a in p.attempts)
        env = _where(p)
        body.append(f"<tr><td>{p.number}</td><td>{escape(p.role)}: {escape(p.label)}</td>"
                    f"<td>{env}</td><td class='{p.outcome}'>{escape(p.outcome)} — "
                    f"{escape(p.why)}</td><td>{verdicts or '—'}</td>"
                    f"<td>{p.seconds:.0f} s</td></tr>")
    return f"<table>{head}{''.join(body)}</table>"


def _where(p: Probe) -> str:
    """The probe's venv, or the QualificationRuns of its attempts."""
    if p.env is not None:
        return (f"<code>{escape(p.env.key)}</code> {'reused' if p.env.reused else 'built'} in "
                f"{p.env.build_seconds:.1f} s")
    runs = [a.run for a in p.attempts if a.run is not None]
    return "<br>".join(f"<code>{escape(r.namespace)}/{escape(r.name)}</code>"
                       + (" (deleted)" if r.deleted else "") for r in runs) or "—"


__all__ = ["plot", "render"]

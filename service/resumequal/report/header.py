"""The verdict header at the top of ``report.html``: the badge, the reason and the facts
of the run (cut, resume, restart, launcher, how far it was exact, controls, seed matrix).

Every piece of text from the report is escaped.
"""

from __future__ import annotations

from html import escape

from resumequal.report.divergence import FIRST_DIVERGENCE_ID, divergence_box
from resumequal.report.markup import seconds_text
from resumequal.results.verdict import Matrix, Report, Verdict
from resumequal.words import count

# One fact of the header: its label and its value, already escaped HTML.
_Fact = tuple[str, str]


def verdict_header(report: Report, color: str, resume_step: int | None) -> str:
    """The header: the result badge, the reason, the run's facts and the first divergence."""
    v = report.verdict
    facts = [*_run_facts(report, resume_step),
             *_divergence_fact(v), *_controls_fact(v), *_matrix_fact(report.matrix)]
    rows = "".join(f"<dt>{k}</dt><dd>{val}</dd>" for k, val in facts)
    return (
        f'<header class="verdict" style="--vc:{color}">'
        f'<span class="badge">{escape(v.result.value)}</span>'
        f'<p class="reason">{escape(v.reason)}</p><dl class="facts">{rows}</dl>'
        f"{divergence_box(v)}</header>"
    )


def _run_facts(report: Report, resume_step: int | None) -> list[_Fact]:
    """What every run has: where it was cut, what it resumed from, how far it was exact."""
    v = report.verdict
    cut = v.cut
    return [
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
        ("restart", escape(seconds_text(report.restart_seconds) + " (kill → first resumed step)")),
        ("launcher", escape(_launcher_words(report.launcher))
         + "".join(f'<br><span class="bad">{escape(c)}</span>' for c in report.caveats)),
        *([("optimizer", escape(report.built.words()))] if report.built is not None else []),
        *([("report", f'<span class="bad">incomplete: {escape(report.incomplete)}</span>')]
          if report.incomplete is not None else []),
        ("exact through step", escape(str(v.exact_through_step))),
        ("compared", escape(f"{count(v.steps_compared, 'step')} on "
                            f"{count(v.ranks_compared, 'rank')}")),
    ]


def _divergence_fact(v: Verdict) -> list[_Fact]:
    """A link to the first divergence, where there is one."""
    d = v.first_divergence
    if d is None:
        return []
    where = f"step {d.step} · {d.boundary} · rank {d.rank} ({d.when_words()})"
    return [("first divergence", f'<a href="#{FIRST_DIVERGENCE_ID}">{escape(where)}</a>')]


def _controls_fact(v: Verdict) -> list[_Fact]:
    """The negative controls counted, naming the omissions the comparator is blind to."""
    if not v.controls:
        return []
    blind = [c.omission for c in v.controls if c.status == "blind"]
    warning = (f' <span class="bad">— comparator blind to {escape(", ".join(blind))}</span>'
               if blind else "")
    return [("negative controls",
             f'<a href="#controls">{escape(v.control_counts.words())}</a>{warning}')]


def _matrix_fact(m: Matrix | None) -> list[_Fact]:
    """How many cells of the seed matrix were exact, where one was run."""
    if m is None or not m.summary:
        return []
    exact = sum(row.exact for row in m.summary)
    total = sum(row.total for row in m.summary)
    return [("seed matrix",
             f'<a href="#matrix">{escape(f"{exact}/{total} exact")}</a>'
             + escape(f" ({len(m.scenarios)} scenarios x {len(m.seeds)} seeds)"))]


def _launcher_words(launcher: str) -> str:
    """The launcher, with how it started the workers."""
    how = {"torchrun": "stock torchrun: every worker a fresh interpreter",
           "forked": "workers forked from one warm process"}
    return f"{launcher} ({how[launcher]})" if launcher in how else launcher

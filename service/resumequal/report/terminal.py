"""The terminal: a compact verdict summary, and a live progress display while legs run.

Both degrade for CI logs: rich drops colour when the console is not a terminal, and
:class:`ProgressDisplay` prints plain, throttled lines instead of redrawing a live display.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table
from rich.text import Text

from resumequal.redact import printable, printable_tree
from resumequal.report.resize import resize_lines
from resumequal.results.verdict import Matrix, MatrixCell, Report, Result, Verdict
from resumequal.spec import REFERENCE_LEG
from resumequal.spec.boundaries import BOUNDARIES

VERDICT_STYLES: dict[Result, str] = {
    Result.PASS: "bold white on green",
    Result.FAIL: "bold white on red",
    Result.NONDETERMINISTIC: "bold black on dark_orange",
    Result.INVALID: "bold white on grey50",
}
_BORDER: dict[Result, str] = {
    Result.PASS: "green",
    Result.FAIL: "red",
    Result.NONDETERMINISTIC: "dark_orange",
    Result.INVALID: "grey50",
}


def print_summary(
    report: Report, console: Console, *, files: Mapping[str, Path | str] | None = None
) -> None:
    """Print the verdict, the reason, where it diverged, drift, failing checks and files.

    The report's text comes from the store (reasons, names, keys): none of its control
    characters reach the terminal (:func:`~resumequal.redact.printable`)."""
    report = Report.model_validate(printable_tree(report.model_dump()))
    files = {printable(k): printable(str(p)) for k, p in (files or {}).items()}
    v = report.verdict
    lines: list[RenderableType] = [
        Text.assemble((f" {v.result.value} ", VERDICT_STYLES[v.result]), "  ", v.reason),
        _facts(report),
    ]
    if v.resize is not None:
        lines.append(_resize_lines(v))
    if v.controls:
        lines.append(_controls_line(v))
    if report.matrix is not None:
        lines.append(_matrix_table(report.matrix))
    failing = [c for c in v.checks if not c.ok]
    if failing:
        checks = Table.grid(padding=(0, 1))
        for c in failing:
            checks.add_row(Text("✗", style="red"), Text(c.name, style="bold"), Text(c.detail))
        lines += [Text("failing checks", style="bold red"), checks]
    if files:
        paths = Table.grid(padding=(0, 2))
        paths.add_column(style="dim")
        for name, path in files.items():
            # Folded, never cut with an ellipsis: people copy these.
            paths.add_row(Text(name), Text(str(path), overflow="fold"))
        lines.append(paths)
    console.print(Panel(Group(*lines), title=Text(f"resumequal · {report.run}"),
                        subtitle=Text(report.pin), border_style=_BORDER[v.result], expand=True))


def _facts(report: Report) -> Table:
    """The cut, the resume, how far it was exact, the first divergence and the drift."""
    v = report.verdict
    # Every string from the report is wrapped in Text: rich would read "[...]" as markup.
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="dim")
    facts.add_column()

    def fact(label: str, value: str | Text) -> None:
        facts.add_row(label, Text(value) if isinstance(value, str) else value)

    cut = v.cut
    fact("cut", f"step {cut.step}, microbatch {cut.microstep}, rank {cut.rank} ({cut.mode} kill)")
    fact("resumed from", v.resumed_from or "-")
    if report.restart_seconds is not None:
        fact("restart", f"{report.restart_seconds:.1f} s")
    fact("launcher", report.launcher if not report.caveats else
         Text(f"{report.launcher} (cannot see what a fresh process changes: see the report)",
              style="yellow"))
    if report.built is not None:
        fact("optimizer", report.built.words())
    if report.incomplete is not None:
        fact("report", Text(f"incomplete: {report.incomplete}", style="yellow"))
    fact("exact through", f"step {v.exact_through_step}")
    skipped = _not_compared(v)
    if skipped:
        fact("not compared", Text(", ".join(skipped), style="yellow"))
    if v.first_divergence is not None:
        d = v.first_divergence
        fact("first divergence", Text(f"step {d.step} · {d.boundary} · rank {d.rank} "
                                      f"({d.when_words()})", style="bold red"))
        fact("", f"control {_short(d.control)}  vs  preempted {_short(d.preempted)}")
        if d.tensors is not None:
            t = d.tensors
            busiest = sorted((m for m in t.modules if m.differ), key=lambda m: -m.differ)[:3]
            where = ", ".join(f"{m.module} {m.differ}/{m.total}" for m in busiest)
            fact("", f"{d.tensor_words()}; by module: {where or 'none'}")
        if d.step_tensors:
            fact("", "this step: " + ", ".join(
                f"{b} {t.differ}/{t.total}" for b, t in d.step_tensors.items()))
        if d.buckets is not None:
            fact("", "DDP buckets: " + ", ".join(
                f"{leg} {len(b)}" for leg, b in d.buckets.items()))
        if d.cause is not None:
            fact("cause", d.cause)
        if d.fix is not None:
            fact("fix", d.fix)
    if report.zoom is not None:
        fact("zoom", Text(report.zoom.summary, style="bold"))
    if v.loss_deltas:
        worst = max(v.loss_deltas, key=lambda s: _sort_key(s.abs_diff))
        fact("max |Δ loss|", f"{worst.abs_diff:.6g} (step {worst.step})")
    for g in v.drift:
        fact(f"{g.group} drift", f"max |a-b| {g.max_abs_diff:.3g}  rel L2 {g.rel_l2:.3g}  "
                                 f"mismatch {g.mismatch_fraction:.3g}")
    return facts


def _resize_lines(v: Verdict) -> Table:
    """``resize 2 → 1 → 2 ranks``, then one line per part: ✓ or ✗, its name, its detail."""
    assert v.resize is not None
    parts = Table.grid(padding=(0, 1))
    worlds = " → ".join(str(w) for w in v.resize.world_sizes)
    parts.add_row(Text(""), Text("resize", style="bold"), Text(f"{worlds} ranks"))
    for ok, label, detail in resize_lines(v.resize):
        parts.add_row(Text("✓", style="green") if ok else Text("✗", style="red"),
                      Text(label, style="bold" if ok else "bold red"), Text(detail))
    return parts


def _controls_line(v: Verdict) -> Text:
    """How many controls were detected (as the HTML says it), then the blind (red) and
    invalid (orange) omissions."""
    counts = v.control_counts
    line = Text(counts.words(), style="green" if counts.all_detected else "bold")
    for status, style in (("blind", "bold red"), ("invalid", "dark_orange")):
        names = [c.omission for c in v.controls if c.status == status]
        if names:
            line.append(f"  {status}: {', '.join(names)}", style=style)
    return line


def _matrix_table(m: Matrix) -> Table:
    """Scenario x seed: ``exact``, or the first divergent ``step·boundary``; exact/total."""
    scenarios = list(dict.fromkeys([*m.scenarios, *(c.scenario for c in m.cells)]))
    seeds = list(dict.fromkeys([*m.seeds, *(c.seed for c in m.cells)]))
    cells = {(c.scenario, c.seed): c for c in m.cells}
    summary = {row.scenario: row for row in m.summary}
    table = Table(
        title="seed matrix", title_justify="left", box=None, padding=(0, 1), show_edge=False
    )
    table.add_column("scenario", style="bold", no_wrap=True)
    for seed in seeds:
        table.add_column(f"seed {seed}", justify="center")
    table.add_column("exact/total", justify="right", no_wrap=True)
    for scenario in scenarios:
        row = summary.get(scenario)
        if row is None:
            total = Text("-", style="dim")
        else:
            style = "green" if row.exact == row.total else "red"
            total = Text(f"{row.exact}/{row.total}", style=style)
        table.add_row(
            Text(scenario),
            *(_matrix_cell(cells.get((scenario, seed))) for seed in seeds),
            total,
        )
    return table


def _matrix_cell(cell: MatrixCell | None) -> Text:
    if cell is None:
        return Text("-", style="dim")
    where = None
    if cell.first_divergent_step is not None:
        where = f"{cell.first_divergent_step}"
        if cell.first_divergent_boundary:
            where += f"·{cell.first_divergent_boundary}"
    if cell.result is Result.PASS:
        return Text("exact", style="green") if where is None else Text(f"≈{where}", "yellow")
    if cell.result is Result.INVALID:
        return Text("INVALID", style="grey50")
    if cell.result is Result.NONDETERMINISTIC:
        return Text(where or "NONDET", style="dark_orange")
    return Text(where or "FAIL", style="bold red")


def _not_compared(v: Verdict) -> list[str]:
    seen = {b for row in v.boundary_table for b, s in row.status.items() if s == "not_compared"}
    return [b for b in BOUNDARIES if b in seen]


class ProgressDisplay:
    """Phase, steps done per leg and restarts, while a qualification runs.

    On a terminal it is a live display; otherwise (CI logs, files) it prints one plain
    line when the phase or the restart count changes, when a leg finishes, and at most
    every ``interval`` seconds in between. Use as a context manager.
    """

    def __init__(
        self,
        console: Console,
        *,
        legs: tuple[str, ...] = (REFERENCE_LEG, "preempted"),
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.legs = legs
        self.interval = interval
        self._clock = clock
        self._live_mode = console.is_terminal and not console.is_dumb_terminal
        self._phase = "Pending"
        self._restarts = 0
        self._steps: dict[str, int] = dict.fromkeys(legs, 0)
        self._total = 0
        self._last_line = ""
        self._last_at = -math.inf
        self._progress = Progress(
            TextColumn("{task.description:>10}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=console,
        )
        self._tasks: dict[str, TaskID] = {
            leg: self._progress.add_task(leg, total=None) for leg in legs
        }
        self._live: Live | None = None

    def __enter__(self) -> ProgressDisplay:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        if self._live_mode and self._live is None:
            self._live = Live(
                self._render(), console=self.console, refresh_per_second=4, transient=False
            )
            self._live.start()

    def stop(self) -> None:
        if self._live is not None:
            self._live.update(self._render(), refresh=True)
            self._live.stop()
            self._live = None
        elif not self._live_mode:
            self._emit(force=True)

    def update(
        self, phase: str, leg_steps: Mapping[str, int], total_steps: int, restarts: int
    ) -> None:
        """Show the current phase, steps done per leg (of ``total_steps``) and the preempted
        leg's restarts."""
        changed = phase != self._phase or restarts != self._restarts
        finished = any(
            leg_steps.get(leg, 0) >= total_steps > self._steps.get(leg, 0) for leg in self.legs
        )
        self._phase, self._restarts, self._total = phase, restarts, total_steps
        for leg in self.legs:
            self._steps[leg] = leg_steps.get(leg, self._steps[leg])
            self._progress.update(
                self._tasks[leg], completed=self._steps[leg], total=total_steps or None
            )
        if self._live is not None:
            self._live.update(self._render())
        elif not self._live_mode:
            self._emit(force=changed or finished)

    def _render(self) -> RenderableType:
        header = Text.assemble(
            ("phase ", "dim"), (self._phase, "bold"), ("   restarts ", "dim"), str(self._restarts)
        )
        return Group(header, self._progress)

    def _line(self) -> str:
        """The main pair's steps, then the negative controls as a count of legs done: one
        line under 80 columns however many controls run (a CI log wraps nothing)."""
        main, controls = self.legs[:2], self.legs[2:]
        steps = "  ".join(f"{leg} {self._steps[leg]}/{self._total}" for leg in main)
        if controls:
            done = sum(self._steps[leg] >= self._total > 0 for leg in controls)
            steps += f"  controls {done}/{len(controls)} done"
        return f"phase={self._phase}  {steps}  restarts={self._restarts}"

    def _emit(self, *, force: bool) -> None:
        line = self._line()
        now = self._clock()
        if line == self._last_line or not (force or now - self._last_at >= self.interval):
            return
        say(self.console, line)
        self._last_line, self._last_at = line, now


def say(console: Console, line: str) -> None:
    """Print one plain line, never wrapped: in a CI log a line cut at 80 columns is two."""
    console.print(line, markup=False, highlight=False, soft_wrap=True)


def _short(value: object, limit: int = 60) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _sort_key(value: float) -> float:
    return math.inf if math.isnan(value) else value

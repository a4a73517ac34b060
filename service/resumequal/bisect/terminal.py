"""The terminal: a line per probe as it starts and ends, a spinner while it builds and
qualifies (elapsed time on it), and the summary at the end.

On a terminal rich shows the spinner; in a CI log (no terminal) only the lines appear.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.status import Status

from resumequal.bisect.bisection import Listener, describe
from resumequal.bisect.result import Attempt, BisectResult, Probe
from resumequal.redact import printable

STYLES = {"same": "green", "flip": "red", "unresolved": "grey50"}
CONCLUSION_STYLES = {"flip": "bold white on red", "no-flip": "bold white on green",
                     "undecided": "bold white on grey50"}


class TerminalProgress(Listener):
    """Progress of a bisection on ``console``: probe k of at most n, what is being built
    or run, elapsed time."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.started = time.monotonic()
        self.status: Status | None = None
        self.head = ""

    def __enter__(self) -> TerminalProgress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop()

    def _elapsed(self) -> str:
        minutes, seconds = divmod(int(time.monotonic() - self.started), 60)
        return f"{minutes}:{seconds:02d}"

    def _show(self, text: str) -> None:
        line = printable(f"[{self._elapsed()}] {text}")
        if not self.console.is_terminal:
            self.console.print(line, markup=False, highlight=False)
            return
        if self.status is None:
            self.status = self.console.status(line)
            self.status.start()
        else:
            self.status.update(line)

    def _stop(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None

    def probe_starts(self, number: int, limit: int, label: str) -> None:
        self.head = f"probe {number} of ≤ {limit}"
        self._show(f"{self.head}: {label}")

    def qualifying(self, number: int, attempt: int, where: str) -> None:
        again = f" (retry {attempt - 1})" if attempt > 1 else ""
        self._show(f"{self.head}: qualifying{again} {where}")

    def probe_done(self, probe: Probe) -> None:
        self._stop()
        verdict = ", ".join(describe(_signature(a)) for a in probe.attempts) or probe.status
        self.console.print(
            f"[{self._elapsed()}] probe {probe.number} {printable(probe.label)}: "
            f"[{STYLES[probe.outcome]}]{probe.outcome}[/] ({printable(verdict)}; "
            f"{probe.seconds:.0f} s)", highlight=False)


def _signature(attempt: Attempt) -> tuple[str, ...] | None:
    if attempt.result is None:
        return None
    first = attempt.first_divergence
    where = () if first is None else (str(first.step), first.boundary)
    return (attempt.result.value, *where)


def print_result(result: BisectResult, console: Console, files: dict[str, str]) -> None:
    """The conclusion, the culprits, the counts and where the files are."""
    console.print(f"[{CONCLUSION_STYLES[result.conclusion]}] {result.conclusion.upper()} [/] "
                  f"{printable(result.summary)}", highlight=False)
    for culprit in result.culprits:
        console.print(f"  culprit: {printable(culprit.label)}", highlight=False)
    console.print(f"  {len(result.probes)} probes, {result.qualifications} qualifications, "
                  f"{result.unresolvable} unresolvable, {result.seconds:.0f} s", highlight=False)
    for name, where in files.items():
        console.print(f"  {name}: {printable(where)}", highlight=False)


__all__ = ["TerminalProgress", "print_result"]

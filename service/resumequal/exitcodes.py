"""What ``resumequal run``, ``compare``, ``validate``, ``zoom`` and ``bisect`` exit with: one
table for the command line, the runner, the ``--help`` epilogs and docs/exit-codes.md.

A verdict gives 0, 1, 3 or 4; an error gives 2 when the input was wrong (the spec, the
command line, credentials, a location without a run) and 3 otherwise (nothing was judged);
an exception no boundary expected (a bug) gives 70 (sysexits' EX_SOFTWARE), never a
verdict's status. ``bisect`` exits 0 when it names what flips the verdict, and 5 or 6 when
there is nothing to bisect or it cannot decide.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING

from resumequal.errors import ResumequalError, UsageError
from resumequal.spec import SpecError

if TYPE_CHECKING:
    # The verdict's models load where a verdict is made: a worker's entry point (the same
    # CLI) never loads them.
    from resumequal.results.verdict import Result


class ExitCode(IntEnum):
    PASS = 0
    FAIL = 1
    SPEC_ERROR = 2
    INVALID = 3
    NONDETERMINISTIC = 4
    NO_FLIP = 5
    UNDECIDED = 6
    INTERNAL_ERROR = 70
    INTERRUPTED = 130


@dataclass(frozen=True)
class Meaning:
    """What an exit status says, and what a nightly job does about it."""

    says: str
    then: str


MEANINGS: dict[ExitCode, Meaning] = {
    ExitCode.PASS: Meaning(
        "PASS: the resume was exact (or within the declared tolerances)",
        "keep the pin"),
    ExitCode.FAIL: Meaning(
        "FAIL: the resumed leg diverged from the control",
        "block the pin; the report names the first divergence"),
    ExitCode.SPEC_ERROR: Meaning(
        "spec or usage error: the message names what to fix; nothing ran",
        "fix the spec or the job; a retry fails the same way"),
    ExitCode.INVALID: Meaning(
        "INVALID: it ran but could not judge (no kill, a timeout, a store error)",
        "read the reason: retry when it was chance (a timeout, a store that failed); "
        "otherwise fix what it names: When INVALID is not chance, docs/exit-codes.md"),
    ExitCode.NONDETERMINISTIC: Meaning(
        "NONDETERMINISTIC: the legs differed before the kill",
        "block the pin until training is reproducible run to run"),
    ExitCode.NO_FLIP: Meaning(
        "bisect, no flip: the bad pin ends as the good one; nothing to bisect",
        "nothing to block: the pins agree (a FAIL in both is no change's doing)"),
    ExitCode.UNDECIDED: Meaning(
        "bisect, undecided: an end or the probes that would decide were not judged "
        "(unresolvable, INVALID, NONDETERMINISTIC, no verdict) or the probe budget ran out",
        "read bisect.json's probes: retry with more --retries or --max-probes, or bisect "
        "the smaller set it names"),
    ExitCode.INTERNAL_ERROR: Meaning(
        "internal error: a bug in resumequal (the message says so, with its traceback); "
        "nothing was judged",
        "report the bug with its output; a retry may fail the same way"),
    ExitCode.INTERRUPTED: Meaning(
        "interrupted (SIGINT or SIGTERM); every process it started was stopped",
        "retry"),
}

def for_result(result: Result) -> ExitCode:
    """The exit status of a verdict (each result has the status of its name)."""
    return ExitCode[result.value]


def for_error(error: ResumequalError) -> ExitCode:
    """SPEC_ERROR when what the command was given is wrong, else INVALID (nothing judged)."""
    # Imported here: the store package loads botocore, which only an error needs.
    from resumequal.store.errors import StoreAccessDenied, StoreConfigError, StoreNotFound

    given = (SpecError, UsageError, StoreNotFound, StoreAccessDenied, StoreConfigError)
    return ExitCode.SPEC_ERROR if isinstance(error, given) else ExitCode.INVALID


def epilog(*codes: ExitCode, says: Mapping[ExitCode, str] | None = None) -> str:
    """The ``--help`` epilog listing ``codes``, ``says`` overriding what some mean for a
    command without a verdict (click keeps a ``\\b`` paragraph as it is)."""
    words = {**{code: MEANINGS[code].says for code in codes}, **(says or {})}
    rows = [f"  {int(code):>3}  {words[code]}" for code in codes]
    return "\b\nExit status:\n" + "\n".join(rows)


__all__ = ["MEANINGS", "ExitCode", "Meaning", "epilog", "for_error", "for_result"]

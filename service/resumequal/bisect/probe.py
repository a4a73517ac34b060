"""One qualification in a probe venv: ``python -m resumequal run``, its verdict read back.

The probe runs in a process of its own with the venv's interpreter, in its run folder (not
the caller's working directory, whose packages could shadow the venv's), and without this
process's ``PYTHONPATH``. What the qualification wrote, its ``verdict.json``, is the
probe's answer; a qualification that wrote none (a spec the probe's packages cannot run,
a crash) has an exit status and the last error line of its log. :class:`Qualified` is what
any probe runner answers (this one, or a QualificationRun on a cluster).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from resumequal.bisect.result import FirstDivergence, RunRef
from resumequal.results.verdict import Result, Verdict

log = logging.getLogger(__name__)

STOP_GRACE_S = 120.0  # after SIGINT, the runner stops every process it started


@dataclass(frozen=True)
class Qualified:
    """One qualification's outcome: its result when it reached one, else ``error``.
    ``where`` is what to open: a run folder, or a QualificationRun's run location."""

    exit_code: int
    seconds: float
    where: str
    result: Result | None
    reason: str = ""
    first: FirstDivergence | None = None
    error: str = ""
    run: RunRef | None = None  # on a cluster

    @classmethod
    def of(cls, verdict: Verdict | None, *, exit_code: int, seconds: float, where: str,
           error: str = "") -> Qualified:
        """From a ``verdict.json`` (None: the qualification wrote none)."""
        if verdict is None:
            return cls(exit_code, seconds, where, None, error=error)
        d = verdict.first_divergence
        first = None if d is None else FirstDivergence(step=d.step, boundary=d.boundary,
                                                       rank=d.rank)
        return cls(exit_code, seconds, where, verdict.result, verdict.reason, first, error)

    @property
    def signature(self) -> tuple[str, ...] | None:
        """What two qualifications must share to count as ending alike: the result, and
        for a divergence its step and boundary (not its rank or value, which move with
        the numbers rather than with the cause)."""
        if self.result is None:
            return None
        where = () if self.first is None else (str(self.first.step), self.first.boundary)
        return (self.result.value, *where)


def qualify(python: Path, run_dir: Path, *, spec: Path | None, sets: Sequence[str],
            pin: str, timeout_s: float) -> Qualified:
    """``python -m resumequal run`` into ``run_dir`` (which must not exist yet), its output
    in ``run_dir.parent / (run_dir.name + ".log")``."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log_path = run_dir.with_name(run_dir.name + ".log")
    args = ["--run-dir", str(run_dir), "--pin", pin, *(["--spec", str(spec)] if spec else []),
            *(a for s in sets for a in ("--set", s))]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("COLUMNS", "100")
    started = time.monotonic()
    with log_path.open("w") as out:
        proc = subprocess.Popen([str(python), "-m", "resumequal", "run", *args], stdout=out,
                                stderr=subprocess.STDOUT, cwd=run_dir.parent, env=env)
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            code = _stop(proc)
        except BaseException:
            _stop(proc)  # Ctrl-C: stop the qualification (and its legs) before leaving
            raise
    seconds = time.monotonic() - started
    verdict, error = _read(run_dir, log_path)
    return Qualified.of(verdict, exit_code=code, seconds=seconds, where=str(run_dir),
                        error=error)


def _stop(proc: subprocess.Popen[bytes]) -> int:
    """As Ctrl-C: the runner stops every process it started, then exits."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _read(run_dir: Path, log_path: Path) -> tuple[Verdict | None, str]:
    verdict = run_dir / "verdict.json"
    if verdict.exists():
        try:
            return Verdict.model_validate_json(verdict.read_text()), ""
        except (ValidationError, OSError) as e:
            return None, f"unreadable verdict.json: {str(e).splitlines()[0]}"
    lines = log_path.read_text(errors="replace").splitlines()
    errors = [line for line in lines if line.startswith(("error:", "internal error:"))]
    return None, (errors or lines or ["no output"])[-1][:500]


__all__ = ["Qualified", "qualify"]

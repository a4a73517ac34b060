"""A local run's comparison in a process of its own, bounded as a cluster's comparator Job is.

On a cluster the comparator is a Job: ``compare`` says None while it runs, and the state
machine ends the run when it has not concluded within ``timeouts.legSeconds``. A local
run compares the same way: :class:`Comparison` starts

    python -m resumequal.local.comparison --run URI --out FILE [--leg LEG ...]

among the run's processes (stopped with them, ended with the runner however it dies), and
polls it. The child judges the location with the run's key and id from its environment —
the qualification with its negative controls, or each ``--leg`` against the control leg
— and writes each verdict as JSON into ``FILE``, in the run's private scratch folder. A
comparison that hangs (a store that stops answering, a stuck read) no longer holds the
runner: its deadline ends the run, with reason Timeout, and the child goes with the run.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pydantic_core
from pydantic import TypeAdapter, ValidationError

from resumequal.errors import ResumequalError
from resumequal.local.processes import ProcessTree
from resumequal.results.verdict import Result, Verdict
from resumequal.store import regular

log = logging.getLogger(__name__)

__all__ = ["Comparison", "ComparisonFailed", "main"]

# The key the qualification's verdict (controls included) is written under.
QUALIFICATION = ""
# What a verdicts file may hold: a few verdicts of a run's steps and controls.
_VERDICTS_BYTES = 64 << 20
_VERDICTS = TypeAdapter(dict[str, Verdict])


class ComparisonFailed(ResumequalError):
    """The comparison process ended without verdicts (it crashed, or was killed)."""


@dataclass
class Comparison:
    """One comparison process of a run: started once, polled until it has concluded."""

    proc: subprocess.Popen[bytes]
    out: Path
    log: Path

    @classmethod
    def start(cls, tree: ProcessTree, python: str, uri: str, scratch: Path, log: Path,
              env: dict[str, str], legs: Sequence[str] = ()) -> Comparison:
        """Start judging the run at ``uri`` (``legs``: each against the control leg; none:
        the qualification) with the run's key and id in ``env``; its output goes to
        ``log``."""
        out = scratch / "comparison.json"
        regular.unlink(scratch, out.name)  # a previous comparison's, or a planted one
        cmd = [python, "-m", "resumequal.local.comparison", "--run", uri, "--out", str(out),
               *(a for leg in legs for a in ("--leg", leg))]
        return cls(tree.spawn(cmd, log, env), out, log)

    def verdicts(self) -> dict[str, Verdict] | None:
        """Each verdict by leg (``QUALIFICATION`` for the qualification's) once the process
        has concluded; None while it runs. ComparisonFailed when it ended without."""
        code = self.proc.poll()
        if code is None:
            return None
        try:
            data = regular.read_file(self.out.parent, self.out.name, _VERDICTS_BYTES)
            return _VERDICTS.validate_python(json.loads(data))
        except (OSError, ValueError, ValidationError) as e:
            raise ComparisonFailed(f"the comparison exited {code} without verdicts "
                                   f"({self.log}): {_last_error(self.log)}") from e


def _last_error(path: Path) -> str:
    try:
        lines = regular.read_file(path.parent, path.name).decode(errors="replace").splitlines()
    except OSError:
        return "no output"
    errors = [line for line in lines if line.startswith("error: ") or "Error" in line]
    return (errors or lines or ["no output"])[-1].strip()


def _judge(uri: str, legs: Sequence[str]) -> dict[str, Verdict]:
    # The comparator (DCP readers, drift statistics, and with them torch) loads here.
    from resumequal.compare import compare_qualification, compare_run
    from resumequal.run.location import RunLocation
    from resumequal.run.signing import RunSeal

    seal = RunSeal.from_env()
    spec = RunLocation.open(uri, seal=seal).read_spec()
    location = RunLocation.open(uri, spec.checkpoint.store_settings, seal=seal)
    if not legs:
        return {QUALIFICATION: compare_qualification(location, spec)}
    verdicts = {}
    for leg in legs:
        found = location.read_leg_spec(leg)
        verdicts[leg] = compare_run(location, found.spec if found else spec, leg=leg)
    return verdicts


def first_failing(verdicts: dict[str, Verdict]) -> Verdict:
    """The verdict that speaks for several: the first that did not pass, else the first."""
    failing = [v for v in verdicts.values() if v.result != Result.PASS]
    return failing[0] if failing else next(iter(verdicts.values()))


def main(argv: Sequence[str] | None = None) -> None:
    """Judge a run location; write the verdicts to ``--out``."""
    from resumequal.logs import configure_logging

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--leg", action="append", default=[])
    args = parser.parse_args(argv)
    configure_logging(logging.INFO, "%(asctime)s comparison %(levelname)s %(name)s: "
                      "%(message)s")
    try:
        verdicts = _judge(args.run, args.leg)
    except ResumequalError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    # NaN and Infinity as JSON's constants, as report files keep them (a drift can be one).
    body = pydantic_core.to_json(_VERDICTS.dump_python(verdicts), inf_nan_mode="constants")
    regular.write_file(args.out.parent, args.out.name, body, mode=0o600)
    log.info("wrote %d verdict(s): %s", len(verdicts),
             json.dumps({k or "qualification": v.result.value for k, v in verdicts.items()}))


if __name__ == "__main__":
    main()

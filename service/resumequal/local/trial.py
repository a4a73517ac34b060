"""Before anything launches: the workload's factory imported and built once, in a process of
its own (:mod:`resumequal.train.trial`), so that a misspelled module or a build that raises
is a spec error up front, not an INVALID qualification minutes later.

A process of its own: the user's module is never imported here, a factory that hangs is
killed at ``timeouts.buildSeconds``, and whatever it starts goes with it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from resumequal.lifeline import dies_with_this_process
from resumequal.spec import QualificationSpec, SpecError

log = logging.getLogger(__name__)


def trial_build(spec: QualificationSpec, python: str = sys.executable) -> float:
    """Build ``spec``'s workload in a child process; its seconds, or SpecError naming
    ``workload.name`` and what failed."""
    name, limit = spec.workload.name, spec.timeouts.build_seconds
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="resumequal-trial-") as work:
        spec_path, result = Path(work, "spec.json"), Path(work, "result.txt")
        spec_path.write_text(spec.model_dump_json())
        out = Path(work, "output.log")
        # Its temporary files go with the trial's folder; its threads are a rank's.
        env = dict(os.environ, TMPDIR=work, OMP_NUM_THREADS=str(spec.world.threads_per_rank))
        with out.open("wb") as sink:
            proc = subprocess.Popen(
                [python, "-m", "resumequal.train.trial", str(spec_path), str(result)],
                stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
                # It ends with this process, even one killed by SIGKILL (resumequal.lifeline).
                preexec_fn=dies_with_this_process(signal.SIGKILL))
            try:
                code = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                # The whole group: a factory's helper processes (loader workers) too, and
                # on a Ctrl-C here the child, in its own session, would not get the signal.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if code is None:
            raise SpecError(f"workload.name {name!r}: the trial build did not finish within "
                            f"{limit:g} s (timeouts.buildSeconds)")
        if code != 0:
            said = result.read_text().strip() if result.exists() else ""
            raise SpecError(said or f"workload.name {name!r}: the trial build exited {code}: "
                            f"{_last_line(out)}")
    seconds = time.monotonic() - started
    log.info("workload %s builds (trial build: %.1f s)", name, seconds)
    return seconds


def _last_line(path: Path) -> str:
    lines = path.read_text(errors="replace").strip().splitlines()
    return lines[-1] if lines else "no output"

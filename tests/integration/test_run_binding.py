"""What a run writes is bound to that run and leg: a bucket writer cannot replay another run.

Two real runs signed with the same checkpoint key, one PASS and one FAIL; the PASS run's
preempted leg (trace and checkpoints) copied over the FAIL run's, as someone with write
access to the store could, is refused by name when the FAIL run is judged again, and the
verdict never becomes PASS. The control leg's final checkpoint filed as the preempted
leg's is refused as another leg's. A local run keeps its key and id, so it can be judged
again later without them in the environment; a judgement that cannot authenticate the run
writes nothing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from resumequal.exitcodes import ExitCode
from resumequal.run.signing import KEY_ENV, RUN_ID_ENV, new_key
from tests.integration.legs import FORKED
from tests.integration.test_run import FAST, _resumequal

pytestmark = pytest.mark.slow

# The environment of a user who set neither: `resumequal run` makes (and keeps) its own.
NO_KEY = {KEY_ENV: "", RUN_ID_ENV: ""}


def _verdict(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "verdict.json").read_text())  # type: ignore[no-any-return]


def _judged(run_dir: Path, env: dict[str, str]) -> dict[str, Any]:
    proc = _resumequal("compare", str(run_dir), "--json", env=env)
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def _failed(verdict: dict[str, Any], check: str) -> str:
    """The detail of the failed validity check ``check``."""
    (found,) = [c for c in verdict["checks"] if c["name"] == check]
    assert not found["ok"], found
    return str(found["detail"])


def _replace(src: Path, dest: Path) -> None:
    shutil.rmtree(dest)
    shutil.copytree(src, dest)


@pytest.mark.timeout(600)
def test_a_pass_runs_leg_copied_into_a_failing_run_is_refused(tmp_path: Path) -> None:
    env = {KEY_ENV: new_key(), RUN_ID_ENV: ""}  # one key for both runs: only the run tells
    passing, failing = tmp_path / "pass", tmp_path / "fail"
    proc = _resumequal("run", "--run-dir", str(passing), *FORKED, *FAST, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _resumequal("run", "--run-dir", str(failing), *FORKED, *FAST,
                       "--omit", "scheduler", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _verdict(failing)["result"] == "FAIL"

    # Its checkpoints alone: the final one is another run's.
    _replace(passing / "preempted" / "checkpoints", failing / "preempted" / "checkpoints")
    judged = _judged(failing, env)
    assert judged["result"] == "INVALID", judged["reason"]
    detail = _failed(judged, "final_checkpoints")
    assert "step-00000012 is refused: it names run " in detail, detail
    assert "a checkpoint of another run, copied here" in detail, detail
    # And its trace: every segment is refused by name, whatever its records say.
    _replace(passing / "preempted" / "trace", failing / "preempted" / "trace")
    judged = _judged(failing, env)
    assert judged["result"] == "INVALID", judged["reason"]
    detail = _failed(judged, "traces")
    for rank in (0, 1):
        assert f"preempted/trace/rank-{rank}/attempt-0/00000000.jsonl: trace segment " \
               "refused: its MAC does not hold for this run" in detail, detail
    assert _verdict(failing)["result"] == "FAIL"  # judged again, not written

    # The control leg's final checkpoint filed as the preempted leg's, in the PASS run.
    final = "step-00000012"
    _replace(passing / "control" / "checkpoints" / final,
             passing / "preempted" / "checkpoints" / final)
    judged = _judged(passing, env)
    assert judged["result"] == "INVALID", judged["reason"]
    detail = _failed(judged, "final_checkpoints")
    assert "written by the control leg, not the preempted leg" in detail, detail

@pytest.mark.timeout(600)
def test_a_local_run_is_judged_again_with_the_key_it_kept(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _resumequal("run", "--run-dir", str(run_dir), *FORKED, *FAST, env=NO_KEY)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Neither the key nor the run id is in the environment: the run's own are kept.
    (run_dir / "verdict.json").unlink()
    proc = _resumequal("compare", str(run_dir), "--write", env=NO_KEY)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _verdict(run_dir)["result"] == "PASS"

    # Another key cannot judge it, and the verdict it has stays.
    before = (run_dir / "verdict.json").read_bytes()
    proc = _resumequal("compare", str(run_dir), "--write", env={**NO_KEY, KEY_ENV: new_key()})
    assert proc.returncode == ExitCode.INVALID, proc.stdout + proc.stderr
    assert "cannot be judged with this key and run id" in proc.stderr
    assert "nothing written" in proc.stderr
    assert (run_dir / "verdict.json").read_bytes() == before

    # Moved, or copied elsewhere: found by the run its key and id authenticate.
    moved = shutil.move(run_dir, tmp_path / "moved")
    proc = _resumequal("compare", str(moved), "--json", env=NO_KEY)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    copied = shutil.copytree(moved, tmp_path / "copied")
    proc = _resumequal("compare", str(copied), "--json", env=NO_KEY)
    assert proc.returncode == 0, proc.stdout + proc.stderr

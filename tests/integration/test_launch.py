"""``resumequal launch`` around real torchrun: the exit status the training operator reads,
and what is left (processes, checkpoints) after the launcher gets SIGTERM, as a pod's
main process does when the pod is deleted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resumequal.local.processes import ProcessTree, alive
from resumequal.qualify.plan import local_torchrun_args
from resumequal.run.location import RunLocation
from resumequal.run.signing import RunSeal
from resumequal.spec import parse_spec
from testing.ports import free_port
from tests.integration.conftest import spec_for
from tests.waiting import eventually

pytestmark = pytest.mark.slow


@pytest.fixture
def tree() -> Iterator[ProcessTree]:
    """Tags the launcher and everything under it, so a test can see what is left."""
    t = ProcessTree()
    yield t
    t.stop_all(grace_seconds=1)


def _launch(tree: ProcessTree, log: Path, mode: str, args: list[str],
            env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "resumequal", "launch", "--mode", mode, "--", *args]
    return tree.spawn(cmd, log, dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))


def _pod_env() -> dict[str, str]:
    """torchrun's arguments as the training operator gives them to an elastic job's pod."""
    return {
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": f"127.0.0.1:{free_port()}",
        "PET_RDZV_ID": "q1-preempted",
        "PET_NNODES": "1",
        "PET_NPROC_PER_NODE": "2",
        "PET_MAX_RESTARTS": "1",
    }


def _armed_leg(tree: ProcessTree, run_dir: Path, mode: str) -> tuple[subprocess.Popen[bytes],
                                                                       dict[str, Any]]:
    """A preempted leg started the way a leg pod starts it, held at its cut."""
    spec = parse_spec(spec_for("tiny-gpt", preemption={"mode": mode}))
    RunLocation.open(str(run_dir), seal=RunSeal.from_env()).write_leg_spec("preempted", spec, [])
    args = ["-m", "resumequal", "leg", "--leg", "preempted", "--run-dir", str(run_dir)]
    proc = _launch(tree, run_dir / "launch.log", mode, args, _pod_env())
    beacon = run_dir / "preempted" / "beacons" / "attempt-0-rank-1.json"
    log = run_dir / "launch.log"
    eventually(beacon.exists, 120, f"the leg to arm:\n{log}", interval=0.05,
               abort=lambda: None if proc.poll() is None else f"the launcher exited "
               f"{proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
    return proc, json.loads(beacon.read_text())


def _checkpoints(run_dir: Path) -> list[str]:
    root = run_dir / "preempted" / "checkpoints"
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


def test_sigterm_in_graceful_mode_saves_then_exits_143(tree: ProcessTree, tmp_path: Path) -> None:
    proc, beacon = _armed_leg(tree, tmp_path, "graceful")
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=120)
    log = (tmp_path / "launch.log").read_text()
    # torchrun itself exits 1 here; the launcher reports the signal it got, which is retryable.
    assert code == 143, log[-3000:]
    assert "SIGTERM (graceful): forwarded to torchrun" in log
    assert "emergency checkpoint committed" in log
    assert _checkpoints(tmp_path) == ["step-00000004", "step-00000005+1"]
    assert tree.pids() == [] and not alive(beacon["pid"])


def test_sigterm_in_hard_mode_kills_everything_at_once(tree: ProcessTree, tmp_path: Path) -> None:
    proc, beacon = _armed_leg(tree, tmp_path, "hard")
    workers = [p for p in tree.pids() if p != proc.pid]
    assert beacon["pid"] in workers
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=60)
    elapsed = time.monotonic() - start
    log = (tmp_path / "launch.log").read_text()
    assert code == 143, log[-3000:]
    assert "SIGTERM (hard): killing torchrun and its workers" in log
    assert elapsed < 10
    assert tree.pids() == [] and not any(alive(p) for p in workers)
    # Nothing was saved on the way out: the periodic checkpoint is the newest.
    assert "emergency checkpoint" not in log
    assert _checkpoints(tmp_path) == ["step-00000004"]


@pytest.mark.parametrize(
    ("script", "code"),
    [
        pytest.param("exit 0", 0, id="success"),
        pytest.param("exit 3", 1, id="workers-fail-past-max-restarts"),
    ],
)
def test_torchrun_ending_on_its_own_gives_its_code(
    tree: ProcessTree, tmp_path: Path, script: str, code: int
) -> None:
    args = [*local_torchrun_args(endpoint=f"127.0.0.1:{free_port()}", nproc=1,
                                 max_restarts=1),
            "--no-python", "sh", "-c", script]
    proc = _launch(tree, tmp_path / "launch.log", "hard", args)
    assert proc.wait(timeout=120) == code
    log = (tmp_path / "launch.log").read_text()
    assert f"torchrun exited {code}" in log
    if code:
        # The worker failed twice: torchrun restarted it once, then gave up.
        assert log.count("failed (exitcode: 3)") == 2
    assert tree.pids() == []


def test_torchrun_killed_by_a_signal_gives_128_plus_the_signal(
    tree: ProcessTree, tmp_path: Path
) -> None:
    args = [*local_torchrun_args(endpoint=f"127.0.0.1:{free_port()}", nproc=1,
                                 max_restarts=0),
            "--no-python", "sleep", "300"]
    proc = _launch(tree, tmp_path / "launch.log", "graceful", args)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    eventually(lambda: len(tree.pids()) >= 3, 60, "the launcher, torchrun and its worker",
               interval=0.05, abort=lambda: None if proc.poll() is None else "it exited")
    (torchrun,) = (int(p) for p in children.read_text().split())
    os.kill(torchrun, signal.SIGKILL)  # e.g. the OOM killer
    assert proc.wait(timeout=60) == 128 + signal.SIGKILL
    assert tree.pids() == []  # its orphaned worker was killed too

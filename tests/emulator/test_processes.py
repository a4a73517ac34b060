"""ProcessTree finds and stops everything it started, orphans in other sessions included."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from resumequal.local.processes import ProcessTree, alive, tagged
from tests.waiting import eventually

# A launcher that, like torchrun, starts its worker in a session of its own.
LAUNCHER = (
    "import subprocess, sys, time\n"
    "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'],"
    " start_new_session=True)\n"
    "print(w.pid, flush=True)\n"
    "time.sleep(300)\n"
)


def _spawn(tree: ProcessTree, tmp_path: Path) -> tuple[int, int]:
    log = tmp_path / "launcher.log"
    proc = tree.spawn([sys.executable, "-c", LAUNCHER], log, dict(os.environ))
    text = eventually(lambda: log.read_text().strip(), 30, "the launcher to report its worker",
                      interval=0.05)
    return proc.pid, int(text)


def test_stop_all_reaches_workers_in_their_own_session(tmp_path: Path) -> None:
    tree = ProcessTree()
    launcher, worker = _spawn(tree, tmp_path)
    assert os.getsid(worker) != os.getsid(launcher)
    assert set(tree.pids()) == {launcher, worker}
    stopped = tree.stop_all(grace_seconds=2)
    assert set(stopped) == {launcher, worker}
    assert not alive(launcher) and not alive(worker)
    assert tree.pids() == []


def test_orphans_of_a_killed_launcher_are_still_found(tmp_path: Path) -> None:
    tree = ProcessTree()
    launcher, worker = _spawn(tree, tmp_path)
    os.kill(launcher, signal.SIGKILL)
    tree.children[0].wait(timeout=10)
    assert alive(worker)
    assert tree.pids() == [worker]
    tree.stop_all(grace_seconds=2)
    assert not alive(worker)


def test_another_tree_is_left_alone(tmp_path: Path) -> None:
    ours, theirs = ProcessTree(), ProcessTree()
    _spawn(theirs, tmp_path / "b")
    try:
        assert ours.stop_all(grace_seconds=1) == []
        assert len(theirs.pids()) == 2
    finally:
        theirs.stop_all(grace_seconds=1)


# Stands for a process that has lost its environment but still runs, as an exiting one
# has for a moment: it drops the tag by exec'ing itself (same pid, same start time).
DROPS_TAG = (
    "import os, sys, time\n"
    "from pathlib import Path\n"
    "go = Path(sys.argv[1])\n"
    "while not go.exists(): time.sleep(0.02)\n"
    "env = {k: v for k, v in os.environ.items() if k != 'RESUMEQUAL_LAUNCH_TAG'}\n"
    "os.execve(sys.executable, [sys.executable, '-c', 'import time; time.sleep(300)'], env)\n"
)


def test_a_process_seen_once_is_followed_until_it_exits(tmp_path: Path) -> None:
    tree = ProcessTree()
    go = tmp_path / "go"
    proc = tree.spawn([sys.executable, "-c", DROPS_TAG, str(go)], tmp_path / "p.log",
                      dict(os.environ))
    eventually(lambda: tree.pids() == [proc.pid], 30, "the process to carry its tag")
    go.touch()
    eventually(lambda: proc.pid not in tagged(tree.tag), 30, "the tag to be gone")
    assert alive(proc.pid) and tree.pids() == [proc.pid]
    assert tree.stop_all(grace_seconds=2) == [proc.pid]
    assert proc.poll() is not None and tree.pids() == []

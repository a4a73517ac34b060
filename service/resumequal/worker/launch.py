"""``resumequal launch``: the main process of a leg's pod, a thin parent of torchrun.

"torchrun" here is the leg's launcher (:mod:`resumequal.spec.launchers`): stock torchrun by
default, or with ``--launcher forked`` torchrun's own agent, options and exits with its
workers forked from a process that loaded their code once (:mod:`resumequal.worker.agent`).

torchrun as a container's main process answers SIGTERM by re-raising it and exiting 1,
which the training operator's ExitCode policy takes for a permanent failure of the whole
job; and it forwards the SIGTERM to its workers, so every pod deletion would be a graceful
stop. The launcher runs torchrun as its child and decides instead:

- torchrun ends on its own: the launcher exits with torchrun's code (128+N for signal N);
- the launcher gets SIGTERM or SIGINT: it exits 128+signal (retryable), never 1. In
  ``graceful`` mode it forwards the signal to torchrun, which forwards it to the workers
  (they commit an emergency checkpoint and exit 143), and waits for torchrun. In ``hard``
  mode it SIGKILLs torchrun and every worker at once, so nothing is saved.

The launcher finds torchrun's processes by a tag in their environment, which all of them
inherit from torchrun (its workers, and a forked leg's forkserver). It must
stay light: no torch, nothing of the training side. As a pod's PID 1 it also reaps the
orphans re-parented to it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from types import FrameType
from typing import Literal

from resumequal.local.processes import Tagged, send_signal
from resumequal.spec.launchers import DEFAULT_LAUNCHER, command

log = logging.getLogger(__name__)

TAG_VAR = "RESUMEQUAL_LAUNCHER_TAG"
Mode = Literal["hard", "graceful"]
SIGNALS = (signal.SIGTERM, signal.SIGINT)
# SIGKILLed processes are gone within milliseconds; this only bounds a kernel that stalls.
KILL_WAIT_SECONDS = 10.0


def exit_code(status: int) -> int:
    """A shell's exit status for a wait status: the exit code, or 128+N for signal N."""
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


class Launcher:
    """Runs ``torchrun ARGS`` as a child and answers SIGTERM/SIGINT as ``mode`` says."""

    def __init__(self, mode: Mode, torchrun_args: list[str], *,
                 launcher: str = DEFAULT_LAUNCHER, python: str = sys.executable) -> None:
        self.mode = mode
        self.cmd = [python, *command(launcher), *torchrun_args]
        self.tag = uuid.uuid4().hex
        self._tagged = Tagged(self.tag, TAG_VAR)
        self.signalled: int | None = None
        self._acted = False
        self.child: subprocess.Popen[bytes] | None = None

    def run(self) -> int:
        """Start torchrun, wait for it, and return the exit status this process should have."""
        previous = {s: signal.signal(s, self._on_signal) for s in SIGNALS}
        try:
            # A session of its own: a terminal's Ctrl-C reaches the launcher alone, which
            # decides what torchrun gets. (Not a blocked signal mask while it starts:
            # torchrun would inherit it and never see a forwarded SIGTERM.)
            self.child = subprocess.Popen(self.cmd, env=dict(os.environ, **{TAG_VAR: self.tag}),
                                          start_new_session=True)
            if self.signalled is not None and not self._acted:
                self._act(self.signalled)  # it arrived while torchrun was starting
            status = self._wait(self.child)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        self._kill_workers()  # whatever a killed or failed torchrun left behind
        if self.signalled is not None:
            return 128 + self.signalled
        code = exit_code(status)
        log.info("torchrun exited %d", code)
        return code

    def _wait(self, child: subprocess.Popen[bytes]) -> int:
        """torchrun's wait status; as PID 1, reap every orphan that ends meanwhile."""
        reap_all = os.getpid() == 1
        while True:
            pid, status = os.waitpid(-1 if reap_all else child.pid, 0)
            if pid == child.pid:
                child.returncode = os.waitstatus_to_exitcode(status)  # reaped here
                return status

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.signalled is None:
            self.signalled = signum
        if self.child is not None:
            self._act(signum)

    def _act(self, signum: int) -> None:
        """Hard: kill everything (again, if asked again). Graceful: forward the first signal."""
        assert self.child is not None
        name = signal.Signals(signum).name
        if self.mode == "hard":
            log.warning("%s (hard): killing torchrun and its workers", name)
            self._kill_workers()
        elif not self._acted:
            log.warning("%s (graceful): forwarded to torchrun", name)
            send_signal(self.child.pid, signum)
        self._acted = True

    def _kill_workers(self) -> None:
        """SIGKILL torchrun, then every process carrying our tag, until none is left."""
        if self.child is not None and self.child.returncode is None:
            send_signal(self.child.pid, signal.SIGKILL)
        deadline = time.monotonic() + KILL_WAIT_SECONDS
        while time.monotonic() < deadline:
            left = self._tagged.live()
            if not left:
                return
            for pid in left:
                send_signal(pid, signal.SIGKILL)
            time.sleep(0.01)
        log.error("processes still alive after SIGKILL: %s", self._tagged.live())


def launch(mode: Mode, torchrun_args: list[str], launcher: str = DEFAULT_LAUNCHER) -> int:
    """Run torchrun (as ``launcher`` starts it) with ``torchrun_args`` under a launcher; the
    exit status to exit with."""
    return Launcher(mode, torchrun_args, launcher=launcher).run()

"""Processes we start, and how to find and stop every one of them.

torchrun starts each worker it runs as a program in a session of its own, so killing the
launcher's process group does not reach the workers, and a SIGKILLed launcher leaves them
orphaned (as it leaves those a forkserver forked, :mod:`resumequal.worker.agent`, and the
forkserver itself). Every process we start therefore carries a tag in its environment,
inherited by its children; cleanup finds tagged processes through /proc, whoever their
parent is now.

A process that is exiting has already lost its environment, though it still runs for a
moment (closing files, releasing ports), so a tag is only seen on a live process; what
was seen once is followed by pid and start time until it has exited.

That cleanup runs only while this process lives. Should it die by SIGKILL, each process it
started gets SIGTERM from the kernel and ends what it started (:mod:`resumequal.lifeline`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import stat
import subprocess
import time
import uuid
from pathlib import Path
from typing import BinaryIO

from resumequal.errors import ResumequalError
from resumequal.lifeline import DIE_WITH_PARENT_ENV, dies_with_this_process

log = logging.getLogger(__name__)

TAG_VAR = "RESUMEQUAL_LAUNCH_TAG"


def tagged(tag: str, var: str = TAG_VAR) -> list[int]:
    """Pids of processes whose environment carries ``var=tag`` (zombies included)."""
    needle = f"{var}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has exited for every purpose of ours)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it has exited for every purpose of ours.
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from field 3 (the state) on, or None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields or None


def _start_time(pid: int) -> int | None:
    """``pid``'s start time in clock ticks (field 22), or None once it has exited (zombies
    included)."""
    fields = _stat(pid)
    if fields is None or fields[0] in ("Z", "X") or len(fields) < 20:
        return None
    return int(fields[19])


class Tagged:
    """The running processes carrying one tag, followed until they exit."""

    def __init__(self, tag: str, var: str = TAG_VAR) -> None:
        self.tag, self.var = tag, var
        self._seen: dict[int, int] = {}  # pid -> start time, which tells a reused pid apart

    def live(self) -> list[int]:
        """Pids that carry the tag, or carried it when last seen and have not exited."""
        now = {}
        for pid in tagged(self.tag, self.var):
            started = _start_time(pid)
            if started is not None:
                now[pid] = started
        for pid, started in self._seen.items():
            if pid not in now and _start_time(pid) == started:
                now[pid] = started
        self._seen = now
        return sorted(now)


class ProcessTree:
    """Launches tagged processes and stops all of them, orphans included."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex
        self.children: list[subprocess.Popen[bytes]] = []
        self._tagged = Tagged(self.tag)

    def spawn(self, cmd: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start ``cmd`` in a new session with our tag, output appended to ``log_path``.

        It gets SIGTERM when this process dies, even by SIGKILL (:mod:`resumequal.lifeline`;
        spawn from the thread that runs the qualification), and its workers SIGKILL when
        it does."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        full_env = dict(env, **{TAG_VAR: self.tag, DIE_WITH_PARENT_ENV: "1"})
        with open_log(log_path) as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env, start_new_session=True,
                # Only a prctl runs between fork and exec: no lock another thread may hold.
                preexec_fn=dies_with_this_process(),
            )
        self.children.append(proc)
        return proc

    def pids(self) -> list[int]:
        """Every live process we started, directly or through a launcher."""
        return self._tagged.live()

    def stop_all(self, grace_seconds: float = 5.0) -> list[int]:
        """SIGTERM every tagged process, SIGKILL what is left after the grace; returns pids."""
        victims = self.pids()
        for pid in victims:
            send_signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_seconds
        while time.monotonic() < deadline and self.pids():
            self._reap()
            time.sleep(0.05)
        leftovers = self.pids()
        for pid in leftovers:
            send_signal(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.pids():
            self._reap()
            time.sleep(0.05)
        self._reap()
        if leftovers:
            log.warning("killed %d process(es) that ignored SIGTERM", len(leftovers))
        return victims

    def _reap(self) -> None:
        for proc in self.children:
            proc.poll()


def open_log(path: Path) -> BinaryIO:
    """``path`` opened for append, created 0600 if absent; ResumequalError if it is a
    symlink or not a regular file of this user (the run folder may be a store others can
    write to: a planted link would have our processes append to a file of its choosing)."""
    # O_NONBLOCK: a planted FIFO is refused below rather than blocking the open.
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as e:
        why = "it is a symbolic link" if e.errno == errno.ELOOP else e.strerror
        raise ResumequalError(f"refusing to write the log {path}: {why}") from e
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        os.close(fd)
        raise ResumequalError(f"refusing to write the log {path}: not a regular file of "
                              f"this user (owner uid {info.st_uid})")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "ab")


def send_signal(pid: int, sig: int) -> None:
    """Signal ``pid``; one that is already gone is not an error."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)

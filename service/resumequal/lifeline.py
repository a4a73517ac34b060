"""A process that ends when the process that started it dies, however that one dies.

``resumequal run`` starts the legs' torchrun agents, their rendezvous stores, trial builds
and replays. Killed with SIGKILL (the OOM killer, a CI job's timeout, ``kill -9``) it runs
no cleanup, and what it started would live on: a rendezvous store listening on loopback
for ever. So each such child asks the kernel (``prctl(PR_SET_PDEATHSIG)``, Linux) for a
signal when its parent dies: SIGTERM, which each of them handles by stopping what it
started in turn (torchrun its workers). A worker of a local run asks for SIGKILL when its
agent dies (:func:`die_with_parent`, where ``DIE_WITH_PARENT_ENV`` is set), so that even
an agent killed outright leaves no worker behind.

The signal comes when the *thread* that started the child ends: children are started from
the thread that runs the whole qualification (the main thread). Imports nothing of ours.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Callable

__all__ = ["DIE_WITH_PARENT_ENV", "die_with_parent", "dies_with_this_process"]

# Set by the local runner in every process it starts, inherited by the workers: "1".
DIE_WITH_PARENT_ENV = "RESUMEQUAL_DIE_WITH_PARENT"
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform == "linux" \
    else None


def _ask(sig: int) -> bool:
    """Ask for ``sig`` when the parent dies; whether the kernel can."""
    return _LIBC is not None and _LIBC.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def dies_with_this_process(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``sig`` when this process
    (the calling thread) dies, and ends at once if it died before the child could ask.
    None where the kernel has no such request (then the caller's cleanup is all)."""
    if _LIBC is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        # In the forked child, before exec: a request the kernel keeps across exec.
        if not _ask(sig) or os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """When ``DIE_WITH_PARENT_ENV`` is set: this process gets ``sig`` when its parent dies
    (a worker, when its torchrun agent does)."""
    if os.environ.get(DIE_WITH_PARENT_ENV) != "1":
        return
    parent = os.getppid()
    # Orphaned before the request held (adopted by init, or by another reaper meanwhile):
    # the parent is gone already.
    if _ask(sig) and (os.getppid() != parent or parent == 1):
        os.kill(os.getpid(), sig)

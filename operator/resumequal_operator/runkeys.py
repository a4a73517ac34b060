"""The operator's master key, and each run's key and seal made from it.

A run's key is HMAC(master, uid) (:func:`resumequal.run.signing.derive_run_key`): the operator
puts it in the run's Secret for the pods, and seals and authenticates what it writes and
reads in the run's location (leg specs, kill orders, beacons, markers, the verdict) with
it, on every reconcile and after a restart, without ever reading a Secret back. The
master comes from a file the chart mounts from a Secret of its own (``--key-file``); an
operator started without one makes a key for its lifetime and says that runs in flight at
its restart cannot be authenticated after it.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from pathlib import Path

from resumequal.errors import CheckpointError
from resumequal.run.signing import RunSeal, check_key, derive_run_key, new_key
from resumequal.store import regular

log = logging.getLogger(__name__)

# A key file holds a key and perhaps a newline; anything much larger is not one.
_KEY_FILE_BYTES = 4096
_LOCK = threading.Lock()
_PROCESS_KEY: MasterKey | None = None


def _check_guarded(path: Path, info: os.stat_result) -> None:
    """CheckpointError unless the key file ``info`` describes is one only root or this
    process's user may change (its owner, no write for group or others) and that others
    may not read (a group read is how a Secret volume gives it to the pod's fsGroup)."""
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid not in (0, os.getuid()):
        raise CheckpointError(f"--key-file {path}: owned by uid {info.st_uid}, neither root "
                              "nor this user; whoever owns it may change it")
    if mode & 0o022:
        raise CheckpointError(f"--key-file {path}: others may write it (mode {mode:o})")
    if mode & 0o004:
        raise CheckpointError(f"--key-file {path}: everyone may read it (mode {mode:o}); "
                              "at most its owner and group may")


class MasterKey:
    """The master key; the only thing that makes run keys. Never shown by its repr."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def __repr__(self) -> str:
        return "MasterKey(...)"

    @classmethod
    def generated(cls) -> MasterKey:
        """This process's key when it was given none (no --key-file): one for its lifetime,
        the same for every controller in it (a leader handing over to another in the same
        process keeps its runs)."""
        global _PROCESS_KEY
        with _LOCK:
            if _PROCESS_KEY is None:
                log.warning("no --key-file: run keys are made from a key of this process's "
                            "own; runs in flight when it restarts will end INVALID (what "
                            "they wrote cannot be authenticated after it)")
                _PROCESS_KEY = cls(new_key().encode())
            return _PROCESS_KEY

    @classmethod
    def from_file(cls, path: Path) -> MasterKey:
        """The key in ``path`` (as a mounted Secret holds it); CheckpointError naming the
        file, never its content, when it is not a key in a regular file that only root or
        this user may change and that not everyone may read. A Secret volume's file (owned
        by root, mode 0440 with the pod's fsGroup, behind the kubelet's links) is one."""
        try:
            # Non-blocking: a FIFO there returns at once, and is refused below.
            fd = regular.open_path(path)
        except regular.NotRegular as e:
            raise CheckpointError(f"--key-file {path}: not a regular file "
                                  f"({e.strerror})") from e
        except OSError as e:
            raise CheckpointError(f"--key-file {path}: cannot read it: {e.strerror}") from e
        try:
            _check_guarded(path, os.fstat(fd))
        except BaseException:
            os.close(fd)
            raise
        data = regular.read_fd(fd, _KEY_FILE_BYTES)
        if len(data) > _KEY_FILE_BYTES:
            raise CheckpointError(f"--key-file {path}: too large to be a key")
        try:
            text = data.decode("ascii").strip()
        except UnicodeDecodeError as e:
            raise CheckpointError(f"--key-file {path}: not a key (not ASCII)") from e
        return cls(check_key(text, f"the master key in --key-file {path}"))

    def run_key(self, uid: str) -> str:
        """The key of the run ``uid``, as its Secret holds it."""
        return derive_run_key(self._key, uid)

    def seal(self, uid: str) -> RunSeal:
        """The seal of the run ``uid``: what its pods hold (their Secret's key, their uid)."""
        return RunSeal(self.run_key(uid).encode(), uid)


__all__ = ["MasterKey"]

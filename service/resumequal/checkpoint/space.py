"""Telling a full disk apart in a failed checkpoint write.

A write that runs out of space does not always say so: torch's zip writer (what DCP's
``torch.save`` of each tensor goes through) reports the short write as ``unexpected pos
704 vs 598`` and drops the ``OSError``; DCP then wraps every rank's failure in a
``CheckpointException`` whose ``failures`` are not in the exception chain. Imports no torch.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["no_space"]

# caffe2/serialize/inline_container.cc: the zip writer's check that a record went out whole.
_SHORT_WRITE = "unexpected pos"


def _causes(error: BaseException) -> Iterator[BaseException]:
    """``error``, its chain, and each rank's failure DCP carries (duck-typed: no torch)."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] for f in failures.values()
                     if isinstance(f, tuple) and f and isinstance(f[0], BaseException)]


def _full(error: BaseException) -> bool:
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return True
    return isinstance(error, RuntimeError) and _SHORT_WRITE in str(error)


def _free_bytes(path: Path) -> int | None:
    """Bytes free to this user on ``path``'s filesystem (its nearest existing folder)."""
    for folder in (path, *path.parents):
        try:
            info = os.statvfs(folder)
        except OSError:
            continue
        return info.f_bavail * info.f_frsize
    return None


def no_space(error: BaseException, path: Path) -> str | None:
    """``"no space left on device: <path> has N bytes free"`` when ``error`` comes from a
    write that ran out of space on ``path``'s filesystem; None for any other failure."""
    if not any(_full(e) for e in _causes(error)):
        return None
    free = _free_bytes(path)
    return (f"no space left on device: {path} has "
            f"{'an unknown number of' if free is None else free} bytes free")

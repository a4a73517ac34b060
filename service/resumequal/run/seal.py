"""Sealed JSON objects of a run location: written with the run's MAC, read only when it holds.

With the run's seal (:class:`~resumequal.run.signing.RunSeal`) every JSON object a run
writes (spec files, beacons, kill orders, markers) carries its MAC in a ``mac`` field, and a
reader with the seal acts only on what holds for this run and this name. Without a seal (a
bare folder in a test) objects are plain JSON.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from resumequal.errors import NotAuthentic
from resumequal.run.signing import MAC_FIELD, RunSeal

log = logging.getLogger(__name__)

__all__ = ["loads", "sealed", "unsealed", "warn_once"]


def loads(data: bytes) -> Any:
    """JSON from the store; ValueError for anything that is not JSON this reader takes
    (too deep a nesting included: whoever writes to the store chooses it)."""
    try:
        return json.loads(data)
    except RecursionError as e:
        raise ValueError("nested too deeply") from e


def sealed(run_seal: RunSeal | None, key: str, body: dict[str, Any]) -> bytes:
    """``body`` as stored under ``key``: sealed with the run's MAC where the writer holds
    the run's seal (every process of a run does; a bare folder in a test may not)."""
    return json.dumps(body).encode() if run_seal is None else run_seal.seal_json(key, body)


def unsealed(run_seal: RunSeal | None, key: str, data: bytes, uri: str, what: str) -> Any:
    """The JSON stored under ``key``; with ``run_seal``, only an object whose MAC holds for
    this run and this name: NotAuthentic otherwise, whatever its form (not JSON, nested too
    deeply, a number no parser takes: nothing a sealing writer wrote; a bucket writer's
    object, one copied from another run or another name). Without a seal, ValueError for
    what is not JSON."""
    if run_seal is None:
        value = loads(data)
        if isinstance(value, dict):
            value.pop(MAC_FIELD, None)
        return value
    try:
        body = run_seal.open_json(key, loads(data))
    except ValueError as e:
        raise NotAuthentic(f"{uri}: not {what} of this run: not JSON a sealing writer "
                           f"writes ({e})") from e
    if body is None:
        raise NotAuthentic(f"{uri}: not {what} of this run: its MAC is missing or does not "
                           f"hold for run {run_seal.run} (written by someone without the "
                           "run's key, or copied from another run or another name)")
    return body


# What was said of objects that are not this run's: each once per process, and a bounded
# number of them (whoever writes the store chooses how many there are).
_WARNED: set[str] = set()
_MAX_WARNED = 256


def warn_once(message: str) -> None:
    """Log ``message`` as a warning the first time it is said in this process."""
    if message not in _WARNED and len(_WARNED) < _MAX_WARNED:
        _WARNED.add(message)
        log.warning("%s", message)

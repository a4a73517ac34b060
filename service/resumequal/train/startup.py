"""A worker's start-up: the cyclic garbage collector paused from the first import to the
first step.

A resumed worker imports torch, DCP and (through DDP and deterministic algorithms) dynamo:
about half a million long-lived objects. With the collector running, each generation-2
pass walks all of them, several times during the imports alone, and those passes are a
fifth of a restart's start-up on a loaded CPU. Start-up allocates little cyclic garbage
(a few thousand objects, none holding tensors that outlive it), so the collector is paused
until the worker is about to train, then everything alive is frozen out of its reach
(``gc.freeze``) and it runs again. Owns only the collector's state: no torch, no I/O.
"""

from __future__ import annotations

import gc

_paused = False


def pause_gc() -> None:
    """Pause the cyclic collector for start-up, unless something else has already."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume_gc(*, freeze: bool = True) -> None:
    """End start-up: freeze what it made (unless ``freeze`` is False, for a start-up that
    failed) and let the collector run again.

    Only undoes a pause of :func:`pause_gc`: a process that never paused (a test, an
    embedding application) keeps its collector as it was, and a second call does nothing.
    """
    global _paused
    if not _paused:
        return
    _paused = False
    if freeze:
        # Frozen objects are never scanned again: the imports' modules, classes and the
        # model live for the whole process, so later collections walk what training makes.
        gc.freeze()
    gc.enable()


def gc_paused() -> bool:
    """Whether this process is still in a start-up that paused the collector."""
    return _paused


__all__ = ["gc_paused", "pause_gc", "resume_gc"]

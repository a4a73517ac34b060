"""A worker's start-up: the cyclic garbage collector paused from the first import to the
first step.

A resumed worker imports torch, DCP and (through DDP and deterministic algorithms) dynamo:
about half a million objects that live as long as the process. With the collector
running, each full pass walks all of them, several times during the imports alone: about
a fifth of a worker's CPU time from its start to its first resumed step. So the collector
is paused (:func:`pause_gc`) until the worker is about to train; then what start-up made is
frozen out of its reach and it runs again (:func:`resume_gc`), so the first step does not
pay one full pass either; after the first step everything is handed back to it
(:func:`thaw_gc`), and the few thousand cyclic objects start-up left (a workload factory's
among them) are collected in the course of training, as they would have been.

Owns only the collector's state: no torch, no I/O.
"""

from __future__ import annotations

import gc

_paused = False
_frozen = False


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
    global _paused, _frozen
    if not _paused:
        return
    _paused = False
    if freeze:
        gc.freeze()
        _frozen = True
    gc.enable()


def thaw_gc() -> None:
    """Give what :func:`resume_gc` froze back to the collector (after the first step)."""
    global _frozen
    if _frozen:
        _frozen = False
        gc.unfreeze()


def gc_paused() -> bool:
    """Whether this process is still in a start-up that paused the collector."""
    return _paused


__all__ = ["gc_paused", "pause_gc", "resume_gc", "thaw_gc"]

"""The collector's pause over a worker's start-up (resumequal.train.startup)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from resumequal.train import startup


@pytest.fixture(autouse=True)
def _collector_as_it_was() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    startup._paused = startup._frozen = False
    gc.unfreeze()
    (gc.enable if enabled else gc.disable)()


def test_start_up_pauses_the_collector_its_end_freezes_and_resumes_it_and_a_step_thaws_it() -> None:
    gc.enable()
    gc.unfreeze()
    startup.pause_gc()
    assert not gc.isenabled() and startup.gc_paused()
    startup.resume_gc()
    assert gc.isenabled() and not startup.gc_paused()
    assert gc.get_freeze_count() > 0
    startup.thaw_gc()  # after the first step: start-up's objects are collectable again
    assert gc.get_freeze_count() == 0 and gc.isenabled()


def test_a_collector_paused_by_someone_else_stays_paused() -> None:
    gc.disable()
    startup.pause_gc()
    assert not startup.gc_paused()
    startup.resume_gc()
    assert not gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_resuming_without_a_pause_changes_nothing() -> None:
    gc.enable()
    gc.unfreeze()
    startup.resume_gc()
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_a_start_up_that_failed_resumes_without_freezing() -> None:
    gc.enable()
    gc.unfreeze()
    startup.pause_gc()
    startup.resume_gc(freeze=False)
    assert gc.isenabled() and not startup.gc_paused()
    assert gc.get_freeze_count() == 0


def test_thawing_what_was_never_frozen_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # Whether the collector is asked to unfreeze, not the frozen count: other threads of the
    # test session (the pod cluster's node agent, watches) free frozen objects meanwhile.
    unfrozen: list[bool] = []
    monkeypatch.setattr(gc, "unfreeze", lambda: unfrozen.append(True))
    gc.freeze()
    startup.thaw_gc()
    assert not unfrozen and gc.get_freeze_count() > 0

"""A missing external program skips a developer's tests but fails a CI run."""

from __future__ import annotations

import shutil

import pytest

from tests.tools import require


def test_a_missing_tool_skips_locally_and_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="promtool is not installed"):
        require("promtool")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must have it"):
        require("promtool")


def test_a_present_tool_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    assert require("kubectl") == "/usr/bin/kubectl"

"""The scratch folder of a run location outside this machine: private to this user, in a
temporary folder anyone can write to."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from resumequal.errors import StoreError
from resumequal.run.location import default_scratch

URI = "s3://bucket/runs/local/q1/abc"


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_scratch_lives_in_a_folder_only_this_user_enters(tmp: Path) -> None:
    scratch = default_scratch(URI)
    parent = scratch.parent
    assert parent == tmp / f"resumequal-{os.getuid()}"
    info = os.lstat(parent)
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
    assert stat.S_IMODE(info.st_mode) == 0o700
    assert default_scratch(URI) == scratch  # the ranks of this machine share it
    assert default_scratch(URI + "x") != scratch


def test_a_folder_others_can_enter_is_refused(tmp: Path) -> None:
    parent = tmp / f"resumequal-{os.getuid()}"
    parent.mkdir()
    parent.chmod(0o777)
    with pytest.raises(StoreError, match=r"not a private folder of this user.*mode 777"):
        default_scratch(URI)


def test_a_planted_link_is_refused(tmp: Path) -> None:
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp / f"resumequal-{os.getuid()}").symlink_to(elsewhere)
    with pytest.raises(StoreError, match="not a folder"):
        default_scratch(URI)


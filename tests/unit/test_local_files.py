"""What a local run writes outside its workers' reach: the legs' scratch folder (private,
never the run folder, which may be a store others write to), torchrun's error files, and
the legs' logs, which a planted link must not redirect."""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from resumequal.errors import ResumequalError
from resumequal.local import backend as local_backend
from resumequal.local.backend import LocalBackend
from resumequal.local.processes import ProcessTree
from resumequal.qualify.plan import qualification_plan
from resumequal.spec import parse_spec

SPEC = parse_spec({"controls": {"enabled": False}})


@dataclass
class Started:
    """The commands a test's backend started, none of them run: a process that writes
    ``output`` to its stdout and exits 0."""

    commands: list[list[str]] = field(default_factory=list)
    output: bytes = b""

    def popen(self, cmd: list[str], *, stdout: IO[bytes], **_kw: Any) -> Any:
        self.commands.append(cmd)
        stdout.write(self.output)
        return _Exited()


class _Exited:
    pid = 2**22 + 1  # above pid_max: never a live process

    def poll(self) -> int:
        return 0


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    return tmp_path


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Started:
    record = Started()
    monkeypatch.setattr(subprocess, "Popen", record.popen)
    monkeypatch.setattr(local_backend, "free_port", lambda: 29400)
    return record


def _option(cmd: list[str], name: str) -> str:
    """The value of ``--name V`` or ``--name=V`` in ``cmd``."""
    for i, arg in enumerate(cmd):
        if arg == name:
            return cmd[i + 1]
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name} not in {cmd}")


def test_legs_work_in_a_private_scratch_outside_the_run_folder(
        tmp: Path, started: Started) -> None:
    run_dir = tmp / "run"
    backend = LocalBackend(SPEC, run_dir)
    backend.launch_legs(qualification_plan(backend.spec).legs[:1])
    leg = next(cmd for cmd in started.commands if "leg" in cmd)
    scratch = Path(_option(leg, "--scratch"))
    assert run_dir.resolve() not in (scratch.resolve(), *scratch.resolve().parents)
    for folder in (scratch, scratch.parent):
        info = folder.lstat()
        assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()
        assert stat.S_IMODE(info.st_mode) == 0o700
    # torchrun keeps its error files there, not in a torchelastic_* folder of /tmp.
    assert Path(_option(leg, "--log-dir")).parent.parent == scratch
    backend.cleanup()
    assert not scratch.exists()


def test_a_planted_log_link_is_refused_and_its_target_untouched(
        tmp: Path, started: Started) -> None:
    run_dir = tmp / "run"
    backend = LocalBackend(SPEC, run_dir)
    plan = qualification_plan(backend.spec).legs[0]
    target = tmp / "elsewhere.txt"
    target.write_text("theirs\n")
    (run_dir / f"{plan.name}.log").symlink_to(target)
    try:
        with pytest.raises(ResumequalError,
                           match=rf"refusing to write the log {run_dir}/{plan.name}\.log: "
                           "it is a symbolic link"):
            backend.launch_legs([plan])
    finally:
        backend.cleanup()
    assert target.read_text() == "theirs\n"
    assert plan.name not in backend.procs
    assert not any("leg" in cmd for cmd in started.commands)


def test_a_log_that_is_not_a_regular_file_is_refused(tmp: Path, started: Started) -> None:
    log = tmp / "leg.log"
    os.mkfifo(log)  # opening it to write would block until someone reads it
    with pytest.raises(ResumequalError, match="refusing to write the log"):
        ProcessTree().spawn(["true"], log, dict(os.environ))
    assert started.commands == []


def test_an_existing_log_of_ours_is_appended_to_and_a_new_one_is_private(
        tmp: Path, started: Started) -> None:
    log = tmp / "leg.log"
    log.write_text("before\n")
    started.output = b"after\n"
    ProcessTree().spawn(["echo", "after"], log, dict(os.environ))
    assert log.read_text() == "before\nafter\n"
    ProcessTree().spawn(["true"], tmp / "new.log", dict(os.environ))
    assert stat.S_IMODE((tmp / "new.log").stat().st_mode) == 0o600

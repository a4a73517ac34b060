"""The run's seal: trace segments and manifests bound to their run, leg and name; the key a
local run keeps."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import time
from pathlib import Path

import pytest

from resumequal.checkpoint.manifest import Manifest, check_bound
from resumequal.errors import CheckpointError, TraceError, TraceNotAuthentic, UsageError
from resumequal.local import runkey
from resumequal.run.location import RunLocation
from resumequal.run.signing import KEY_ENV, RUN_ID_ENV, RunSeal, new_key, new_run_id
from resumequal.spec import QualificationSpec
from resumequal.store.log import parse_segment, segment_bytes
from testing.trace_records import step_record, trace_line

SEAL = RunSeal(new_key().encode(), "run-a")
NAME = "preempted/trace/rank-1/attempt-1/00000003.jsonl"
RECORDS = [step_record(0, 0, 5), step_record(0, 0, 6)]
LINES = [trace_line(r) for r in RECORDS]


def test_a_sealed_segment_reads_back_under_its_own_run_and_name() -> None:
    data = segment_bytes(LINES, 3, SEAL, NAME)
    assert parse_segment(data, "here", SEAL, NAME) == LINES
    # A reader without the seal (the operator's progress today) reads it as before.
    assert parse_segment(data, "here") == LINES


@pytest.mark.parametrize(("seal", "name"), [
    (RunSeal(SEAL.key, "run-b"), NAME),                              # another run
    (SEAL.child("seed-11"), NAME),                                   # a sub-run of it
    (SEAL, NAME.replace("preempted", "control")),                    # another leg
    (SEAL, NAME.replace("rank-1", "rank-0")),                        # another rank
    (SEAL, NAME.replace("attempt-1", "attempt-0")),                  # another attempt
    (SEAL, NAME.replace("00000003", "00000004")),                    # another place
    (RunSeal(new_key().encode(), "run-a"), NAME),                    # another key
])
def test_a_segment_anywhere_else_is_refused(seal: RunSeal, name: str) -> None:
    data = segment_bytes(LINES, 3, SEAL, NAME)
    with pytest.raises(TraceNotAuthentic, match="its MAC does not hold for this run"):
        parse_segment(data, "there", seal, name)


def test_an_unsealed_or_changed_segment_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(TraceNotAuthentic, match="carries no MAC"):
        parse_segment(segment_bytes(LINES, 3), "there", SEAL, NAME)
    data = segment_bytes(LINES, 3, SEAL, NAME).replace(b'"step": 6', b'"step": 7')
    with pytest.raises(TraceNotAuthentic):
        parse_segment(data, "there", SEAL, NAME)
    # A trailer that is not even JSON is refused for its MAC, never parsed.
    mac = SEAL.mac(NAME, b"".join(LINES)).encode()
    data = b"".join(LINES) + b'{"mac":"' + b"0" * 64 + b'"' + b"[" * 100_000 + b"\n"
    with pytest.raises(TraceNotAuthentic):
        parse_segment(data, "there", SEAL, NAME)
    data = b"".join(LINES) + b'{"mac":"' + mac + b'"' + b"[" * 100_000 + b"\n"
    with pytest.raises(TraceError, match="no valid trailer"):
        parse_segment(data, "there", SEAL, NAME)


def _write(location: RunLocation, leg: str = "control") -> None:
    sink = location.trace_sink(leg, 0, 0)
    for line in LINES:
        sink.append(line)
    sink.close()


def test_a_sealed_location_writes_and_reads_its_legs_and_sub_runs(tmp_path: Path) -> None:
    location = RunLocation.open(str(tmp_path / "run"), seal=SEAL)
    for loc in (location, location.child("seed-11")):
        _write(loc)
        assert loc.traces("control").records(0) == RECORDS
    # The export verifies each sub-run's segments under that sub-run's seal.
    (tmp_path / "run" / "run.json").write_text("{}")
    out = location.materialize(tmp_path / "export")
    for leg in ("control", "seed-11/control"):
        assert (out / leg / "trace" / "rank-0.jsonl").read_bytes() == b"".join(LINES)
    # The seed's segments, moved into the parent run's place, are another run's.
    seed = tmp_path / "run" / "seed-11" / "control" / "trace" / "rank-0" / "attempt-0"
    mine = tmp_path / "run" / "control" / "trace" / "rank-0" / "attempt-0"
    for segment in sorted(seed.iterdir()):
        (mine / segment.name).write_bytes(segment.read_bytes())
    with pytest.raises(TraceNotAuthentic):
        location.traces("control").records(0)
    with pytest.raises(TraceNotAuthentic):
        location.materialize(tmp_path / "export-2")
    # Progress skips them: never counted as steps.
    assert location.traces("control").records_so_far(1) == {}


def _manifest(**changes: object) -> Manifest:
    fields: dict[str, object] = dict(name="step-00000005+1", step=5, microstep=1,
                                     world_size=2, attempt=1, created_at=1.0, files={},
                                     info={"leg": "preempted"}, run="run-a")
    return Manifest.model_validate({**fields, **changes})


def test_a_manifest_binds_its_run_leg_and_position() -> None:
    assert check_bound(_manifest(), "c", "preempted", "run-a").run == "run-a"
    with pytest.raises(CheckpointError, match=re.escape("names run run-b, not this run (run-a)")):
        check_bound(_manifest(run="run-b"), "c", "preempted", "run-a")
    with pytest.raises(CheckpointError, match="names no run"):
        check_bound(_manifest(run=""), "c", "preempted", "run-a")
    with pytest.raises(CheckpointError, match="written by the control leg, not the preempted"):
        check_bound(_manifest(info={"leg": "control"}), "c", "preempted", "run-a")
    with pytest.raises(CheckpointError, match="written by no leg"):
        check_bound(_manifest(info={}), "c", "preempted", "run-a")
    with pytest.raises(CheckpointError, match="do not agree"):
        check_bound(_manifest(step=6), "c", "preempted", "run-a")


def test_the_run_id_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUN_ID_ENV, "run-b")
    with pytest.raises(CheckpointError, match=re.escape("not this run (run-b)")):
        check_bound(_manifest(), "c", "preempted")
    monkeypatch.setenv(RUN_ID_ENV, "../../etc")
    with pytest.raises(CheckpointError, match="is not a run id"):
        check_bound(_manifest(), "c", "preempted")


def test_a_seal_needs_a_key_and_a_run_id_and_never_shows_its_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RUN_ID_ENV)
    with pytest.raises(CheckpointError, match=f"no run id: {RUN_ID_ENV} is not set"):
        RunSeal.from_env()
    monkeypatch.setenv(RUN_ID_ENV, "run-a")
    seal = RunSeal.from_env()
    assert seal.key.decode() not in repr(seal) and "run-a" in repr(seal)


def _claimed(root: Path, seal: RunSeal) -> RunLocation:
    """A run location whose run.json the run with ``seal`` wrote."""
    RunLocation.open(str(root), seal=seal).claim(QualificationSpec())
    return RunLocation.open(str(root))


def test_a_local_run_keeps_its_key_for_this_user_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv(KEY_ENV)
    monkeypatch.delenv(RUN_ID_ENV)
    seal = RunSeal(new_key().encode(), new_run_id())
    location = _claimed(tmp_path / "run", seal)
    with pytest.raises(UsageError, match=f"set {KEY_ENV} and {RUN_ID_ENV}"):
        runkey.seal_for(location)
    path = runkey.remember(location.uri, seal)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert runkey.seal_for(location) == seal
    # Another run's location is not authenticated by this run's key.
    elsewhere = _claimed(tmp_path / "other", RunSeal(new_key().encode(), new_run_id()))
    assert runkey.recall(elsewhere) is None
    # What the environment says comes first: the kept run id with the key given.
    monkeypatch.setenv(KEY_ENV, seal.key.decode())
    assert runkey.seal_for(location) == seal
    # A key that does not hold: the run kept for this place, for check_seal to refuse.
    other = new_key()
    monkeypatch.setenv(KEY_ENV, other)
    assert runkey.seal_for(location) == RunSeal(other.encode(), seal.run)
    moved = shutil.copytree(tmp_path / "run", tmp_path / "copy")
    with pytest.raises(UsageError, match=f"set {RUN_ID_ENV}"):
        runkey.seal_for(RunLocation.open(str(moved)))
    monkeypatch.setenv(RUN_ID_ENV, "run-z")
    assert runkey.seal_for(location).run == "run-z"
    monkeypatch.delenv(KEY_ENV)
    monkeypatch.delenv(RUN_ID_ENV)
    # A key file others could have written is not used.
    os.chmod(path, 0o644)
    assert runkey.recall(location) is None
    os.chmod(path, 0o600)
    # Its key is held to a key's one form (64 hex characters), as any key is.
    for bad in ("short", "z" * 64):
        path.write_text(json.dumps({"uri": location.uri, "run": seal.run, "key": bad}))
        assert runkey.recall(location) is None


@pytest.mark.parametrize("how", ["mv", "cp -r"])
def test_a_moved_or_copied_run_is_found_by_its_run_not_its_path(
        how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv(KEY_ENV)
    monkeypatch.delenv(RUN_ID_ENV)
    seals = [RunSeal(new_key().encode(), new_run_id()) for _ in range(3)]
    for i, seal in enumerate(seals):
        runkey.remember(_claimed(tmp_path / f"run-{i}", seal).uri, seal)
    move = shutil.move if how == "mv" else shutil.copytree
    move(tmp_path / "run-1", tmp_path / "moved")
    assert runkey.seal_for(RunLocation.open(str(tmp_path / "moved"))) == seals[1]


def test_the_keys_folder_keeps_the_runs_used_last(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(runkey, "KEEP_KEYS", 3)
    paths = []
    start = time.time() - 100
    for i in range(3):
        paths.append(runkey.remember(str(tmp_path / f"run-{i}"),
                                     RunSeal(new_key().encode(), new_run_id())))
        os.utime(paths[-1], (start + i, start + i))
    # A fourth run: the one used longest ago goes (beyond KEEP_KEYS).
    newest = runkey.remember(str(tmp_path / "run-3"), RunSeal(new_key().encode(), new_run_id()))
    assert not paths[0].exists() and paths[1].exists() and paths[2].exists()
    # Later, those unused for KEEP_DAYS go too.
    gone = runkey.prune(runkey.keys_folder(), now=start + 2 + runkey.KEEP_DAYS * 86400)
    assert gone == [paths[1]] and newest.exists()

"""Unit tests for cut points, beacons, failure markers and SIGTERM handling, and for the
run-directory and checkpoint-root checks of a worker."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest

from resumequal.checkpoint import FolderRoot, RemoteRoot
from resumequal.errors import TrainingError
from resumequal.run.beacons import KillOrder
from resumequal.run.layout import FAILED_MARKER, RUN_FILE
from resumequal.run.legfiles import LegFiles
from resumequal.spec import QualificationSpec, SpecError, parse_spec
from resumequal.train.preemption import (
    Arming,
    CutPoint,
    StopFlag,
    check_not_failed,
    order_applies,
    write_beacon,
)
from resumequal.train.worker import check_run_dir, checkpoint_root, claim_run_dir

CUT = CutPoint(step=6, microstep=1, rank=1, at="microbatch", arm_timeout=0.05)


def _arming(
    tmp_path: Path, cut: CutPoint | None = CUT, *, rank: int = 1, attempt: int = 0,
    stop: StopFlag | None = None, arms: list[tuple[int, int, str]] | None = None,
) -> Arming:
    def on_arm(step: int, microstep: int, where: str) -> None:
        if arms is not None:
            arms.append((step, microstep, where))

    return Arming(cut, rank=rank, attempt=attempt, files=LegFiles.folder(tmp_path),
                  stop=stop or StopFlag(), on_arm=on_arm)


# --- beacons ---------------------------------------------------------------------------------


def test_write_beacon_publishes_the_pid_to_kill(tmp_path: Path) -> None:
    before = time.time()
    path = Path(write_beacon(LegFiles.folder(tmp_path), rank=1, attempt=0, step=6, microstep=1,
                             where="microbatch"))
    assert path == tmp_path / "beacons" / "attempt-0-rank-1.json"
    body = json.loads(path.read_text())
    assert body["pid"] == os.getpid()
    assert body["host"] == socket.gethostname()
    assert (body["rank"], body["attempt"], body["step"], body["microstep"], body["at"]) == (
        1, 0, 6, 1, "microbatch")
    assert before <= body["armedAt"] <= time.time()
    # Atomic: the temporary file was renamed away, nothing else is in the folder.
    assert [p.name for p in (tmp_path / "beacons").iterdir()] == ["attempt-0-rank-1.json"]


def test_write_beacon_replaces_an_older_beacon(tmp_path: Path) -> None:
    files = LegFiles.folder(tmp_path)
    write_beacon(files, rank=0, attempt=2, step=3, microstep=0, where="microbatch")
    path = Path(write_beacon(files, rank=0, attempt=2, step=4, microstep=2,
                             where="checkpoint_commit"))
    body = json.loads(path.read_text())
    assert (body["step"], body["microstep"], body["at"]) == (4, 2, "checkpoint_commit")
    assert len(list((tmp_path / "beacons").iterdir())) == 1


# --- arming ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cut", "rank", "attempt", "position"),
    [
        pytest.param(None, 1, 0, (6, 1, "microbatch"), id="no-cut"),
        pytest.param(CUT, 0, 0, (6, 1, "microbatch"), id="other-rank"),
        pytest.param(CUT, 1, 0, (5, 1, "microbatch"), id="other-step"),
        pytest.param(CUT, 1, 0, (6, 0, "microbatch"), id="other-microstep"),
        pytest.param(CUT, 1, 0, (6, 1, "checkpoint_commit"), id="other-place"),
        pytest.param(CUT, 1, 1, (6, 1, "microbatch"), id="restarted-attempt"),
    ],
)
def test_maybe_hold_passes_through_when_not_armed(
    tmp_path: Path, cut: CutPoint | None, rank: int, attempt: int,
    position: tuple[int, int, str],
) -> None:
    arms: list[tuple[int, int, str]] = []
    arming = _arming(tmp_path, cut, rank=rank, attempt=attempt, arms=arms)
    assert not arming.armed_at(*position)
    arming.maybe_hold(*position)  # an armed hold would raise after CUT.arm_timeout
    assert arms == []
    assert not (tmp_path / "beacons").exists()
    assert not (tmp_path / FAILED_MARKER).exists()


def test_armed_at_matches_exactly_the_cut(tmp_path: Path) -> None:
    assert _arming(tmp_path).armed_at(6, 1, "microbatch")


def test_hold_past_the_arm_timeout_fails_the_leg_for_good(tmp_path: Path) -> None:
    arms: list[tuple[int, int, str]] = []
    arming = _arming(tmp_path, CUT, arms=arms)
    check_not_failed(LegFiles.folder(tmp_path))  # nothing has failed yet
    start = time.monotonic()
    with pytest.raises(TrainingError) as info:
        arming.maybe_hold(6, 1, "microbatch")
    elapsed = time.monotonic() - start
    reason = str(info.value)
    assert reason.startswith("rank 1 held at the cut (step 6, microstep 1, microbatch) for 0.05s")
    assert "timeouts.armSeconds" in reason
    assert CUT.arm_timeout <= elapsed < 5
    assert arms == [(6, 1, "microbatch")]
    assert json.loads((tmp_path / "beacons" / "attempt-0-rank-1.json").read_text())["step"] == 6

    marker = json.loads((tmp_path / FAILED_MARKER).read_text())
    assert marker["reason"] == reason
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FAILED.json", "beacons"]
    with pytest.raises(TrainingError) as again:
        check_not_failed(LegFiles.folder(tmp_path))
    assert str(again.value) == f"this leg has already failed: {reason}"


def test_unreadable_failure_marker_still_stops_the_leg(tmp_path: Path) -> None:
    (tmp_path / FAILED_MARKER).write_text("{not json")
    with pytest.raises(TrainingError, match="already failed: unreadable failure marker"):
        check_not_failed(LegFiles.folder(tmp_path))


def test_sigterm_flag_releases_an_armed_hold(tmp_path: Path) -> None:
    stop = StopFlag()
    cut = CutPoint(step=3, microstep=0, rank=0, at="checkpoint_commit", arm_timeout=30.0)
    arming = _arming(tmp_path, cut, rank=0, stop=stop)

    def request() -> None:
        stop.requested = True

    timer = threading.Timer(0.2, request)
    start = time.monotonic()
    timer.start()
    try:
        arming.maybe_hold(3, 0, "checkpoint_commit")
    finally:
        timer.cancel()
    elapsed = time.monotonic() - start
    assert 0.2 <= elapsed < 5
    assert (tmp_path / "beacons" / "attempt-0-rank-0.json").exists()
    assert not (tmp_path / FAILED_MARKER).exists()


# --- kill orders -----------------------------------------------------------------------------


def _order(pid: int, pod_uid: str | None = None,
           mode: Literal["hard", "graceful"] = "graceful") -> KillOrder:
    # An hour's grace: the watchdog of a graceful order never fires within a test.
    return KillOrder(rank=1, attempt=0, pid=pid, pod_uid=pod_uid, mode=mode,
                     grace_seconds=3600.0, issued_at=time.time())


@pytest.mark.parametrize(
    ("pid", "order_uid", "my_uid", "applies"),
    [
        pytest.param(7, None, None, True, id="pid-only"),
        pytest.param(7, None, "uid-a", True, id="pid-only-in-a-pod"),
        pytest.param(7, "uid-a", "uid-a", True, id="pid-and-pod"),
        pytest.param(8, "uid-a", "uid-a", False, id="other-pid"),
        pytest.param(7, "uid-b", "uid-a", False, id="replacement-pod"),
        pytest.param(7, "uid-a", None, False, id="pod-uid-unknown-here"),
    ],
)
def test_an_order_applies_to_its_pid_and_pod_only(
    pid: int, order_uid: str | None, my_uid: str | None, applies: bool
) -> None:
    assert order_applies(_order(pid, order_uid), 7, my_uid) is applies


def _hold_with_order(tmp_path: Path, order: KillOrder, arm_timeout: float) -> Arming:
    """Arm rank 1 with the order already in the store; hold until released or failed."""
    LegFiles.folder(tmp_path).write_kill_order(order)
    cut = CutPoint(step=6, microstep=1, rank=1, at="microbatch", arm_timeout=arm_timeout)
    return _arming(tmp_path, cut)


def test_a_graceful_order_for_this_process_stops_it_and_arms_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_UID", "uid-a")
    arming = _hold_with_order(tmp_path, _order(os.getpid(), "uid-a"), arm_timeout=30)
    start = time.monotonic()
    try:
        arming.maybe_hold(6, 1, "microbatch")
        assert time.monotonic() - start < 5
        assert arming.stop.requested
        assert arming.watchdog is not None and arming.watchdog.daemon
        assert arming.watchdog.is_alive()  # SIGKILL after the grace, unless we exit first
    finally:
        if arming.watchdog is not None:
            arming.watchdog.cancel()
    assert not (tmp_path / FAILED_MARKER).exists()


@pytest.mark.parametrize(
    ("pid_offset", "order_uid"),
    [pytest.param(0, "uid-b", id="replacement-pod"), pytest.param(1, None, id="other-pid")],
)
def test_an_order_for_another_pod_or_pid_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    pid_offset: int, order_uid: str | None,
) -> None:
    monkeypatch.setenv("POD_UID", "uid-a")
    # A hard order: obeyed, it would SIGKILL this test process.
    order = _order(os.getpid() + pid_offset, order_uid, mode="hard")
    arming = _hold_with_order(tmp_path, order, arm_timeout=0.7)
    with pytest.raises(TrainingError, match="without being killed"):
        arming.maybe_hold(6, 1, "microbatch")
    assert not arming.stop.requested and arming.watchdog is None
    ignored = [r for r in caplog.records if "ignoring a kill order" in r.getMessage()]
    assert len(ignored) == 1  # read about every 0.2 s, reported once
    assert (tmp_path / FAILED_MARKER).exists()


def test_an_order_written_while_holding_is_read_within_the_poll(tmp_path: Path) -> None:
    arming = _arming(tmp_path, CutPoint(step=6, microstep=1, rank=1, at="microbatch",
                                        arm_timeout=30))
    timer = threading.Timer(0.3, LegFiles.folder(tmp_path).write_kill_order,
                            args=(_order(os.getpid()),))
    start = time.monotonic()
    timer.start()
    try:
        arming.maybe_hold(6, 1, "microbatch")
    finally:
        timer.cancel()
        if arming.watchdog is not None:
            arming.watchdog.cancel()
    assert 0.3 <= time.monotonic() - start < 3
    assert arming.stop.requested


@pytest.fixture
def sigterm_handler() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.usefixtures("sigterm_handler")
def test_stop_flag_install_turns_sigterm_into_a_request() -> None:
    stop = StopFlag()
    stop.install()
    assert not stop.requested
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 5
    while not stop.requested and time.monotonic() < deadline:
        time.sleep(0.01)  # Python runs the handler in the main thread between bytecodes
    assert stop.requested


# --- run directory ---------------------------------------------------------------------------


def test_claim_run_dir_ties_a_new_dir_to_the_spec(tmp_path: Path) -> None:
    spec = parse_spec({"training": {"seed": 3}})
    run_dir = tmp_path / "runs" / "r1"
    claim_run_dir(run_dir, spec)
    body = json.loads((run_dir / RUN_FILE).read_text())
    assert body["spec_digest"] == spec.digest()
    assert parse_spec(body["spec"]) == spec
    check_run_dir(run_dir, spec)
    check_run_dir(run_dir, parse_spec({"training": {"seed": 3}}))


def test_run_dir_of_another_spec_is_refused_and_kept(tmp_path: Path) -> None:
    mine = parse_spec({"training": {"seed": 3}})
    theirs = parse_spec({"training": {"seed": 4}})
    claim_run_dir(tmp_path, mine)
    original = (tmp_path / RUN_FILE).read_text()
    claim_run_dir(tmp_path, theirs)  # an existing claim is left alone
    assert (tmp_path / RUN_FILE).read_text() == original
    with pytest.raises(TrainingError) as info:
        check_run_dir(tmp_path, theirs)
    msg = str(info.value)
    assert f"run directory {tmp_path} belongs to another run" in msg
    assert mine.digest()[:12] in msg and theirs.digest()[:12] in msg
    check_run_dir(tmp_path, mine)


def test_dir_without_run_file_is_not_a_run_dir(tmp_path: Path) -> None:
    with pytest.raises(TrainingError, match=f"is not a run directory \\(no {RUN_FILE}\\)"):
        check_run_dir(tmp_path, QualificationSpec())


def test_unreadable_run_file(tmp_path: Path) -> None:
    (tmp_path / RUN_FILE).write_text('{"spec": {}}')
    with pytest.raises(TrainingError, match="unreadable run file"):
        check_run_dir(tmp_path, QualificationSpec())


# --- checkpoint root -------------------------------------------------------------------------


def _with_store(store: str | None) -> QualificationSpec:
    return parse_spec({"checkpoint": {"store": store}})


def test_checkpoint_root_defaults_to_the_leg_folder(tmp_path: Path) -> None:
    assert checkpoint_root(_with_store(None), tmp_path, "preempted") == FolderRoot(
        tmp_path / "preempted" / "checkpoints")


def test_checkpoint_root_under_a_plain_path(tmp_path: Path) -> None:
    spec = _with_store(str(tmp_path / "ckpts"))
    assert checkpoint_root(spec, Path("/elsewhere"), "control") == FolderRoot(
        tmp_path / "ckpts" / "control" / "checkpoints")


def test_checkpoint_root_under_a_file_uri(tmp_path: Path) -> None:
    spec = _with_store(f"file://{tmp_path}/ckpts")
    assert checkpoint_root(spec, Path("/elsewhere"), "control") == FolderRoot(
        tmp_path / "ckpts" / "control" / "checkpoints")


def test_a_file_uri_with_a_host_is_refused_by_the_spec() -> None:
    with pytest.raises(SpecError, match="no host"):
        _with_store("file://data/ckpts")


@pytest.mark.usefixtures("aws_env")  # no credential lookup over the network
def test_checkpoint_root_on_s3_is_a_remote_root(tmp_path: Path) -> None:
    root = checkpoint_root(_with_store("s3://bucket/prefix"), tmp_path, "control")
    assert isinstance(root, RemoteRoot)
    assert root.uri() == "s3://bucket/prefix/control/checkpoints"


def test_other_object_stores_are_refused_by_the_spec() -> None:
    with pytest.raises(SpecError, match="scheme 'az' is not supported"):
        _with_store("az://bucket/prefix")

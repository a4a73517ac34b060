"""What a run reads back from its store and acts on is its own: every small object
(beacons, kill orders, pod kill records, completion and failure markers, the run's and the
legs' specs, run.json) carries its MAC, bound to the run and the name it was written
under, and result files (verdict.json, zoom.json) a ``.mac`` beside them. Whoever can
write the store but holds no key (a bucket writer) gets nothing of theirs acted on."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from resumequal.errors import CheckpointError, NotAuthentic, ReportError, TrainingError
from resumequal.results.verdict import Result
from resumequal.run.beacons import KillOrder, PodKill
from resumequal.run.location import RunLocation
from resumequal.run.signing import RunSeal, derive_run_key, new_key
from resumequal.spec import QualificationSpec, SpecError
from resumequal_operator.runkeys import MasterKey
from testing.operator.workers import verdict

KEY = new_key().encode()


def _at(root: Path, run: str = "run-a", key: bytes = KEY) -> RunLocation:
    return RunLocation.open(str(root), seal=RunSeal(key, run))


def _order(rank: int = 1) -> KillOrder:
    return KillOrder(rank=rank, attempt=0, pid=4242, mode="hard", grace_seconds=0,
                     issued_at=100.0)


def _tamper(root: Path, key: str, **changes: object) -> None:
    """Change fields of a stored object as a bucket writer would: its MAC kept."""
    path = root / key
    body = json.loads(path.read_text())
    path.write_text(json.dumps({**body, **changes}))


def test_objects_of_the_run_read_back(tmp_path: Path) -> None:
    loc = _at(tmp_path)
    files = loc.leg("preempted")
    files.write_beacon(1, 0, step=4, microstep=1, where="microbatch")
    files.write_kill_order(_order())
    files.write_pod_kill(PodKill(rank=1, attempt=0, pod="p-worker-1", mode="hard",
                                 grace_seconds=0, issued_at=101.0))
    files.mark_rank_done(0, 1, 6)
    files.mark_failed("out of memory")
    spec = QualificationSpec()
    loc.write_spec(spec)
    loc.write_leg_spec("preempted", spec, ["rng"])
    assert loc.claim(spec)
    loc.check_claim(spec)
    beacon = files.read_beacon(1, 0)
    assert beacon is not None and beacon.rank == 1 and "mac" not in beacon.model_dump()
    assert files.read_kill_order(1, 0) == _order()
    pod_kill = files.read_pod_kill(1, 0)
    assert pod_kill is not None and pod_kill.pod == "p-worker-1"
    assert loc.ranks_done("preempted") == {0}
    assert files.failure() == "out of memory"
    assert loc.read_spec() == spec
    leg = loc.read_leg_spec("preempted")
    assert leg is not None and leg.omit == ["rng"] and leg.spec == spec
    # Each stored object says what it is to a person reading it, and carries its MAC.
    stored = json.loads((tmp_path / "preempted/beacons/kill-attempt-0-rank-1.json").read_text())
    assert stored["pid"] == 4242 and len(stored["mac"]) == 64


@pytest.mark.parametrize("writer", ["no key", "another run", "another key"])
def test_a_kill_order_not_of_this_run_is_refused(tmp_path: Path, writer: str) -> None:
    order = _order()
    key = "preempted/beacons/kill-attempt-0-rank-1.json"
    if writer == "no key":
        (tmp_path / key).parent.mkdir(parents=True)
        (tmp_path / key).write_text(order.model_dump_json())
    else:
        other = _at(tmp_path, run="run-b") if writer == "another run" \
            else _at(tmp_path, key=new_key().encode())
        other.write_kill_order("preempted", order)
    with pytest.raises(NotAuthentic, match="not a kill order of this run"):
        _at(tmp_path).leg("preempted").read_kill_order(1, 0)


def test_a_changed_field_or_a_copy_under_another_name_is_refused(tmp_path: Path) -> None:
    loc = _at(tmp_path)
    files = loc.leg("preempted")
    files.write_beacon(1, 0, step=4, microstep=1, where="microbatch")
    files.write_kill_order(_order())
    # A bucket writer points the kill at another process, keeping the MAC.
    _tamper(tmp_path, "preempted/beacons/kill-attempt-0-rank-1.json", pid=1)
    with pytest.raises(NotAuthentic):
        files.read_kill_order(1, 0)
    # ... or copies rank 1's beacon (another pid, another pod) as rank 0's.
    src = tmp_path / "preempted/beacons/attempt-0-rank-1.json"
    (tmp_path / "preempted/beacons/attempt-0-rank-0.json").write_bytes(src.read_bytes())
    with pytest.raises(NotAuthentic, match="not a beacon of this run"):
        files.read_beacon(0, 0)
    # ... or the control leg's spec as the preempted leg's.
    spec = QualificationSpec()
    loc.write_leg_spec("control", spec, [])
    (tmp_path / "legs/preempted.spec.json").write_bytes(
        (tmp_path / "legs/control.spec.json").read_bytes())
    with pytest.raises(NotAuthentic, match="not a leg spec of this run"):
        loc.read_leg_spec("preempted")


def test_a_leg_spec_a_bucket_writer_changed_is_never_run(tmp_path: Path) -> None:
    """The attack of the issue: a changed workload module (code the workers import) or S3
    endpoint (where their signed requests go) in legs/<leg>.spec.json."""
    loc = _at(tmp_path)
    loc.write_leg_spec("control", QualificationSpec(), [])
    loc.write_spec(QualificationSpec())
    for key in ("legs/control.spec.json", "spec.json"):
        body = json.loads((tmp_path / key).read_text())
        spec = body.get("spec", body)
        spec["workload"]["name"] = "attacker_module:build"
        (tmp_path / key).write_text(json.dumps(body))
    with pytest.raises(NotAuthentic):
        loc.read_leg_spec("control")
    # The comparator has no spec to judge by: as one that does not parse.
    with pytest.raises(SpecError, match="not the run's spec of this run"):
        loc.read_spec()


def test_markers_not_of_this_run_count_for_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    loc = _at(tmp_path)
    other = _at(tmp_path, run="run-b").leg("control")
    other.mark_rank_done(0, 0, 6)
    other.mark_failed("planted")
    (tmp_path / "control/done/rank-1.json").write_text('{"rank": 1}')
    with caplog.at_level(logging.WARNING, logger="resumequal.run"):
        assert loc.ranks_done("control") == set()
        assert loc.leg("control").failure() is None
    assert "control/FAILED.json" in caplog.text and "not a failure marker" in caplog.text
    # The run's own marker counts, and is read once (markers are final).
    loc.leg("control").mark_rank_done(0, 0, 6)
    assert loc.ranks_done("control") == {0}
    (tmp_path / "control/done/rank-0.json").write_text("{}")
    assert loc.ranks_done("control") == {0}


@pytest.mark.parametrize("planted", [
    b"not json", b"[" * 100_000, b'{"reason": ' + b"9" * 5000 + b"}", b'{"reason": 1e999}',
    b'{"reason": "x", "mac": "' + b"0" * 64 + b'"}', b"\xff\xfe",
], ids=["text", "deep", "long-int", "infinity", "forged-mac", "binary"])
def test_a_failure_marker_that_does_not_authenticate_is_ignored_whatever_its_form(
    planted: bytes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    loc = _at(tmp_path)
    (tmp_path / "control").mkdir()
    (tmp_path / "control/FAILED.json").write_bytes(planted)
    with caplog.at_level(logging.WARNING, logger="resumequal.run"):
        assert loc.leg_failure("control") is None
        assert loc.leg_failure("control") is None  # read again, said once
    said = [r for r in caplog.records if "control/FAILED.json" in r.getMessage()]
    assert len(said) == 1 and "not a failure marker of this run" in said[0].getMessage()


def test_run_json_of_another_run_is_refused(tmp_path: Path) -> None:
    spec = QualificationSpec()
    assert _at(tmp_path, run="run-b").claim(spec)
    with pytest.raises(TrainingError, match="not a run file of this run"):
        _at(tmp_path).check_claim(spec)


def test_a_verdict_is_read_only_with_its_mac(tmp_path: Path) -> None:
    loc = _at(tmp_path)
    body = verdict(Result.FAIL).model_dump_json().encode()
    loc.put_result("verdict.json", body)
    read = loc.read_verdict()
    assert read is not None and read.result == Result.FAIL
    # Turned into a PASS by whoever can write the store: the MAC beside it no longer holds.
    (tmp_path / "verdict.json").write_bytes(verdict(Result.PASS).model_dump_json().encode())
    with pytest.raises(ReportError, match=r"verdict\.json: not this run's"):
        loc.read_verdict()
    # Another run's verdict and MAC, copied over both.
    other = tmp_path / "b"
    _at(other, run="run-b").put_result("verdict.json", body)
    for name in ("verdict.json", "verdict.json.mac"):
        (tmp_path / name).write_bytes((other / name).read_bytes())
    with pytest.raises(ReportError, match="not this run's"):
        loc.read_verdict()
    # No MAC at all.
    (tmp_path / "verdict.json.mac").unlink()
    with pytest.raises(ReportError, match=r"verdict\.json\.mac is missing"):
        loc.read_verdict()


def test_published_results_get_their_macs(tmp_path: Path) -> None:
    loc = _at(tmp_path / "run")
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text('{"a": 1}')
    loc.publish({"report.json": out / "report.json"})
    assert loc.read_result("report.json") == b'{"a": 1}'
    with pytest.raises(NotAuthentic):
        _at(tmp_path / "run", run="run-b").read_result("report.json")


def test_the_operators_run_keys(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text(new_key() + "\n")
    path.chmod(0o440)
    master = MasterKey.from_file(path)
    assert repr(master) == "MasterKey(...)" and path.read_text().strip() not in repr(master)
    # What the operator seals with is what the run's pods hold: their Secret's key.
    seal = master.seal("uid-1")
    assert seal == RunSeal(master.run_key("uid-1").encode(), "uid-1")
    assert master.run_key("uid-1") != master.run_key("uid-2")
    assert master.run_key("uid-1") == derive_run_key(path.read_text().strip().encode(), "uid-1")
    # A run key opens nothing of another run.
    loc = tmp_path / "loc"
    RunLocation.open(str(loc), seal=master.seal("uid-2")).leg("p").write_kill_order(_order())
    with pytest.raises(NotAuthentic):
        RunLocation.open(str(loc), seal=seal).leg("p").read_kill_order(1, 0)


@pytest.mark.parametrize(("content", "mode", "error"), [
    ("a" * 64, 0o440, "not random"),
    ("0123456789abcdef", 0o440, "16 characters"),
    (new_key(), 0o666, "others may write it"),
    (new_key(), 0o460, "others may write it"),
    (new_key(), 0o644, "everyone may read it"),
    (new_key(), 0o404, "everyone may read it"),
    ("abcdefghi" * 8, 0o400, "72 characters"),
    ("x" * 5000, 0o440, "too large"),
])
def test_a_master_key_file_that_is_not_one_is_refused_naming_the_file(
    tmp_path: Path, content: str, mode: int, error: str
) -> None:
    path = tmp_path / "key"
    path.write_text(content)
    path.chmod(mode)
    with pytest.raises(CheckpointError, match=error) as e:
        MasterKey.from_file(path)
    assert str(path) in str(e.value) and content[:64] not in str(e.value)


def test_a_master_key_file_of_another_user_a_fifo_or_a_folder_is_refused_at_once(
    tmp_path: Path
) -> None:
    path = tmp_path / "key"
    os.mkfifo(path, 0o440)
    with pytest.raises(CheckpointError, match=r"not a regular file .*is a FIFO"):
        MasterKey.from_file(path)  # not a wait for a writer that never comes
    with pytest.raises(CheckpointError, match="cannot read it: is a folder"):
        MasterKey.from_file(tmp_path)
    if os.getuid() == 0:  # only root can give a file away
        other = tmp_path / "other"
        other.write_text(new_key())
        other.chmod(0o400)
        os.chown(other, 12345, -1)
        with pytest.raises(CheckpointError, match="owned by uid 12345, neither root nor"):
            MasterKey.from_file(other)


def test_a_secret_volume_s_key_file_is_a_valid_key_file(tmp_path: Path) -> None:
    """As the kubelet mounts the chart's Secret: root's file, 0440 for the pod's fsGroup,
    reached through the volume's links (..data/key)."""
    data = tmp_path / "..2026_01_01" / "key"
    data.parent.mkdir()
    data.write_text(new_key())
    data.chmod(0o440)
    if os.getuid() == 0:
        os.chown(data, 0, 65532)
    (tmp_path / "..data").symlink_to(data.parent.name)
    (tmp_path / "key").symlink_to("..data/key")
    assert MasterKey.from_file(tmp_path / "key").run_key("uid-1")


def test_a_run_id_cannot_be_smuggled_into_a_derived_key() -> None:
    with pytest.raises(CheckpointError, match="run uid"):
        derive_run_key(KEY, "uid\0other")


def test_a_leg_specs_missing_spec_error_still_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "legs").mkdir()
    (tmp_path / "legs/control.spec.json").write_text("{not json")
    # With the run's seal what is not JSON is no spec file of this run, said by name.
    with pytest.raises(NotAuthentic, match=r"control\.spec\.json: not a leg spec of this run: "
                       "not JSON"):
        _at(tmp_path).read_leg_spec("control")
    with pytest.raises(SpecError, match=r"control\.spec\.json: not JSON"):
        RunLocation.open(str(tmp_path)).read_leg_spec("control")

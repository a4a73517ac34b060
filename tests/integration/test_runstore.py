"""RunLocation against a local folder and a real S3 server (SeaweedFS over HTTP)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from resumequal.errors import ReportError, StoreError, TraceError, TrainingError
from resumequal.results.verdict import Cut, Result, Verdict
from resumequal.run.beacons import KillOrder
from resumequal.run.layout import SMALL_OBJECT_BYTES
from resumequal.run.legfiles import LegFiles
from resumequal.run.location import RunLocation
from resumequal.run.progress import LegProgress
from resumequal.spec import QualificationSpec, SpecError, parse_spec
from resumequal.store import StoreAccessDenied, StoreObjectTooLarge, StoreUnavailable
from resumequal.store.gcssettings import GCSSettings
from resumequal.store.log import parse_segment, segment_bytes
from resumequal.store.s3settings import S3Settings
from testing.trace_records import startup_record, step_record, trace_line

if TYPE_CHECKING:
    from tests.gcsserver import FakeGCS
    from tests.s3server import SeaweedFS

pytest_plugins = ("tests.s3server", "tests.gcsserver")

Opener = Callable[[], RunLocation]


def _step(rank: int, attempt: int, step: int, finished_at: float = 1.0) -> bytes:
    return trace_line(step_record(rank, attempt, step, finished_at))


def _start(rank: int, attempt: int) -> bytes:
    return trace_line(startup_record(rank, attempt))


def _verdict(result: Result = Result.PASS) -> Verdict:
    return Verdict(result=result, reason="exact", cut=Cut(step=6, microstep=1, rank=1,
                   mode="hard", at="microbatch"), resumed_from="step-00000004",
                   first_divergence=None, exact_through_step=12, checks=[])


@pytest.fixture(params=["folder", "s3", "gs"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> RunLocation:
    if request.param == "folder":
        return RunLocation.open(str(tmp_path / "run"))
    if request.param == "gs":
        gcs: FakeGCS = request.getfixturevalue("gcs_server")
        return RunLocation.open(f"gs://{gcs.new_bucket()}/rq/local/q1/abc123",
                                GCSSettings(endpoint_url=gcs.endpoint))
    server: SeaweedFS = request.getfixturevalue("s3_server")
    request.getfixturevalue("aws_env")
    bucket = server.new_bucket()
    return RunLocation.open(f"s3://{bucket}/rq/local/q1/abc123",
                            S3Settings(endpoint_url=server.endpoint, addressing_style="path"))


def _append(location: RunLocation, leg: str, rank: int, attempt: int,
            lines: list[bytes]) -> None:
    """Write trace lines the way the workers of this location do."""
    sink = location.trace_sink(leg, rank, attempt)
    for line in lines:
        sink.append(line)
    sink.close()


# --- both layouts ----------------------------------------------------------------------------


def test_url_names_artifacts_under_the_location(location: RunLocation) -> None:
    url = location.url("report.html")
    assert url.endswith("/report.html")
    assert url == f"{location.uri}/report.html"
    assert url.startswith(("s3://", "gs://") if location.store.shared() else "/")


def test_claim_then_check_and_refuse_another_spec(location: RunLocation) -> None:
    mine, theirs = parse_spec({"training": {"seed": 3}}), parse_spec({"training": {"seed": 4}})
    with pytest.raises(TrainingError, match=r"is not a run directory \(no run.json\)"):
        location.check_claim(mine)
    assert location.claim(mine) is True
    assert location.claim(theirs) is False  # an existing claim is left alone
    location.check_claim(mine)
    with pytest.raises(TrainingError, match="belongs to another run"):
        location.check_claim(theirs)


def test_leg_spec_round_trip_with_omissions(location: RunLocation) -> None:
    spec = parse_spec({"training": {"seed": 5}})
    assert location.read_leg_spec("control-rng") is None
    location.write_leg_spec("control-rng", spec, ["rng"])
    got = location.read_leg_spec("control-rng")
    assert got is not None and got.omit == ["rng"] and got.leg == "control-rng"
    assert got.spec.training.seed == 5
    if not location.store.shared():
        assert got.spec == spec
    else:  # on S3 the leg's checkpoints live under the run location
        assert got.spec.checkpoint.store == location.uri
    with pytest.raises(SpecError, match="unknown omission"):
        location.write_leg_spec("control", spec, ["optimiser"])


def test_beacons_and_failure_markers(location: RunLocation) -> None:
    assert location.read_beacon("preempted", 1) is None
    assert location.leg_failure("preempted") is None
    files = location.leg("preempted")
    uri = files.write_beacon(rank=1, attempt=0, step=6, microstep=1, where="microbatch")
    assert uri.endswith("preempted/beacons/attempt-0-rank-1.json")
    beacon = location.read_beacon("preempted", 1)
    assert beacon is not None
    assert (beacon.rank, beacon.step, beacon.microstep, beacon.at) == (
        1, 6, 1, "microbatch")
    files.mark_failed("held too long")
    assert location.leg_failure("preempted") == "held too long"
    assert location.leg_failure("control") is None


def test_objects_larger_than_their_reader_takes_are_refused_unread(
        location: RunLocation) -> None:
    # A planted 1 MiB + 1 byte marker is not read whole, into a worker or the operator.
    huge = b'{"reason": "' + b"x" * SMALL_OBJECT_BYTES + b'"}'
    location.store.put_bytes("preempted/beacons/attempt-0-rank-1.json", huge)
    with pytest.raises(StoreObjectTooLarge, match=r"attempt-0-rank-1\.json: larger than"):
        location.read_beacon("preempted", 1)
    location.store.put_bytes("preempted/FAILED.json", huge)
    assert location.leg_failure("preempted") == "unreadable failure marker (too large to read)"


def test_a_beacon_names_the_pod_uid_from_the_downward_api(
    location: RunLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = location.leg("preempted")
    monkeypatch.delenv("POD_UID", raising=False)
    files.write_beacon(rank=1, attempt=0, step=6, microstep=1, where="microbatch")
    beacon = location.read_beacon("preempted", 1)
    assert beacon is not None and beacon.pod_uid is None
    monkeypatch.setenv("POD_UID", "9b2c-uid")
    monkeypatch.setenv("POD_NAME", "q1-preempted-worker-1")
    files.write_beacon(rank=1, attempt=0, step=6, microstep=1, where="microbatch")
    beacon = location.read_beacon("preempted", 1)
    assert beacon is not None
    assert (beacon.pod, beacon.pod_uid) == ("q1-preempted-worker-1", "9b2c-uid")


def test_kill_orders_round_trip_next_to_the_beacon(location: RunLocation) -> None:
    files = location.leg("preempted")
    assert files.read_kill_order(rank=1, attempt=0) is None
    order = KillOrder(rank=1, attempt=0, pid=4242, pod_uid="9b2c-uid", mode="graceful",
                      grace_seconds=20.0, issued_at=1700000000.5)
    uri = location.write_kill_order("preempted", order)
    assert uri.endswith("preempted/beacons/kill-attempt-0-rank-1.json")
    assert files.read_kill_order(rank=1, attempt=0) == order
    # Another rank or attempt has no order; the beacon's own key is untouched.
    assert files.read_kill_order(rank=0, attempt=0) is None
    assert files.read_kill_order(rank=1, attempt=1) is None
    assert location.read_beacon("preempted", 1) is None
    # A second order replaces the first (the same key).
    hard = order.model_copy(update={"mode": "hard", "pod_uid": None})
    location.write_kill_order("preempted", hard)
    assert files.read_kill_order(rank=1, attempt=0) == hard


def test_an_unreadable_kill_order_is_a_store_error_naming_it(location: RunLocation) -> None:
    files = location.leg("preempted")
    files.store.put_bytes(files.kill_order_key(1, 0), b'{"rank": 1, "pid": "x"}')
    with pytest.raises(StoreError, match=r"preempted/beacons/kill-attempt-0-rank-1\.json: "
                                         r"not a kill order"):
        files.read_kill_order(1, 0)


def test_ranks_done_lists_the_completion_markers(location: RunLocation) -> None:
    assert location.ranks_done("preempted") == set()
    files = location.leg("preempted")
    uri = files.mark_rank_done(rank=1, attempt=1, steps=12)
    assert uri.endswith("preempted/done/rank-1.json")
    assert location.ranks_done("preempted") == {1}
    files.mark_rank_done(rank=0, attempt=1, steps=12)
    files.store.put_bytes(files.key("done/notes.txt"), b"not a marker")
    assert location.ranks_done("preempted") == {0, 1}
    assert location.ranks_done("control") == set()
    body = json.loads(files.store.get_bytes(files.done_key(1)))
    assert (body["rank"], body["attempt"], body["steps"]) == (1, 1, 12)


def test_progress_counts_steps_of_every_rank_attempts_and_the_resume(
    location: RunLocation,
) -> None:
    assert location.leg_progress("preempted", 2) == LegProgress(0, 0, None)
    for rank in (0, 1):
        _append(location, "preempted", rank, 0,
                [_start(rank, 0), _step(rank, 0, 1), _step(rank, 0, 2)])
    _append(location, "preempted", 0, 0, [_step(0, 0, 3)])
    assert location.leg_progress("preempted", 2) == LegProgress(2, 1, None)
    _append(location, "preempted", 0, 1, [_start(0, 1), _step(0, 1, 3, 50.0)])
    assert location.leg_progress("preempted", 2) == LegProgress(3 - 1, 2, None)
    _append(location, "preempted", 1, 1, [_start(1, 1), _step(1, 1, 3, 60.0)])
    assert location.leg_progress("preempted", 2) == LegProgress(3, 2, 60.0)


def test_attempts_started_numbers_the_next_attempt(location: RunLocation) -> None:
    # What a worker whose store is fresh every attempt numbers its attempt by.
    assert location.attempts_started("preempted") == 0
    _append(location, "preempted", 1, 0, [_start(1, 0), _step(1, 0, 1)])
    assert location.attempts_started("preempted") == 1
    _append(location, "preempted", 0, 1, [_start(0, 1)])
    assert location.attempts_started("preempted") == 2
    assert location.attempts_started("control") == 0  # legs are counted apart


def test_verdict_round_trip_and_a_foreign_schema(location: RunLocation, tmp_path: Path) -> None:
    assert location.read_verdict() is None
    path = tmp_path / "verdict.json"
    path.write_text(_verdict().model_dump_json())
    published = location.publish({"verdict.json": path})
    assert published == {"verdict.json": location.url("verdict.json")}
    got = location.read_verdict()
    assert got is not None and got.result == Result.PASS
    path.write_text(json.dumps({"schema_version": "resumequal.dev/report/v0"}))
    location.publish({"verdict.json": path})
    with pytest.raises(ReportError, match=r"verdict.json: unknown schema_version"):
        location.read_verdict()


def test_materialize_rebuilds_a_run_folder(location: RunLocation, tmp_path: Path) -> None:
    spec = QualificationSpec()
    location.claim(spec)
    location.write_spec(spec)
    location.leg("preempted").write_beacon(1, 0, 6, 1, "microbatch")
    _append(location, "preempted", 1, 0, [_start(1, 0), _step(1, 0, 1)])
    _append(location, "preempted", 1, 1, [_start(1, 1), _step(1, 1, 1)])
    local = location.materialize(tmp_path / "copy")
    lines = (local / "preempted" / "trace" / "rank-1.jsonl").read_bytes().splitlines(True)
    assert lines == [_start(1, 0), _step(1, 0, 1), _start(1, 1), _step(1, 1, 1)]
    assert json.loads((local / "run.json").read_text())["spec_digest"] == spec.digest()
    assert (local / "preempted" / "beacons" / "attempt-0-rank-1.json").is_file()
    assert location.read_spec() == location.leg_spec(spec)


def test_delete_all_removes_everything(location: RunLocation) -> None:
    location.claim(QualificationSpec())
    location.leg("control").mark_failed("x")
    _append(location, "control", 0, 0, [_step(0, 0, 1)])
    assert location.delete_all() == 3
    assert location.leg_failure("control") is None
    with pytest.raises(SpecError, match="is not a run directory"):
        location.read_spec()


# --- S3 segments -----------------------------------------------------------------------------


@pytest.fixture
def s3_location(s3_server: SeaweedFS, aws_env: dict[str, str]) -> RunLocation:
    bucket = s3_server.new_bucket()
    return RunLocation.open(f"s3://{bucket}/rq/local/q1/uid",
                            S3Settings(endpoint_url=s3_server.endpoint, addressing_style="path"))


def test_segments_keep_order_across_ten_attempts_and_many_segments(
    s3_location: RunLocation, tmp_path: Path,
) -> None:
    s3_location.claim(QualificationSpec())
    expected = []
    for attempt in (0, 1, 2, 10):  # attempt-10 sorts after attempt-2 by number, not by text
        lines = [_start(0, attempt)] + [_step(0, attempt, s) for s in range(1, 12)]
        _append(s3_location, "control", 0, attempt, lines)
        expected += lines
    keys = [o.key for o in s3_location.store.list("control/trace")]
    assert "control/trace/rank-0/attempt-10/00000011.jsonl" in keys
    local = s3_location.materialize(tmp_path / "copy")
    got = (local / "control" / "trace" / "rank-0.jsonl").read_bytes().splitlines(True)
    assert got == expected


def test_a_sink_groups_records_and_continues_after_existing_segments(
    s3_location: RunLocation,
) -> None:
    sink = s3_location.trace_sink("control", 0, 0, every=3)
    for step in range(1, 5):
        sink.append(_step(0, 0, step))
    assert [o.key.rsplit("/", 1)[1] for o in s3_location.store.list("control/trace")] == [
        "00000000.jsonl"]
    sink.close()
    again = s3_location.trace_sink("control", 0, 0)
    assert again.seq == 2
    assert s3_location.leg_progress("control", 1).steps_done == 4


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        pytest.param(lambda b: b[: len(b) // 2], "truncated trace segment", id="truncated"),
        pytest.param(lambda b: b.replace(b'"step": 2', b'"step": 3'), "corrupted trace segment",
                     id="flipped"),
        pytest.param(lambda b: b"garbage\n", "corrupted trace segment", id="no-trailer"),
    ],
)
def test_a_damaged_segment_is_named_by_materialize_and_skipped_by_progress(
    s3_location: RunLocation, s3_server: SeaweedFS, tmp_path: Path,
    damage: Callable[[bytes], bytes], message: str,
) -> None:
    s3_location.claim(QualificationSpec())
    _append(s3_location, "control", 0, 0, [_step(0, 0, 1), _step(0, 0, 2)])
    key = "control/trace/rank-0/attempt-0/00000001.jsonl"
    full = s3_location.store.uri(key)
    bucket, _, bucket_key = full.removeprefix("s3://").partition("/")
    s3 = s3_server.client()
    body = s3.get_object(Bucket=bucket, Key=bucket_key)["Body"].read()
    s3.put_object(Bucket=bucket, Key=bucket_key, Body=damage(body))
    with pytest.raises(TraceError, match=f"{full}: {message}"):
        s3_location.materialize(tmp_path / "copy")
    assert s3_location.leg_progress("control", 1).steps_done == 1


def test_a_missing_segment_is_named(
    s3_location: RunLocation, tmp_path: Path,
) -> None:
    s3_location.claim(QualificationSpec())
    _append(s3_location, "control", 0, 0, [_step(0, 0, s) for s in (1, 2, 3)])
    s3_location.store.delete("control/trace/rank-0/attempt-0/00000001.jsonl")
    with pytest.raises(TraceError, match=r"attempt-0/00000001.jsonl: trace segment missing"):
        s3_location.materialize(tmp_path / "copy")


def test_segment_round_trip() -> None:
    data = segment_bytes([_step(0, 0, 1), _step(0, 0, 2)], seq=4)
    assert parse_segment(data, "x") == [_step(0, 0, 1), _step(0, 0, 2)]


def test_materialize_of_an_empty_prefix_says_it_is_not_a_run(
    s3_location: RunLocation, tmp_path: Path,
) -> None:
    with pytest.raises(StoreError, match=r"run.json does not exist"):
        s3_location.materialize(tmp_path / "copy")


def test_an_unreachable_store_and_wrong_credentials_are_clear_errors(
    closed_endpoint: str, s3_server: SeaweedFS, aws_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    down = RunLocation.open("s3://b/rq/ns/run/uid",
                            S3Settings(endpoint_url=closed_endpoint, max_attempts=1))
    with pytest.raises(StoreUnavailable, match=f"cannot reach {closed_endpoint}"):
        down.leg_failure("control")
    bucket = s3_server.new_bucket()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    denied = RunLocation.open(f"s3://{bucket}/rq/ns/run/uid",
                              S3Settings(endpoint_url=s3_server.endpoint, max_attempts=1))
    with pytest.raises(StoreAccessDenied) as info:
        denied.read_beacon("preempted", 1)
    assert "not-the-secret" not in str(info.value)
    assert f"s3://{bucket}/rq/ns/run/uid/preempted/beacons/attempt-0-rank-1.json" in str(
        info.value)


def test_env_endpoint_reaches_the_store_without_a_spec(
    s3_location: RunLocation, s3_server: SeaweedFS, monkeypatch: pytest.MonkeyPatch,
) -> None:
    s3_location.write_leg_spec("control", QualificationSpec(), [])
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint)
    bare = RunLocation.open(s3_location.uri)
    got = bare.read_leg_spec("control")
    assert got is not None and got.spec.checkpoint.store == s3_location.uri


def test_leg_files_of_a_folder_keep_the_old_layout(tmp_path: Path) -> None:
    files = LegFiles.folder(tmp_path)
    files.write_beacon(0, 2, 3, 0, "microbatch")
    assert [p.name for p in (tmp_path / "beacons").iterdir()] == ["attempt-2-rank-0.json"]


def test_open_refuses_other_schemes_and_a_bare_bucket() -> None:
    with pytest.raises(StoreError, match="scheme 'az' is not supported"):
        RunLocation.open("az://b/x")
    with pytest.raises(StoreError, match="name a prefix under the bucket"):
        RunLocation.open("s3://bucket")


# --- resumequal compare ----------------------------------------------------------------------


def test_compare_writes_the_result_files_into_a_folder(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from resumequal import cli
    from tests.unit.test_compare import SyntheticRun, make_spec

    root = SyntheticRun(tmp_path / "q7", spec=make_spec(controls={"enabled": False})).write()
    result = CliRunner().invoke(cli.main, ["compare", str(root), "--write", "--json",
                                           "--pin", "torch==x"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["result"] == "PASS"
    for name in ("verdict.json", "report.json", "report.html", "metrics.prom"):
        assert (root / name).is_file(), name
    assert 'run="q7"' in (root / "metrics.prom").read_text()
    verdict = RunLocation.open(str(root)).read_verdict()
    assert verdict is not None and verdict.result == Result.PASS


def test_compare_of_an_empty_s3_prefix_exits_2_naming_it(
    s3_server: SeaweedFS, aws_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from click.testing import CliRunner

    from resumequal import cli

    bucket = s3_server.new_bucket()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint)
    uri = f"s3://{bucket}/rq/ns/run/uid"
    result = CliRunner().invoke(cli.main, ["compare", uri, "--write"])
    assert result.exit_code == 2
    assert f"error: {uri}/run.json does not exist" in result.stderr


def test_trace_writer_groups_steps_but_flushes_what_the_backend_acts_on(
    s3_location: RunLocation,
) -> None:
    from resumequal.trace.records import ArmRecord, TraceWriter

    sink = s3_location.trace_sink("preempted", 1, 0, every=10)
    writer = TraceWriter(sink)
    arm = ArmRecord(rank=1, attempt=0, step=6, microstep=1, pid=7, armed_at=1.0)
    writer.write(arm)  # not a step: in the store before the beacon is written
    segments = s3_location.store.list("preempted/trace")
    assert [o.key.rsplit("/", 1)[1] for o in segments] == ["00000000.jsonl"]
    records = s3_location.traces("preempted").records_so_far(2)[1]
    assert [r.kind for r in records] == ["arm"]
    writer.close()

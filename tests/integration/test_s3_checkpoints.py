"""Checkpoints on S3 (SeaweedFS over HTTP): the commit protocol with real torchrun legs.

The workers reach the endpoint through the spec's ``checkpoint.s3.endpoint_url`` and take
the dummy credentials from the AWS_* variables they inherit from the test process.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from resumequal.checkpoint import Position, RemoteRoot, checkpoint_location, remote
from resumequal.checkpoint.manifest import Manifest
from resumequal.compare import compare_run
from resumequal.results.verdict import Result
from resumequal.run.location import RunLocation
from resumequal.spec import QualificationSpec
from resumequal.store.s3settings import S3Settings
from tests.integration import legs
from tests.integration.conftest import ControlRuns, spec_for
from tests.outage import Outage

if TYPE_CHECKING:
    from tests.s3server import SeaweedFS

pytest_plugins = ("tests.s3server",)
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("aws_env")]

STEP4 = "step-00000004"
STEP8 = "step-00000008"


def _s3_spec(endpoint: str, bucket: str, **overrides: dict[str, Any]) -> dict[str, Any]:
    spec = spec_for("dropout-mlp", **overrides)
    spec["checkpoint"].update({
        "store": f"s3://{bucket}/runs",
        "s3": {"endpoint_url": endpoint, "addressing_style": "path", "max_attempts": 3},
    })
    return spec


def _root(server: SeaweedFS, bucket: str, run_dir: Path, leg: str) -> RemoteRoot:
    """The leg's checkpoints as the workers see them, reached directly at the server."""
    where = checkpoint_location(
        f"s3://{bucket}/runs",
        S3Settings(endpoint_url=server.endpoint, addressing_style="path"),
        run_dir / "inspect",
        leg,
    )
    assert isinstance(where, RemoteRoot)
    return where


def _objects(root: RemoteRoot, name: str) -> set[str]:
    return {o.key.removeprefix(root.key(name) + "/") for o in root.store.list(root.key(name))}


def test_control_and_hard_killed_legs_on_s3_are_bitwise_identical(
    s3_server: SeaweedFS, tmp_path: Path
) -> None:
    bucket = s3_server.new_bucket()
    spec = legs.write_spec(tmp_path / "spec.yaml", _s3_spec(s3_server.endpoint, bucket))
    control = legs.launch(spec, "control", tmp_path)
    legs.preempt(spec, tmp_path, signal.SIGKILL)
    assert control.wait(240) == 0, control.tail()

    for rank in range(2):
        (restore,) = legs.restores(tmp_path, "preempted", rank)
        assert (restore.attempt, restore.checkpoint) == (1, STEP4)
    assert legs.first_divergence(tmp_path, tmp_path) is None
    for leg in ("control", "preempted"):
        root = _root(s3_server, bucket, tmp_path, leg)
        assert remote.committed(root) == [Position(4), Position(8), Position(12)]
    assert not (tmp_path / "control" / "checkpoints").exists()  # nothing local but scratch
    # The comparator reads both final checkpoints where they lie, verified, for the drift.
    verdict = compare_run(RunLocation.open(str(tmp_path)))
    assert verdict.result == Result.PASS, verdict.reason
    assert verdict.reason.startswith("exact:")


def test_a_kill_after_the_upload_before_the_marker_leaves_the_checkpoint_uncommitted(
    s3_server: SeaweedFS, control_run: ControlRuns, tmp_path: Path
) -> None:
    bucket = s3_server.new_bucket()
    spec = legs.write_spec(tmp_path / "spec.yaml", _s3_spec(
        s3_server.endpoint, bucket,
        preemption={"at": "checkpoint_commit", "step": 8, "microstep": 0}))
    lp = legs.launch(spec, "preempted", tmp_path)
    beacon = legs.wait_beacon(lp, rank=1)
    root = _root(s3_server, bucket, tmp_path, "preempted")
    # Rank 1 holds after uploading its shards; no manifest, no marker: not a checkpoint.
    held = _objects(root, STEP8)
    assert {"dcp/__1_0.distcp", "rank-1.json"} <= held
    assert not held & {"manifest.json", "manifest.hmac", "COMMITTED"}
    assert remote.committed(root) == [Position(4)]
    legs.os.kill(beacon["pid"], signal.SIGKILL)
    assert lp.wait(240) == 0, lp.tail()

    for rank in range(2):
        (restore,) = legs.restores(tmp_path, "preempted", rank)
        assert restore.checkpoint == STEP4
    assert "removed uncommitted checkpoint s3://" in lp.log.read_text()
    # The restart saved step 8 again, whole this time.
    assert remote.committed(root) == [Position(4), Position(8), Position(12)]
    assert legs.first_divergence(control_run("dropout-mlp"), tmp_path) is None


def test_a_flipped_byte_in_a_committed_object_fails_the_resume_naming_it(
    s3_server: SeaweedFS, tmp_path: Path
) -> None:
    bucket = s3_server.new_bucket()
    spec = legs.write_spec(tmp_path / "spec.yaml", _s3_spec(s3_server.endpoint, bucket))
    lp = legs.launch(spec, "preempted", tmp_path)
    beacon = legs.wait_beacon(lp, rank=1)
    root = _root(s3_server, bucket, tmp_path, "preempted")
    assert remote.committed(root) == [Position(4)]
    s3 = s3_server.client()
    key = "runs/" + root.key(STEP4, "dcp/__1_0.distcp")  # the bucket key, under the prefix
    body = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0x01  # same size: only the digest can tell
    s3.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    legs.os.kill(beacon["pid"], signal.SIGKILL)
    assert lp.wait(240) != 0

    log = lp.log.read_text()
    expected = re.escape(f"checkpoint s3://{bucket}/runs/{root.key(STEP4)} is refused: "
                         "dcp/__1_0.distcp fails its BLAKE3 check at chunk ")
    assert re.search(expected, log), lp.tail()
    assert not legs.restores(tmp_path, "preempted", 0)  # nothing was loaded


@pytest.fixture
def proxy(s3_server: SeaweedFS) -> Iterator[Outage]:
    """The S3 endpoint as the workers reach it, which the test can take down while the
    server keeps its objects (to inspect them afterwards)."""
    p = Outage(("127.0.0.1", s3_server.port))
    yield p
    p.close()


def test_an_endpoint_down_during_a_save_fails_the_leg_and_keeps_the_committed_one(
    s3_server: SeaweedFS, proxy: Outage, tmp_path: Path
) -> None:
    bucket = s3_server.new_bucket()
    # Graceful: the SIGTERM makes every rank write an emergency checkpoint, a save that
    # runs while the endpoint is down. The workers wait for the store for
    # timeouts.backendErrorSeconds (here 3 s), then give up.
    spec = legs.write_spec(tmp_path / "spec.yaml", _s3_spec(
        proxy.endpoint, bucket, preemption={"mode": "graceful"},
        timeouts={"backend_error_seconds": 3}))
    lp = legs.launch(spec, "preempted", tmp_path)
    beacon = legs.wait_beacon(lp, rank=1)
    root = _root(s3_server, bucket, tmp_path, "preempted")
    before = _contents(root, STEP4)
    proxy.close()
    legs.os.kill(beacon["pid"], signal.SIGTERM)
    assert lp.wait(240) != 0

    log = lp.log.read_text()
    # The save fails on every rank once the store's retry budget is spent, then the
    # restart stops at its first request to the store, before training.
    down = (re.escape(proxy.endpoint)
            + r" kept failing to \w+ s3://\S+ for \d+ s .*retry budget of 3 s")
    assert re.search(r"error: cannot save step-00000005\+1: .*" + down, log), lp.tail()
    assert re.search(r"error: checkpoint store s3://\S+: " + down, log), lp.tail()
    # The server kept its objects behind the cut: step 4 is still committed, whole, unchanged.
    assert remote.committed(root) == [Position(4)]
    assert _contents(root, STEP4) == before


def _contents(root: RemoteRoot, name: str) -> tuple[Manifest, dict[str, bytes]]:
    """Checkpoint ``name``'s authenticated manifest and the bytes of every object it names,
    each object of the manifest's size."""
    manifest = remote.read_manifest(root, name)
    return manifest, {rel: root.store.get_bytes(root.key(name, rel), entry.size)
                      for rel, entry in sorted(manifest.files.items())}


def test_a_missing_bucket_stops_the_leg_before_training(
    s3_server: SeaweedFS, tmp_path: Path
) -> None:
    spec = legs.write_spec(tmp_path / "spec.yaml",
                           _s3_spec(s3_server.endpoint, "rq-no-such-bucket"))
    lp = legs.launch(spec, "control", tmp_path)
    assert lp.wait(120) != 0
    assert "bucket 'rq-no-such-bucket' does not exist" in lp.log.read_text(), lp.tail()
    assert legs.steps(tmp_path, "control", 0) == {}


def test_spec_round_trip_keeps_the_s3_settings() -> None:
    spec = QualificationSpec.model_validate(_s3_spec("http://127.0.0.1:9", "b"))
    again = QualificationSpec.model_validate(spec.model_dump(mode="json", by_alias=True))
    assert again.digest() == spec.digest()
    assert again.checkpoint.s3 is not None and again.checkpoint.s3.max_attempts == 3


"""A whole qualification with its run location on S3 (SeaweedFS over HTTP).

Workers, the runner and the comparator reach the endpoint only through the standard AWS
environment (``AWS_ENDPOINT_URL_S3`` and the dummy keys), as pods on a cluster do.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from resumequal.qualify.plan import leg_module_args, local_torchrun_args
from resumequal.results.verdict import Result
from resumequal.run.location import RunLocation
from resumequal.run.signing import KEY_ENV, RUN_ID_ENV, RunSeal, new_key
from testing.ports import free_port
from tests.exposition import value
from tests.integration import legs
from tests.integration.conftest import spec_for
from tests.outage import Outage
from tests.waiting import eventually

if TYPE_CHECKING:
    from tests.s3server import SeaweedFS

pytest_plugins = ("tests.s3server",)
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("aws_env")]


def _resumequal(*args: str, env: dict[str, str],
                timeout: float = 280) -> subprocess.CompletedProcess[str]:
    return legs.resumequal(*args, env=env, columns=200, timeout=timeout)


@pytest.mark.timeout(900)
def test_a_qualification_on_s3_passes_with_every_artifact_in_the_bucket(
    s3_server: SeaweedFS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = s3_server.new_bucket()
    # The run's checkpoint key, kept for the zoom at the end.
    # (and its id, kept by `resumequal run` for compare and zoom: none in the environment)
    env = {"AWS_ENDPOINT_URL_S3": s3_server.endpoint, KEY_ENV: new_key(), RUN_ID_ENV: ""}
    run_dir = tmp_path / "q1"
    # The default spec (tiny-gpt, 2 ranks, a hard kill mid-accumulation) with one of its
    # controls, killed gracefully (the preempted leg is the hard kill): every control leg
    # takes the same path through the store (the default six run in
    # tests/integration/test_run.py, on a folder).
    proc = _resumequal("run", "--run-dir", str(run_dir), "--store", f"s3://{bucket}/rq",
                       "--set", "controls.omissions=[pending_grads]",
                       env=env, timeout=840)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    keys = {o["Key"] for page in s3_server.client().get_paginator("list_objects_v2")
            .paginate(Bucket=bucket) for o in page.get("Contents", [])}
    (uid,) = {k.split("/")[3] for k in keys}
    base = f"rq/local/q1/{uid}"
    uri = f"s3://{bucket}/{base}"
    rel = {k.removeprefix(base + "/") for k in keys}
    legs_run = ["control", "preempted", "nc-pending-grads"]
    expected = {"run.json", "spec.json", "verdict.json", "report.json", "report.html",
                "metrics.prom", "preempted/beacons/attempt-0-rank-1.json"}
    for leg in legs_run:
        expected |= {f"legs/{leg}.spec.json",
                     f"{leg}/trace/rank-0/attempt-0/00000000.jsonl",
                     f"{leg}/trace/rank-1/attempt-0/00000000.jsonl",
                     f"{leg}/checkpoints/step-00000012/COMMITTED"}
        if leg != "control":
            expected |= {f"{leg}/trace/rank-1/attempt-1/00000000.jsonl"}
    assert expected <= rel, sorted(expected - rel)
    # Every trace record is its own segment: startup, inventory, 12 steps on the control leg.
    control0 = [k for k in rel if k.startswith("control/trace/rank-0/attempt-0/")]
    assert len(control0) == 2 + 12
    # Nothing of the run but logs and staging stays on local disk.
    assert not (run_dir / "control" / "checkpoints").exists()
    assert (run_dir / "control.log").is_file()
    assert f"{uri}/report.html" in proc.stdout
    assert "PASS" in proc.stdout

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint)
    location = RunLocation.open(uri)  # the operator's view: endpoint from the environment
    verdict = location.read_verdict()
    progress = location.leg_progress("preempted", 2)
    assert verdict is not None and verdict.result == Result.PASS, verdict
    assert (progress.steps_done, progress.attempts) == (12, 2)
    assert progress.resumed_at is not None
    assert [(c.omission, c.status) for c in verdict.controls
            if c.status != "not_applicable"] == [("pending_grads", "detected")]
    report = json.loads(s3_server.client().get_object(
        Bucket=bucket, Key=f"{base}/report.json")["Body"].read())
    assert report["verdict"]["result"] == "PASS"

    # The comparator Job: a fresh process that sees only the bucket.
    s3 = s3_server.client()
    for name in ("verdict.json", "report.json", "report.html", "metrics.prom"):
        s3.delete_object(Bucket=bucket, Key=f"{base}/{name}")
    again = _resumequal("compare", uri, "--write", "--pin", "torch==test", "--json", env=env,
                        timeout=400)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    judged = json.loads(again.stdout)
    assert judged["result"] == "PASS"
    for field in ("exact_through_step", "first_divergence", "resumed_from", "cut"):
        assert judged[field] == verdict.model_dump(mode="json")[field], field
    assert [c["status"] for c in judged["controls"]] == [c.status for c in verdict.controls]
    metrics = s3.get_object(Bucket=bucket, Key=f"{base}/metrics.prom")["Body"].read().decode()
    assert value(metrics, "resumequal_qualification_passed", namespace="local", run="q1",
                 pin="torch==test") == 1.0
    html = s3.get_object(Bucket=bucket, Key=f"{base}/report.html")["Body"].read().decode()
    assert "<svg" in html and "PASS" in html
    assert json.loads(s3.get_object(Bucket=bucket, Key=f"{base}/verdict.json")["Body"]
                      .read())["result"] == "PASS"

    # resumequal zoom from the bucket alone: the resumed step replays as both legs ran it,
    # from the checkpoint in the bucket, and nothing differs.
    zoomed = _resumequal("zoom", uri, "--step", "6", env=env, timeout=400)
    assert zoomed.returncode == 0, zoomed.stdout[-3000:] + zoomed.stderr[-3000:]
    zoom = json.loads(s3.get_object(Bucket=bucket, Key=f"{base}/zoom.json")["Body"].read())
    assert [(r["leg"], r["start"], r["reproduced"]) for r in zoom["replays"]] == [
        ("control", None, True), ("preempted", "step-00000004", True)]
    assert zoom["origin_kind"] == "none" and zoom["modules"] == []
    assert zoom["modules_total"] > 10
    report = json.loads(s3.get_object(Bucket=bucket, Key=f"{base}/report.json")["Body"].read())
    assert report["zoom"]["step"] == 6


def _leg_on_s3(server: SeaweedFS, bucket: str, tmp_path: Path, leg: str,
               **overrides: dict[str, object]) -> tuple[Path, str]:
    """A leg spec written to an S3 run location; the location's URI."""
    uri = f"s3://{bucket}/rq/test/{leg}/uid"
    spec = legs.write_spec(tmp_path / "spec.yaml", spec_for("dropout-mlp", **overrides))
    location = RunLocation.open(uri, seal=RunSeal.from_env())  # as the operator seals it
    from resumequal.spec import load_spec

    loaded = load_spec(spec)
    location.write_spec(loaded)
    location.write_leg_spec(leg, loaded, [])
    return spec, uri


def _launch(uri: str, leg: str, log_dir: Path, env: dict[str, str]) -> legs.LegProcess:
    """``resumequal leg --run-dir s3://...`` under torchrun, without --spec, as a pod runs it."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{leg}.log"
    cmd = [*legs.TORCHRUN,
           *local_torchrun_args(endpoint=f"127.0.0.1:{free_port()}", nproc=2,
                                max_restarts=1),
           *leg_module_args(leg, uri, scratch=str(log_dir / "scratch"))]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                env=dict(os.environ, OMP_NUM_THREADS="1", POD_NAME="pod-a",
                                         **env), start_new_session=True)
    lp = legs.LegProcess(proc, log, log_dir, leg)
    legs.RUNNING.append(lp)
    return lp


@pytest.mark.timeout(400)
def test_an_async_saving_leg_on_s3_is_killed_and_resumes_from_the_store(
    s3_server: SeaweedFS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = s3_server.new_bucket()
    env = {"AWS_ENDPOINT_URL_S3": s3_server.endpoint}
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint)
    _, uri = _leg_on_s3(s3_server, bucket, tmp_path, "preempted",
                        checkpoint={"async": True})
    lp = _launch(uri, "preempted", tmp_path / "local", env)
    location = RunLocation.open(uri)
    beacon = None
    deadline = legs.time.monotonic() + 180
    while beacon is None and legs.time.monotonic() < deadline:
        assert lp.proc.poll() is None, lp.tail()
        beacon = location.read_beacon("preempted", 1)
        legs.time.sleep(0.1)
    assert beacon is not None, lp.tail()
    assert beacon.pod == "pod-a"
    # The arm record was uploaded before the beacon: a SIGKILL now loses no step.
    before = location.leg_progress("preempted", 2)
    assert before.steps_done == 5
    os.kill(beacon.pid, signal.SIGKILL)
    assert lp.wait(300) == 0, lp.tail()

    after = location.leg_progress("preempted", 2)
    assert (after.steps_done, after.attempts) == (12, 2)
    assert location.ranks_done("preempted") == {0, 1}
    for rank in range(2):
        (restore,) = legs.restores(uri, "preempted", rank)
        assert (restore.attempt, restore.checkpoint) == (1, "step-00000004")
        assert sorted(legs.steps(uri, "preempted", rank)) == list(range(1, 13))


@pytest.mark.timeout(200)
def test_denied_credentials_at_leg_start_fail_the_leg_naming_the_object(
    s3_server: SeaweedFS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = s3_server.new_bucket()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint)
    _, uri = _leg_on_s3(s3_server, bucket, tmp_path, "control")
    env = {"AWS_ENDPOINT_URL_S3": s3_server.endpoint,
           "AWS_SECRET_ACCESS_KEY": "rq-wrong-secret"}
    lp = _launch(uri, "control", tmp_path / "local", env)
    code = lp.wait(150)
    assert code != 0
    log = lp.log.read_text()
    assert (f"error: wrong credentials or no permission for {uri}/legs/control.spec.json"
            in log), lp.tail()
    assert "rq-wrong-secret" not in log
    # Stopped before training: no trace, no checkpoint, no claim.
    assert [o.key for o in RunLocation.open(uri).store.list()] == [
        "legs/control.spec.json", "spec.json"]


def _outage_run(s3_server: SeaweedFS, tmp_path: Path, outage: Outage, seconds: float,
                *sets: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``resumequal run`` on S3 reached through ``outage``, which goes down for ``seconds``
    once the control leg's workers have written three steps; what the run printed, and
    when the outage began (after the run's start)."""
    bucket = s3_server.new_bucket()
    env = {"AWS_ENDPOINT_URL_S3": outage.endpoint, KEY_ENV: new_key(), RUN_ID_ENV: ""}
    raw = s3_server.client()

    def steps_written() -> int:
        keys = [o["Key"] for page in raw.get_paginator("list_objects_v2").paginate(
            Bucket=bucket) for o in page.get("Contents", [])]
        return sum("/control/trace/rank-0/attempt-0/" in k for k in keys)

    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        run = pool.submit(_resumequal, "run", "--run-dir", str(tmp_path / "q1"),
                          "--store", f"s3://{bucket}/rq", "--set", "workload.name=dropout-mlp",
                          "--set", "controls.enabled=false", *(a for s in sets
                                                               for a in ("--set", s)),
                          env=env, timeout=500)
        eventually(lambda: steps_written() >= 2 + 3, 240, "three steps of the control leg",
                   interval=0.05, abort=lambda: "the run ended" if run.done() else None)
        began = time.monotonic() - started
        outage.down_for(seconds).join()
        return run.result(), began


@pytest.mark.timeout(600)
def test_a_ten_second_outage_of_the_store_is_ridden_out_by_a_local_run(
    s3_server: SeaweedFS, tmp_path: Path
) -> None:
    """Connections refused for 10 s while the control leg trains (botocore alone gives up in
    half a second): every worker's and the runner's request waits for the store to come
    back, and the qualification passes."""
    outage = Outage(("127.0.0.1", s3_server.port))
    try:
        proc, _ = _outage_run(s3_server, tmp_path, outage, 10)
    finally:
        outage.close()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "PASS" in proc.stdout
    log = (tmp_path / "q1" / "control.log").read_text()
    assert "trying again in" in log  # the workers waited out the outage


@pytest.mark.timeout(600)
def test_an_outage_past_the_budget_ends_the_run_invalid_naming_the_store_and_the_time(
    s3_server: SeaweedFS, tmp_path: Path
) -> None:
    # Down for 7 s against a budget of 4: the workers give up after 4 s of failures. The
    # report's requests, made from then on, retry for 4 s each; whether they outlast the
    # outage or not, the verdict is written into the run folder (test_runner_conclude.py).
    outage = Outage(("127.0.0.1", s3_server.port))
    try:
        proc, _ = _outage_run(s3_server, tmp_path, outage, 7,
                              "timeouts.backendErrorSeconds=4")
    finally:
        outage.close()
    assert proc.returncode == 3, proc.stdout[-4000:] + proc.stderr[-4000:]
    verdict = json.loads((tmp_path / "q1" / "verdict.json").read_text())
    assert verdict["result"] == "INVALID"
    reason = verdict["reason"]
    assert outage.endpoint in reason, reason
    assert re.search(r"(for \d+ ?s|failing for \d+s).*backendErrorSeconds", reason), reason

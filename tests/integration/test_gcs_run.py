"""A whole qualification with its run location on Cloud Storage (fake-gcs-server over
HTTP). The runner, the workers and the comparator reach it only through the store's own
environment (``STORAGE_EMULATOR_HOST``), as pods on a cluster do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from resumequal.results.verdict import Result
from resumequal.run.location import RunLocation
from resumequal.run.signing import KEY_ENV, RUN_ID_ENV, new_key
from tests.integration import legs

if TYPE_CHECKING:
    from tests.gcsserver import FakeGCS

pytest_plugins = ("tests.gcsserver",)
pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_a_qualification_on_gcs_passes_with_every_artifact_in_the_bucket(
    gcs_server: FakeGCS, gcs_env: dict[str, str], tmp_path: Path,
) -> None:
    bucket = gcs_server.new_bucket()
    env = {**gcs_env, KEY_ENV: new_key(), RUN_ID_ENV: ""}
    run_dir = tmp_path / "q1"
    proc = legs.resumequal("run", "--run-dir", str(run_dir), "--store", f"gs://{bucket}/rq",
                           "--set", "controls.omissions=[pending_grads]", env=env,
                           columns=200, timeout=840)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "PASS" in proc.stdout

    (uid,) = {o.key.split("/")[2] for o in RunLocation.open(f"gs://{bucket}/rq").store.list()}
    location = RunLocation.open(f"gs://{bucket}/rq/local/q1/{uid}")
    rel = {o.key for o in location.store.list()}
    for leg in ("control", "preempted", "nc-pending-grads"):
        assert {f"legs/{leg}.spec.json", f"{leg}/trace/rank-0/attempt-0/00000000.jsonl",
                f"{leg}/checkpoints/step-00000012/COMMITTED"} <= rel, sorted(rel)
    assert {"run.json", "spec.json", "verdict.json", "report.json", "report.html"} <= rel
    # Nothing of the run but logs and staging stays on local disk.
    assert not (run_dir / "control" / "checkpoints").exists()
    verdict = location.read_verdict()
    assert verdict is not None and verdict.result == Result.PASS, verdict
    assert [(c.omission, c.status) for c in verdict.controls
            if c.status != "not_applicable"] == [("pending_grads", "detected")]
    report = json.loads(location.store.get_bytes("report.json"))
    assert report["verdict"]["result"] == "PASS"

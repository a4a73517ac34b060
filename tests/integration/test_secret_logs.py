"""A debug-level ``resumequal`` command against a real S3 server (SeaweedFS over HTTP), with
credentials, a session token and endpoint userinfo in the environment: not one of them
reaches what the command prints, nor (for a whole run) any file it writes, here or in the
bucket. The command runs as a process of its own, so logging is configured exactly as a
user's shell gets it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.integration import legs
from tests.integration.conftest import spec_for
from tests.s3server import ACCESS_KEY, SECRET_KEY

if TYPE_CHECKING:
    from tests.s3server import SeaweedFS

pytest_plugins = ("tests.s3server",)
pytestmark = [pytest.mark.usefixtures("aws_env"), pytest.mark.timeout(120)]

TOKEN = "rq-dummy-session-token-7f3a9c"
USER, PASSWORD = "rquser", "rq-endpoint-pa55"
ROOT = Path(__file__).resolve().parents[2]


def _resumequal(*args: str, endpoint: str, timeout: float = 100,
                **extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AWS_SESSION_TOKEN": TOKEN,
           "AWS_ENDPOINT_URL_S3": endpoint.replace("://", f"://{USER}:{PASSWORD}@", 1),
           "RESUMEQUAL_S3_ADDRESSING_STYLE": "path",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "service"), str(ROOT / "operator")]),
           **extra}
    return subprocess.run([sys.executable, "-m", "resumequal", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


SECRETS = (ACCESS_KEY, SECRET_KEY, TOKEN, PASSWORD, f"{USER}:")


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def _leaks_in(data: bytes) -> list[str]:
    return [s for s in SECRETS if s.encode() in data]


def test_debug_run_against_s3_logs_no_key_token_or_userinfo(s3_server: SeaweedFS) -> None:
    bucket = s3_server.new_bucket()
    s3_server.client().put_object(Bucket=bucket, Key="runs/a/run.json", Body=b"{}")
    done = _resumequal("-v", "compare", f"s3://{bucket}/runs/a", endpoint=s3_server.endpoint)
    assert done.returncode == 2, done.stderr[-2000:]
    printed = done.stdout + done.stderr
    assert "DEBUG resumequal" in printed or "INFO botocore" in printed  # it did log
    assert "DEBUG botocore" not in printed and "DEBUG urllib3" not in printed
    assert _leaks(printed) == []


def test_default_level_prints_nothing_of_botocore(s3_server: SeaweedFS) -> None:
    bucket = s3_server.new_bucket()
    done = _resumequal("compare", f"s3://{bucket}/none", endpoint=s3_server.endpoint)
    assert done.returncode == 2
    assert "Found credentials" not in done.stderr
    assert done.stderr.startswith("error: s3://"), done.stderr[-2000:]
    assert _leaks(done.stdout + done.stderr) == []


def test_an_unreachable_endpoint_is_named_without_its_userinfo(closed_endpoint: str) -> None:
    done = _resumequal("-v", "compare", "s3://bucket/run", endpoint=closed_endpoint)
    assert done.returncode == 3  # nothing judged: worth a retry
    assert f"cannot reach {closed_endpoint.replace('://', '://***@')}" in done.stderr
    assert _leaks(done.stdout + done.stderr) == []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_debug_run_on_s3_leaves_no_key_token_or_userinfo_anywhere(
    s3_server: SeaweedFS, tmp_path: Path
) -> None:
    """A whole (small) qualification at DEBUG: every line it prints, every file it writes
    on this machine (run folder, leg logs, scratch under TMPDIR) and every object it puts
    in the bucket is free of the key, the secret, the session token and the userinfo."""
    bucket = s3_server.new_bucket()
    spec = legs.write_spec(tmp_path / "spec.yaml", spec_for(
        "dropout-mlp", training={"steps": 4, "accumulation_steps": 2},
        checkpoint={"every_steps": 2, "keep_last": 2},
        preemption={"step": 3, "microstep": 1, "rank": 1, "mode": "hard"},
        controls={"enabled": False}))
    scratch = tmp_path / "tmp"  # staging and downloaded copies: whatever is left is read
    scratch.mkdir()
    done = _resumequal("-v", "run", "--spec", str(spec), "--run-dir", str(tmp_path / "q1"),
                       "--store", f"s3://{bucket}/rq", endpoint=s3_server.endpoint,
                       timeout=540, TMPDIR=str(scratch))
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-4000:]
    assert "DEBUG resumequal" in printed  # it did log at DEBUG
    assert _leaks(printed) == []

    written = [p for p in tmp_path.rglob("*") if p.is_file() and p != spec]
    assert any(p.suffix == ".log" for p in written), written  # the legs' logs
    assert {str(p): _leaks_in(p.read_bytes()) for p in written
            if _leaks_in(p.read_bytes())} == {}

    s3 = s3_server.client()
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
            for o in page.get("Contents", [])]
    assert any(k.endswith("verdict.json") for k in keys) and any("/trace/" in k for k in keys)
    leaked = {k: found for k in keys
              if (found := _leaks_in(s3.get_object(Bucket=bucket, Key=k)["Body"].read()))}
    assert leaked == {}

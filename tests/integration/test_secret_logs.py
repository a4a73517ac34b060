"""A debug-level ``resumequal`` command against a real S3 endpoint (moto over HTTP), with
credentials, a session token and endpoint userinfo in the environment: not one of them
reaches what the command prints. The command runs as a process of its own, so logging is
configured exactly as a user's shell gets it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.s3server import ACCESS_KEY, SECRET_KEY

if TYPE_CHECKING:
    from tests.s3server import MotoServer

pytest_plugins = ("tests.s3server",)
pytestmark = [pytest.mark.usefixtures("aws_env"), pytest.mark.timeout(120)]

TOKEN = "rq-dummy-session-token-7f3a9c"
USER, PASSWORD = "rquser", "rq-endpoint-pa55"
ROOT = Path(__file__).resolve().parents[2]


def _resumequal(*args: str, endpoint: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AWS_SESSION_TOKEN": TOKEN,
           "AWS_ENDPOINT_URL_S3": endpoint.replace("://", f"://{USER}:{PASSWORD}@", 1),
           "RESUMEQUAL_S3_ADDRESSING_STYLE": "path",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "service"), str(ROOT / "operator")])}
    return subprocess.run([sys.executable, "-m", "resumequal", *args], env=env,
                          capture_output=True, text=True, timeout=100, check=False)


def _leaks(text: str) -> list[str]:
    return [s for s in (ACCESS_KEY, SECRET_KEY, TOKEN, PASSWORD, f"{USER}:") if s in text]


def test_debug_run_against_s3_logs_no_key_token_or_userinfo(moto_server: MotoServer) -> None:
    bucket = moto_server.new_bucket()
    moto_server.client().put_object(Bucket=bucket, Key="runs/a/run.json", Body=b"{}")
    done = _resumequal("-v", "compare", f"s3://{bucket}/runs/a", endpoint=moto_server.endpoint)
    assert done.returncode == 2, done.stderr[-2000:]
    printed = done.stdout + done.stderr
    assert "DEBUG resumequal" in printed or "INFO botocore" in printed  # it did log
    assert "DEBUG botocore" not in printed and "DEBUG urllib3" not in printed
    assert _leaks(printed) == []


def test_default_level_prints_nothing_of_botocore(moto_server: MotoServer) -> None:
    bucket = moto_server.new_bucket()
    done = _resumequal("compare", f"s3://{bucket}/none", endpoint=moto_server.endpoint)
    assert done.returncode == 2
    assert "Found credentials" not in done.stderr
    assert done.stderr.startswith("error: s3://"), done.stderr[-2000:]
    assert _leaks(done.stdout + done.stderr) == []


def test_an_unreachable_endpoint_is_named_without_its_userinfo(closed_endpoint: str) -> None:
    done = _resumequal("-v", "compare", "s3://bucket/run", endpoint=closed_endpoint)
    assert done.returncode == 2
    assert f"cannot reach {closed_endpoint.replace('://', '://***@')}" in done.stderr
    assert _leaks(done.stdout + done.stderr) == []

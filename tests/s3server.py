"""Real S3 endpoints for tests, on 127.0.0.1: SeaweedFS, a real S3 server, and moto's
server as a subprocess (with S3's atomic conditional writes, :mod:`tests.moto_s3`).

``s3_server`` is SeaweedFS (``weed mini``, :mod:`testing.cluster.seaweed`), one for the
session, built from its Go module if this checkout has not built it yet. Every test that
needs an S3 server and no fault of one runs on it; each isolates itself with a bucket of
its own. The server carries a tag of the session's (:mod:`testing.cluster.daemons`), and
the session's end stops it and everything it started.

moto's server is kept for tests whose fault is the endpoint itself going away: each gets
a server of its own to SIGKILL (like a gateway pod dying) and start again on the same
port, in about a second and in memory. ``moto_servers`` is the session-scoped factory
(every server it started is stopped at the end of the session).

A test module loads the fixtures as a plugin, without a conftest::

    pytest_plugins = ("tests.s3server",)

``aws_env`` gives each test the dummy credentials both servers accept, and nothing else
from the AWS chain (no profile, no instance metadata); ``closed_endpoint`` is a loopback
URL where nothing listens.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

from testing.ports import free_port

ACCESS_KEY = "AKIARQTESTDUMMYKEY00"
SECRET_KEY = "rq-dummy-secret-for-tests-only"
REGION = "us-east-1"
READY_TIMEOUT_S = 30.0
REPO = Path(__file__).resolve().parents[1]
# Every bucket is a SeaweedFS collection with a volume of its own, and a session makes a
# few hundred: more than the dozen volumes SeaweedFS sizes a small disk for.
SEAWEEDFS_VOLUMES = 2000


class S3Endpoint:
    """An S3 endpoint on loopback: where it answers, raw clients, fresh buckets."""

    endpoint: str

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1])

    def client(self, service: str = "s3", **keys: str) -> Any:
        """A raw boto3 client (s3, or iam for users and policies) for setting up and
        tampering; the dummy credentials by default."""
        session = boto3.session.Session(
            aws_access_key_id=keys.get("access_key", ACCESS_KEY),
            aws_secret_access_key=keys.get("secret_key", SECRET_KEY),
            region_name=REGION,
        )
        return session.client(
            service, endpoint_url=self.endpoint, config=Config(s3={"addressing_style": "path"})
        )

    def new_bucket(self) -> str:
        name = f"rq-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name


class SeaweedFS(S3Endpoint):
    """SeaweedFS's S3 gateway: its admin identity has the dummy credentials, and its IAM API
    makes users, keys and policies that it enforces on every request, as AWS does."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint


class MotoServer(S3Endpoint):
    """One moto server process; its state lives in memory and dies with it. ``env`` adds
    to its environment."""

    def __init__(self, log_path: Path, port: int | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.endpoint = f"http://127.0.0.1:{port or free_port()}"
        self.log_path = log_path
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        assert not self.running, "already running"
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.moto_s3", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=dict(os.environ, PYTHONPATH=str(REPO), **self.env),
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"moto server exited with {self.proc.returncode}; see {self.log_path}"
                )
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1):
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto server not answering on {self.endpoint}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Kill the server abruptly; what it stored is gone."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """SeaweedFS for the session: tests isolate themselves with a bucket each."""
    from testing.cluster import build, daemons, seaweed

    # Built once per pin and cached in build/cluster/bin (CI builds it before the tests).
    weed = build.build(build.SEAWEEDFS) / "weed"
    root = tmp_path_factory.mktemp("seaweedfs")
    # Its objects are thrown away: a second for a clean exit, not the ten weed mini can
    # take to close a few hundred volumes, then SIGKILL.
    try:
        with daemons.stopped_after("SeaweedFS", grace=1.0) as tag:
            server = seaweed.start(weed, root, cluster=tag,
                                   credentials=(ACCESS_KEY, SECRET_KEY), iam_writes=True,
                                   max_volumes=SEAWEEDFS_VOLUMES)
            yield SeaweedFS(server.endpoint)
    finally:
        # The objects go; the log stays with the session's other temporary files.
        shutil.rmtree(root / "data", ignore_errors=True)


@pytest.fixture(scope="session")
def moto_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], MotoServer]]:
    """Start a fresh moto server per call; all of them are stopped at the end."""
    started: list[MotoServer] = []
    logs = tmp_path_factory.mktemp("moto")

    def start() -> MotoServer:
        server = MotoServer(logs / f"moto-{len(started)}.log")
        started.append(server)
        server.start()
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def closed_endpoint() -> str:
    """An http endpoint on loopback where nothing listens: connections are refused."""
    return f"http://127.0.0.1:{free_port()}"


def use_dummy_credentials(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Dummy credentials in the environment, and no other source in the AWS chain."""
    for name in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ):
        monkeypatch.delenv(name, raising=False)
    env = {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Dummy credentials in the environment, and no other source in the AWS chain."""
    return use_dummy_credentials(monkeypatch)

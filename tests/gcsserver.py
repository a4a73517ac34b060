"""A Cloud Storage endpoint for tests, on 127.0.0.1: fake-gcs-server
(:mod:`testing.cluster.fakegcs`), one for the session, built from its Go module if this
checkout has not built it yet. Each test isolates itself with a bucket of its own. The
server carries a tag of the session's (:mod:`testing.cluster.daemons`), and the session's
end stops it.

A test module loads the fixture as a plugin, without a conftest::

    pytest_plugins = ("tests.gcsserver",)

``gcs_env`` points the environment's ``STORAGE_EMULATOR_HOST`` at it (what a worker
without a spec reaches) and keeps Application Default Credentials out of the way.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator

import pytest

from testing.cluster.fakegcs import GCSServer


class FakeGCS:
    """fake-gcs-server: where it answers, fresh buckets."""

    def __init__(self, server: GCSServer) -> None:
        self.server = server
        self.endpoint = server.endpoint

    def new_bucket(self) -> str:
        name = f"rq-{uuid.uuid4().hex[:12]}"
        self.server.create_bucket(name)
        return name


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGCS]:
    """fake-gcs-server for the session: tests isolate themselves with a bucket each."""
    from testing.cluster import build, daemons, fakegcs

    # Built once per pin and cached in build/cluster/bin (CI builds it before the tests).
    binary = build.build(build.FAKE_GCS) / "fake-gcs-server"
    root = tmp_path_factory.mktemp("fake-gcs")
    try:
        with daemons.stopped_after("fake-gcs-server") as tag:
            yield FakeGCS(fakegcs.start(binary, root, cluster=tag))
    finally:
        shutil.rmtree(root / "data", ignore_errors=True)


@pytest.fixture
def gcs_env(gcs_server: FakeGCS, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The emulator in the environment, and no Application Default Credentials."""
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.endpoint)
    return {"STORAGE_EMULATOR_HOST": gcs_server.endpoint}

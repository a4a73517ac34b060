"""fake-gcs-server on this machine: Google Cloud Storage's JSON API for the ``gs://`` store's
tests and runs.

One process (built from its Go module, :mod:`testing.cluster.build`) serving plain http on
``host:port`` with its objects in a folder of its own, so that objects as large as a
checkpoint's shards stay out of memory. It takes any request without credentials, as an
emulator does; a client reaches it through ``STORAGE_EMULATOR_HOST`` or an endpoint.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from testing.ports import free_port

from . import daemons

START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class GCSServer:
    """A running server: where it answers."""

    endpoint: str

    def create_bucket(self, name: str) -> None:
        """Make the bucket ``name`` (the JSON API's buckets.insert)."""
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project=resumequal", method="POST",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()

    def answers(self) -> bool:
        """Whether it lists its buckets."""
        try:
            with urllib.request.urlopen(f"{self.endpoint}/storage/v1/b?project=resumequal",
                                        timeout=2) as answer:
                return bool(answer.status == 200)
        except (OSError, urllib.error.URLError):
            return False


def start(binary: Path, root: Path, *, cluster: str, host: str = "127.0.0.1",
          port: int | None = None) -> GCSServer:
    """Start fake-gcs-server under ``root`` and wait until its API answers."""
    port = port or free_port()
    endpoint = f"http://{host}:{port}"
    proc = daemons.start("fake-gcs-server", [
        str(binary), "-scheme=http", f"-host={host}", f"-port={port}",
        "-backend=filesystem", f"-filesystem-root={root / 'data'}",
        # Where resumable uploads continue: this server, not storage.googleapis.com.
        f"-public-host={host}:{port}", f"-external-url={endpoint}", "-log-level=warn",
    ], cluster=cluster, logs=root / "logs")
    server = GCSServer(endpoint)
    daemons.wait_until("fake-gcs-server", server.answers, START_TIMEOUT_S, proc=proc,
                       logs=root / "logs", name="fake-gcs-server")
    return server

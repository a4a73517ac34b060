"""SeaweedFS for the S3 benches (``--server seaweedfs``): a real S3 server on loopback.

``weed mini`` as the tests and the local cluster run it (``testing/cluster/seaweed.py``),
built from its Go module on first use (``PYTHONPATH=. python3 -m testing.cluster build``
builds it ahead), started on a free 127.0.0.1 port with the credentials of the
environment as its one identity, its objects in a folder on disk. Where moto holds every
object in one Python process, SeaweedFS writes them to volume files and serves them from
there, as a real endpoint does: its figures are those of a real server sharing this
machine's CPUs with the client.
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SERVERS = ("moto", "seaweedfs")


@contextmanager
def seaweedfs_server(root: Path | None = None) -> Iterator[str]:
    """SeaweedFS under ``root`` (a temporary folder by default) accepting
    ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``; its endpoint. Stopped at the end with
    every process it started."""
    if str(REPO) not in sys.path:  # testing/ is the repository's, not an installed package
        sys.path.insert(0, str(REPO))
    from testing.cluster import build, daemons, seaweed

    weed = build.build(build.SEAWEEDFS) / "weed"
    tag = f"bench-{uuid.uuid4().hex[:10]}"
    with tempfile.TemporaryDirectory(prefix="rq-seaweedfs-", dir=root) as folder:
        try:
            server = seaweed.start(
                weed, Path(folder), cluster=tag,
                credentials=(os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]))
            yield server.endpoint
        finally:
            daemons.stop_all(tag, grace=2.0)

"""SeaweedFS's S3 gateway on this machine: a real S3 server for the runs, the checkpoint
tests and the cluster.

``weed mini`` (SeaweedFS's one-process master, volume server, filer and S3 gateway, built
from its Go module) with a data folder of its own, its S3 API on ``host:port`` and one
identity whose access key and secret are made on the spot (or given) and required for every
request (``-s3.config``, SeaweedFS's static identities file).

It behaves as AWS S3 does where SeaweedFS's defaults differ: a write to a missing bucket
fails with NoSuchBucket instead of creating the bucket. The Iceberg and Lance endpoints it
would open on fixed ports (8181, 9101) stay closed, so several servers run side by side,
and it reports nothing to SeaweedFS's telemetry.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from testing.ports import free_port

from . import daemons

START_TIMEOUT_S = 90.0
# Each of its servers also listens for gRPC on its port + 10000 (SeaweedFS's default).
GRPC_OFFSET = 10000


@dataclass(frozen=True)
class S3Server:
    """A running gateway: where it answers and the credentials it accepts."""

    endpoint: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"

    def to_json(self) -> dict[str, str]:
        return {"endpoint": self.endpoint, "access_key": self.access_key,
                "secret_key": self.secret_key, "region": self.region}

    @classmethod
    def from_json(cls, data: dict[str, str]) -> S3Server:
        return cls(**data)

    def client(self) -> object:
        """A boto3 S3 client for it (path-style, as SeaweedFS serves buckets)."""
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=self.region,
                            aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key,
                            config=Config(s3={"addressing_style": "path"}))


def identities(access_key: str, secret_key: str) -> str:
    """SeaweedFS's S3 identities file: one admin identity."""
    return json.dumps({"identities": [{
        "name": "resumequal", "credentials": [{"accessKey": access_key,
                                               "secretKey": secret_key}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}, indent=1)


def start(weed: Path, root: Path, *, cluster: str, host: str = "127.0.0.1",
          port: int | None = None, credentials: tuple[str, str] | None = None,
          iam_writes: bool = False, max_volumes: int = 0) -> S3Server:
    """Start ``weed mini`` under ``root`` and wait until its S3 API answers.

    ``credentials``: the admin identity's (access key, secret), made here when None.
    ``iam_writes``: the IAM API on the S3 port may create users, keys and policies (mini
    serves it read-only by default). ``max_volumes``: every bucket is a collection with
    volumes of its own, and by default (0) the volume server takes as many volumes as the
    free disk holds at mini's volume size of 1 GiB, a dozen with 12 GiB free: a server
    that gets a bucket per test needs more (an empty volume is a few files, no space).
    """
    root.mkdir(parents=True, exist_ok=True)
    data = root / "data"
    data.mkdir(exist_ok=True)
    access, secret = credentials or ("RQ" + secrets.token_hex(9).upper(),
                                     secrets.token_hex(20))
    config = root / "s3.json"
    config.write_text(identities(access, secret))
    config.chmod(0o600)
    port = port or free_port(also=(GRPC_OFFSET,))
    ports = {name: free_port(also=(GRPC_OFFSET,))
             for name in ("master", "volume", "filer", "webdav", "admin")}
    # Its glog files go with its other logs (by default every start leaves some in /tmp).
    proc = daemons.start("seaweedfs", [
        str(weed), f"-logdir={root / 'logs'}", "mini", f"-dir={data}", f"-ip={host}",
        f"-ip.bind={host}",
        f"-s3.port={port}", f"-s3.config={config}",
        f"-master.port={ports['master']}", f"-volume.port={ports['volume']}",
        f"-filer.port={ports['filer']}", f"-webdav.port={ports['webdav']}",
        f"-admin.port={ports['admin']}",
        "-s3.autoCreateBucket=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
        "-master.telemetry=false", f"-s3.iam.readOnly={str(not iam_writes).lower()}",
        f"-volume.max={max_volumes}",
    ], cluster=cluster, logs=root / "logs")
    server = S3Server(f"http://{host}:{port}", access, secret)

    def ready() -> bool:
        try:
            server.client().list_buckets()  # type: ignore[attr-defined]
            return True
        except Exception:
            return False

    daemons.wait_until("SeaweedFS S3", ready, START_TIMEOUT_S, proc=proc,
                       logs=root / "logs", name="seaweedfs", interval=0.5)
    return server


def wait_gone(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)

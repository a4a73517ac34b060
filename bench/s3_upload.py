"""S3Store transfer cost next to raw boto3, against a moto server (or SeaweedFS) on loopback.

Starts ``python -m moto.server`` on 127.0.0.1 (dummy credentials; SeaweedFS with
``--server seaweedfs``, :mod:`seaweedfs`), writes ~200 MB of
checkpoint-like files, then, alternating rounds so both sides see the same server state:

- upload: ``S3Store.put_file`` (sha256 of the file + multipart upload) next to boto3's
  ``upload_file`` of the same bytes with the same part size and concurrency;
- download: ``S3Store.get_file(expect_sha256=...)`` (ranged parallel download to a
  temporary file, sha256, rename) next to boto3's ``download_file``.

Prints MB/s (best round) and the median over rounds of raw time / store time (1.0 = no
overhead).

    python bench/s3_upload.py [--files 8] [--mb 25] [--rounds 5] [--server seaweedfs]

moto keeps objects in one Python process, so absolute figures are far below a real
endpoint; the ratio is what this measures. SeaweedFS is a real server, on the same CPUs.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from resumequal.store import S3Config
from resumequal.store.s3 import S3Store
from seaweedfs import SERVERS, seaweedfs_server

MiB = 1 << 20


@contextmanager
def moto_server() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("moto server did not start") from None
                time.sleep(0.05)
        yield endpoint
    finally:
        proc.kill()
        proc.wait()


def timed(fn: Callable[[Path], Any], path: Path) -> float:
    start = time.perf_counter()
    fn(path)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--mb", type=int, default=25, help="MiB per file")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--server", choices=SERVERS, default="moto", help="the S3 server")
    args = parser.parse_args()

    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
    )
    total_mb = args.files * args.mb * MiB / 1e6
    server = seaweedfs_server() if args.server == "seaweedfs" else moto_server()
    with server as endpoint, tempfile.TemporaryDirectory() as tmp:
        files = []
        for i in range(args.files):
            path = Path(tmp, f"shard-{i}.distcp")
            path.write_bytes(os.urandom(args.mb * MiB))
            files.append(path)
        config = S3Config(endpoint_url=endpoint, addressing_style="path")
        store = S3Store("s3://bench/ours", config)
        raw = boto3.session.Session().client(
            "s3", endpoint_url=endpoint, config=Config(s3={"addressing_style": "path"})
        )
        raw_transfer = TransferConfig(
            multipart_threshold=config.multipart_threshold_mb * MiB,
            multipart_chunksize=config.multipart_chunk_mb * MiB,
            max_concurrency=config.max_concurrency,
        )
        raw.create_bucket(Bucket="bench")
        print(
            f"{args.files} files x {args.mb} MiB = {total_mb:.0f} MB, parts of "
            f"{config.multipart_chunk_mb} MiB, {config.max_concurrency} threads, "
            f"{os.cpu_count()} CPUs, {args.server} at {endpoint}"
        )

        # Store and raw boto3 alternate file by file (who goes first alternates too), so
        # load from elsewhere on the machine hits both alike; a round's ratio compares
        # the two sums, and the median round is reported.
        digests: dict[str, str] = {}
        down = Path(tmp, "down")
        steps: dict[str, tuple[Callable[[Path], Any], Callable[[Path], Any]]] = {
            "up": (
                lambda p: digests.__setitem__(p.name, store.put_file(p.name, p)),
                lambda p: raw.upload_file(str(p), "bench", f"raw/{p.name}", Config=raw_transfer),
            ),
            "down": (
                lambda p: store.get_file(p.name, down / p.name, expect_sha256=digests[p.name]),
                lambda p: raw.download_file(
                    "bench", f"raw/{p.name}", str(down / p.name), Config=raw_transfer
                ),
            ),
        }
        seconds: dict[str, list[tuple[float, float]]] = {"up": [], "down": []}
        for _ in range(args.rounds):
            for what, (ours, theirs) in steps.items():
                mine = base = 0.0
                for i, p in enumerate(files):
                    if i % 2 == 0:
                        mine += timed(ours, p)
                        base += timed(theirs, p)
                    else:
                        base += timed(theirs, p)
                        mine += timed(ours, p)
                seconds[what].append((mine, base))

        for what, label, raw_label in (
            ("up", "put_file", "upload_file"),
            ("down", "get_file+sha256", "download_file"),
        ):
            rounds = seconds[what]
            ratio = statistics.median(base / mine for mine, base in rounds)
            print(
                f"{label:>16}: {total_mb / min(m for m, _ in rounds):7.1f} MB/s   "
                f"boto3 {raw_label}: {total_mb / min(b for _, b in rounds):7.1f} MB/s   "
                f"ratio {ratio:.2f} (median of {len(rounds)} rounds; 1.00 = as fast as boto3)"
            )


if __name__ == "__main__":
    main()

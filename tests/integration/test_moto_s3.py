"""moto's server as the tests start it (:mod:`tests.moto_s3`): conditional writes racing on
one key are decided as S3 decides them, one winner, where moto as it is can let several
win."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from tests.moto_s3 import PAUSE_ENV, UNLOCKED_ENV
from tests.s3server import MotoServer

pytestmark = pytest.mark.timeout(60)

WRITERS = 8


def _race(tmp_path: Path, env: dict[str, str]) -> tuple[list[bool], bytes]:
    """``WRITERS`` writers each creating one key with If-None-Match: *: who was told it
    won, and what the key holds."""
    server = MotoServer(tmp_path / "moto.log", env=env)
    server.start()
    try:
        client, bucket = server.client(), server.new_bucket()

        def create(i: int) -> bool:
            try:
                client.put_object(Bucket=bucket, Key="run.json", Body=f"writer {i}".encode(),
                                  IfNoneMatch="*")
            except ClientError as e:
                assert e.response["ResponseMetadata"]["HTTPStatusCode"] in (409, 412), e
                return False
            return True

        with ThreadPoolExecutor(max_workers=WRITERS) as pool:
            won = list(pool.map(create, range(WRITERS)))
        return won, client.get_object(Bucket=bucket, Key="run.json")["Body"].read()
    finally:
        server.stop()


def test_racing_conditional_creates_have_one_winner(tmp_path: Path) -> None:
    # Every writer is held between moto's look and its write: all of them pass the look.
    won, body = _race(tmp_path, {PAUSE_ENV: "0.3"})
    assert won.count(True) == 1, won
    assert body == f"writer {won.index(True)}".encode()


def test_without_the_lock_moto_lets_several_win(tmp_path: Path) -> None:
    # What the lock is for: the same race against moto as it is.
    won, _ = _race(tmp_path, {PAUSE_ENV: "0.3", UNLOCKED_ENV: "1"})
    assert won.count(True) > 1, won

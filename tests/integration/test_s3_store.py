"""The store against real S3 servers over HTTP on loopback: SeaweedFS for everything a
server does, moto's server in a subprocess of the test's own where the server is killed
mid-way. Nothing in boto3 is patched: errors come from real responses, refused
connections and a server that dies. The contract every store keeps (the ``store``
fixture's tests) runs on a folder, S3 and Cloud Storage (fake-gcs-server)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from resumequal.store import (
    FileStore,
    GCSSettings,
    ObjectInfo,
    S3Config,
    Store,
    StoreAccessDenied,
    StoreIntegrityError,
    StoreNotFound,
    StoreUnavailable,
)
from resumequal.store.gcs import GCSStore
from resumequal.store.s3 import S3Store
from tests.outage import Outage

if TYPE_CHECKING:
    from tests.gcsserver import FakeGCS
    from tests.s3server import MotoServer, S3Endpoint, SeaweedFS

# The fixtures (s3_server, moto_servers, aws_env, gcs_server) come from these plugins.
pytest_plugins = ("tests.s3server", "tests.gcsserver")
pytestmark = [pytest.mark.usefixtures("aws_env"), pytest.mark.timeout(120)]

MiB = 1 << 20


def s3_config(server: S3Endpoint, **fields: object) -> S3Config:
    return S3Config.model_validate(
        {"endpoint_url": server.endpoint, "addressing_style": "path", **fields}
    )


@pytest.fixture(params=["file", "s3", "gs"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "file":
        return FileStore(str(tmp_path / "store"))
    if request.param == "gs":
        gcs: FakeGCS = request.getfixturevalue("gcs_server")
        return GCSStore(f"gs://{gcs.new_bucket()}/runs/q1",
                        GCSSettings(endpoint_url=gcs.endpoint))
    server: SeaweedFS = request.getfixturevalue("s3_server")
    return S3Store(f"s3://{server.new_bucket()}/runs/q1", s3_config(server))


@pytest.fixture
def s3(s3_server: SeaweedFS) -> S3Store:
    return S3Store(f"s3://{s3_server.new_bucket()}/runs", s3_config(s3_server))


# --- every method on both stores ----------------------------------------------------------


def test_round_trip_every_method(store: Store, tmp_path: Path) -> None:
    key = "ns/run/uid/control/checkpoints/step-00000004/manifest.json"
    assert not store.exists(key)
    store.put_bytes(key, b'{"step": 4}')
    assert store.exists(key)
    assert store.get_bytes(key) == b'{"step": 4}'
    assert store.uri(key).endswith("/" + key)

    data = os.urandom(300_000)
    src = tmp_path / "shard.distcp"
    src.write_bytes(data)
    digest = store.put_file("ns/run/uid/control/checkpoints/step-00000004/dcp/0.distcp", src)
    assert digest == hashlib.sha256(data).hexdigest()
    dest = tmp_path / "restore" / "0.distcp"
    got = store.get_file(
        "ns/run/uid/control/checkpoints/step-00000004/dcp/0.distcp", dest, expect_sha256=digest
    )
    assert got == digest
    assert dest.read_bytes() == data

    assert store.list("ns/run/uid/control") == [
        ObjectInfo("ns/run/uid/control/checkpoints/step-00000004/dcp/0.distcp", len(data)),
        ObjectInfo("ns/run/uid/control/checkpoints/step-00000004/manifest.json", 11),
    ]
    store.delete(key)
    store.delete(key)  # a missing key is not an error
    assert not store.exists(key)
    assert store.delete_prefix("ns/run") == 1
    assert store.list() == []


def test_put_new_is_exclusive_between_racing_writers(store: Store) -> None:
    """A run's claim: of writers racing to create one key, one writes it, the others are
    told it exists (a conditional put on S3, an exclusive create in a folder)."""
    def claim(i: int) -> bool:
        return store.put_new("run.json", f"writer {i}".encode())

    with ThreadPoolExecutor(max_workers=16) as pool:
        won = list(pool.map(claim, range(16)))
    assert won.count(True) == 1, won
    assert store.get_bytes("run.json") == f"writer {won.index(True)}".encode()
    assert store.put_new("run.json", b"late") is False


def test_listing_order_and_folder_prefixes(store: Store) -> None:
    keys = [
        "c/step-00000010/manifest.json",
        "c/step-00000005+1/manifest.json",
        "c/step-00000005/dcp/1.distcp",
        "c/step-00000005/dcp/0.distcp",
        "c/step-00000005/manifest.json",
        "c/COMMITTED",
        "trace/rank-0.jsonl",
    ]
    for i, key in enumerate(keys):
        store.put_bytes(key, bytes(i))
    assert [o.key for o in store.list()] == sorted(keys)
    assert [o.size for o in store.list()] == [keys.index(o.key) for o in store.list()]
    assert [o.key for o in store.list("c/step-00000005")] == [
        "c/step-00000005/dcp/0.distcp",
        "c/step-00000005/dcp/1.distcp",
        "c/step-00000005/manifest.json",
    ]
    assert store.list("c/step-00000005/dcp/") == store.list("c/step-00000005/dcp")
    assert store.list("c/step-0000000") == []
    assert store.list("absent") == []


def test_delete_prefix_takes_the_folder_only(store: Store) -> None:
    for key in ("c/step-00000005/a", "c/step-00000005/d/b", "c/step-00000005+1/a", "c/z"):
        store.put_bytes(key, b"1")
    assert store.delete_prefix("c/step-00000005/") == 2
    assert [o.key for o in store.list()] == ["c/step-00000005+1/a", "c/z"]
    assert store.delete_prefix("c/step-00000005") == 0


def test_delete_prefix_beyond_one_batch(s3: S3Store) -> None:
    with ThreadPoolExecutor(8) as pool:  # one store from many threads, as ranks' uploaders do
        list(pool.map(lambda i: s3.put_bytes(f"gc/{i:04d}", b""), range(1005)))
    s3.put_bytes("keep", b"")
    assert s3.delete_prefix("gc") == 1005
    assert s3.list() == [ObjectInfo("keep", 0)]


def test_flipped_byte_is_caught_on_download(store: Store, tmp_path: Path) -> None:
    data = bytearray(os.urandom(1 << 20))
    src = tmp_path / "shard.bin"
    src.write_bytes(data)
    digest = store.put_file("c/shard.bin", src)
    data[777_777] ^= 0x10
    store.put_bytes("c/shard.bin", bytes(data))  # bit rot or tampering after the upload
    dest = tmp_path / "out" / "shard.bin"
    with pytest.raises(StoreIntegrityError, match="does not match") as info:
        store.get_file("c/shard.bin", dest, expect_sha256=digest)
    assert store.uri("c/shard.bin") in str(info.value)
    assert not dest.exists()
    assert os.listdir(dest.parent) == []  # no temporary either
    assert store.get_file("c/shard.bin", dest) == hashlib.sha256(data).hexdigest()


def test_ranged_reads_fill_a_buffer_and_stop_at_the_end(store: Store) -> None:
    data = os.urandom(3 * MiB + 5)
    store.put_bytes("c/shard.bin", data)
    out = bytearray(MiB)
    assert store.get_range("c/shard.bin", 2 * MiB + 3, out) == MiB
    assert out == data[2 * MiB + 3:3 * MiB + 3]
    assert store.get_range("c/shard.bin", 3 * MiB, out) == 5  # the object ends there
    assert out[:5] == data[3 * MiB:]
    assert store.get_range("c/shard.bin", len(data), out) == 0
    assert store.get_range("c/shard.bin", 0, bytearray()) == 0
    with pytest.raises(StoreNotFound, match=f"^{store.uri('c/gone.bin')} does not exist$"):
        store.get_range("c/gone.bin", 0, out)


# --- S3 specifics ---------------------------------------------------------------------------


def test_multipart_upload_and_ranged_download(s3_server: SeaweedFS, tmp_path: Path) -> None:
    bucket = s3_server.new_bucket()
    store = S3Store(
        f"s3://{bucket}/big",
        s3_config(s3_server, multipart_threshold_mb=5, multipart_chunk_mb=5),
    )
    data = os.urandom(6 * MiB)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    digest = store.put_file("shard.bin", src)
    assert digest == hashlib.sha256(data).hexdigest()
    head = s3_server.client().head_object(Bucket=bucket, Key="big/shard.bin")
    assert head["ETag"].strip('"').endswith("-2")  # uploaded as 5 MiB + 1 MiB parts
    assert head["ContentLength"] == 6 * MiB
    dest = tmp_path / "down.bin"
    assert store.get_file("shard.bin", dest, expect_sha256=digest) == digest
    assert dest.read_bytes() == data


def test_prefix_isolates_stores_in_one_bucket(s3_server: SeaweedFS) -> None:
    bucket = s3_server.new_bucket()
    a = S3Store(f"s3://{bucket}/a", s3_config(s3_server))
    ab = S3Store(f"s3://{bucket}/ab", s3_config(s3_server))
    whole = S3Store(f"s3://{bucket}", s3_config(s3_server))
    a.put_bytes("k", b"1")
    ab.put_bytes("k", b"2")
    assert a.list() == [ObjectInfo("k", 1)]
    assert [o.key for o in whole.list()] == ["a/k", "ab/k"]
    assert whole.uri("a/k") == a.uri("k") == f"s3://{bucket}/a/k"


@pytest.mark.parametrize(
    "op",
    ["get_bytes", "get_file", "exists", "list", "put_bytes", "put_file", "delete_prefix"],
)
def test_missing_bucket_names_the_bucket(s3_server: SeaweedFS, tmp_path: Path, op: str) -> None:
    store = S3Store("s3://rq-no-such-bucket/runs", s3_config(s3_server))
    src = tmp_path / "src"
    src.write_bytes(b"x")
    calls: dict[str, Callable[[], object]] = {
        "get_bytes": lambda: store.get_bytes("k"),
        "get_file": lambda: store.get_file("k", tmp_path / "out"),
        "exists": lambda: store.exists("k"),
        "list": lambda: store.list(),
        "put_bytes": lambda: store.put_bytes("k", b"x"),
        "put_file": lambda: store.put_file("k", src),
        "delete_prefix": lambda: store.delete_prefix("c"),
    }
    with pytest.raises(StoreNotFound, match="bucket 'rq-no-such-bucket' does not exist"):
        calls[op]()
    assert not (tmp_path / "out").exists()


def test_missing_key_names_the_key(s3: S3Store, tmp_path: Path) -> None:
    uri = s3.uri("c/step-00000004/manifest.json")
    with pytest.raises(StoreNotFound, match=f"^{uri} does not exist$"):
        s3.get_bytes("c/step-00000004/manifest.json")
    with pytest.raises(StoreNotFound, match=f"^{uri} does not exist$"):  # HEAD: no error body
        s3.get_file("c/step-00000004/manifest.json", tmp_path / "m.json")
    assert not s3.exists("c/step-00000004/manifest.json")
    assert not (tmp_path / "m.json").exists()


# --- credentials ------------------------------------------------------------------------------

FAKE_SECRET = "rq-FAKE-SECRET-7f3a9c-must-never-be-logged"
FAKE_KEY_ID = "AKIARQFAKEKEYID12345"


def _iam_user(server: SeaweedFS, bucket: str, *grants: tuple[list[str], str]) -> dict[str, str]:
    """A user of the server's IAM with a key, allowed each (actions, resource under the
    bucket) of ``grants`` and nothing else; its key id and secret."""
    iam = server.client("iam")
    user = f"u-{uuid.uuid4().hex[:12]}"
    iam.create_user(UserName=user)
    key = iam.create_access_key(UserName=user)["AccessKey"]
    policy = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": actions,
                       "Resource": f"arn:aws:s3:::{bucket}{resource}"}
                      for actions, resource in grants],
    }
    iam.put_user_policy(UserName=user, PolicyName="granted", PolicyDocument=json.dumps(policy))
    return {"id": key["AccessKeyId"], "secret": key["SecretAccessKey"]}


@pytest.fixture(scope="module")
def iam_bucket(s3_server: SeaweedFS) -> tuple[str, dict[str, str]]:
    """A bucket with ``open/x``, and an IAM user allowed to read and write ``open/*`` only."""
    bucket = s3_server.new_bucket()
    raw = s3_server.client()
    raw.put_object(Bucket=bucket, Key="data/open/x", Body=b"readable")
    raw.put_object(Bucket=bucket, Key="data/closed/x", Body=b"secret data")
    return bucket, _iam_user(s3_server, bucket, (["s3:GetObject", "s3:PutObject"], "/data/open/*"))


def _operations(store: S3Store, key: str, tmp_path: Path) -> dict[str, Callable[[], object]]:
    src = tmp_path / "src"
    src.write_bytes(b"x")
    return {
        "get_bytes": lambda: store.get_bytes(key),
        "get_file": lambda: store.get_file(key, tmp_path / "out"),
        "exists": lambda: store.exists(key),
        "put_bytes": lambda: store.put_bytes(key, b"x"),
        "put_file": lambda: store.put_file(key, src),
    }


@pytest.mark.parametrize("who", ["unknown key id", "wrong secret", "no permission"])
def test_wrong_credentials_are_access_denied_and_never_shown(
    s3_server: SeaweedFS,
    iam_bucket: tuple[str, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    who: str,
) -> None:
    bucket, real = iam_bucket
    key_id, secret, key = {
        "unknown key id": (FAKE_KEY_ID, FAKE_SECRET, "open/x"),
        "wrong secret": (real["id"], FAKE_SECRET, "open/x"),
        "no permission": (real["id"], real["secret"], "closed/x"),
    }[who]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    caplog.set_level(logging.DEBUG)
    store = S3Store(f"s3://{bucket}/data", s3_config(s3_server, max_attempts=2))
    for op, call in _operations(store, key, tmp_path).items():
        with pytest.raises(StoreAccessDenied) as info:
            call()
        message = str(info.value)
        assert message.startswith(
            f"wrong credentials or no permission for s3://{bucket}/data/{key}"
        ), (op, message)
        chain = "".join(traceback.format_exception(info.value))  # with the boto3 cause
        for shown in (message, chain, caplog.text):
            assert secret not in shown
            assert real["secret"] not in shown
            assert FAKE_SECRET not in shown
        assert key_id not in message
    assert not (tmp_path / "out").exists()


def test_right_credentials_pass_with_auth_enforced(
    s3_server: SeaweedFS,
    iam_bucket: tuple[str, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bucket, real = iam_bucket
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", real["id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", real["secret"])
    store = S3Store(f"s3://{bucket}/data", s3_config(s3_server))
    store.put_bytes("open/y", b"written")
    assert store.get_bytes("open/y") == b"written"
    assert store.get_bytes("open/x") == b"readable"


def test_a_delete_refused_for_some_keys_names_one_and_counts_the_others(
    s3_server: SeaweedFS, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DeleteObjects answers 200 with an error for each key it refused, and deletes the rest.
    bucket = s3_server.new_bucket()
    raw = s3_server.client()
    for key in ("c/closed/a", "c/closed/b", "c/open/a", "c/open/b"):
        raw.put_object(Bucket=bucket, Key=f"data/{key}", Body=b"1")
    user = _iam_user(s3_server, bucket, (["s3:ListBucket"], ""),
                     (["s3:DeleteObject"], "/data/c/open/*"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", user["id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", user["secret"])
    store = S3Store(f"s3://{bucket}/data", s3_config(s3_server))
    with pytest.raises(StoreAccessDenied, match=(
            rf"^wrong credentials or no permission: cannot delete s3://{bucket}/data/c/closed/"
            r"[ab] and 1 more \(AccessDenied\)$")):
        store.delete_prefix("c")
    left = raw.list_objects_v2(Bucket=bucket)["Contents"]
    assert [o["Key"] for o in left] == ["data/c/closed/a", "data/c/closed/b"]


def test_no_credentials_anywhere_is_access_denied(
    s3: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    store = S3Store(s3.uri(), s3.config)
    with pytest.raises(StoreAccessDenied, match="no usable credentials in the AWS chain"):
        store.get_bytes("k")


# --- an endpoint that is not there, or goes away ---------------------------------------------


def test_unreachable_endpoint_is_unavailable_after_retries(
    closed_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    endpoint = closed_endpoint
    store = S3Store(
        "s3://bucket/runs",
        S3Config(endpoint_url=endpoint, addressing_style="path", max_attempts=3),
    )
    caplog.set_level(logging.DEBUG, logger="botocore.retries")
    start = time.monotonic()
    with pytest.raises(StoreUnavailable, match=f"cannot reach {endpoint} .* after 3 attempts"):
        store.put_bytes("k", b"x")
    assert time.monotonic() - start < 15
    retried = [r for r in caplog.records if "Retry needed" in r.getMessage()]
    assert len(retried) == 2  # botocore retried before we gave up


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """An http endpoint on loopback that accepts every connection and never answers."""
    server = socket.create_server(("127.0.0.1", 0), backlog=32)
    server.settimeout(0.1)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, name="silent-endpoint", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        done.set()
        thread.join(timeout=5)
        for conn in [*held, server]:
            conn.close()


def test_an_endpoint_that_never_answers_fails_within_the_timeouts_warning_per_retry(
    silent_endpoint: str, caplog: pytest.LogCaptureFixture, aws_env: dict[str, str]
) -> None:
    store = S3Store("s3://bucket/runs", S3Config(
        endpoint_url=silent_endpoint, addressing_style="path", max_attempts=3,
        connect_timeout_seconds=1, read_timeout_seconds=1))
    caplog.set_level(logging.WARNING, logger="resumequal.store")
    start = time.monotonic()
    with pytest.raises(StoreUnavailable, match=rf"cannot reach {silent_endpoint} to read "
                       r"s3://bucket/runs/k after 3 attempts \(ReadTimeoutError\)"):
        store.get_bytes("k")
    # Three attempts of 1 s each, and the backoff between them (at most 1 + 2 s).
    assert time.monotonic() - start < 3 * 1 + 3 + 2
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "retrying (2/3) GetObject s3://bucket/runs/k: ReadTimeoutError",
        "retrying (3/3) GetObject s3://bucket/runs/k: ReadTimeoutError",
    ]
    assert aws_env["AWS_ACCESS_KEY_ID"] not in caplog.text
    assert aws_env["AWS_SECRET_ACCESS_KEY"] not in caplog.text


@pytest.mark.slow
@pytest.mark.waits
def test_a_default_store_gives_up_on_an_endpoint_that_never_answers_within_a_minute(
    silent_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = S3Store("s3://bucket/runs", S3Config(endpoint_url=silent_endpoint,
                                                 addressing_style="path"))
    caplog.set_level(logging.WARNING, logger="resumequal.store")
    start = time.monotonic()
    with pytest.raises(StoreUnavailable, match=r"after 5 attempts \(ReadTimeoutError\)"):
        store.put_bytes("ckpt/manifest.json", b"{}")
    assert time.monotonic() - start < 60
    retries = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert retries == [f"retrying ({n}/5) PutObject s3://bucket/runs/ckpt/manifest.json: "
                       "ReadTimeoutError" for n in range(2, 6)]


def test_endpoint_dying_mid_way_then_coming_back(
    moto_servers: Callable[[], MotoServer], tmp_path: Path
) -> None:
    server = moto_servers()
    store = S3Store(f"s3://{server.new_bucket()}/runs", s3_config(server, max_attempts=2))
    store.put_bytes("c/a", b"before")
    src = tmp_path / "shard.bin"
    src.write_bytes(os.urandom(1 << 20))

    server.stop()  # SIGKILL: the gateway is gone, with everything it held
    with pytest.raises(StoreUnavailable, match=f"cannot reach {server.endpoint}"):
        store.put_bytes("c/b", b"during")
    with pytest.raises(StoreUnavailable):
        store.put_file("c/shard.bin", src)
    with pytest.raises(StoreUnavailable):
        store.get_file("c/a", tmp_path / "a")
    with pytest.raises(StoreUnavailable):
        store.list()

    server.start()  # same port; moto keeps nothing, so the bucket is made again
    bucket = store.bucket
    server.client().create_bucket(Bucket=bucket)
    store.put_file("c/shard.bin", src)  # the same client recovers its connections
    assert store.list() == [ObjectInfo("c/shard.bin", 1 << 20)]


def test_endpoint_killed_during_a_multipart_upload(
    moto_servers: Callable[[], MotoServer], tmp_path: Path
) -> None:
    server = moto_servers()
    bucket = server.new_bucket()
    store = S3Store(
        f"s3://{bucket}/runs",
        s3_config(
            server,
            max_attempts=2,
            multipart_threshold_mb=5,
            multipart_chunk_mb=5,
            max_concurrency=1,  # one part after the other: the upload lasts a while
        ),
    )
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(60 * MiB))
    raw = server.client()
    with ThreadPoolExecutor(1) as pool:
        upload = pool.submit(store.put_file, "big.bin", src)
        deadline = time.monotonic() + 30
        while not raw.list_multipart_uploads(Bucket=bucket).get("Uploads"):
            assert not upload.done() and time.monotonic() < deadline, "upload never started"
            time.sleep(0.01)
        server.stop()  # parts are going out
        with pytest.raises(StoreUnavailable, match=f"cannot reach {server.endpoint} to upload"):
            upload.result(timeout=60)


def test_fixture_credentials_do_not_leak_either(
    s3: S3Store, aws_env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(StoreNotFound) as info:
        s3.get_bytes("absent")
    secret, key_id = aws_env["AWS_SECRET_ACCESS_KEY"], aws_env["AWS_ACCESS_KEY_ID"]
    assert secret not in caplog.text
    assert secret not in str(info.value)
    assert key_id not in str(info.value)


# --- streamed writes and hashed ranged downloads ------------------------------------------


def _parts_store(server: S3Endpoint, **fields: object) -> S3Store:
    """5 MiB parts (S3's smallest), so a few MiB make a multipart object."""
    config = s3_config(server, multipart_threshold_mb=5, multipart_chunk_mb=5, **fields)
    return S3Store(f"s3://{server.new_bucket()}/parts", config)


def _bodies_sent(store: S3Store) -> list[tuple[str, bytes, dict[str, str]]]:
    """(operation, body, headers) of every request with a body ``store`` sends from now on,
    as botocore hands it to the connection (signed, checksummed)."""
    sent: list[tuple[str, bytes, dict[str, str]]] = []

    def record(request: Any, event_name: str, **_: Any) -> None:
        body = request.body
        if body is not None and not isinstance(body, bytes | bytearray):
            position = body.tell()
            body, _ = body.read(), body.seek(position)
        if body:
            sent.append((event_name.rsplit(".", 1)[-1], bytes(body), {
                k.lower(): v.decode() if isinstance(v, bytes) else v
                for k, v in request.headers.items()}))

    store._client.meta.events.register("before-send.s3", record)
    return sent


def _upload_small_and_in_parts(store: S3Store) -> None:
    store.put_bytes("small", b"x" * 1000)
    writer = store.writer("shard.bin")
    writer.write(os.urandom(7 * MiB))
    writer.close()


def test_bodies_go_unsigned_beside_a_checksum_the_store_checks(s3_server: SeaweedFS) -> None:
    # Over plain http botocore would hash every body once more (SigV4's payload sha256)
    # after the sha256 a checkpoint's manifest keeps: the body goes UNSIGNED-PAYLOAD with
    # its CRC32, as botocore sends it over https.
    store = _parts_store(s3_server)
    sent = _bodies_sent(store)
    _upload_small_and_in_parts(store)
    data = [(op, h) for op, _, h in sent if op in ("PutObject", "UploadPart")]
    assert [op for op, _ in data] == ["PutObject", "UploadPart", "UploadPart"]
    for _, headers in data:
        assert headers["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"
        assert "x-amz-checksum-crc32" in headers
    assert len(store.get_bytes("shard.bin")) == 7 * MiB


def test_bodies_are_signed_for_a_store_that_wants_them_or_without_checksums(
    s3_server: SeaweedFS, monkeypatch: pytest.MonkeyPatch
) -> None:
    signed = _parts_store(s3_server, sign_payloads=True)
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
    unchecked = _parts_store(s3_server)
    for store in (signed, unchecked):
        sent = _bodies_sent(store)
        _upload_small_and_in_parts(store)
        assert [op for op, _, _ in sent][:3] == ["PutObject", "UploadPart", "UploadPart"]
        for _, body, headers in sent:
            assert headers["x-amz-content-sha256"] == hashlib.sha256(body).hexdigest()
    assert len(unchecked.get_bytes("shard.bin")) == 7 * MiB


def test_a_streamed_object_goes_up_in_parts_and_exists_only_once_closed(
    s3_server: SeaweedFS,
) -> None:
    store = _parts_store(s3_server, max_concurrency=2)
    data = os.urandom(12 * MiB + 3)
    writer = store.writer("shard.bin")
    for start in range(0, len(data), 3 * MiB + 1):  # writes that straddle parts
        writer.write(memoryview(data)[start : start + 3 * MiB + 1])
    assert writer.tell() == len(data)
    raw = s3_server.client()
    assert store.list() == []  # parts are going up, the object does not exist yet
    assert len(raw.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])) == 1
    assert writer.close() == hashlib.sha256(data).hexdigest()
    head = raw.head_object(Bucket=store.bucket, Key="parts/shard.bin")
    assert head["ETag"].strip('"').endswith("-3")  # 5 + 5 + 2 MiB
    assert store.get_bytes("shard.bin") == data
    assert not raw.list_multipart_uploads(Bucket=store.bucket).get("Uploads")


def test_a_small_streamed_object_is_one_put_and_an_empty_one_round_trips(
    s3_server: SeaweedFS, tmp_path: Path,
) -> None:
    store = _parts_store(s3_server)
    for key, data in (("small", os.urandom(1000)), ("empty", b"")):
        writer = store.writer(key)
        writer.write(data)
        assert writer.close() == hashlib.sha256(data).hexdigest()
        head = s3_server.client().head_object(Bucket=store.bucket, Key=f"parts/{key}")
        assert "-" not in head["ETag"].strip('"')  # a plain PUT, no multipart upload
        # A range of an empty object is unsatisfiable (416): the download still works.
        digest = store.get_file(key, tmp_path / key, expect_sha256=hashlib.sha256(data).hexdigest())
        assert digest == hashlib.sha256(data).hexdigest()
        assert (tmp_path / key).read_bytes() == data


def test_an_aborted_stream_leaves_no_object_and_no_upload(s3_server: SeaweedFS) -> None:
    store = _parts_store(s3_server)
    store.put_bytes("shard.bin", b"the committed one")
    writer = store.writer("shard.bin")
    writer.write(os.urandom(11 * MiB))  # two parts sent, one buffered
    writer.abort()
    raw = s3_server.client()
    assert not raw.list_multipart_uploads(Bucket=store.bucket).get("Uploads")
    assert store.get_bytes("shard.bin") == b"the committed one"
    with pytest.raises(ValueError, match="after close or abort"):
        writer.write(b"x")


def test_a_stream_to_a_dead_endpoint_fails_as_unavailable_and_leaves_nothing(
    moto_servers: Callable[[], MotoServer],
) -> None:
    server = moto_servers()
    store = _parts_store(server, max_attempts=2)
    writer = store.writer("shard.bin")
    writer.write(os.urandom(6 * MiB))  # one part on its way
    server.stop()
    with pytest.raises(StoreUnavailable, match=f"cannot reach {server.endpoint} to upload"):
        writer.write(os.urandom(5 * MiB))
        writer.close()


def test_the_sha256_taken_while_uploading_catches_a_corrupted_object_on_download(
    s3_server: SeaweedFS, tmp_path: Path,
) -> None:
    store = _parts_store(s3_server, max_concurrency=3)
    data = bytearray(os.urandom(17 * MiB))  # four ranged GETs, three at a time
    writer = store.writer("shard.bin")
    writer.write(data)
    digest = writer.close()
    dest = tmp_path / "out" / "shard.bin"
    assert store.get_file("shard.bin", dest, expect_sha256=digest) == digest
    assert dest.read_bytes() == data  # every part landed at its offset
    data[16 * MiB + 5] ^= 0x01  # in the last part, hashed last
    s3_server.client().put_object(Bucket=store.bucket, Key="parts/shard.bin", Body=bytes(data))
    with pytest.raises(StoreIntegrityError, match="does not match"):
        store.get_file("shard.bin", dest, expect_sha256=digest)
    assert not dest.exists()  # the earlier verified copy is gone too
    assert os.listdir(dest.parent) == []


def _changed_on_their_way(store: S3Store) -> None:
    """From now on one bit of every object body the store sends flips after botocore took
    its checksum and signature, as a faulty link or proxy would flip it."""
    def flip(request: Any, **_: Any) -> None:
        body = request.body
        if body is not None and not isinstance(body, bytes | bytearray):
            position = body.tell()
            body, _ = body.read(), body.seek(position)
        if body:
            changed = bytearray(body)
            changed[len(changed) // 2] ^= 0x01
            request.body = bytes(changed)

    for operation in ("PutObject", "UploadPart"):
        store._client.meta.events.register(f"before-send.s3.{operation}", flip)


@pytest.mark.parametrize("signed", [False, True], ids=["crc32", "signed"])
def test_a_body_changed_on_its_way_is_refused_by_the_server(
    s3_server: SeaweedFS, signed: bool
) -> None:
    # What an unsigned body's CRC32 (or a signed one's sha256) is for: the server checks
    # it and stores nothing of a body that does not match. moto stores such a body.
    store = _parts_store(s3_server, sign_payloads=signed)
    store.put_bytes("shard.bin", b"the committed one")
    _changed_on_their_way(store)
    with pytest.raises(StoreIntegrityError, match=(
            rf"^{s3_server.endpoint} refused the bytes sent to write "
            rf"{store.uri('shard.bin')}: .* \((BadDigest|XAmzContentSHA256Mismatch)\)$")):
        store.put_bytes("shard.bin", os.urandom(1000))
    writer = store.writer("big.bin")
    with pytest.raises(StoreIntegrityError, match=(
            rf"refused the bytes sent to upload {store.uri('big.bin')}: ")):
        try:
            writer.write(os.urandom(11 * MiB))  # two parts sent, one buffered
            writer.close()
        finally:
            writer.abort()
    raw = s3_server.client()
    assert raw.get_object(Bucket=store.bucket, Key="parts/shard.bin")["Body"].read() == (
        b"the committed one")
    assert not store.exists("big.bin")
    assert not raw.list_multipart_uploads(Bucket=store.bucket).get("Uploads")


# --- an outage, ridden out within the retry budget ----------------------------------------


@pytest.fixture
def outage(s3_server: SeaweedFS) -> Iterator[Outage]:
    """The server behind a proxy that can refuse connections for a while, keeping its
    objects."""
    proxy = Outage(("127.0.0.1", s3_server.port))
    yield proxy
    proxy.close()


def _patient(outage: Outage, bucket: str, seconds: float) -> S3Store:
    return S3Store(f"s3://{bucket}/runs", S3Config(
        endpoint_url=outage.endpoint, addressing_style="path", retry_seconds=seconds,
        multipart_threshold_mb=5, multipart_chunk_mb=5, max_concurrency=2))


def test_a_worker_store_rides_out_a_ten_second_outage(
    s3_server: SeaweedFS, outage: Outage, caplog: pytest.LogCaptureFixture
) -> None:
    """Connections refused for 10 s: botocore's five attempts fail in half a second, and
    the request is made again with backoff until the endpoint is back."""
    store = _patient(outage, s3_server.new_bucket(), seconds=60)
    store.put_bytes("before", b"x")
    caplog.set_level(logging.WARNING, logger="resumequal.store")
    impatient = S3Store(store.uri(), store.config.model_copy(update={"retry_seconds": 0.0}))
    with outage.down(), pytest.raises(StoreUnavailable):  # botocore's attempts give up at once
        impatient.put_bytes("x", b"x")
    # Python's global random generator is a worker's training state (a checkpoint saves it,
    # the trace compares it): no retry draws from it.
    generator = random.getstate()
    down = outage.down_for(10)
    start = time.monotonic()
    time.sleep(0.2)  # down by now
    store.put_bytes("during/a", b"a")
    writer = store.writer("during/parts")
    writer.write(os.urandom(11 * MiB))  # a multipart upload, its parts through the outage
    writer.close()
    assert [o.key for o in store.list("during")] == ["during/a", "during/parts"]
    assert store.get_bytes("before") == b"x"
    waited = time.monotonic() - start
    down.join()
    assert 9 < waited < 10 + 2 * 5 + 5, waited  # back within a backoff of its return
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("put_object s3://" in w and "trying again in" in w for w in warned), warned
    assert random.getstate() == generator


def test_past_the_budget_a_request_fails_naming_the_endpoint_the_object_and_the_time(
    s3_server: SeaweedFS, outage: Outage
) -> None:
    store = _patient(outage, s3_server.new_bucket(), seconds=3)
    start = time.monotonic()
    with outage.down(), pytest.raises(StoreUnavailable, match=(
            rf"{outage.endpoint} kept failing to write s3://\S+/runs/k for [2-3] s "
            r"\(EndpointConnectionError\); given up after the store's retry budget of 3 s "
            r"\(timeouts.backendErrorSeconds\)")):
        store.put_bytes("k", b"x")
    assert 2 < time.monotonic() - start < 4

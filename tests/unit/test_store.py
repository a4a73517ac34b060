"""Unit tests for the store package without a network: FileStore end to end, keys and
prefixes, atomic writes, sha256 checks, open_store dispatch and S3Config validation.
The same behaviour against a real S3 endpoint is in tests/integration/test_s3_store.py."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from resumequal.errors import StoreError
from resumequal.store import (
    FileStore,
    GCSSettings,
    ObjectInfo,
    S3Config,
    S3Settings,
    StoreIntegrityError,
    StoreNotFound,
    StoreObjectTooLarge,
    open_store,
)
from resumequal.store import file as file_module
from resumequal.store.gcs import GCSStore
from resumequal.store.s3 import S3Store


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(str(tmp_path / "store"))


def test_bytes_round_trip_and_uri(store: FileStore, tmp_path: Path) -> None:
    assert not store.exists("a/b.json")
    store.put_bytes("a/b.json", b'{"x": 1}')
    assert store.exists("a/b.json")
    assert not store.exists("a")  # a folder is not an object
    assert store.get_bytes("a/b.json") == b'{"x": 1}'
    store.put_bytes("a/b.json", b"replaced")
    assert store.get_bytes("a/b.json") == b"replaced"
    assert store.uri("a/b.json") == f"{tmp_path}/store/a/b.json"
    assert store.uri() == f"{tmp_path}/store"


def test_a_read_takes_no_more_than_its_cap(store: FileStore) -> None:
    store.put_bytes("a/marker.json", b"x" * 10)
    assert store.get_bytes("a/marker.json", 10) == b"x" * 10
    with pytest.raises(StoreObjectTooLarge, match=r"a/marker\.json: larger than the 9 bytes"):
        store.get_bytes("a/marker.json", 9)


def test_file_uri_root(tmp_path: Path) -> None:
    store = FileStore(f"file://{tmp_path}/s")
    store.put_bytes("k", b"v")
    assert (tmp_path / "s" / "k").read_bytes() == b"v"
    assert store.uri("k") == f"file://{tmp_path}/s/k"
    assert FileStore(f"file://localhost{tmp_path}/s").get_bytes("k") == b"v"


def test_file_uri_with_host_is_rejected() -> None:
    with pytest.raises(StoreError, match="not a host"):
        FileStore("file://server/data")


def test_put_file_returns_sha256_and_get_file_verifies(store: FileStore, tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    assert store.put_file("ckpt/shard.bin", src) == expected
    dest = tmp_path / "down" / "deep" / "shard.bin"
    assert store.get_file("ckpt/shard.bin", dest, expect_sha256=expected) == expected
    assert dest.read_bytes() == data
    assert store.get_file("ckpt/shard.bin", str(dest)) == expected  # str paths too, no check


def test_flipped_byte_fails_verification_and_leaves_no_file(
    store: FileStore, tmp_path: Path
) -> None:
    data = bytearray(os.urandom(1 << 16))
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    digest = store.put_file("x/shard.bin", src)
    data[1234] ^= 0x01
    (Path(store.root) / "x" / "shard.bin").write_bytes(data)
    dest = tmp_path / "down.bin"
    dest.write_bytes(b"an older copy")
    with pytest.raises(StoreIntegrityError, match=r"x/shard\.bin.*does not match") as info:
        store.get_file("x/shard.bin", dest, expect_sha256=digest)
    assert store.uri("x/shard.bin") in str(info.value)
    assert not dest.exists()
    assert sorted(os.listdir(tmp_path)) == ["src.bin", "store"]  # no temporary left


def test_missing_key_names_the_key(store: FileStore, tmp_path: Path) -> None:
    with pytest.raises(StoreNotFound, match=r"store/no/such\.key does not exist"):
        store.get_bytes("no/such.key")
    with pytest.raises(StoreNotFound, match=r"no/such\.key"):
        store.get_file("no/such.key", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    store.put_bytes("dir/k", b"")
    with pytest.raises(StoreNotFound, match="dir does not exist"):
        store.get_bytes("dir")  # a folder, not an object


def test_missing_local_source_is_the_callers_error(store: FileStore, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        store.put_file("k", tmp_path / "absent")


def test_list_is_recursive_sorted_and_prefixes_are_folders(store: FileStore) -> None:
    keys = [
        "run/step-00000005+1/b",
        "run/step-00000005/dcp/1.distcp",
        "run/step-00000005/dcp/0.distcp",
        "run/step-00000005/manifest.json",
        "run/step-00000004/manifest.json",
        "other/x",
    ]
    for i, key in enumerate(keys):
        store.put_bytes(key, b"x" * i)
    assert store.list() == sorted(ObjectInfo(k, i) for i, k in enumerate(keys))
    assert [o.key for o in store.list("run/step-00000005")] == [
        "run/step-00000005/dcp/0.distcp",
        "run/step-00000005/dcp/1.distcp",
        "run/step-00000005/manifest.json",
    ]
    assert store.list("run/step-00000005/") == store.list("run/step-00000005")
    assert store.list("run/step-0000000") == []  # a prefix is a folder, not a string prefix
    assert store.list("nothing/here") == []
    assert FileStore(str(Path(store.root) / "absent")).list() == []


def test_delete_and_delete_prefix(store: FileStore) -> None:
    for key in ("c/step-00000005/a", "c/step-00000005/d/b", "c/step-00000005+1/a", "c/keep"):
        store.put_bytes(key, b"1")
    store.delete("c/keep")
    store.delete("c/keep")  # idempotent
    assert not store.exists("c/keep")
    assert store.delete_prefix("c/step-00000005") == 2
    assert [o.key for o in store.list()] == ["c/step-00000005+1/a"]
    assert store.delete_prefix("c/absent") == 0
    with pytest.raises(ValueError, match="whole store"):
        store.delete_prefix("")
    with pytest.raises(ValueError, match="whole store"):
        store.delete_prefix("/")


@pytest.mark.parametrize("key", ["", "/abs", "a/", "a//b", "../up", "a/../b", "a/./b", "a/b.rqtmp"])
def test_bad_keys_are_rejected(store: FileStore, key: str) -> None:
    with pytest.raises(ValueError, match="store key"):
        store.put_bytes(key, b"")


def test_failed_write_keeps_the_old_object_and_no_temporary(
    store: FileStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.put_bytes("k", b"old")

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(file_module.os, "fsync", broken_fsync)
    with pytest.raises(StoreError, match=r"cannot write .*/k: No space left"):
        store.put_bytes("k", b"new")
    monkeypatch.undo()
    assert store.get_bytes("k") == b"old"
    assert os.listdir(store.root) == ["k"]


def test_temporary_files_are_not_listed(store: FileStore) -> None:
    store.put_bytes("a/k", b"1")
    Path(store.root, "a", ".k.deadbeef.rqtmp").write_bytes(b"half")  # left by a kill
    assert [o.key for o in store.list()] == ["a/k"]
    assert store.delete_prefix("a") == 1
    assert not Path(store.root, "a").exists()


@pytest.mark.usefixtures("aws_env")  # no credential lookup over the network
def test_open_store_dispatches_on_scheme(tmp_path: Path) -> None:
    assert isinstance(open_store(str(tmp_path)), FileStore)
    assert isinstance(open_store(f"file://{tmp_path}"), FileStore)
    s3 = open_store("s3://bucket/runs/x/", S3Settings(endpoint_url="http://127.0.0.1:9"))
    assert isinstance(s3, S3Store)
    assert s3.uri("a/b") == "s3://bucket/runs/x/a/b"
    assert s3.config.endpoint_url == "http://127.0.0.1:9"  # the settings reached the client
    assert S3Store("s3://bucket").uri("k") == "s3://bucket/k"
    gs = open_store("gs://bucket/x", GCSSettings(endpoint_url="http://127.0.0.1:9"))
    assert isinstance(gs, GCSStore) and gs.uri("k") == "gs://bucket/x/k"
    # Settings of another scheme's store are not its own: a folder ignores them.
    assert isinstance(open_store(str(tmp_path), S3Settings()), FileStore)
    with pytest.raises(StoreError, match="scheme 'az' is not supported"):
        open_store("az://bucket/x")
    with pytest.raises(StoreError, match="s3://bucket"):
        open_store("s3:///no-bucket")


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"multipart_chunk_mb": 4}, "multipart_chunk_mb"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"addressing_style": "dns"}, "addressing_style"),
        ({"retry_mode": "legacy"}, "retry_mode"),
        ({"endpoint_url": "minio:9000"}, "endpoint_url"),
        ({"aws_secret_access_key": "rq-SECRET-in-config"}, "aws_secret_access_key"),
        ({"endpoint_url": "http://user:rq-SECRET-in-url@minio:9000"}, "user:password"),
    ],
)
def test_s3_config_rejects_bad_fields_without_echoing_them(
    fields: dict[str, object], match: str
) -> None:
    with pytest.raises(ValidationError, match=match) as info:
        S3Config.model_validate(fields)
    assert "rq-SECRET" not in str(info.value)


def test_s3_config_from_a_spec_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from resumequal.store import StoreError
    from resumequal.store.s3settings import ADDRESSING_STYLE_ENV, s3_config

    spec = S3Settings(endpoint_url="http://minio:9000", addressing_style="path")
    assert s3_config(spec).addressing_style == "path"
    monkeypatch.delenv(ADDRESSING_STYLE_ENV, raising=False)
    assert s3_config(None) == S3Config()
    monkeypatch.setenv(ADDRESSING_STYLE_ENV, "path")
    assert s3_config(None).addressing_style == "path"
    # A spec says it all: the environment does not override it.
    assert s3_config(S3Settings()).addressing_style == "auto"
    monkeypatch.setenv(ADDRESSING_STYLE_ENV, "sideways")
    with pytest.raises(StoreError, match=f"{ADDRESSING_STYLE_ENV}='sideways'"):
        s3_config(None)


def test_s3_timeouts_come_from_the_spec_and_bound_a_silent_endpoint_under_a_minute() -> None:
    from resumequal.store.s3settings import s3_config

    default = s3_config(S3Settings())
    assert default == S3Config()
    # Each attempt at an endpoint that never answers waits out the read timeout; standard
    # retries back off at most 1 + 2 + 4 + 8 s between five attempts.
    assert default.max_attempts * default.read_timeout_seconds + 15 < 60
    tuned = s3_config(S3Settings(connect_timeout_seconds=1.5, read_timeout_seconds=30))
    assert (tuned.connect_timeout_seconds, tuned.read_timeout_seconds) == (1.5, 30)


def test_whether_payloads_are_signed_from_a_spec_or_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from resumequal.store import StoreError
    from resumequal.store.s3settings import SIGN_PAYLOADS_ENV, s3_config

    monkeypatch.delenv(SIGN_PAYLOADS_ENV, raising=False)
    assert s3_config(None).sign_payloads is False
    assert s3_config(S3Settings(sign_payloads=True)).sign_payloads is True
    monkeypatch.setenv(SIGN_PAYLOADS_ENV, "1")
    assert s3_config(None).sign_payloads is True
    assert s3_config(S3Settings()).sign_payloads is False  # a spec says it all
    monkeypatch.setenv(SIGN_PAYLOADS_ENV, "yes")
    with pytest.raises(StoreError, match=f"{SIGN_PAYLOADS_ENV}='yes': expected 0 or 1"):
        s3_config(None)


@pytest.mark.parametrize("model", [S3Settings, GCSSettings])
def test_store_settings_are_spelt_and_bounded_like_every_spec_section(
    model: type[S3Settings | GCSSettings],
) -> None:
    """A store's settings live with the store, which the spec imports, so they spell the
    spec's section convention and ceilings themselves: they must stay the spec's."""
    from resumequal.spec import MAX_SECONDS, MAX_URI, SECTION_CONFIG

    assert model.model_config == SECTION_CONFIG
    assert model.model_fields["endpoint_url"].metadata[0].max_length == MAX_URI
    for name in ("connect_timeout_seconds", "read_timeout_seconds"):
        assert [m.le for m in model.model_fields[name].metadata if hasattr(m, "le")] \
            == [MAX_SECONDS]


def test_put_new_writes_only_once(store: FileStore) -> None:
    assert store.put_new("run.json", b"first") is True
    assert store.put_new("run.json", b"second") is False
    assert store.get_bytes("run.json") == b"first"


def test_put_file_onto_itself_keeps_the_file(store: FileStore) -> None:
    store.put_bytes("report.html", b"<html/>")
    own = Path(store.local_folder()) / "report.html"
    assert store.put_file("report.html", own) == hashlib.sha256(b"<html/>").hexdigest()
    assert store.get_bytes("report.html") == b"<html/>"


def test_child_and_delete_all(store: FileStore, tmp_path: Path) -> None:
    child = store.child("seed-11")
    child.put_bytes("a/b", b"x")
    child.put_bytes("c", b"y")
    assert child.uri("c") == f"{tmp_path}/store/seed-11/c"
    assert store.list() == [ObjectInfo("seed-11/a/b", 1), ObjectInfo("seed-11/c", 1)]
    assert child.delete_all() == 2
    assert not (tmp_path / "store" / "seed-11").exists()
    assert FileStore(str(tmp_path / "absent")).delete_all() == 0


@pytest.mark.usefixtures("aws_env")  # no credential lookup over the network
def test_only_a_folder_store_is_a_local_folder(tmp_path: Path) -> None:
    assert FileStore(f"file://{tmp_path}/s").local_folder() == f"{tmp_path}/s"
    s3 = S3Store("s3://bucket/runs", S3Config(endpoint_url="http://127.0.0.1:9"))
    assert s3.local_folder() is None
    assert s3.child("x").uri("k") == "s3://bucket/runs/x/k"
    with pytest.raises(ValueError, match="whole bucket"):
        S3Store("s3://bucket", S3Config(endpoint_url="http://127.0.0.1:9")).delete_all()


@pytest.mark.usefixtures("aws_env")  # no credential lookup over the network
def test_put_new_on_s3_is_a_conditional_put_and_looks_first_only_where_there_is_none() -> None:
    from botocore.stub import ANY, Stubber

    s3 = S3Store("s3://bucket/runs", S3Config(endpoint_url="http://127.0.0.1:9"))
    put = {"Bucket": "bucket", "Key": "runs/run.json", "Body": ANY}
    with Stubber(s3._client) as stub:
        stub.add_response("put_object", {}, {**put, "IfNoneMatch": "*"})
        stub.add_client_error("put_object", "PreconditionFailed", http_status_code=412,
                              expected_params={**put, "IfNoneMatch": "*"})
        # An endpoint without conditional writes: look, then write.
        stub.add_client_error("put_object", "NotImplemented", http_status_code=501,
                              expected_params={**put, "IfNoneMatch": "*"})
        stub.add_client_error("head_object", "404", http_status_code=404,
                              expected_params={"Bucket": "bucket", "Key": "runs/run.json"})
        stub.add_response("head_bucket", {}, {"Bucket": "bucket"})
        stub.add_response("put_object", {}, put)
        assert s3.put_new("run.json", b"first") is True
        assert s3.put_new("run.json", b"second") is False
        assert s3.put_new("run.json", b"third") is True
        stub.assert_no_pending_responses()


def test_a_streamed_object_appears_whole_at_close_and_not_at_all_on_abort(
    store: FileStore,
) -> None:
    store.put_bytes("c/shard", b"old")
    writer = store.writer("c/shard")
    for piece in (b"ab", memoryview(b"cdef"), bytearray(b"g")):
        writer.write(piece)
    assert writer.tell() == 7
    assert store.get_bytes("c/shard") == b"old"  # readers see the old object meanwhile
    assert writer.close() == hashlib.sha256(b"abcdefg").hexdigest()
    assert store.get_bytes("c/shard") == b"abcdefg"
    aborted = store.writer("c/shard")
    aborted.write(b"never")
    aborted.abort()
    assert store.get_bytes("c/shard") == b"abcdefg"
    assert [o.key for o in store.list()] == ["c/shard"]
    assert os.listdir(os.path.join(store.root, "c")) == ["shard"]  # no temporary left


ENDPOINTS = [
    "http://minio:9000", "https://s3.example.com", "http://127.0.0.1:9", "http://[::1]:9000",
    "http://[fe80::1%25eth0]:9000", "http://minio:9000/", "http://minio.:9000",
    "http://host-1.svc.cluster.local:9000/path", "http://999.1.1.1", "http://h%0d%0a",
    "http://[::1", "http://h\r\n:9", "http://h\tx", "http://-h", "http://h-", "http://h_x",
    "http://[not-v6]:9000", "http://" + "a" * 64, "http://" + ".".join(["a" * 63] * 5),
    "http://h:99999", "http://h:port", "http://h:-1", "http://h.example.com:443/p/q",
    "http://ü.example", "http://h/%0a", "https://[2001:db8::1]",
]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_the_spec_the_s3_settings_and_botocore_take_the_same_endpoints(endpoint: str) -> None:
    """One check (resumequal.store.s3settings.endpoint_problem) for the spec, the S3
    settings and the environment; what it takes, botocore takes (a client is made), and
    what botocore refuses it refuses up front."""
    import boto3.session  # type: ignore[import-untyped]
    from botocore.utils import (  # type: ignore[import-untyped]
        is_valid_endpoint_url,
        is_valid_ipv6_endpoint_url,
    )

    from resumequal.store.s3settings import S3Settings, endpoint_problem

    ours = endpoint_problem(endpoint) is None
    try:
        boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                       aws_access_key_id="k", aws_secret_access_key="s")
        botocore_takes = True
    except ValueError:
        botocore_takes = False
    assert ours <= botocore_takes, endpoint  # what we take, a client is made with
    try:
        valid = is_valid_endpoint_url(endpoint) or is_valid_ipv6_endpoint_url(endpoint)
    except ValueError:
        valid = False
    assert botocore_takes == bool(valid), endpoint
    if not botocore_takes:
        assert not ours, endpoint
    spec_takes = True
    try:
        S3Settings(endpoint_url=endpoint)
        S3Config(endpoint_url=endpoint)
    except ValidationError as e:
        spec_takes = False
        assert "a" * 64 not in str(e) and "%0d" not in str(e)  # never echoed
    assert spec_takes == ours, endpoint


def test_an_endpoint_from_the_environment_no_client_takes_is_a_store_config_error(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    from resumequal.store.errors import StoreConfigError

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://h%0d%0a")
    with pytest.raises(StoreConfigError, match="AWS_ENDPOINT_URL_S3 has a host that is no"):
        open_store("s3://bucket/runs")

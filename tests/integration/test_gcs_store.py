"""The ``gs://`` store against fake-gcs-server over HTTP on loopback: what is particular
to it (the contract every store keeps runs in test_s3_store.py). Nothing in the Cloud
Storage client is patched: errors come from real responses and refused connections."""

from __future__ import annotations

import hashlib
import logging
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from resumequal.run.location import RunLocation
from resumequal.spec import QualificationSpec, parse_spec
from resumequal.store import (
    GCSSettings,
    ObjectInfo,
    StoreNotFound,
    StoreUnavailable,
    open_store,
)
from resumequal.store.errors import StoreConfigError
from resumequal.store.gcs import GCSStore
from tests.outage import Outage

if TYPE_CHECKING:
    from tests.gcsserver import FakeGCS

pytest_plugins = ("tests.gcsserver",)
pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20


@pytest.fixture
def gcs(gcs_server: FakeGCS) -> GCSStore:
    return GCSStore(f"gs://{gcs_server.new_bucket()}/runs",
                    GCSSettings(endpoint_url=gcs_server.endpoint))


@pytest.mark.parametrize("op", ["read", "look up", "write", "list", "delete", "download"])
def test_a_missing_bucket_is_named(gcs_server: FakeGCS, tmp_path: Path, op: str) -> None:
    store = GCSStore("gs://rq-no-such-bucket/runs", GCSSettings(endpoint_url=gcs_server.endpoint))
    calls = {"read": lambda: store.get_bytes("k"), "look up": lambda: store.exists("k"),
             "write": lambda: store.put_bytes("k", b"x"), "list": lambda: store.list(),
             "delete": lambda: store.delete("k"),
             "download": lambda: store.get_file("k", tmp_path / "k")}
    with pytest.raises(StoreNotFound, match="bucket 'rq-no-such-bucket' does not exist") as info:
        calls[op]()
    assert op in str(info.value) and gcs_server.endpoint in str(info.value)


def test_a_missing_key_is_named_and_deleting_it_is_no_error(gcs: GCSStore,
                                                           tmp_path: Path) -> None:
    for read in (lambda: gcs.get_bytes("gone"), lambda: gcs.get_bytes("gone", 10),
                 lambda: gcs.get_file("gone", tmp_path / "gone")):
        with pytest.raises(StoreNotFound, match=f"^{gcs.uri('gone')} does not exist$"):
            read()
    assert not gcs.exists("gone")
    gcs.delete("gone")
    assert not (tmp_path / "gone").exists()


def test_a_streamed_object_exists_only_once_closed_and_not_at_all_aborted(
    gcs: GCSStore,
) -> None:
    data = os.urandom(3 * MiB + 7)
    writer = gcs.writer("ckpt/shard")
    for start in range(0, len(data), MiB):
        writer.write(memoryview(data)[start:start + MiB])
    assert writer.tell() == len(data) and not gcs.exists("ckpt/shard")
    assert writer.close() == hashlib.sha256(data).hexdigest()
    assert gcs.get_bytes("ckpt/shard") == data
    aborted = gcs.writer("ckpt/aborted")
    aborted.write(b"half")
    aborted.abort()
    empty = gcs.writer("ckpt/empty")
    assert empty.close() == hashlib.sha256(b"").hexdigest()
    assert gcs.list("ckpt") == [ObjectInfo("ckpt/empty", 0), ObjectInfo("ckpt/shard", len(data))]


def test_an_unreachable_endpoint_is_unavailable_after_the_attempts_warning_per_retry(
    closed_endpoint: str, caplog: pytest.LogCaptureFixture,
) -> None:
    store = GCSStore("gs://b/runs", GCSSettings(endpoint_url=closed_endpoint, max_attempts=3))
    caplog.set_level(logging.WARNING, logger="resumequal.store")
    generator = random.getstate()
    with pytest.raises(StoreUnavailable, match=f"cannot reach {closed_endpoint} to read "
                                               r"gs://b/runs/k after 3 attempts"):
        store.get_bytes("k")
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.split(":")[0] for w in warned] == ["retrying (2/3) read gs",
                                                 "retrying (3/3) read gs"]
    # A worker's training state holds Python's global generator: no retry draws from it.
    assert random.getstate() == generator


@pytest.fixture
def outage(gcs_server: FakeGCS) -> Iterator[Outage]:
    proxy = Outage(("127.0.0.1", int(gcs_server.endpoint.rsplit(":", 1)[1])))
    yield proxy
    proxy.close()


def test_a_worker_store_rides_out_an_outage_and_past_its_budget_names_the_time(
    gcs_server: FakeGCS, outage: Outage,
) -> None:
    bucket = gcs_server.new_bucket()
    store = GCSStore(f"gs://{bucket}/runs", GCSSettings(endpoint_url=outage.endpoint),
                     retry_seconds=30)
    store.put_bytes("before", b"x")
    generator = random.getstate()
    down = outage.down_for(3)
    start = time.monotonic()
    time.sleep(0.2)
    store.put_bytes("during", b"y")
    assert store.get_bytes("before") == b"x" and store.get_bytes("during") == b"y"
    down.join()
    assert 2.5 < time.monotonic() - start < 3 + 5 + 3
    assert random.getstate() == generator
    hasty = GCSStore(store.uri(), store.config, retry_seconds=1)
    with outage.down(), pytest.raises(StoreUnavailable, match=(
            rf"{outage.endpoint} kept failing to read gs://{bucket}/runs/before for \d+ s "
            r"\(ConnectionError\); given up after the store's retry budget of 1 s")):
        hasty.get_bytes("before")


def test_a_process_without_a_spec_reaches_the_emulator_the_environment_names(
    gcs_server: FakeGCS, monkeypatch: pytest.MonkeyPatch,
) -> None:
    bucket = gcs_server.new_bucket()
    spec = parse_spec({"checkpoint": {"store": f"gs://{bucket}/ckpt",
                                      "gcs": {"endpointUrl": gcs_server.endpoint}}})
    settings = spec.checkpoint.store_settings
    assert settings is not None
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "")
    location = RunLocation.open(f"gs://{bucket}/rq/ns/run/uid", settings)
    location.write_spec(QualificationSpec())
    # A worker's environment, as the runner and the operator set it: no spec needed.
    for name, value in settings.environment().items():
        monkeypatch.setenv(name, value)
    assert RunLocation.open(location.uri).read_spec().checkpoint.store == location.uri
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://user:pw@host:1")
    with pytest.raises(StoreConfigError, match="STORAGE_EMULATOR_HOST holds user:password") \
            as info:
        open_store(f"gs://{bucket}/x")
    assert "pw" not in str(info.value)


def test_no_request_draws_from_the_global_random_generator(gcs: GCSStore,
                                                           tmp_path: Path) -> None:
    """A worker's training state holds Python's global generator (a checkpoint saves it,
    the trace compares it): the client's multipart boundaries, retries and background
    bucket lookups would each draw from it."""
    generator = random.getstate()
    src = tmp_path / "src"
    src.write_bytes(os.urandom(MiB))
    digest = gcs.put_file("a/file", src)
    gcs.put_bytes("a/small", b"x")
    assert gcs.put_new("a/new", b"y") and not gcs.put_new("a/new", b"z")
    writer = gcs.writer("a/stream")
    writer.write(b"s" * 1000)
    writer.close()
    assert gcs.get_file("a/file", tmp_path / "dst", digest) == digest
    assert gcs.get_bytes("a/small", 10) == b"x" and gcs.exists("a/stream")
    assert gcs.get_range("a/file", MiB - 1, bytearray(4)) == 1
    assert len(gcs.list("a")) == 4 and gcs.delete_prefix("a") == 4
    time.sleep(0.5)  # a background thread's request would be made by now
    assert random.getstate() == generator

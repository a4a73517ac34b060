"""A third store is one class: registered under its scheme, everything else finds it.

The toy store below keeps objects in a dict. Registering it is all it takes for
``open_store``, the spec's store URIs and a whole run location (spec files, a leg's trace
written and read back, beacons) to work through it.
"""

from __future__ import annotations

import builtins
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from typing_extensions import Buffer

from resumequal.run.location import RunLocation
from resumequal.spec import QualificationSpec, SpecError, parse_spec, store_uri
from resumequal.store import (
    ObjectInfo,
    StoreNotFound,
    StoreSettings,
    open_store,
    register,
    schemes,
)
from resumequal.store import registry as registry_module
from resumequal.store.base import LocalPath, check_key, folder
from resumequal.store.errors import too_large
from resumequal.store.file import FileStore
from resumequal.trace.records import StepRecord, TraceWriter
from tests.unit.test_compare import step_record


class MemoryWriter:
    """A streamed object of a MemoryStore: kept aside until ``close`` stores it whole."""

    def __init__(self, store: MemoryStore, key: str) -> None:
        self.store, self.key, self.data = store, key, bytearray()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data).cast("B")
        self.data += view
        return len(view)

    def tell(self) -> int:
        return len(self.data)

    def close(self) -> str:
        self.store.put_bytes(self.key, bytes(self.data))
        return hashlib.sha256(self.data).hexdigest()

    def abort(self) -> None:
        self.data = bytearray()


class MemoryStore:
    """Objects in a dict shared by every store of one bucket: ``mem://bucket/prefix``."""

    scheme: ClassVar[str] = "mem"
    example: ClassVar[str] = "mem://bucket/prefix"
    buckets: ClassVar[dict[str, dict[str, bytes]]] = {}

    @classmethod
    def authority_problem(cls, authority: str) -> str | None:
        return None if authority else "a mem:// store names a bucket"

    settings: ClassVar[None] = None

    @classmethod
    def open(cls, uri: str, settings: StoreSettings | None, retry_seconds: float) -> MemoryStore:
        return cls(uri)

    def __init__(self, uri: str) -> None:
        bucket, _, prefix = uri.removeprefix("mem://").partition("/")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.objects = self.buckets.setdefault(bucket, {})

    def _full(self, key: str) -> str:
        return f"{self.prefix}/{check_key(key)}" if self.prefix else check_key(key)

    def uri(self, key: str = "") -> str:
        root = f"mem://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        return f"{root}/{check_key(key)}" if key else root

    def put_bytes(self, key: str, data: bytes, *, sync: bool = True) -> None:
        self.objects[self._full(key)] = bytes(data)

    def put_new(self, key: str, data: bytes) -> bool:
        if self._full(key) in self.objects:
            return False
        self.put_bytes(key, data)
        return True

    def put_file(self, key: str, local_path: LocalPath) -> str:
        data = Path(local_path).read_bytes()
        self.put_bytes(key, data)
        return hashlib.sha256(data).hexdigest()

    def writer(self, key: str) -> MemoryWriter:
        return MemoryWriter(self, key)

    def get_bytes(self, key: str, max_bytes: int | None = None) -> bytes:
        try:
            data = self.objects[self._full(key)]
        except KeyError as e:
            raise StoreNotFound(f"{self.uri(key)} does not exist") from e
        if max_bytes is not None and len(data) > max_bytes:
            raise too_large(self.uri(key), max_bytes)
        return data


    def get_range(self, key: str, offset: int, out: Buffer) -> int:
        data = self.get_bytes(key)[offset:offset + len(memoryview(out))]
        memoryview(out).cast("B")[:len(data)] = data
        return len(data)

    def get_file(self, key: str, local_path: LocalPath, expect_sha256: str | None = None) -> str:
        data = self.get_bytes(key)
        os.makedirs(os.path.dirname(os.path.abspath(local_path)), exist_ok=True)
        Path(local_path).write_bytes(data)
        return hashlib.sha256(data).hexdigest()

    def exists(self, key: str) -> bool:
        return self._full(key) in self.objects

    def _under(self, prefix: str) -> Iterator[str]:
        base = (f"{self.prefix}/" if self.prefix else "") + folder(prefix)
        for full in self.objects:
            if full.startswith(base):
                yield full

    def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        cut = len(self.prefix) + 1 if self.prefix else 0
        return sorted(ObjectInfo(full[cut:], len(self.objects[full]))
                      for full in self._under(prefix))

    def delete(self, key: str) -> None:
        self.objects.pop(self._full(key), None)

    def delete_prefix(self, prefix: str) -> int:
        gone = list(self._under(prefix))
        for full in gone:
            del self.objects[full]
        return len(gone)

    def delete_all(self) -> int:
        return self.delete_prefix("")

    def child(self, name: str) -> MemoryStore:
        return MemoryStore(self.uri(name))

    def local_folder(self) -> None:
        return None

    def shared(self) -> bool:
        return True


@pytest.fixture
def mem(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """MemoryStore registered for one test, as its module would register it."""
    monkeypatch.setattr(registry_module, "_CLASSES", dict(registry_module._CLASSES))
    monkeypatch.setattr(MemoryStore, "buckets", {})
    register(MemoryStore)
    yield


def test_a_scheme_is_unknown_until_its_store_registers() -> None:
    assert set(schemes()) == {"file", "gs", "s3"}
    with pytest.raises(ValueError, match="scheme 'mem' is not supported; use file:///abs/path, "
                                         "gs://bucket/prefix or s3://bucket/prefix"):
        store_uri("mem://bucket/x")


@pytest.mark.usefixtures("mem")
def test_a_registered_store_serves_its_scheme_everywhere() -> None:
    assert schemes()["mem"] == "mem://bucket/prefix"
    assert isinstance(open_store("mem://b/runs"), MemoryStore)
    # The spec takes its URIs, checked by the store's own rule.
    assert parse_spec({"checkpoint": {"store": "mem://b/ckpt/"}}).checkpoint.store == (
        "mem://b/ckpt")
    with pytest.raises(SpecError, match="a mem:// store names a bucket"):
        parse_spec({"checkpoint": {"store": "mem:///ckpt"}})


@pytest.mark.usefixtures("mem")
def test_a_run_location_round_trips_through_a_registered_store() -> None:
    location = RunLocation.open("mem://b/rq/ns/run/uid")
    spec = QualificationSpec()
    location.write_spec(spec)
    location.write_leg_spec("control", spec, [])
    assert location.read_spec() == location.leg_spec(spec)
    leg_spec = location.read_leg_spec("control")
    # A shared store holds the legs' checkpoints under the run location.
    assert leg_spec is not None and leg_spec.spec.checkpoint.store == location.uri

    records = [step_record(0, 0, s) for s in (1, 2)]
    with TraceWriter(location.trace_sink("control", rank=0, attempt=0)) as writer:
        for record in records:
            writer.write(record)
    traces = location.traces("control")
    assert [k.key for k in traces.segments()] == [
        "control/trace/rank-0/attempt-0/00000000.jsonl",
        "control/trace/rank-0/attempt-0/00000001.jsonl"]
    read = traces.records(0)
    assert [r.step for r in read if isinstance(r, StepRecord)] == [1, 2]
    assert location.leg_progress("control", 1).steps_done == 2

    location.leg("preempted").write_beacon(1, 0, 6, 1, "microbatch")
    beacon = location.read_beacon("preempted", 1)
    assert beacon is not None and beacon.step == 6
    assert location.child("seed-3").uri == "mem://b/rq/ns/run/uid/seed-3"


def test_a_thread_asking_during_discovery_waits_for_every_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Discovery as on a fresh process: the S3 store registers only when its (slow) import
    # finishes, and a second thread asks meanwhile (the operator's workers do).
    s3_class = registry_module.store_class("s3")
    assert s3_class is not None
    monkeypatch.setattr(registry_module, "_CLASSES", {"file": FileStore})
    monkeypatch.setattr(registry_module, "_discovered", False)
    importing = threading.Event()
    real_import = registry_module.importlib.import_module

    def slow_import(name: str) -> object:
        module = real_import(name)
        if name == "resumequal.store.s3":
            importing.set()
            time.sleep(0.3)
            registry_module.register(s3_class)
        return module

    monkeypatch.setattr(registry_module.importlib, "import_module", slow_import)
    found: list[object] = []
    first = threading.Thread(target=lambda: found.append(registry_module.store_class("s3")))
    first.start()
    assert importing.wait(10)
    found.append(registry_module.store_class("s3"))  # asked while the first discovers
    first.join(10)
    assert found == [s3_class, s3_class]

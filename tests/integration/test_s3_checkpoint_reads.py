"""Restoring from S3 (SeaweedFS) copies nothing: each rank fetches just the chunks it
loads, in ranged GETs, each checked against the authenticated manifest before DCP sees
it. In one process with a world-1 gloo group."""

from __future__ import annotations

import importlib
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from typing_extensions import Buffer

from resumequal.checkpoint import CheckpointManager, Position, RemoteRoot, layout
from resumequal.checkpoint.chunks import CHUNK_BYTES
from resumequal.checkpoint.reading import VerifiedCheckpoint
from resumequal.errors import CheckpointError
from resumequal.store.s3 import S3Store
from resumequal.store.s3settings import S3Config
from tests.checkpoint_attacks import payload
from tests.process_group import single_rank_group
from tests.unit.rank_states import Plain

if TYPE_CHECKING:
    from tests.s3server import SeaweedFS

pytestmark = [pytest.mark.usefixtures("aws_env", "process_group"), pytest.mark.timeout(120)]

NAME = Position(4).name
# Two tensors of three chunks each (float32), side by side in rank 0's one shard file.
ELEMENTS = 3 * CHUNK_BYTES // 4
SHARD = "dcp/__0_0.distcp"


@pytest.fixture(scope="module")
def process_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with single_rank_group(tmp_path_factory.mktemp("pg")):
        yield


def _state() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    return {"a": torch.randn(ELEMENTS, generator=gen), "b": torch.randn(ELEMENTS, generator=gen),
            "small": torch.arange(5.0)}


def _zeros(keys: tuple[str, ...] = ("a", "b", "small")) -> dict[str, Any]:
    return {k: torch.zeros_like(v) for k, v in _state().items() if k in keys}


class _Ranges:
    """Every ranged read of the store: (key, offset, length); whole downloads refused."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads: list[tuple[str, int, int]] = []
        get_range = S3Store.get_range

        def recorded(store: S3Store, key: str, offset: int, out: Buffer) -> int:
            self.reads.append((key, offset, len(memoryview(out))))
            return get_range(store, key, offset, out)

        def refused(*_: Any, **__: Any) -> str:
            raise AssertionError("a restore downloads no whole object")

        monkeypatch.setattr(S3Store, "get_range", recorded)
        monkeypatch.setattr(S3Store, "get_file", refused)


@pytest.fixture
def root(s3_server: SeaweedFS, tmp_path: Path) -> RemoteRoot:
    config = S3Config(endpoint_url=s3_server.endpoint, addressing_style="path")
    store = S3Store(f"s3://{s3_server.new_bucket()}/runs", config)
    root = RemoteRoot(store, "leg/checkpoints", tmp_path / "local")
    mgr = CheckpointManager(root, rank=0, world_size=1, attempt=0, keep_last=2)
    assert mgr.save(Position(4), _state(), Plain(step=4)) == NAME
    return root


def _where(checkpoint: VerifiedCheckpoint, key: str) -> tuple[int, int]:
    """Tensor ``key``'s offset and length in the shard."""
    meta = checkpoint.reader().read_metadata()
    (info,) = [v for k, v in meta.storage_data.items() if k.fqn == key]
    assert f"{layout.DCP_DIR}/{info.relative_path}" == SHARD
    return info.offset, info.length


def _flip(s3_server: SeaweedFS, root: RemoteRoot, rel: str, at: int) -> None:
    assert isinstance(root.store, S3Store)
    s3, key = s3_server.client(), f"runs/{root.key(NAME, rel)}"
    body = bytearray(s3.get_object(Bucket=root.store.bucket, Key=key)["Body"].read())
    body[at] ^= 0x01  # same size: only the digest can tell
    s3.put_object(Bucket=root.store.bucket, Key=key, Body=bytes(body))


def test_a_restore_reads_ranges_of_the_objects_and_gives_back_the_state(
    root: RemoteRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    ranges = _Ranges(monkeypatch)
    mgr = CheckpointManager(root, rank=0, world_size=1, attempt=1, keep_last=2)
    assert mgr.newest() == NAME
    loaded = mgr.load(NAME, lambda _: _zeros(), Plain)
    for key, value in _state().items():
        assert torch.equal(loaded.tensors[key], value), key
    assert loaded.rank_state == Plain(step=4)
    shard = [(offset, length) for key, offset, length in ranges.reads
             if key == root.key(NAME, SHARD)]
    # Every chunk of the shard, whole and once.
    size = root.open(NAME, 0).manifest.files[SHARD].size
    assert sorted(shard) == [(i, min(CHUNK_BYTES, size - i))
                             for i in range(0, size, CHUNK_BYTES)]
    assert not (root.local / ".cache").exists()


def test_a_reader_of_one_tensor_fetches_only_its_chunks(
    root: RemoteRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = root.open(NAME, 0)
    offset, length = _where(checkpoint, "b")
    ranges = _Ranges(monkeypatch)
    state = _zeros(("b",))
    dcp.load(state, storage_reader=checkpoint.reader())
    assert torch.equal(state["b"], _state()["b"])
    first, last = offset // CHUNK_BYTES, (offset + length - 1) // CHUNK_BYTES
    fetched = sorted(o // CHUNK_BYTES for k, o, _ in ranges.reads if k == root.key(NAME, SHARD))
    assert fetched == list(range(first, last + 1))


def test_a_changed_chunk_on_s3_is_refused_by_its_reader_only(
    root: RemoteRoot, s3_server: SeaweedFS
) -> None:
    checkpoint = root.open(NAME, 0)
    offset, length = _where(checkpoint, "a")
    b_offset, _ = _where(checkpoint, "b")
    chunk = (offset + length // 2) // CHUNK_BYTES  # wholly inside a's bytes
    assert chunk < b_offset // CHUNK_BYTES
    _flip(s3_server, root, SHARD, chunk * CHUNK_BYTES + 7)
    state = _zeros(("b",))
    dcp.load(state, storage_reader=checkpoint.reader())  # b's chunks are intact
    assert torch.equal(state["b"], _state()["b"])
    with pytest.raises(CheckpointException) as info:
        dcp.load(_zeros(("a",)), storage_reader=checkpoint.reader())
    (error,) = [exc for exc, _ in info.value.failures.values()]
    assert isinstance(error, CheckpointError)
    assert str(error).startswith(
        f"checkpoint {root.uri(NAME)} is refused: {SHARD} fails its BLAKE3 check at chunk "
        f"{chunk} (bytes {chunk * CHUNK_BYTES}-{(chunk + 1) * CHUNK_BYTES} of ")


def test_a_planted_metadata_on_s3_is_refused_before_it_is_unpickled(
    root: RemoteRoot, tmp_path: Path
) -> None:
    mgr = CheckpointManager(root, rank=0, world_size=1, attempt=1, keep_last=2)
    assert mgr.newest() == NAME
    rel = f"{layout.DCP_DIR}/.metadata"
    size = len(root.store.get_bytes(root.key(NAME, rel)))
    marker = tmp_path / "payload-ran"
    planted = payload(marker)  # pickle ignores what follows its end: pad to the same size
    root.store.put_bytes(root.key(NAME, rel), planted + b"\0" * (size - len(planted)))
    with pytest.raises(CheckpointError, match=(
            r"checkpoint s3://\S+ is refused: dcp/\.metadata fails its BLAKE3 check at "
            "chunk 0")):
        mgr.load(NAME, lambda _: _zeros(), Plain)
    assert not marker.exists()
    pickle.loads(root.store.get_bytes(root.key(NAME, rel)))  # the payload was live
    assert marker.exists()


def test_a_truncated_object_is_refused_where_it_ends(root: RemoteRoot) -> None:
    checkpoint = root.open(NAME, 0)
    data = root.store.get_bytes(root.key(NAME, SHARD))
    root.store.put_bytes(root.key(NAME, SHARD), data[:CHUNK_BYTES + 10])
    with pytest.raises(CheckpointException) as info:
        dcp.load(_zeros(), storage_reader=checkpoint.reader())
    (error,) = [exc for exc, _ in info.value.failures.values()]
    assert f"checkpoint {root.uri(NAME)} is refused: {SHARD} ends at byte " in str(error)


def test_the_scale_bench_on_s3_gives_back_every_saved_state(
    s3_server: SeaweedFS, tmp_path: Path
) -> None:
    """bench/checkpoint_scale.py's correctness path at a few MB, S3 included: every save
    and restore it times gives back the saved state (its timings are not checked)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    try:
        bench = importlib.import_module("checkpoint_scale")
    finally:
        sys.path.pop(0)
    cfg = bench.Config(d_model=64, layers=2, heads=2, vocab=512, seq=16, ranks=1, rounds=1,
                       endpoint=s3_server.endpoint, bucket=s3_server.new_bucket(),
                       server="seaweedfs")
    figures = bench.measure(cfg, tmp_path)  # check_same raises on any difference
    (rounds,) = figures["ranks"]
    for op in ("rq_s3_save", "dcp_s3_save", "rq_s3_load", "dcp_s3_load"):
        assert rounds[0][f"{op}_s"] > 0, op
    report = bench.report(cfg, figures)
    assert "S3 save" in report and "S3 restore" in report


def test_an_endpoint_that_ignores_range_is_refused_saying_so(tmp_path: Path) -> None:
    """A gateway that answers every ranged GET with the whole object (200): the resume is
    refused naming the endpoint and what it did, never read whole into memory chunk by
    chunk, nor called a checkpoint changed after its commit."""
    from tests.moto_s3 import IGNORE_RANGE_ENV
    from tests.s3server import MotoServer

    server = MotoServer(tmp_path / "moto.log", env={IGNORE_RANGE_ENV: "1"})
    server.start()
    try:
        config = S3Config(endpoint_url=server.endpoint, addressing_style="path")
        root = RemoteRoot(S3Store(f"s3://{server.new_bucket()}/runs", config),
                          "leg/checkpoints", tmp_path / "local")
        mgr = CheckpointManager(root, rank=0, world_size=1, attempt=0, keep_last=2)
        assert mgr.save(Position(4), _state(), Plain(step=4)) == NAME
        resumed = CheckpointManager(root, rank=0, world_size=1, attempt=1, keep_last=2)
        assert resumed.newest() == NAME
        with pytest.raises(CheckpointError) as info:
            resumed.load(NAME, lambda _: _zeros(), Plain)
    finally:
        server.stop()
    message = str(info.value)
    assert f"{server.endpoint} answered a GET of bytes 0-" in message
    assert "HTTP 200 without a Content-Range: it ignores Range" in message
    assert "changed after it was committed" not in message

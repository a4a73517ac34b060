"""Reading a checkpoint checks every byte against the manifest as it is read: a rank reads
(and checks) only the chunks holding what it loads, refuses a changed chunk naming the file
and the chunk, never unpickles an unchecked ``.metadata``, and hands torch the very bytes
it checked. In one process with a world-1 gloo group."""

from __future__ import annotations

import json
import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from resumequal.checkpoint import CheckpointManager, FolderRoot, Position, layout, reading
from resumequal.checkpoint.chunks import CHUNK_BYTES, ChunkHasher, chunk_digests, chunk_runs
from resumequal.checkpoint.manifest import (
    MANIFEST_FORMAT,
    FileEntry,
    Manifest,
    authenticate,
    signed,
)
from resumequal.checkpoint.reading import VerifiedCheckpoint
from resumequal.errors import CheckpointError
from resumequal.run.signing import key_from_env, sign
from tests.checkpoint_attacks import payload
from tests.unit.rank_states import Plain

pytestmark = pytest.mark.usefixtures("single_process_group")

NAME = Position(4).name
# Two tensors of three chunks each (float32), side by side in rank 0's one shard file.
ELEMENTS = 3 * CHUNK_BYTES // 4


def _state() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    return {"a": torch.randn(ELEMENTS, generator=gen), "b": torch.randn(ELEMENTS, generator=gen),
            "small": torch.arange(5.0)}


def _zeros() -> dict[str, Any]:
    return {k: torch.zeros_like(v) for k, v in _state().items()}


@pytest.fixture
def root(tmp_path: Path) -> FolderRoot:
    root = FolderRoot(tmp_path / "ckpt")
    mgr = CheckpointManager(root, rank=0, world_size=1, attempt=0, keep_last=2)
    assert mgr.save(Position(4), _state(), Plain(step=4)) == NAME
    return root


def _shard(root: FolderRoot) -> Path:
    (shard,) = (root.root / NAME / layout.DCP_DIR).glob("*.distcp")
    return shard


def _offset(checkpoint: VerifiedCheckpoint, key: str) -> tuple[str, int, int]:
    """Where tensor ``key`` lies: its file (relative to the checkpoint), offset, length."""
    meta = checkpoint.reader().read_metadata()
    (info,) = [v for k, v in meta.storage_data.items() if k.fqn == key]
    return f"{layout.DCP_DIR}/{info.relative_path}", info.offset, info.length


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _load(checkpoint: VerifiedCheckpoint, keys: list[str]) -> dict[str, Any]:
    state = {k: v for k, v in _zeros().items() if k in keys}
    dcp.load(state, storage_reader=checkpoint.reader())
    return state


def _read_chunks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """Every run of chunks read from now on: (file, first, last)."""
    runs: list[tuple[str, int, int]] = []
    fill = VerifiedCheckpoint._fill

    def recorded(self: VerifiedCheckpoint, f: Any, rel: str, entry: FileEntry,
                 window: tuple[int, int], *rest: Any) -> memoryview:
        runs.append((rel, *window))
        return fill(self, f, rel, entry, window, *rest)

    monkeypatch.setattr(VerifiedCheckpoint, "_fill", recorded)
    return runs


def test_a_reader_of_one_tensor_reads_and_checks_only_its_chunks(
    root: FolderRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = root.open(NAME, 0)
    rel, offset, length = _offset(checkpoint, "b")
    runs = _read_chunks(monkeypatch)
    loaded = _load(checkpoint, ["b"])
    assert torch.equal(loaded["b"], _state()["b"])
    first, last = offset // CHUNK_BYTES, (offset + length - 1) // CHUNK_BYTES
    assert [run for run in runs if run[0] == rel] == [(rel, first, last)]
    assert (first, last) != (0, len(checkpoint.manifest.files[rel].chunks) - 1)


def test_a_changed_chunk_is_refused_by_its_reader_only_naming_file_and_chunk(
    root: FolderRoot
) -> None:
    checkpoint = root.open(NAME, 0)
    rel, offset, length = _offset(checkpoint, "a")
    _, b_offset, _ = _offset(checkpoint, "b")
    chunk = (offset + length // 2) // CHUNK_BYTES  # wholly inside a's bytes
    assert chunk < b_offset // CHUNK_BYTES
    _flip(_shard(root), chunk * CHUNK_BYTES + 7)
    # Whoever loads b never reads that chunk: its load succeeds.
    assert torch.equal(_load(checkpoint, ["b"])["b"], _state()["b"])
    with pytest.raises(CheckpointException) as info:
        _load(checkpoint, ["a"])
    (error,) = [exc for exc, _ in info.value.failures.values()]
    assert isinstance(error, CheckpointError)
    assert str(error).startswith(
        f"checkpoint {root.root / NAME} is refused: {rel} fails its BLAKE3 check at chunk "
        f"{chunk} (bytes {chunk * CHUNK_BYTES}-{(chunk + 1) * CHUNK_BYTES} of ")


def test_the_manager_names_the_rank_file_and_chunk(root: FolderRoot) -> None:
    mgr = CheckpointManager(root, rank=0, world_size=1, attempt=0, keep_last=2)
    assert mgr.newest() == NAME
    _flip(_shard(root), CHUNK_BYTES + 1)
    with pytest.raises(CheckpointError, match=(
            rf"rank 0: DCP load of {NAME} failed: rank 0: checkpoint \S+ is refused: "
            rf"dcp/{_shard(root).name} fails its BLAKE3 check at chunk 1 ")):
        mgr.load(NAME, lambda _: _zeros(), Plain)


def test_torch_is_given_the_bytes_that_were_checked_not_the_file_again(
    root: FolderRoot, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What each read brought in is zeroed on disk right after it was checked: what loads
    is what was checked."""
    checkpoint = root.open(NAME, 0)
    fill = VerifiedCheckpoint._fill

    def then_swap(self: VerifiedCheckpoint, f: Any, rel: str, entry: FileEntry,
                  window: tuple[int, int], *rest: Any) -> memoryview:
        checked = fill(self, f, rel, entry, window, *rest)
        with (root.root / NAME / rel).open("r+b") as out:
            out.seek(window[0] * CHUNK_BYTES)
            out.write(bytes(len(checked)))
        return checked

    monkeypatch.setattr(VerifiedCheckpoint, "_fill", then_swap)
    monkeypatch.setattr(reading, "WINDOW_BYTES", CHUNK_BYTES)  # several reads per file
    loaded = _load(checkpoint, ["a", "b", "small"])
    for key, value in _state().items():
        assert torch.equal(loaded[key], value), key


def test_a_planted_metadata_is_refused_before_it_is_unpickled(
    root: FolderRoot, tmp_path: Path
) -> None:
    mgr = CheckpointManager(root, rank=0, world_size=1, attempt=0, keep_last=2)
    assert mgr.newest() == NAME
    metadata = root.root / NAME / layout.DCP_DIR / ".metadata"
    marker = tmp_path / "payload-ran"
    planted = payload(marker)  # pickle ignores what follows its end: pad to the same size
    metadata.write_bytes(planted + b"\0" * (metadata.stat().st_size - len(planted)))
    with pytest.raises(CheckpointError, match=(
            r"checkpoint \S+ is refused: dcp/\.metadata fails its BLAKE3 check at chunk 0")):
        mgr.load(NAME, lambda _: _zeros(), Plain)
    assert not marker.exists()
    pickle.loads(metadata.read_bytes())  # the payload was live
    assert marker.exists()


@pytest.mark.parametrize("window_chunks", [1, 2, 16])
def test_loads_in_runs_of_any_length_give_back_every_tensor(
    root: FolderRoot, monkeypatch: pytest.MonkeyPatch, window_chunks: int
) -> None:
    monkeypatch.setattr(reading, "WINDOW_BYTES", window_chunks * CHUNK_BYTES)
    runs = _read_chunks(monkeypatch)
    loaded = _load(root.open(NAME, 0), ["a", "b", "small"])
    for key, value in _state().items():
        assert torch.equal(loaded[key], value), key
    chunks = len(root.open(NAME, 0).manifest.files[f"dcp/{_shard(root).name}"].chunks)
    read = [c for _, first, last in runs for c in range(first, last + 1)]
    assert len(read) - len(set(read)) <= len(runs) - 1  # only a run's first chunk re-listed
    assert set(read) == set(range(chunks))


def test_runs_hold_whole_ranges_skip_untouched_chunks_and_stop_at_the_cap() -> None:
    c = 10
    assert chunk_runs([(0, 5), (5, 20), (25, 1)], c, 8) == [(0, 2)]
    assert chunk_runs([(0, 5), (45, 10)], c, 8) == [(0, 0), (4, 5)]  # chunks 1-3 unread
    assert chunk_runs([(0, 30), (30, 30), (60, 30)], c, 4) == [(0, 2), (3, 5), (6, 8)]
    assert chunk_runs([(0, 35), (35, 30)], c, 4) == [(0, 3), (3, 6)]  # chunk 3 in both
    assert chunk_runs([(0, 100), (50, 5)], c, 4) == [(0, 9)]  # one long range, then inside it
    assert chunk_runs([(0, 0), (5, 0)], c, 4) == []


@pytest.mark.parametrize("threads", [0, 2])
def test_hashing_while_writing_gives_the_digests_of_the_whole(threads: int) -> None:
    raw = torch.randn(CHUNK_BYTES + 3, generator=torch.Generator().manual_seed(1)).numpy()
    data = raw.tobytes()  # four chunks and 12 bytes
    hasher = ChunkHasher()
    with ThreadPoolExecutor(max(1, threads)) as pool:
        for piece in (data[:10], data[10:3 * CHUNK_BYTES + 20], data[3 * CHUNK_BYTES + 20:]):
            hasher.update(piece, pool if threads else None)
    assert hasher.size == len(data)
    assert hasher.digests() == chunk_digests(data) and len(hasher.digests()) == 5
    assert ChunkHasher().digests() == []


def _manifest(**files: FileEntry) -> Manifest:
    return Manifest(name=NAME, step=4, microstep=0, world_size=1, attempt=0, created_at=0.0,
                    files=files, run="")


def test_a_manifest_with_a_digest_missing_or_too_many_is_invalid() -> None:
    _manifest(x=FileEntry(size=CHUNK_BYTES + 1, chunks=["0" * 64] * 2))
    _manifest(empty=FileEntry(size=0, chunks=[]))
    for size, count in ((CHUNK_BYTES + 1, 1), (1, 2)):
        with pytest.raises(ValueError, match=f"x: {count} chunk digests for {size} bytes"):
            _manifest(x=FileEntry(size=size, chunks=["0" * 64] * count))


def test_a_manifest_of_an_older_format_is_refused_naming_both_formats() -> None:
    body = json.loads(signed(_manifest())[0])
    old = {**body, "format": 2, "files": {"dcp/.metadata": {"size": 3, "sha256": "0" * 64}}}
    del old["chunk_bytes"]
    data, mac = _signed_raw(old)
    with pytest.raises(CheckpointError, match=(
            f"checkpoint here is refused: its manifest has format 2; this version reads "
            f"format {MANIFEST_FORMAT}")):
        authenticate(data, mac, "here", run="")


def _signed_raw(body: dict[str, Any]) -> tuple[bytes, bytes]:
    data = json.dumps(body).encode()
    return data, sign(data, key_from_env()).encode()


def test_a_save_reads_nothing_back_to_hash_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shards, DCP's metadata and the rank state are hashed as they are written, never
    read back (whoever can write the folder could have changed them since)."""
    from resumequal.store import regular

    read: list[str] = []
    for name in ("open_file", "open_path", "read_file", "read_fd"):
        original = getattr(regular, name)

        def reading(*args: Any, _name: str = name, _f: Any = original, **kw: Any) -> Any:
            read.append(f"{_name}{args}")
            return _f(*args, **kw)

        monkeypatch.setattr(regular, name, reading)
    mgr = CheckpointManager(FolderRoot(tmp_path), rank=0, world_size=1, attempt=0, keep_last=2)
    assert mgr.save(Position(4), _state(), Plain(step=4)) == NAME
    assert read == []
    assert torch.equal(_load(FolderRoot(tmp_path).open(NAME, 0), ["a"])["a"], _state()["a"])
    assert read, "a load reads through these: none seen, so nothing above was watched"


def test_a_file_no_rank_reported_fails_the_commit(tmp_path: Path) -> None:
    mgr = CheckpointManager(FolderRoot(tmp_path), rank=0, world_size=1, attempt=0, keep_last=2)
    staging = layout.staging_path(tmp_path, Position(4), 0)
    with pytest.raises(CheckpointError, match=(
            f"commit of {NAME} failed; it stays uncommitted: checkpoint {staging} is "
            "refused: files not in the manifest: dcp/stray")):
        mgr.save(Position(4), _state(), Plain(step=4),
                 before_commit=lambda: (staging / "dcp" / "stray").write_bytes(b"x"))
    assert layout.committed(tmp_path) == []

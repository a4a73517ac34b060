"""Unit tests for checkpoints on an object store (the COMMITTED-marker protocol), in one
process with a world-1 gloo group. The store is a FileStore behind a RemoteRoot: the
protocol only uses the Store interface, so no S3 server is needed here (the integration
tests run it against SeaweedFS over HTTP)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from typing_extensions import Buffer

from resumequal.checkpoint import (
    CheckpointManager,
    FolderRoot,
    Position,
    RemoteRoot,
    checkpoint_location,
    remote,
)
from resumequal.checkpoint.chunks import chunk_digests
from resumequal.errors import CheckpointError
from resumequal.spec import QualificationSpec, SpecError, parse_spec
from resumequal.store import FileStore, StoreUnavailable
from resumequal.store.base import LocalPath, ObjectWriter
from resumequal.store.s3settings import S3Settings
from tests.unit.checkpoint_managers import rank0_manager
from tests.unit.rank_states import Plain

PREFIX = "control/checkpoints"


pytestmark = pytest.mark.usefixtures("single_process_group")


class FlakyStore(FileStore):
    """A FileStore whose uploads fail (as after botocore's retries) while ``down``; with
    ``shards_down`` only the streamed ones (DCP's shards) fail."""

    down = False
    shards_down = False

    def put_file(self, key: str, local_path: LocalPath) -> str:
        if self.down:
            raise StoreUnavailable(f"cannot reach the endpoint to upload {self.uri(key)}")
        return super().put_file(key, local_path)

    def writer(self, key: str) -> ObjectWriter:
        return _FlakyWriter(self, key, super().writer(key))


class _FlakyWriter:
    """Fails where an S3 stream fails when the endpoint is gone: at the request that
    carries the bytes (a small object's one PUT at ``close``)."""

    def __init__(self, store: FlakyStore, key: str, inner: ObjectWriter) -> None:
        self.store, self.key, self.inner = store, key, inner

    def write(self, data: Buffer) -> int:
        return self.inner.write(data)

    def tell(self) -> int:
        return self.inner.tell()

    def close(self) -> str:
        if self.store.down or self.store.shards_down:
            self.inner.abort()
            uri = self.store.uri(self.key)
            raise StoreUnavailable(f"cannot reach the endpoint to upload {uri}")
        return self.inner.close()

    def abort(self) -> None:
        self.inner.abort()


def _root(tmp_path: Path) -> RemoteRoot:
    return RemoteRoot(FlakyStore(str(tmp_path / "bucket")), PREFIX, tmp_path / "local")


def _state(seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    return {"model": nn.Linear(4, 3).state_dict()}


def _template(_: Plain) -> dict[str, Any]:
    return {"model": {k: torch.zeros_like(v) for k, v in _state(0)["model"].items()}}


def _save(m: CheckpointManager, step: int, **kw: Any) -> str:
    return m.save(Position(step), _state(step), Plain(step=step), info={"leg": "control"}, **kw)


def _keys(root: RemoteRoot, name: str) -> set[str]:
    return {o.key[len(root.key(name)) + 1 :] for o in root.store.list(root.key(name))}


def test_a_save_uploads_every_file_then_the_manifest_then_the_marker(tmp_path: Path) -> None:
    root = _root(tmp_path)
    seen: list[set[str]] = []
    name = _save(rank0_manager(root), 4,
                 before_commit=lambda: seen.append(_keys(root, "step-00000004")))
    assert name == "step-00000004"
    # At before_commit this rank's files are uploaded, the commit has not happened.
    assert seen == [{"dcp/.metadata", "dcp/__0_0.distcp", "rank-0.json"}]
    assert _keys(root, name) == seen[0] | {"manifest.json", "manifest.hmac", "COMMITTED"}
    manifest = remote.read_manifest(root, name)
    assert sorted(manifest.files) == sorted(seen[0])
    for rel, entry in manifest.files.items():
        assert entry.size == (tmp_path / "bucket" / PREFIX / name / rel).stat().st_size
    assert remote.committed(root) == [Position(4)]
    assert not (root.local / ".staging" / "step-00000004.attempt-0").exists()


def test_resume_downloads_verifies_and_loads_the_newest_committed(tmp_path: Path) -> None:
    root = _root(tmp_path)
    m = rank0_manager(root)
    _save(m, 4)
    _save(m, 8)
    fresh = rank0_manager(root)
    assert fresh.collect_garbage() == []
    assert fresh.newest() == "step-00000008"
    loaded = fresh.load("step-00000008", _template, Plain)
    assert loaded.rank_state.model_dump() == {"step": 8}
    for k, v in _state(8)["model"].items():
        assert torch.equal(loaded.tensors["model"][k], v)


def test_a_checkpoint_without_its_marker_is_never_loaded_and_is_collected(
    tmp_path: Path
) -> None:
    root = _root(tmp_path)
    m = rank0_manager(root)
    _save(m, 4)
    _save(m, 8)
    root.store.delete(root.key("step-00000008", remote.COMMITTED))  # a kill before it
    fresh = rank0_manager(root)
    assert fresh.collect_garbage() == ["step-00000008"]
    assert _keys(root, "step-00000008") == set()
    assert fresh.newest() == "step-00000004"


@pytest.mark.parametrize("tamper", ["flip", "truncate", "extra", "missing"])
def test_a_damaged_committed_checkpoint_fails_the_resume_naming_the_object(
    tamper: str, tmp_path: Path
) -> None:
    root = _root(tmp_path)
    _save(rank0_manager(root), 4)
    shard = tmp_path / "bucket" / PREFIX / "step-00000004" / "dcp" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    if tamper == "flip":
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
        expect = r"step-00000004 is refused: dcp/__0_0\.distcp fails its BLAKE3 check at chunk 0"
    elif tamper == "truncate":
        shard.write_bytes(bytes(data[:-1]))
        expect = r"__0_0\.distcp has \d+ bytes, the manifest says"
    elif tamper == "extra":
        (shard.parent / "__0_1.distcp").write_bytes(b"x")
        expect = r"objects not in the manifest: dcp/__0_1\.distcp"
    else:
        shard.unlink()
        expect = r"__0_0\.distcp is listed in the manifest but missing"
    with pytest.raises(CheckpointError, match=expect):
        m = rank0_manager(root)
        name = m.newest()  # the listing (sizes, names) is checked here, the bytes at the load
        assert name is not None
        m.load(name, _template, Plain)


def test_a_failed_upload_fails_the_save_and_keeps_the_committed_one(tmp_path: Path) -> None:
    root = _root(tmp_path)
    m = rank0_manager(root)
    _save(m, 4)
    assert isinstance(root.store, FlakyStore)
    root.store.down = True
    with pytest.raises(CheckpointError, match=r"upload of checkpoint step-00000008 .* "
                       r"uncommitted: rank 0: cannot reach the endpoint"):
        _save(m, 8)
    root.store.down = False
    assert remote.committed(root) == [Position(4)]
    fresh = rank0_manager(root)
    fresh.collect_garbage()
    assert fresh.newest() == "step-00000004"


def test_shards_go_to_the_store_while_written_never_to_the_staging_folder(
    tmp_path: Path,
) -> None:
    root = _root(tmp_path)
    staged: list[set[str]] = []

    def look() -> None:
        staging = root.local / ".staging" / "step-00000004.attempt-0"
        staged.append({p.relative_to(staging).as_posix() for p in staging.rglob("*")
                       if p.is_file()})

    name = _save(rank0_manager(root), 4, before_commit=look)
    # DCP's .metadata and the rank state are staged, then uploaded; the shard never is.
    assert staged == [{"dcp/.metadata", "rank-0.json"}]
    manifest = remote.read_manifest(root, name)
    shard = tmp_path / "bucket" / PREFIX / name / "dcp" / "__0_0.distcp"
    # The digests taken on the way up are the ones of what the store holds.
    assert manifest.files["dcp/__0_0.distcp"].chunks == chunk_digests(shard.read_bytes())
    assert manifest.files["dcp/__0_0.distcp"].size == shard.stat().st_size


def test_a_failed_shard_upload_fails_the_save_and_leaves_no_shard(tmp_path: Path) -> None:
    root = _root(tmp_path)
    m = rank0_manager(root)
    _save(m, 4)
    assert isinstance(root.store, FlakyStore)
    root.store.shards_down = True
    with pytest.raises(CheckpointError, match=r"upload of checkpoint step-00000008 to .*"
                       r"step-00000008 failed; it stays uncommitted: rank 0: cannot reach "
                       r"the endpoint to upload .*__0_0\.distcp$"):
        _save(m, 8)
    assert "dcp/__0_0.distcp" not in _keys(root, "step-00000008")
    root.store.shards_down = False
    assert remote.committed(root) == [Position(4)]
    assert _save(m, 8) == "step-00000008"  # the same manager saves again once it is back


def test_a_failed_shard_upload_in_a_background_save_names_the_store_error(
    tmp_path: Path
) -> None:
    root = _root(tmp_path)
    m = rank0_manager(root, async_save=True)
    assert isinstance(root.store, FlakyStore)
    root.store.shards_down = True
    m.save(Position(4), _state(4), Plain(step=4), background=True)
    with pytest.raises(CheckpointError, match=r"background write of step-00000004 failed on "
                       r"rank\(s\) 0; rank 0: cannot reach the endpoint to upload"):
        m.poll(wait=True)
    assert remote.committed(root) == []


@pytest.mark.parametrize("before", [True, False])
def test_the_zip_crc_is_off_only_while_shards_stream(before: bool, tmp_path: Path) -> None:
    seen: list[bool] = []

    class Watching(FlakyStore):
        def writer(self, key: str) -> ObjectWriter:
            seen.append(torch.serialization.get_crc32_options())
            return super().writer(key)

    store = Watching(str(tmp_path / "bucket"))
    root = RemoteRoot(store, PREFIX, tmp_path / "local")
    m = rank0_manager(root)
    torch.serialization.set_crc32_options(before)
    try:
        _save(m, 4)
        assert seen == [False]  # the shard's torch.save records carry no CRC32
        assert torch.serialization.get_crc32_options() is before
        store.shards_down = True
        with pytest.raises(CheckpointError):
            _save(m, 8)
        assert torch.serialization.get_crc32_options() is before
    finally:
        torch.serialization.set_crc32_options(True)
    loaded = rank0_manager(root).load(_newest(root), _template, Plain)  # torch.load reads them
    assert loaded.rank_state.model_dump() == {"step": 4}
    for k, v in _state(4)["model"].items():
        assert torch.equal(loaded.tensors["model"][k], v)


def test_retention_keeps_the_newest_committed(tmp_path: Path) -> None:
    root = _root(tmp_path)
    m = rank0_manager(root, keep_last=2)
    for step in (2, 4, 6):
        _save(m, step)
    assert remote.committed(root) == [Position(4), Position(6)]
    assert _keys(root, "step-00000002") == set()


def test_saving_a_position_again_replaces_it(tmp_path: Path) -> None:
    root = _root(tmp_path)
    m = rank0_manager(root)
    _save(m, 4)
    m.save(Position(4), _state(9), Plain(step=9))
    loaded = rank0_manager(root).load(_newest(root), _template, Plain)
    assert loaded.rank_state.model_dump() == {"step": 9}


def _newest(root: RemoteRoot) -> str:
    m = rank0_manager(root)
    name = m.newest()
    assert name is not None
    return name


def test_a_background_save_uploads_at_its_commit(tmp_path: Path) -> None:
    root = _root(tmp_path)
    m = rank0_manager(root, async_save=True)
    m.save(Position(4), _state(4), Plain(step=4), background=True)
    assert m.poll(wait=True) == "step-00000004"
    assert remote.committed(root) == [Position(4)]
    loaded = rank0_manager(root).load(_newest(root), _template, Plain)
    assert loaded.rank_state.model_dump() == {"step": 4}


def test_every_rank_uploads_only_the_files_it_wrote(tmp_path: Path) -> None:
    for rel in ("dcp/.metadata", "dcp/__0_0.distcp", "dcp/__1_0.distcp", "dcp/__10_0.distcp",
                "rank-0.json", "rank-1.json", "rank-10.json", ".rank-1.json.tmp"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    assert remote.own_files(tmp_path, 0) == ["dcp/.metadata", "dcp/__0_0.distcp", "rank-0.json"]
    assert remote.own_files(tmp_path, 1) == ["dcp/__1_0.distcp", "rank-1.json"]
    assert remote.own_files(tmp_path, 10) == ["dcp/__10_0.distcp", "rank-10.json"]


def test_a_file_another_rank_renames_while_listed_is_not_uploaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks on one node share the staging folder: rank 2's temporary rank state, listed by
    rank 1 and renamed before rank 1's stat, was once an upload failure (ENOENT)."""
    import os

    from resumequal.store import regular

    for rel in ("dcp/__1_0.distcp", "rank-1.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    walk = os.fwalk

    def listing_then_rename(*args: Any, **kwargs: Any) -> Any:
        for path, dirs, files, fd in walk(*args, **kwargs):
            # Listed, and gone (renamed to rank-2.json) before it is looked at.
            yield path, dirs, [*files, ".rank-2.json.0123456789abcdef.rqtmp", "rank-3.json"], fd

    monkeypatch.setattr(regular.os, "fwalk", listing_then_rename)
    assert remote.own_files(tmp_path, 1) == ["dcp/__1_0.distcp", "rank-1.json"]
    assert remote.own_files(tmp_path, 3) == []


# --- spec -------------------------------------------------------------------------------------


@pytest.mark.usefixtures("aws_env")  # no credential lookup over the network
def test_an_s3_store_with_its_settings_is_a_valid_spec(tmp_path: Path) -> None:
    spec = QualificationSpec.model_validate({"checkpoint": {
        "store": "s3://bucket/runs", "s3": {"endpoint_url": "http://127.0.0.1:9000/",
                                            "addressing_style": "path", "max_attempts": 2}}})
    assert spec.checkpoint.s3 == S3Settings(endpoint_url="http://127.0.0.1:9000",
                                        addressing_style="path", max_attempts=2)
    where = checkpoint_location(spec.checkpoint.store, spec.checkpoint.s3, tmp_path, "control")
    assert isinstance(where, RemoteRoot)
    assert where.uri("step-00000004") == "s3://bucket/runs/control/checkpoints/step-00000004"
    assert where.local == tmp_path / "control" / ".ckpt-local"
    assert checkpoint_location(None, None, tmp_path, "control") == FolderRoot(
        tmp_path / "control" / "checkpoints")


@pytest.mark.parametrize(("checkpoint", "message"), [
    ({"store": "az://bucket"}, "scheme 'az' is not supported"),
    ({"store": "s3:///prefix"}, "names a bucket"),
    ({"store": "gs:///prefix"}, "names a bucket"),
    ({"store": "/data", "s3": {}}, "checkpoint.s3 configures s3:// stores"),
    ({"store": "s3://b", "gcs": {}}, "checkpoint.gcs configures gs:// stores"),
    ({"store": "gs://b", "s3": {}}, "checkpoint.s3 configures s3:// stores"),
    ({"store": "s3://b", "s3": {"endpoint_url": "http://user:secret@host"}},
     "without user:password"),
])
def test_a_bad_store_is_refused_naming_why(checkpoint: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message) as info:
        parse_spec({"checkpoint": checkpoint})
    assert "secret" not in str(info.value)


@pytest.mark.usefixtures("aws_env")  # no credential lookup over the network
def test_the_commit_backend_follows_the_store_not_its_scheme(tmp_path: Path) -> None:
    folder = checkpoint_location(f"file://{tmp_path}/ckpts", None, tmp_path / "run", "control")
    assert folder == FolderRoot(tmp_path / "ckpts" / "control" / "checkpoints")
    assert folder.durable_staging and folder.scratch == folder.root
    marker = checkpoint_location("s3://bucket/runs", S3Settings(endpoint_url="http://127.0.0.1:9"),
                                 tmp_path / "run", "control")
    assert isinstance(marker, RemoteRoot) and not marker.durable_staging
    assert marker.scratch == tmp_path / "run" / "control" / ".ckpt-local"

"""Two gloo ranks, each as if on a machine of its own (one rank per node: each reads its own
chunks), save shards of their own into one folder checkpoint; a byte changed in a chunk
only rank 1 reads is refused by rank 1, naming the file and the chunk, while rank 0 loads
its part untouched — and the failure reaches both ranks. (Ranks that share a machine check
each chunk once between them: tests/integration/test_node_restore.py.)"""

from __future__ import annotations

import os
import pickle
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from resumequal.checkpoint import CheckpointManager, FolderRoot, Position, layout, node
from resumequal.checkpoint.chunks import CHUNK_BYTES
from resumequal.errors import CheckpointError
from tests.integration.legs import free_port
from tests.unit.rank_states import Plain

NAME = Position(2).name
ELEMENTS = 3 * CHUNK_BYTES // 4  # three chunks of float32 per rank


def _state(rank: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(rank)
    return {"shared": torch.arange(4.0),
            f"rank_{rank}": {"w": torch.randn(ELEMENTS, generator=gen)}}


def _worker(rank: int, port: int, root: str, phase: str, out: dict[int, str]) -> None:
    pytest.MonkeyPatch().setattr(node, "machine", lambda: f"machine-{rank}")
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    mgr = CheckpointManager(FolderRoot(Path(root)), rank=rank, world_size=2, attempt=0,
                            keep_last=2)
    try:
        if phase == "save":
            out[rank] = str(mgr.save(Position(2), _state(rank), Plain(step=2)))
        else:
            assert mgr.newest() == NAME
            mine = f"rank_{rank}"
            template = {"shared": torch.zeros(4), mine: {"w": torch.zeros(ELEMENTS)}}
            got, want = mgr.load(NAME, lambda _: template, Plain).tensors, _state(rank)
            ok = (torch.equal(got["shared"], want["shared"])
                  and torch.equal(got[mine]["w"], want[mine]["w"]))
            out[rank] = "loaded" if ok else "differs"
    except CheckpointError as e:
        out[rank] = str(e)
    finally:
        dist.destroy_process_group()


def _run(root: Path, phase: str) -> dict[int, str]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(free_port(), str(root), phase, out), nprocs=2, join=True)
        return dict(out)


def _where(root: Path, key: str) -> tuple[Path, int, int]:
    """The file, offset and length of tensor ``key`` (the test trusts this metadata)."""
    dcp_dir = root / NAME / layout.DCP_DIR
    meta = pickle.loads((dcp_dir / ".metadata").read_bytes())
    (info,) = [v for k, v in meta.storage_data.items() if k.fqn == key]
    return dcp_dir / info.relative_path, info.offset, info.length


def test_a_chunk_only_rank_1_reads_is_refused_by_rank_1_naming_file_and_chunk(
    tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    assert _run(root, "save") == {0: NAME, 1: NAME}
    assert _run(root, "load") == {0: "loaded", 1: "loaded"}

    shard, offset, length = _where(root, "rank_1.w")
    assert shard.name.startswith("__1_")  # rank 1's own file
    chunk = (offset + length // 2) // CHUNK_BYTES
    data = bytearray(shard.read_bytes())
    data[chunk * CHUNK_BYTES + 5] ^= 0x01
    shard.write_bytes(bytes(data))

    out = _run(root, "load")
    refusal = (f"rank 1: checkpoint {root / NAME} is refused: dcp/{shard.name} fails its "
               f"BLAKE3 check at chunk {chunk} (bytes {chunk * CHUNK_BYTES}-")
    for rank in (0, 1):
        assert out[rank].startswith(f"rank {rank}: DCP load of {NAME} failed: "), out[rank]
        assert refusal in out[rank], out[rank]
        assert "rank 0: checkpoint" not in out[rank]  # rank 0 read its part untouched

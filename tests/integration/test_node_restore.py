"""The ranks of one machine restore together (resumequal.checkpoint.node): they meet over
abstract Unix sockets, refusing any process the process group did not name; two gloo
ranks restore a checkpoint through the node's shared reads (from a folder and from an
object store) bit for bit as plain DCP loads it, never read a chunk again once the node
checked it (a store file swapped after the check is not read), and a chunk the follower
finds changed fails both ranks alike."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

from resumequal.checkpoint import CheckpointManager, FolderRoot, Position, RemoteRoot, layout
from resumequal.checkpoint.chunks import CHUNK_BYTES
from resumequal.checkpoint.node import Card, Door, Node
from resumequal.errors import CheckpointError
from resumequal.store import FileStore
from testing.ports import free_port
from tests.unit.rank_states import Plain

NAME = Position(2).name
ELEMENTS = 3 * CHUNK_BYTES // 4  # three chunks of float32


def _meet(cards: Callable[[list[Card]], list[Card]],
          timeout: float = 5.0) -> list[Node | BaseException | None]:
    """Two ranks of this process (two threads) meet through real doors, their cards as
    ``cards`` rewrites them: each one's node or error."""
    doors = [Door(), Door()]
    shown = cards([door.card for door in doors])
    met: list[Node | BaseException | None] = [None, None]

    def meet(rank: int) -> None:
        try:
            met[rank] = doors[rank].meet(shown, rank, timeout)
        except CheckpointError as e:
            met[rank] = e

    threads = [threading.Thread(target=meet, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 5)
    for door in doors:
        door.close()
    for node in met:
        if isinstance(node, Node):
            node.close()
    return met


def test_the_ranks_of_one_machine_meet_and_the_lowest_leads() -> None:
    leader, follower = _meet(lambda cards: cards)
    assert isinstance(leader, Node) and isinstance(follower, Node)
    assert leader.leader and not follower.leader
    assert list(leader.channels) == [1] and list(follower.channels) == [0]


def test_ranks_of_other_machines_restore_alone() -> None:
    alone = _meet(lambda cards: [card._replace(machine=f"m{i}")
                                 for i, card in enumerate(cards)])
    assert alone == [None, None]


def test_the_leader_refuses_a_connection_from_a_process_the_group_did_not_name() -> None:
    # The follower's card names another pid: this process's connection is refused.
    met = _meet(lambda cards: [cards[0], cards[1]._replace(pid=os.getpid() + 1)], timeout=1)
    assert isinstance(met[0], CheckpointError)
    assert str(met[0]).startswith("rank(s) 1 of this machine did not join its restore")


def test_a_follower_refuses_a_leader_of_another_pid() -> None:
    met = _meet(lambda cards: [cards[0]._replace(pid=os.getpid() + 1), cards[1]], timeout=1)
    assert isinstance(met[1], CheckpointError)
    assert str(met[1]).startswith(
        f"the restore of this machine's rank 0 is served by pid {os.getpid()}")


def _state(rank: int) -> dict[str, Any]:
    """Two replicated tensors (as under DDP) and one of each rank's own (as a shard)."""
    shared = torch.Generator().manual_seed(0)
    own = torch.Generator().manual_seed(1 + rank)
    return {"a": torch.randn(ELEMENTS, generator=shared),
            "b": torch.randn(ELEMENTS, generator=shared), "small": torch.arange(5.0),
            f"rank_{rank}": {"w": torch.randn(ELEMENTS, generator=own)}}


def _zeros(rank: int) -> dict[str, Any]:
    return {k: _zero(v) for k, v in _state(rank).items()}


def _zero(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _zero(v) for k, v in value.items()}
    return torch.zeros_like(value)


def _flat(state: dict[str, Any]) -> list[torch.Tensor]:
    return [t for v in state.values() for t in (v.values() if isinstance(v, dict) else [v])]


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(_flat(a), _flat(b), strict=True))


def _worker(rank: int, port: int, work: str, out: dict[Any, Any]) -> None:
    from resumequal.checkpoint import node, reading

    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    rounds: list[str] = []
    restore = node.Node.restore

    def counted(self: Node, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for found in restore(self, *args, **kwargs):
            rounds.append(found[0])
            yield found

    node.Node.restore = counted  # type: ignore[method-assign]
    try:
        saved = Path(work, "saved")
        mgr = CheckpointManager(FolderRoot(saved), rank=rank, world_size=2, attempt=0,
                                keep_last=2)
        assert mgr.save(Position(2), _state(rank), Plain(step=2)) == NAME
        if rank == 0:
            for copy in ("swap", "tamper"):
                shutil.copytree(saved, Path(work, copy))
        dist.barrier()

        def load(root: str) -> dict[str, Any]:
            fresh = CheckpointManager(FolderRoot(Path(work, root)), rank=rank, world_size=2,
                                      attempt=1, keep_last=2)
            assert fresh.newest() == NAME
            return fresh.load(NAME, lambda _: _zeros(rank), Plain).tensors

        # Several rounds of two chunks, ranges across their boundaries.
        node.WINDOW_BYTES = 2 * CHUNK_BYTES
        shared = load("saved")
        plain = _zeros(rank)
        dcp.load(plain, storage_reader=dcp.FileSystemReader(str(saved / NAME / layout.DCP_DIR)))
        out[rank, "restore"] = (_same(shared, plain) and _same(shared, _state(rank)),
                                len(rounds))
        # The same through an object store's ranged reads (a FileStore behind the Store
        # interface), several chunks fetched at once.
        remote = RemoteRoot(FileStore(str(Path(work, "bucket"))), "ckpt",
                            Path(work, f"local-{rank}"))
        writer = CheckpointManager(remote, rank=rank, world_size=2, attempt=0, keep_last=2)
        assert writer.save(Position(2), _state(rank), Plain(step=2)) == NAME
        reader = CheckpointManager(remote, rank=rank, world_size=2, attempt=1, keep_last=2)
        assert reader.newest() == NAME
        before = len(rounds)
        stored = reader.load(NAME, lambda _: _zeros(rank), Plain).tensors
        out[rank, "store"] = (_same(stored, _state(rank)), len(rounds) - before)

        # Each rank zeroes its shares of the node's rounds in the store once checked.
        fill = reading._Shares.fill

        def then_swap(self: reading._Shares, rel: str, first: int, last: int,
                      into: memoryview) -> None:
            fill(self, rel, first, last, into)
            with Path(work, "swap", NAME, rel).open("r+b") as swapped:
                swapped.seek(first * CHUNK_BYTES)
                swapped.write(bytes(len(into)))

        reading._Shares.fill = then_swap  # type: ignore[method-assign]
        out[rank, "swap"] = _same(load("swap"), _state(rank))
        reading._Shares.fill = fill  # type: ignore[method-assign]

        # One round per file: the last chunk of rank 0's shard is rank 1's to check.
        node.WINDOW_BYTES = 128 << 20
        if rank == 0:
            (shard,) = Path(work, "tamper", NAME, layout.DCP_DIR).glob("__0_*.distcp")
            data = bytearray(shard.read_bytes())
            data[-3] ^= 0x01
            shard.write_bytes(bytes(data))
            out["tampered"] = (shard.name, (len(data) - 1) // CHUNK_BYTES)
        dist.barrier()
        refusals: list[str] = []
        check = reading.VerifiedCheckpoint._check

        def recorded(self: reading.VerifiedCheckpoint, *args: Any) -> None:
            try:
                check(self, *args)
            except CheckpointError as e:
                refusals.append(str(e))
                raise

        reading.VerifiedCheckpoint._check = recorded  # type: ignore[method-assign]
        try:
            load("tamper")
            out[rank, "tamper"] = ("loaded", refusals)
        except CheckpointError as e:
            out[rank, "tamper"] = (str(e), refusals)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def restored(tmp_path_factory: pytest.TempPathFactory) -> dict[Any, Any]:
    """Two ranks save, then restore through their node: as saved, with the store swapped
    after the checks, and with a chunk of rank 1's share changed."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(free_port(), str(tmp_path_factory.mktemp("node")), out),
                 nprocs=2, join=True)
        return dict(out)


@pytest.mark.slow
def test_two_ranks_restore_through_their_node_bit_for_bit_as_plain_dcp(
    restored: dict[Any, Any]
) -> None:
    for rank in (0, 1):
        same, rounds = restored[rank, "restore"]
        assert same, f"rank {rank} restored other tensors than plain DCP loads"
        assert rounds > 2, "the load did not go through the node's rounds"
        same, rounds = restored[rank, "store"]
        assert same, f"rank {rank} restored other tensors from the object store"
        assert rounds > 2, "the object store's load did not go through the node's rounds"


@pytest.mark.slow
def test_a_store_file_swapped_after_the_node_checked_it_is_never_read(
    restored: dict[Any, Any]
) -> None:
    assert restored[0, "swap"] and restored[1, "swap"]


@pytest.mark.slow
def test_a_chunk_changed_in_the_followers_share_fails_both_ranks_naming_it(
    restored: dict[Any, Any]
) -> None:
    shard, chunk = restored["tampered"]
    refusal = f"dcp/{shard} fails its BLAKE3 check at chunk {chunk} (bytes "
    assert restored[0, "tamper"][1] == []  # the leader checked no such chunk
    (found,) = restored[1, "tamper"][1]
    assert refusal in found
    for rank in (0, 1):
        error = restored[rank, "tamper"][0]
        assert error.startswith(f"rank {rank}: DCP load of {NAME} failed: ranks 0, 1: "
                                "checkpoint "), error
        assert f"is refused: {refusal}" in error, error

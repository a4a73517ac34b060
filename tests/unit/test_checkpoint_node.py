"""The ranks of one machine restoring together (resumequal.checkpoint.node): how a round's
chunks are split among them, how the rounds are cut, who is on a machine, and the rounds
themselves between two ranks played by two threads over a socket pair, each filling its
share from a fake store."""

from __future__ import annotations

import random
import socket
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from resumequal.checkpoint import node
from resumequal.checkpoint.node import Card, Node, Round, _Channel, local_ranks, plan, share
from resumequal.errors import CheckpointError

CHUNK = 8


def test_a_round_is_split_into_contiguous_shares_that_cover_it_once() -> None:
    for first, last, parts in ((0, 9, 2), (3, 3, 2), (5, 20, 3), (0, 6, 8)):
        for carried in (False, True):
            rnd = Round("f", first, last, carried)
            shares = [share(rnd, parts, i) for i in range(parts)]
            chunks = [c for s in shares if s is not None for c in range(s[0], s[1] + 1)]
            assert chunks == list(range(first + carried, last + 1))  # in order, each once
            sizes = [s[1] + 1 - s[0] for s in shares if s is not None]
            assert max(sizes, default=0) - min(sizes, default=0) <= 1
    assert share(Round("f", 0, 9, False), 2, 0) == (0, 4)
    assert share(Round("f", 0, 9, True), 2, 1) == (5, 9)  # chunk 0 is copied, not read
    assert share(Round("f", 4, 4, True), 2, 0) is None  # nothing of its own to read


def test_rounds_hold_whole_ranges_of_every_rank_and_carry_a_shared_chunk() -> None:
    c = 10
    wanted = {"b": [(0, 35), (35, 30)], "a": [(0, 5), (45, 10)]}
    # a: chunks 1-3 touched by no one; b: chunk 3 holds the end of one range and the start
    # of the next, in a round of its own each.
    assert plan(wanted, c, 4) == [Round("a", 0, 0, False), Round("a", 4, 5, False),
                                  Round("b", 0, 3, False), Round("b", 3, 6, True)]
    # Two ranks loading the same range ask for it once; a range longer than a round is one.
    assert plan({"a": [(0, 95), (0, 95)]}, c, 2) == [Round("a", 0, 9, False)]


def test_ranks_are_on_one_machine_when_their_machine_is_the_same_and_known() -> None:
    cards = [Card("m1", 10, "a"), Card("m2", 11, "b"), Card("m1", 12, "c"),
             Card(None, 13, "d"), Card(None, 14, "e"), None]
    assert local_ranks(cards, 0) == local_ranks(cards, 2) == [0, 2]
    assert local_ranks(cards, 1) == [1]
    assert local_ranks(cards, 3) == [3]  # a machine unknown is no one's
    assert local_ranks(cards, 5) == [5]
    assert node.machine() is not None and node.machine() == node.machine()


class _Store:
    """Files in memory as a rank's shares of them are read: each chunk filled is recorded
    with the rank that filled it; a chunk in ``bad`` fails as a changed one does."""

    def __init__(self, files: dict[str, bytes], rank: int, filled: list[tuple[int, str, int]],
                 bad: frozenset[tuple[str, int]] = frozenset()) -> None:
        self.files, self.rank, self.filled, self.bad = files, rank, filled, bad

    def size(self, rel: str, ranges: Sequence[tuple[int, int]]) -> int:
        if rel not in self.files:
            raise CheckpointError(f"{rel} is read but not listed in its manifest")
        return len(self.files[rel])

    def fill(self, rel: str, first: int, last: int, out: memoryview) -> None:
        data = self.files[rel]
        assert len(out) == min((last + 1) * CHUNK, len(data)) - first * CHUNK
        for i in range(first, last + 1):
            self.filled.append((self.rank, rel, i))
            if (rel, i) in self.bad:
                raise CheckpointError(f"{rel} fails its BLAKE3 check at chunk {i}")
        out[:] = data[first * CHUNK:(last + 1) * CHUNK]

    def prefetch(self, rel: str, first: int, last: int) -> None:
        """Nothing to tell."""


def _restore(files: dict[str, bytes], wanted: list[dict[str, list[tuple[int, int]]]], *,
             bad: frozenset[tuple[str, int]] = frozenset(),
             leave: int | None = None) -> tuple[list[Any], list[tuple[int, str, int]]]:
    """Two local ranks restore ``wanted`` (each its own) together: each one's loaded bytes
    per (file, offset), or the error it raised; and every chunk filled, by whom. Rank
    ``leave`` stops after its first round."""
    ends = socket.socketpair()
    nodes = [Node((0, 1), 0, {1: _Channel(ends[0], 1, 10)}),
             Node((0, 1), 1, {0: _Channel(ends[1], 0, 10)})]
    filled: list[tuple[int, str, int]] = []
    results: list[Any] = [None, None]

    def run(rank: int) -> None:
        loaded: dict[tuple[str, int], bytes] = {}
        rounds = nodes[rank].restore(wanted[rank], where="ckpt", chunk=CHUNK,
                                     shares=_Store(files, rank, filled, bad))
        try:
            for n, (rel, base, view) in enumerate(rounds):
                for offset, length in wanted[rank].get(rel, []):
                    if base <= offset and offset + length <= base + len(view):
                        loaded.setdefault((rel, offset), bytes(view[offset - base:][:length]))
                if rank == leave and n == 0:
                    rounds.close()
                    break
            results[rank] = loaded
        except CheckpointError as e:
            results[rank] = e

    threads = [threading.Thread(target=run, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    return results, filled


def _files() -> dict[str, bytes]:
    gen = random.Random(0)
    return {"x": gen.randbytes(10 * CHUNK + 3), "y": gen.randbytes(5 * CHUNK)}


@pytest.fixture
def small_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node, "WINDOW_BYTES", 3 * CHUNK)


@pytest.mark.usefixtures("small_rounds")
def test_two_ranks_load_every_range_each_chunk_read_once_by_one_of_them() -> None:
    files = _files()
    # Rank 0 loads all of x (ranges across chunk and round boundaries); rank 1 some of x
    # and all of y, as ranks loading different shards do.
    mine = {"x": [(0, 5), (5, 14), (19, 9), (28, 30), (58, 25)]}
    theirs = {"x": [(19, 9), (58, 25)], "y": [(0, 40)]}
    results, filled = _restore(files, [mine, theirs])
    for rank, wanted in enumerate((mine, theirs)):
        assert results[rank] == {(rel, o): files[rel][o:o + n]
                                 for rel, ranges in wanted.items() for o, n in ranges}
    chunks = [(rel, i) for _, rel, i in filled]
    assert sorted(chunks) == sorted(set(chunks))  # none read twice, carried ones included
    assert set(chunks) == {("x", i) for i in range(11)} | {("y", i) for i in range(5)}
    assert {rank for rank, _, _ in filled} == {0, 1}


@pytest.mark.usefixtures("small_rounds")
def test_a_chunk_refused_by_the_follower_fails_both_ranks_alike() -> None:
    files = _files()
    wanted = {"x": [(0, len(files["x"]))]}
    results, filled = _restore(files, [wanted, wanted], bad=frozenset({("x", 7)}))
    assert (1, "x", 7) in filled and (0, "x", 7) not in filled  # the follower's share
    for result in results:
        assert isinstance(result, CheckpointError)
        assert str(result) == "x fails its BLAKE3 check at chunk 7"


@pytest.mark.usefixtures("small_rounds")
def test_a_range_outside_its_file_or_a_file_unlisted_fails_both_ranks() -> None:
    files = _files()
    results, _ = _restore(files, [{"x": [(0, 8)]}, {"z": [(0, 8)]}])
    for result in results:
        assert isinstance(result, CheckpointError)
        assert str(result) == "z is read but not listed in its manifest"


@pytest.mark.usefixtures("small_rounds")
def test_a_rank_that_leaves_fails_the_other_at_once() -> None:
    files = _files()
    wanted = {"x": [(o, CHUNK) for o in range(0, 10 * CHUNK, CHUNK)]}  # in four rounds
    results, _ = _restore(files, [wanted, wanted], leave=1)
    assert isinstance(results[0], CheckpointError)
    assert str(results[0]) == ("checkpoint ckpt: rank 1 of this machine left its restore "
                               "before the end")

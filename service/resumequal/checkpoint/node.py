"""The ranks of one machine restoring a checkpoint together: each chunk read from the store
and checked once per machine, every rank loading it from the memory it was checked in.

Under DDP every rank loads the whole replicated state; alone, each would read and hash all of
it (:meth:`~resumequal.checkpoint.reading.VerifiedCheckpoint.read_ranges`). The ranks of a
machine (a *node*) split that work instead:

- **Who shares.** Before a load every rank opens a :class:`Door`, a listening Unix socket in
  the abstract namespace under a random name, and the manager gathers every rank's
  :class:`Card` over the process group: its machine (the kernel's boot id, the network
  namespace abstract sockets live in, the pid namespace ``SO_PEERCRED`` gives pids in, the
  uid), its pid and its socket's name. Ranks of one machine are a node. Not torchrun's
  ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``: they say how many ranks a node has, not which, nothing
  sets them under ``torch.multiprocessing``, and two pods on one host share neither sockets
  nor pids.
- **Meeting.** The node's lowest rank leads; the others connect to its socket, and each side
  takes the other's ``SO_PEERCRED``: a connection from any pid but one the process group
  named, or of another uid, is refused (abstract sockets have no file permissions, and their
  names are listed in ``/proc/net/unix``).
- **Rounds.** The followers send the leader the byte ranges DCP's plan has them load, per
  file; the leader cuts the union of every local rank's ranges into rounds of whole chunks
  holding whole ranges, at most :data:`WINDOW_BYTES` each (:func:`plan`), creates two memfds
  of a round's size (the *slots*), and sends the plan and the slots (``SCM_RIGHTS``); every
  rank maps both. Round ``n`` goes into slot ``n % 2``: each rank reads its share of the
  round's chunks (:func:`share`) from the store straight into the slot and hashes each chunk
  there against the manifest (the same checked read as a rank alone,
  :meth:`~resumequal.checkpoint.reading.VerifiedCheckpoint.read_checked`), then reports to
  the leader; once every rank has, the leader tells them the round is checked, and each
  loads its own ranges of the round from the slot, then goes on to its share of the next
  round (the kernel told which one beforehand). A chunk two rounds share (a range across
  their boundary) is copied by the leader from the previous slot, never read again.

Why nothing unchecked is used and nothing is read twice. A byte reaches DCP only from a slot
where its chunk matched the authenticated manifest; the store is read once per chunk per
node, never again once checked, so a file swapped after its check is never read. A slot is
memory of the node's ranks alone (processes the process group named, their pids checked by
the kernel), out of reach of whoever writes the store. It is written again only for round
``n + 2``, which a rank starts after round ``n + 1`` was checked, which needs every rank's
report of it, which each sends only once it has loaded round ``n``: no rank writes a slot
while another may load from it. Sealing a memfd per round (``F_SEAL_WRITE``) would have the
kernel enforce that last point, but only against a rank of the job itself (which could write
before the seal, or into its peers' memory, all the same), and at the price of fresh pages
for every byte in every round, allocated by the rank that fills them and mapped anew by
every other: measured here, that costs more than every rank hashing everything alone.

Errors. A rank that fails its share (a chunk that does not match, a short file, a store
error) reports the error; the leader tells every local rank the first one in rank order and
each raises it as the same CheckpointError a rank alone raises (naming the file and the
chunk); DCP's gather of the read step fails the ranks of other nodes. A rank that stops
closes its socket: its peers fail at once. A peer that hangs fails them after the process
group's timeout.

Memory. The node holds its two slots while it restores: two rounds' bytes, at most
:data:`WINDOW_BYTES` each (more only for a single range longer than that), in memfd (shmem)
pages charged to the memory cgroup of the rank that first wrote them (a pod's limit; nothing
goes to ``/dev/shm``, which pods often cap at 64 MiB); they are freed when the load ends.
Every local rank maps both slots (its resident size counts the pages it touched).

FSDP and resharding: ranks that load different ranges are served from the union, each chunk
of it still read once per node; a round holds what any local rank loads. A world of one, a
rank alone on its machine and the comparator read as before, each rank its own chunks, and
so does every rank for DCP's ``.metadata`` and its rank state (small files, read and
checked whole before DCP plans the load).
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import secrets
import socket
import struct
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from resumequal.checkpoint.chunks import chunk_runs
from resumequal.errors import CheckpointError

__all__ = ["WINDOW_BYTES", "Card", "Door", "Meeting", "Node", "Round", "Shares", "local_ranks",
           "machine", "plan", "share"]

log = logging.getLogger(__name__)

# The most bytes of one round (what a slot holds), unless one range is longer: large enough
# that a round's messages and waits vanish beside its reads (a 1 GB file: 8 rounds), small
# enough that two of them are no one's memory problem.
WINDOW_BYTES = 128 << 20
_SLOTS = 2
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_LENGTH = struct.Struct(">Q")
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

# What a local rank loads from one file: (offset, length) ranges; the files by name.
Ranges = Mapping[str, Sequence[tuple[int, int]]]


class Card(NamedTuple):
    """What a rank tells the others before a load: where it runs and how to reach it."""

    machine: str | None
    pid: int
    address: str


def machine() -> str | None:
    """This process's machine as far as sharing memory goes: the kernel (its boot id), the
    network namespace (where abstract sockets live), the pid namespace (where the pids of
    ``SO_PEERCRED`` are given) and the uid; None where ``/proc`` does not say."""
    try:
        boot = _BOOT_ID.read_text().strip()
        net, pids = os.stat("/proc/self/ns/net"), os.stat("/proc/self/ns/pid")
    except OSError:
        return None
    return (f"{boot}/net:{net.st_dev}:{net.st_ino}/pid:{pids.st_dev}:{pids.st_ino}"
            f"/uid:{os.getuid()}")


def local_ranks(cards: Sequence[Card | None], rank: int) -> list[int]:
    """The ranks on ``rank``'s machine, in order (the first leads): ``[rank]`` when its
    machine is unknown."""
    mine = cards[rank]
    if mine is None or mine.machine is None:
        return [rank]
    return [r for r, card in enumerate(cards) if card is not None and card.machine == mine.machine]


class Round(NamedTuple):
    """Chunks ``first``..``last`` of file ``rel``, checked and loaded by the node together;
    ``carried``: chunk ``first`` is the previous round's last, copied from it."""

    rel: str
    first: int
    last: int
    carried: bool


def plan(wanted: Ranges, chunk: int, most: int) -> list[Round]:
    """The rounds serving ``wanted`` (every local rank's ranges, per file), in order of file
    and offset: runs of whole chunks holding whole ranges, at most ``most`` chunks each
    unless one range is longer (:func:`~resumequal.checkpoint.chunks.chunk_runs`)."""
    rounds = []
    for rel in sorted(wanted):
        previous = None
        for first, last in chunk_runs(sorted(set(wanted[rel])), chunk, most):
            rounds.append(Round(rel, first, last, carried=previous == first))
            previous = last
    return rounds


def share(rnd: Round, parts: int, index: int) -> tuple[int, int] | None:
    """The chunks (first, last) of ``rnd`` that local rank ``index`` of ``parts`` reads:
    the round's own chunks (a carried one is not read) in contiguous pieces of sizes that
    differ by one at most; None when it has none."""
    start = rnd.first + rnd.carried
    count = rnd.last + 1 - start
    first = start + count * index // parts
    last = start + count * (index + 1) // parts - 1
    return (first, last) if first <= last else None


class _PeerGone(Exception):
    """The socket to local rank ``rank`` closed: that rank stopped, or failed and left."""

    def __init__(self, rank: int) -> None:
        super().__init__(f"rank {rank} of this machine left its restore before the end")


def _peer(sock: socket.socket) -> tuple[int, int]:
    """The pid and uid of the process at the other end of ``sock``, as the kernel saw it."""
    pid, uid, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                               _CRED.size))
    return pid, uid


class _Channel:
    """Messages (JSON, each with file descriptors or none) to and from one local rank."""

    def __init__(self, sock: socket.socket, rank: int, timeout: float) -> None:
        sock.settimeout(timeout)
        self._sock, self.rank = sock, rank

    def send(self, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
        body = json.dumps(message).encode()
        frame = memoryview(_LENGTH.pack(len(body)) + body)
        try:
            sent = socket.send_fds(self._sock, [frame], list(fds)) if fds else 0
            self._sock.sendall(frame[sent:])
        except (BrokenPipeError, ConnectionResetError) as e:
            raise _PeerGone(self.rank) from e

    def receive(self) -> tuple[dict[str, Any], list[int]]:
        """The next message and the file descriptors that came with it (the caller's to
        close)."""
        fds: list[int] = []
        try:
            (length,) = _LENGTH.unpack(self._exactly(_LENGTH.size, fds))
            message = json.loads(self._exactly(length, fds))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return message, fds

    def _exactly(self, n: int, fds: list[int]) -> bytes:
        out = bytearray()
        while len(out) < n:
            try:
                data, got, _, _ = socket.recv_fds(self._sock, n - len(out), _SLOTS,
                                                  socket.MSG_CMSG_CLOEXEC)
            except ConnectionResetError as e:
                raise _PeerGone(self.rank) from e
            fds.extend(got)
            if not data:
                raise _PeerGone(self.rank)
            out += data
        return bytes(out)

    def close(self) -> None:
        self._sock.close()


class Door:
    """This rank's listening socket, opened before the ranks gather their cards so that a
    follower can connect to its leader as soon as it knows who that is."""

    def __init__(self) -> None:
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            address = f"\0resumequal-node-{secrets.token_hex(16)}"
            self._listener.bind(address)
            self._listener.listen(64)
        except OSError:
            self._listener.close()
            raise
        self.card = Card(machine(), os.getpid(), address)

    @classmethod
    def open(cls) -> Door | None:
        """A door, or None where this process cannot listen on an abstract socket (it then
        restores alone)."""
        try:
            return cls()
        except OSError as e:
            log.info("restoring alone: no abstract Unix socket here (%s)", e.strerror or e)
            return None

    def meet(self, cards: Sequence[Card | None], rank: int, timeout: float) -> Node | None:
        """The node of ``rank`` among every rank's ``cards``, connected (the leader waits
        for each follower); None when ``rank`` is alone on its machine."""
        ranks = local_ranks(cards, rank)
        if len(ranks) < 2:
            return None
        if rank == ranks[0]:
            return Node(tuple(ranks), rank, self._admit(cards, ranks[1:], timeout))
        leader = cards[ranks[0]]
        assert leader is not None
        return Node(tuple(ranks), rank, {ranks[0]: _connect(leader, ranks[0], timeout)})

    def _admit(self, cards: Sequence[Card | None], followers: list[int],
               timeout: float) -> dict[int, _Channel]:
        """A channel from each of ``followers``, told apart by their pids; a connection
        from any other process is refused."""
        expected = {card.pid: r for r in followers if (card := cards[r]) is not None}
        channels: dict[int, _Channel] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(channels) < len(followers):
                self._listener.settimeout(max(0.0, deadline - time.monotonic()))
                conn, _ = self._listener.accept()
                pid, uid = _peer(conn)
                follower = expected.get(pid)
                if uid != os.getuid() or follower is None or follower in channels:
                    log.warning("refused a connection to this node's restore from pid %d, "
                                "uid %d: not a rank of this machine", pid, uid)
                    conn.close()
                    continue
                channels[follower] = _Channel(conn, follower, timeout)
        except OSError as e:
            for channel in channels.values():
                channel.close()
            missing = sorted(set(followers) - set(channels))
            raise CheckpointError(f"rank(s) {', '.join(map(str, missing))} of this machine "
                                  f"did not join its restore: {e.strerror or e}") from e
        return channels

    def close(self) -> None:
        self._listener.close()


def _connect(leader: Card, rank: int, timeout: float) -> _Channel:
    """A channel to the leader ``rank``, once the kernel says the process listening is its."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        sock.connect(leader.address)
        pid, uid = _peer(sock)
    except OSError as e:
        sock.close()
        raise CheckpointError(f"cannot join the restore of this machine's rank {rank}: "
                              f"{e.strerror or e}") from e
    if pid != leader.pid or uid != os.getuid():
        sock.close()
        raise CheckpointError(f"the restore of this machine's rank {rank} is served by pid "
                              f"{pid}, uid {uid}, not by rank {rank} (pid {leader.pid})")
    return _Channel(sock, rank, timeout)


@dataclass(frozen=True)
class Meeting:
    """Every rank's card, gathered before a load, and this rank's door: what it takes to meet
    the other ranks of its machine once DCP reads (:meth:`node`)."""

    door: Door
    cards: tuple[Card | None, ...]
    rank: int
    timeout: float

    def node(self) -> Node | None:
        """This rank's node, connected; None when it is alone on its machine."""
        return self.door.meet(self.cards, self.rank, self.timeout)


class Shares(Protocol):
    """How a rank reads its shares of a node's rounds from the checkpoint's store."""

    def size(self, rel: str, ranges: Sequence[tuple[int, int]]) -> int:
        """The size of file ``rel``, once every ``(offset, length)`` of ``ranges`` was
        found within it (CheckpointError otherwise)."""
        ...

    def fill(self, rel: str, first: int, last: int, out: memoryview) -> None:
        """Chunks ``first``..``last`` of file ``rel`` read into ``out`` (exactly their
        bytes), each checked against the manifest where it lies there."""
        ...

    def prefetch(self, rel: str, first: int, last: int) -> None:
        """A hint that chunks ``first``..``last`` of file ``rel`` are filled next."""
        ...


@dataclass
class _Slots:
    """The two memfds rounds alternate between, mapped (shared, writable) in this rank."""

    maps: list[mmap.mmap]
    views: list[memoryview]

    @classmethod
    def map(cls, fds: Sequence[int], size: int, where: str) -> _Slots:
        """Map ``fds`` (closed here) of ``size`` bytes each."""
        maps: list[mmap.mmap] = []
        try:
            for fd in fds:
                if os.fstat(fd).st_size != size:
                    raise CheckpointError(f"checkpoint {where}: a slot of this machine's "
                                          f"restore has {os.fstat(fd).st_size} bytes, not "
                                          f"{size}")
                maps.append(mmap.mmap(fd, size, mmap.MAP_SHARED,
                                      mmap.PROT_READ | mmap.PROT_WRITE))
        finally:
            for fd in fds:
                os.close(fd)
        return cls(maps, [memoryview(m) for m in maps])

    def close(self) -> None:
        try:
            for view in self.views:
                view.release()
            for mapped in self.maps:
                mapped.close()
        except BufferError:  # a view of a slot still held (by a traceback): unmapped with it
            pass


@dataclass
class Node:
    """The ranks of this machine in one restore, the leader (the lowest rank) connected to
    each follower: ``channels`` holds the leader's one channel per follower, a follower's
    its one to the leader."""

    ranks: tuple[int, ...]
    rank: int
    channels: dict[int, _Channel]

    @property
    def leader(self) -> bool:
        return self.rank == self.ranks[0]

    def restore(self, wanted: Ranges, *, where: str, chunk: int,
                shares: Shares) -> Generator[tuple[str, int, memoryview], None, None]:
        """This rank's part of the node's restore of ``wanted`` (its ranges, per file): for
        each round, its file, its offset and its checked bytes, to load this rank's ranges
        of the round from; a view is valid until the next one is taken. Raises, on every
        local rank alike, the first error any local rank met; ends the node (its sockets
        closed) either way."""
        try:
            try:
                rounds, slots = self._lead(wanted, chunk, shares, where) if self.leader \
                    else self._follow(wanted, shares, where)
                try:
                    yield from self._rounds(rounds, slots, chunk, shares, where)
                finally:
                    slots.close()
            except _PeerGone as e:
                raise CheckpointError(f"checkpoint {where}: {e}") from e
            except OSError as e:  # a timeout, or a socket or memfd call that failed
                raise CheckpointError(f"checkpoint {where}: the restore of this machine's "
                                      f"ranks failed: {e.strerror or e}") from e
        finally:
            self.close()

    def _lead(self, wanted: Ranges, chunk: int, shares: Shares,
              where: str) -> tuple[list[Round], _Slots]:
        """The plan from every local rank's ranges, and the slots, sent to each follower."""
        union = {rel: list(ranges) for rel, ranges in wanted.items()}
        for channel in self._followers():
            message, _ = channel.receive()
            for rel, ranges in message["ranges"].items():
                union.setdefault(rel, []).extend((int(o), int(n)) for o, n in ranges)
        try:
            sizes = {rel: shares.size(rel, ranges) for rel, ranges in sorted(union.items())}
        except CheckpointError as e:
            self._tell({"error": str(e)})
            raise
        rounds = plan(union, chunk, max(1, WINDOW_BYTES // chunk))
        size = max((_round_bytes(rnd, chunk, sizes[rnd.rel]) for rnd in rounds), default=1)
        fds = [os.memfd_create(f"resumequal-restore-{i}", os.MFD_CLOEXEC)
               for i in range(_SLOTS)]
        try:
            for fd in fds:
                os.ftruncate(fd, size)
            for channel in self._followers():
                channel.send({"rounds": [list(rnd) for rnd in rounds], "slot_bytes": size}, fds)
            return rounds, _Slots.map([os.dup(fd) for fd in fds], size, where)
        finally:
            for fd in fds:
                os.close(fd)

    def _follow(self, wanted: Ranges, shares: Shares, where: str) -> tuple[list[Round], _Slots]:
        """This rank's ranges sent to the leader; the plan and the slots it sent back."""
        (leader,) = self.channels.values()
        leader.send({"ranges": {rel: list(ranges) for rel, ranges in wanted.items()}})
        message, fds = leader.receive()
        if "error" in message or len(fds) != _SLOTS:
            for fd in fds:
                os.close(fd)
            raise CheckpointError(message.get("error") or f"checkpoint {where}: the leader "
                                  f"of this machine's restore sent {len(fds)} slot(s)")
        rounds = [Round(rel, int(first), int(last), bool(carried))
                  for rel, first, last, carried in message["rounds"]]
        return rounds, _Slots.map(fds, int(message["slot_bytes"]), where)

    def _rounds(self, rounds: list[Round], slots: _Slots, chunk: int, shares: Shares,
                where: str) -> Iterator[tuple[str, int, memoryview]]:
        """Every round: this rank's share of it checked into its slot, the node agreed that
        all of it was, then its bytes to load from."""
        parts, index = len(self.ranks), self.ranks.index(self.rank)
        for n, rnd in enumerate(rounds):
            # The kernel reads this rank's share of the next round while it checks and loads
            # this one (of the first, while it starts reading it).
            for ahead in rounds[n + 1:n + 2] if n else rounds[:2]:
                if (mine := share(ahead, parts, index)) is not None:
                    shares.prefetch(ahead.rel, *mine)
            size = _round_bytes(rnd, chunk, shares.size(rnd.rel, ()))
            slot = slots.views[n % _SLOTS][:size]
            failure = None
            try:
                if rnd.carried and self.leader:  # the previous round's last chunk, checked
                    before = rounds[n - 1]
                    at = (before.last - before.first) * chunk
                    carried = slots.views[(n - 1) % _SLOTS][at:at + min(chunk, size)]
                    slot[:len(carried)] = carried
                mine = share(rnd, parts, index)
                if mine is not None:
                    first, last = mine
                    shares.fill(rnd.rel, first, last,
                                slot[(first - rnd.first) * chunk:(last + 1 - rnd.first) * chunk])
            except Exception as e:  # anything: a rank that raised here would leave its
                failure = e         # peers waiting, so each failure is told to the node
            self._agree(n, failure, where)
            yield rnd.rel, rnd.first * chunk, slot

    def _agree(self, n: int, failure: Exception | None, where: str) -> None:
        """Returns once every local rank checked its share of round ``n``; raises the first
        failure of any (in rank order) on every one."""
        mine = None if failure is None else str(failure)
        if self.leader:
            reports = [mine] + [self._report(channel, n, where) for channel in self._followers()]
            first = next((text for text in reports if text is not None), None)
            if first is not None:
                self._tell({"error": first})
                raise CheckpointError(first) from failure
            self._tell({"checked": n})
            return
        (leader,) = self.channels.values()
        leader.send({"filled": n, "error": mine})
        answer, _ = leader.receive()
        if "error" in answer:
            raise CheckpointError(answer["error"]) from failure
        if answer != {"checked": n}:
            raise CheckpointError(f"checkpoint {where}: the leader of this machine's restore "
                                  f"sent {answer} where round {n} was due")

    @staticmethod
    def _report(channel: _Channel, n: int, where: str) -> str | None:
        message, _ = channel.receive()
        if message.get("filled") != n:
            raise CheckpointError(f"checkpoint {where}: rank {channel.rank} of this machine "
                                  f"sent {message} where its report of round {n} was due")
        error: str | None = message["error"]
        return error

    def _followers(self) -> list[_Channel]:
        return [self.channels[r] for r in sorted(self.channels)]

    def _tell(self, message: dict[str, Any]) -> None:
        """``message`` to every follower still there."""
        for channel in self._followers():
            with contextlib.suppress(_PeerGone):
                channel.send(message)

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()


def _round_bytes(rnd: Round, chunk: int, file_size: int) -> int:
    return min((rnd.last + 1) * chunk, file_size) - rnd.first * chunk

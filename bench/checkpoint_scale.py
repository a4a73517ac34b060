"""resumequal's checkpoint save and restore next to plain DCP, at real sizes, in a folder
and on S3 (moto's server on loopback, or SeaweedFS with ``--server seaweedfs``).

Builds a real training state — tiny-gpt (d_model 768, 12 layers, 12 heads, vocab 8192,
seq 128: 98M parameters) after one AdamW step, model + optimizer ≈ 1.17 GB — on every
rank of a gloo group (``--ranks`` processes on this machine, the state replicated as
under DDP), and measures side by side in each round, every step between barriers:

- save: ``CheckpointManager.save`` (every file hashed per chunk while written and
  fsynced, the manifest, the rename) next to ``dcp.save`` with ``sync_files`` (its fsync
  per file) and one fsync of the folder;
- restore, cold (every file of the checkpoint dropped from the page cache first with
  ``posix_fadvise(DONTNEED)``): ``newest()`` + ``load()`` (manifest, then every chunk
  checked as it is read; the ranks, all on this machine, read and check each chunk once
  between them and load from the memory it was checked in,
  :mod:`resumequal.checkpoint.node`) next to ``dcp.load`` of the plain checkpoint, and,
  with several ranks, the same load with each rank reading and checking every chunk it
  loads alone (as before the ranks shared their reads, and as a rank alone on its machine
  does). The shared restore's ratio to plain DCP is printed against its target
  (:data:`NODE_TARGET`);
- on S3 (unless ``--no-s3``; a moto server started here, ``bench/moto_ranges.py``, which
  serves a ranged GET from the bytes asked for where moto copies the whole object, its
  objects in its memory: there is no cache to drop; or, with ``--server seaweedfs``, a
  real S3 server, :mod:`seaweedfs`, its objects in volume files under the work folder):
  the same save and restore through a
  :class:`RemoteRoot` (shards streamed to the store as DCP writes them, hashed on the way;
  restores fetch each chunk a rank reads in a ranged GET and check it) next to plain DCP
  through the same store without resumequal: shards streamed by the same object writers,
  unhashed, and restores fetching each item's bytes in one ranged GET, unchecked, as many
  at once as resumequal's;
- with ``--head``, also the path before issue 38: the save as DCP's with its zip CRCs,
  then rank 0 hashing every file into the manifest; the restore as a copy of the whole
  checkpoint into a private folder per rank, hashed on the way, then ``dcp.load`` of it.

Every restore is compared with the saved state, tensor by tensor. Prints seconds (the
slowest rank's; the median over rounds), the ratio to plain DCP and the peak of each
rank's resident memory above what it held before the step (sampled every 5 ms), next to
the bound of issue 38: the bytes the rank saves or loads + 1 GB.

    python bench/checkpoint_scale.py [--ranks 2] [--rounds 2] [--head] [--no-s3] [--dir /tmp]
        [--server seaweedfs]
    python bench/checkpoint_scale.py --d-model 64 --layers 1 --vocab 256   # a few MB
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock

# The repository root: the checkpoints written by hand (testing/) beside ours.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from pydantic import BaseModel
from torch.distributed.checkpoint.filesystem import FileSystem, _StorageInfo
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.futures import Future

from resumequal.checkpoint import CheckpointManager, FolderRoot, Position, RemoteRoot
from resumequal.checkpoint.manifest import copy_verified
from resumequal.checkpoint.node import Door
from resumequal.local.backend import free_port
from resumequal.run.signing import KEY_ENV, RUN_ID_ENV, new_key, new_run_id
from resumequal.store import Store
from resumequal.store.file import fsync_dir
from resumequal.store.s3 import S3Store
from resumequal.store.s3settings import S3Config
from resumequal.workloads.tiny_gpt import TinyGPT, TinyGPTParams
from seaweedfs import SERVERS, seaweedfs_server
from testing.checkpoints import write_manifest

_PAGE = os.sysconf("SC_PAGE_SIZE")
# A restore by the ranks of one machine, which share their reads, at most this many times
# plain DCP's load by as many ranks.
NODE_TARGET = 1.3


@dataclass(frozen=True)
class Config:
    """What one run measures: the model, the ranks, the rounds, where it writes."""

    d_model: int = 768
    layers: int = 12
    heads: int = 12
    vocab: int = 8192
    seq: int = 128
    ranks: int = 2
    rounds: int = 2
    head: bool = False
    dir: str = ""
    # The S3 server's endpoint and bucket (started by :func:`run`); "" for no S3.
    endpoint: str = ""
    bucket: str = ""
    server: str = "moto"  # or "seaweedfs"


class BenchState(BaseModel):
    """The rank state saved beside the tensors."""

    step: int


def build_state(cfg: Config) -> dict[str, Any]:
    """tiny-gpt's model and AdamW state after one step on random tokens (same on every
    rank: the same seed)."""
    torch.manual_seed(0)
    params = TinyGPTParams(vocab_size=cfg.vocab, d_model=cfg.d_model, n_layers=cfg.layers,
                           n_heads=cfg.heads, seq_len=cfg.seq, dropout=0.0)
    model = TinyGPT(params)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(cfg.vocab, (1, cfg.seq + 1))
    logits = model(tokens[:, :-1])
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def _map(obj: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_map(v, fn) for v in obj)
    return obj


def _tensors(obj: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    _map(obj, out.append)
    return out


def state_bytes(state: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(state))


def check_same(loaded: dict[str, Any], saved: dict[str, Any], what: str) -> None:
    """Every tensor of ``loaded`` equals ``saved``'s, in the same order."""
    got, want = _tensors(loaded), _tensors(saved)
    if len(got) != len(want) or not all(map(torch.equal, got, want)):
        raise AssertionError(f"{what}: the restored state differs from the saved one")


def drop_cache(folder: Path) -> None:
    """Every file under ``folder`` out of the page cache (it is clean: synced)."""
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


class _PeakRss:
    """The peak of this process's resident memory while in the block, above its start."""

    def __enter__(self) -> _PeakRss:
        self.start = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def extra(self) -> int:
        return self.peak - self.start


def timed(fn: Callable[[], Any],
          before: Callable[[], None] | None = None) -> tuple[float, float, int]:
    """``fn``'s wall time from a barrier to a barrier, this rank's CPU time in it (every
    thread) and its peak extra RSS. ``before`` runs on rank 0 first (dropping caches),
    outside the timing."""
    gc.collect()
    if before is not None and dist.get_rank() == 0:
        before()
    dist.barrier()
    with _PeakRss() as rss:
        cpu, start = time.process_time(), time.perf_counter()
        fn()
        cpu = time.process_time() - cpu
        dist.barrier()
        wall = time.perf_counter() - start
    return wall, cpu, rss.extra


def _plain_save(state: dict[str, Any], folder: Path) -> None:
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(folder), sync_files=True))
    if dist.get_rank() == 0:
        fsync_dir(folder)


def _head_save(state: dict[str, Any], root: Path, position: Position) -> None:
    """The save before issue 38: DCP's writer (zip CRCs, its fsyncs), then rank 0 reads
    every file back to hash it into the manifest, and renames the folder into place."""
    staging = root / ".staging" / position.name
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(staging / "dcp"), sync_files=True))
    dist.barrier()
    if dist.get_rank() == 0:
        write_manifest(staging, name=position.name, step=position.step, microstep=0,
                       world_size=dist.get_world_size(), attempt=0)
        fsync_dir(staging / "dcp")
        staging.rename(root / position.name)
        fsync_dir(root)


def _head_load(template: dict[str, Any], checkpoint: Path, private: Path) -> None:
    """The restore before issue 38: a hashed copy of the whole checkpoint per rank, then
    DCP reads the copy."""
    copy = private / f"rank-{dist.get_rank()}" / checkpoint.name
    shutil.rmtree(copy.parent, ignore_errors=True)
    copy_verified(checkpoint, copy)
    dcp.load(template, storage_reader=dcp.FileSystemReader(str(copy / "dcp")))


class _StoreStream:
    """One object written by the store's streaming writer, closed once (DCP closes its
    streams itself)."""

    def __init__(self, store: Store, key: str) -> None:
        self._writer = store.writer(key)
        self.closed = False

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return self._writer.write(data)

    def tell(self) -> int:
        return self._writer.tell()

    def flush(self) -> None:
        """Full parts are on their way already."""

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._writer.close()

    def abort(self) -> None:
        self._writer.abort()


class _StoreFiles(FileSystem):
    """DCP's file system over objects ``<prefix>/<file>`` of a store: plain DCP on S3.
    Every file DCP writes is streamed as one object, unhashed; DCP's ``.metadata``, which
    it writes under a temporary name and renames, is written under its own name."""

    def __init__(self, store: Store, prefix: str) -> None:
        super().__init__()
        self._store, self._prefix = store, prefix

    def _key(self, path: str | os.PathLike[str]) -> str:
        return f"{self._prefix}/{Path(path).name.removesuffix('.tmp')}"

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        if mode == "rb":  # DCP's .metadata
            import io
            yield io.BytesIO(self._store.get_bytes(self._key(path)))
            return
        stream = _StoreStream(self._store, self._key(path))
        try:
            yield stream
            stream.close()
        except BaseException:
            stream.abort()
            raise

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        """Objects need no folder."""

    def exists(self, path: str | os.PathLike[str]) -> bool:
        return False

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        """Written under its final name already."""

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        """Nothing is left under a temporary name."""


class _PlainStoreWriter(dcp.FileSystemWriter):
    def __init__(self, store: Store, prefix: str) -> None:
        super().__init__(f"/{prefix}", sync_files=False)
        self.fs = _StoreFiles(store, prefix)


class _PlainStoreReader(dcp.FileSystemReader):
    """DCP's reader over the same objects: each item's bytes in one ranged GET, unchecked,
    ``AT_ONCE`` in flight (as many as resumequal's restore fetches at once)."""

    AT_ONCE = 8

    def __init__(self, store: Store, prefix: str) -> None:
        super().__init__(f"/{prefix}")
        self.fs = _StoreFiles(store, prefix)
        self._store, self._prefix = store, prefix

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        import io

        from torch.distributed._shard._utils import narrow_tensor_by_index

        def fetch(info: _StorageInfo) -> bytearray:
            data = bytearray(info.length)
            key = f"{self._prefix}/{info.relative_path}"
            if self._store.get_range(key, info.offset, data) != info.length:
                raise RuntimeError(f"{key} ends before byte {info.offset + info.length}")
            return data

        items = list(plan.items)
        infos = [self.storage_data[item.storage_index] for item in items]
        with ThreadPoolExecutor(self.AT_ONCE) as pool:
            ahead = [pool.submit(fetch, info) for info in infos[:self.AT_ONCE]]
            for n, item in enumerate(items):
                data = ahead[n].result()
                ahead[n] = None  # type: ignore[call-overload]
                if n + self.AT_ONCE < len(infos):
                    ahead.append(pool.submit(fetch, infos[n + self.AT_ONCE]))
                if item.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(item, io.BytesIO(data))
                    continue
                tensor = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
                tensor = narrow_tensor_by_index(tensor, item.storage_offsets, item.lengths)
                target = planner.resolve_tensor(item).detach()
                target.copy_(tensor)
                planner.commit_tensor(item, target)
        done: Future[None] = Future()
        done.set_result(None)
        return done


def _s3(cfg: Config, prefix: str) -> S3Store:
    # Fewer parts in flight than the default 10: moto on a few cores drops connections
    # under 2 ranks x 10 parts of 16 MiB (the same store serves both sides).
    return S3Store(f"s3://{cfg.bucket}/{prefix}",
                   S3Config(endpoint_url=cfg.endpoint, addressing_style="path",
                            max_concurrency=4, read_timeout_seconds=300))


def _round(cfg: Config, state: dict[str, Any], work: Path, n: int) -> dict[str, float]:
    """One round on this rank: every save, then every cold restore, checked. Who goes
    first alternates from round to round."""
    rank, world = dist.get_rank(), dist.get_world_size()
    position = Position(n + 1)
    root = FolderRoot(work / "rq")
    mgr = CheckpointManager(root, rank=rank, world_size=world, attempt=0, keep_last=1)
    fresh = CheckpointManager(root, rank=rank, world_size=world, attempt=1, keep_last=1)
    plain, head = work / f"plain-{n}", work / "head"
    out: dict[str, float] = {}

    def record(name: str, fn: Callable[[], Any], folder: Path | None = None) -> None:
        before = None if folder is None else lambda: drop_cache(folder)
        out[f"{name}_s"], out[f"{name}_cpu"], rss = timed(fn, before)
        out[f"{name}_rss"] = float(rss)

    def load(name: str, fn: Callable[[dict[str, Any]], Any], folder: Path | None) -> None:
        template = _map(state, torch.zeros_like)
        record(name, lambda: fn(template), folder)
        check_same(template, state, name)

    def rq_load(template: dict[str, Any]) -> None:
        assert fresh.newest() == position.name
        fresh.load(position.name, lambda _: template, BenchState)

    saves: list[tuple[str, Callable[[], Any]]] = [
        ("rq_save", lambda: mgr.save(position, state, BenchState(step=n + 1))),
        ("dcp_save", lambda: _plain_save(state, plain))]
    def alone_load(template: dict[str, Any]) -> None:
        # As before the ranks of a machine shared their reads (and as a rank alone on its
        # machine still does): every rank reads and checks every chunk it loads.
        with mock.patch.object(Door, "open", return_value=None):
            rq_load(template)

    loads: list[tuple[str, Callable[[dict[str, Any]], Any], Path | None]] = [
        ("rq_load", rq_load, root.root / position.name),
        ("dcp_load", lambda t: dcp.load(t, storage_reader=dcp.FileSystemReader(str(plain))),
         plain)]
    if world > 1:
        loads.append(("alone_load", alone_load, root.root / position.name))
    if cfg.endpoint:
        s3_root = RemoteRoot(_s3(cfg, "rq"), "ckpt", work / "s3-local")
        s3_mgr = CheckpointManager(s3_root, rank=rank, world_size=world, attempt=0,
                                   keep_last=1)
        s3_fresh = CheckpointManager(s3_root, rank=rank, world_size=world, attempt=1,
                                     keep_last=1)
        plain_s3 = _s3(cfg, f"plain-{n}")

        def rq_s3_load(template: dict[str, Any]) -> None:
            assert s3_fresh.newest() == position.name
            s3_fresh.load(position.name, lambda _: template, BenchState)

        saves += [("rq_s3_save", lambda: s3_mgr.save(position, state, BenchState(step=n + 1))),
                  ("dcp_s3_save", lambda: dcp.save(state, storage_writer=_PlainStoreWriter(
                      plain_s3, "dcp")))]
        loads += [("rq_s3_load", rq_s3_load, None),
                  ("dcp_s3_load", lambda t: dcp.load(t, storage_reader=_PlainStoreReader(
                      plain_s3, "dcp")), None)]
    if cfg.head:
        saves.append(("head_save", lambda: _head_save(state, head, position)))
        loads.append(("head_load", lambda t: _head_load(t, head / position.name,
                                                        work / "private"), head / position.name))
    order = 1 if n % 2 == 0 else -1
    for name, fn in saves[::order]:
        record(name, fn)
    for name, loader, folder in loads[::order]:
        load(name, loader, folder)
    dist.barrier()
    if rank == 0:
        for folder in (plain, head, work / "private"):
            shutil.rmtree(folder, ignore_errors=True)
        if cfg.endpoint:
            _s3(cfg, f"plain-{n}").delete_all()
    return out


def measure(cfg: Config, work: Path) -> dict[str, Any]:
    """Every round on this rank (in a process group already made); on rank 0, every
    rank's figures per round."""
    state = build_state(cfg)
    rounds = [_round(cfg, state, work, n) for n in range(cfg.rounds)]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, rounds)
    return {"bytes": state_bytes(state), "ranks": gathered}


def _worker(rank: int, cfg: Config, port: int, result: str) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // cfg.ranks))
    warnings.filterwarnings("ignore", module="torch.distributed.checkpoint")
    store = dist.TCPStore("127.0.0.1", port, cfg.ranks, rank == 0,
                          timeout=timedelta(seconds=600))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=cfg.ranks,
                            timeout=timedelta(seconds=600))
    try:
        figures = measure(cfg, Path(cfg.dir))
        if rank == 0:
            Path(result).write_text(json.dumps(figures))
    finally:
        dist.destroy_process_group()


def _dummy_credentials() -> None:
    for name, value in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(name, value)


@contextlib.contextmanager
def s3_server(server: str, work: Path) -> Iterator[str]:
    """``server`` (moto or seaweedfs) on loopback with one bucket ``bench``; its endpoint.
    Dummy credentials for whoever reaches it."""
    _dummy_credentials()
    with moto_server(work) if server == "moto" else seaweedfs_server(work) as endpoint:
        import boto3  # type: ignore[import-untyped]

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        yield endpoint


@contextlib.contextmanager
def moto_server(work: Path) -> Iterator[str]:
    """moto's S3 server on loopback (ranged GETs served from their bytes alone), in a
    process of its own (its objects in its memory); its endpoint."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with (work / "moto.log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("moto_ranges.py")),
                                 "-H", "127.0.0.1", "-p", str(port)],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"moto server not answering; see {work}/moto.log") from None
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(30)


def run(cfg: Config, s3: bool = True) -> dict[str, Any]:
    """Spawn ``cfg.ranks`` ranks measuring in a fresh folder under ``cfg.dir`` (and, with
    ``s3``, the S3 server ``cfg.server``); their figures."""
    os.environ.setdefault(KEY_ENV, new_key())
    os.environ.setdefault(RUN_ID_ENV, new_run_id())
    work = Path(tempfile.mkdtemp(prefix="rq-ckpt-scale-", dir=cfg.dir or None))
    try:
        with contextlib.ExitStack() as stack:
            endpoint = stack.enter_context(s3_server(cfg.server, work)) if s3 else ""
            result = work / "result.json"
            ranked = Config(**{**asdict(cfg), "dir": str(work), "endpoint": endpoint,
                               "bucket": "bench" if s3 else ""})
            mp.spawn(_worker, args=(ranked, free_port(), str(result)), nprocs=cfg.ranks,
                     join=True)
            return json.loads(result.read_text())  # type: ignore[no-any-return]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def summary(figures: dict[str, Any]) -> dict[str, float]:
    """Per figure, the slowest (or fullest) rank's value, median over rounds."""
    ranks: list[list[dict[str, float]]] = figures["ranks"]
    names = ranks[0][0].keys()
    return {name: statistics.median(max(r[n][name] for r in ranks) for n in range(len(ranks[0])))
            for name in names}


def _round_ratios(figures: dict[str, Any], op: str, ours: str = "rq") -> list[float]:
    """resumequal's time (``ours``: its figure's prefix) over plain DCP's in each round, the
    slowest rank's of each."""
    ranks: list[list[dict[str, float]]] = figures["ranks"]
    return [max(r[n][f"{ours}_{op}_s"] for r in ranks) / max(r[n][f"dcp_{op}_s"] for r in ranks)
            for n in range(len(ranks[0]))]


def _ratio(figures: dict[str, Any], op: str, ours: str = "rq") -> float:
    return statistics.geometric_mean(_round_ratios(figures, op, ours))


def node_lines(figures: dict[str, Any]) -> list[str]:
    """The restore of several ranks on one machine, which share their reads (each chunk
    read and checked once per machine), next to plain DCP's load by as many ranks, against
    the target; and the same ranks each reading and checking alone, as before."""
    s = summary(figures)
    if "alone_load_s" not in s:
        return []
    ratio, alone = _ratio(figures, "load"), _ratio(figures, "load", "alone")
    return [
        f"folder restore (cold), ranks of one machine: shared reads {s['rq_load_s']:.2f}s, "
        f"each rank alone {s['alone_load_s']:.2f}s, plain DCP {s['dcp_load_s']:.2f}s "
        f"(CPU s {s['alone_load_cpu']:.2f} alone)",
        f"ratio to plain DCP: shared {ratio:.2f} (target: at most {NODE_TARGET:.2f}, "
        f"{'met' if ratio <= NODE_TARGET else 'NOT met'}), alone {alone:.2f}; per round, "
        "shared: " + ", ".join(f"{r:.2f}" for r in _round_ratios(figures, "load"))
        + "; alone: " + ", ".join(f"{r:.2f}" for r in _round_ratios(figures, "load", "alone")),
    ]


def report(cfg: Config, figures: dict[str, Any]) -> str:
    s = summary(figures)
    gb = figures["bytes"] / 1e9
    lines = [f"checkpoint of {gb:.3f} GB (tiny-gpt d_model {cfg.d_model}, {cfg.layers} "
             f"layers, vocab {cfg.vocab}, seq {cfg.seq}, AdamW), {cfg.ranks} rank(s), "
             f"{cfg.rounds} round(s); seconds: medians over rounds of the slowest rank; "
             "ratio: the geometric mean of the rounds' (who goes first alternates, and the "
             "second of two saves in a row is the slower)",
             f"{'':<22}{'resumequal':>11}{'plain DCP':>11}{'ratio':>7}"
             + (f"{'before #38':>12}" if cfg.head else "")
             + f"{'CPU s rq/DCP':>15}{'RSS+ MB rq/DCP':>17}"]
    rows = [("save", "folder save", True), ("load", "folder restore (cold)", True),
            ("s3_save", "S3 save", False), ("s3_load", "S3 restore", False)]
    for op, label, has_head in rows:
        if f"rq_{op}_s" not in s:
            continue
        rq, plain = s[f"rq_{op}_s"], s[f"dcp_{op}_s"]
        ratio = _ratio(figures, op)
        head = ""
        if cfg.head:
            head = f"{s[f'head_{op}_s']:>11.2f}s" if has_head else f"{'':>12}"
        cpu = f"{s[f'rq_{op}_cpu']:.2f}/{s[f'dcp_{op}_cpu']:.2f}"
        rss = f"{s[f'rq_{op}_rss'] / 1e6:.0f}/{s[f'dcp_{op}_rss'] / 1e6:.0f}"
        lines.append(f"{label:<22}{rq:>10.2f}s{plain:>10.2f}s{ratio:>7.2f}{head}"
                     f"{cpu:>15}{rss:>17}")
    ranks: list[list[dict[str, float]]] = figures["ranks"]
    for op, label, _ in rows:
        if f"rq_{op}_s" in ranks[0][0]:
            lines.append(f"ratio per round, {label}: "
                         + ", ".join(f"{ratio:.2f}" for ratio in _round_ratios(figures, op)))
    bound = figures["bytes"] + 1e9  # every rank loads the whole (replicated) state
    for op, label, _ in rows:
        if f"rq_{op}_rss" in ranks[0][0]:
            peaks = [max(r[f"rq_{op}_rss"] for r in rounds) / 1e6 for rounds in ranks]
            lines.append(f"peak RSS+ per rank, resumequal {label}: "
                         + ", ".join(f"rank {i} {mb:.0f} MB" for i, mb in enumerate(peaks))
                         + f" (bound: what a rank loads + 1 GB = {bound / 1e6:.0f} MB)")
    lines += node_lines(figures)
    lines.append("folder restores are cold: every file of the checkpoint dropped from the page "
                 "cache first (posix_fadvise DONTNEED, no root needed); "
                 + ("S3's objects live in moto's memory: no cache to drop" if cfg.server == "moto"
                    else "S3's objects are SeaweedFS's volume files, read through the page "
                    "cache (not dropped)"))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    d = Config()
    parser.add_argument("--d-model", type=int, default=d.d_model)
    parser.add_argument("--layers", type=int, default=d.layers)
    parser.add_argument("--heads", type=int, default=d.heads)
    parser.add_argument("--vocab", type=int, default=d.vocab)
    parser.add_argument("--seq", type=int, default=d.seq)
    parser.add_argument("--ranks", type=int, default=d.ranks)
    parser.add_argument("--rounds", type=int, default=d.rounds)
    parser.add_argument("--head", action="store_true",
                        help="also measure the copy path of before issue 38")
    parser.add_argument("--no-s3", action="store_true", help="measure the folder only")
    parser.add_argument("--dir", default="", help="where to write (default: the temp folder)")
    parser.add_argument("--server", choices=SERVERS, default="moto", help="the S3 server")
    a = parser.parse_args()
    cfg = Config(d_model=a.d_model, layers=a.layers, heads=a.heads, vocab=a.vocab, seq=a.seq,
                 ranks=a.ranks, rounds=a.rounds, head=a.head, dir=a.dir, server=a.server)
    print(report(cfg, run(cfg, s3=not a.no_s3)))


if __name__ == "__main__":
    main()

"""resumequal's S3 checkpoint save and resume next to raw boto3, against moto on loopback.

Starts ``python -m moto.server`` on a free 127.0.0.1 port (dummy credentials; SeaweedFS, a
real S3 server, with ``--server seaweedfs``: :mod:`seaweedfs`), builds a
~300 MB state dict of float32 tensors of mixed sizes and, in a single-process gloo group
(rank 0 of 1, over a FileStore), measures side by side in every round:

- save: ``CheckpointManager.save`` on the S3 root the worker builds
  (``checkpoint_location`` → ``RemoteRoot``): DCP serialises the shards straight into
  parallel multipart uploads, hashed on the way (no local copy, no second pass), then
  DCP's ``.metadata`` and the rank state, the manifest, ``COMMITTED`` and retention —
  next to boto3's ``upload_file`` of the same files (a local DCP copy of the same state,
  written beforehand and timed apart) to the same endpoint;
- resume: ``newest()`` + ``load()`` (manifest check against the listing, parallel ranged
  download hashed as the parts land, BLAKE3 check, DCP load into fresh tensors) next to
  boto3's ``download_file`` of the same objects.

One untimed round first warms both sides (connections, thread pools, moto's first
objects). Every round starts with the local DCP write, then the two saves, then the two
resumes; who goes first alternates from round to round. Whoever goes first after the
resumes pays for them: moto's kernel time (page faults, page cache) doubles in the
transfer that follows its serving of two 300 MB downloads, whichever side sends it. So
rounds are compared in pairs, one of each order: a pair's ratio is boto3's time over
resumequal's, each summed over the pair, and an odd ``--rounds`` is rounded up. Prints
MB/s (median round) and the median over pairs of that ratio (1.00 = as fast as the raw
transfer alone), and the ratio of each side's best round: on a machine shared with other
work, the best round of each side is the one least disturbed.

    python bench/s3_checkpoint.py [--mb 300] [--rounds 4] [--server seaweedfs]

moto keeps objects in one Python process and shares the CPUs with the client, so
absolute figures are far below a real endpoint; the ratios are what this measures.
SeaweedFS is a real server, sharing the CPUs all the same.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import shutil
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3  # type: ignore[import-untyped]
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from boto3.s3.transfer import TransferConfig  # type: ignore[import-untyped]
from botocore.config import Config  # type: ignore[import-untyped]
from pydantic import BaseModel, ConfigDict

from resumequal.checkpoint import CheckpointManager, Position, RemoteRoot, checkpoint_location
from resumequal.run.signing import KEY_ENV, RUN_ID_ENV, new_key, new_run_id
from resumequal.store import S3Config
from resumequal.store.s3settings import S3Settings
from s3_upload import moto_server  # the same loopback moto launcher
from seaweedfs import SERVERS, seaweedfs_server

MiB = 1 << 20
BUCKET = "rq-bench"
REGION = "us-east-1"
# (count, elements) of float32 tensors: a few large weights, many mid-size, many small.
_MIX = ((4, 10 * MiB), (6, 4 * MiB), (20, MiB // 2), (50, 16 * 1024))
_MIX_BYTES = sum(n * e * 4 for n, e in _MIX)


def dummy_credentials() -> None:
    """Dummy credentials in the environment and nothing else from the AWS chain."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_WEB_IDENTITY_TOKEN_FILE",
                 "AWS_ROLE_ARN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(name, None)
    os.environ.update(
        AWS_ACCESS_KEY_ID="AKIARQBENCHDUMMYKEY0",
        AWS_SECRET_ACCESS_KEY="rq-dummy-secret-for-bench-only",
        AWS_DEFAULT_REGION=REGION,
        AWS_REGION=REGION,
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
    )


@contextmanager
def process_group(tmp: Path) -> Iterator[None]:
    """A single-process gloo group (rank 0 of 1) over a FileStore, as the unit tests use."""
    store = dist.FileStore(str(tmp / "pg-store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1,
                            timeout=timedelta(seconds=120))
    try:
        yield
    finally:
        dist.destroy_process_group()


def raw_client(endpoint: str) -> Any:
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, config=Config(s3={"addressing_style": "path"})
    )


def make_state(mb: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """~``mb`` MB of float32 tensors of mixed sizes (the _MIX proportions), reproducible."""
    scale = mb * 1e6 / _MIX_BYTES
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for group, (count, elements) in enumerate(_MIX):
        for i in range(count):
            n = max(1, int(elements * scale))
            state[f"g{group}.t{i:02d}"] = torch.randn(n, generator=gen)
    return state


def state_bytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def zeros_like_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(v) for k, v in state.items()}


def s3_root(endpoint: str, run_dir: Path, leg: str = "control") -> RemoteRoot:
    """The checkpoint root a worker builds for ``checkpoint.store=s3://…`` (worker.py)."""
    spec = S3Settings(endpoint_url=endpoint, addressing_style="path")
    root = checkpoint_location(f"s3://{BUCKET}/runs", spec, run_dir, leg)
    assert isinstance(root, RemoteRoot)
    return root


def transfer_config() -> Any:
    """boto3's transfer settings matching S3Store's defaults (part size, concurrency)."""
    config = S3Config()
    return TransferConfig(
        multipart_threshold=config.multipart_threshold_mb * MiB,
        multipart_chunksize=config.multipart_chunk_mb * MiB,
        max_concurrency=config.max_concurrency,
    )


# The CPU time this process spent in each timed step, by the step's name: both sides run
# here, moto apart, so this is what each side's client costs (moto's share is the same
# bytes for both).
CPU: dict[str, list[float]] = {}


def timed(fn: Callable[[], Any], name: str = "") -> float:
    """``fn``'s wall time, started from the same quiet state for every side: the local
    files the step before wrote flushed (their writeback would otherwise land on whoever
    comes next; a resume writes 300 MB to disk), garbage collected, moto idle. Its CPU time
    goes to ``CPU[name]``."""
    os.sync()
    gc.collect()
    time.sleep(0.3)
    cpu = time.process_time()
    start = time.perf_counter()
    fn()
    wall = time.perf_counter() - start
    CPU.setdefault(name, []).append(time.process_time() - cpu)
    return wall


def quiet() -> None:
    logging.basicConfig(level=logging.WARNING)
    warnings.filterwarnings("ignore", module="torch.distributed.checkpoint")


def pair_ratios(mine: list[float], base: list[float]) -> list[float]:
    """boto3's time over resumequal's per pair of rounds (one of each order), each summed."""
    return [(base[i] + base[i + 1]) / (mine[i] + mine[i + 1]) for i in range(0, len(mine) - 1, 2)]


def report(label: str, mb: float, mine: list[float], base: list[float], base_label: str,
           extra: str = "") -> None:
    ratio = statistics.median(pair_ratios(mine, base))
    print(f"  {label:<30} {mb / statistics.median(mine):7.1f} MB/s   "
          f"{base_label:<20} {mb / statistics.median(base):7.1f} MB/s   "
          f"ratio {ratio:.2f} (best rounds {min(base) / min(mine):.2f}){extra}")
    # Rounds alternate: resumequal goes first in the even ones, boto3 in the odd ones.
    first, second = (statistics.median(mine[0::2]), statistics.median(base[1::2])), (
        statistics.median(mine[1::2]), statistics.median(base[0::2]))
    print(f"  {'':<30} median s, resumequal / boto3: going first {first[0]:.2f} / "
          f"{first[1]:.2f}, going second {second[0]:.2f} / {second[1]:.2f}")


class BenchRankState(BaseModel):
    """A small rank state, as the training loop's is: a counter and an RNG state."""

    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")
    step: int
    rng: bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=300, help="state size in MB")
    parser.add_argument("--rounds", type=int, default=4,
                        help="timed rounds, an even number (one of each order per pair)")
    parser.add_argument("--server", choices=SERVERS, default="moto", help="the S3 server")
    args = parser.parse_args()
    args.rounds += args.rounds % 2
    quiet()
    dummy_credentials()
    # Checkpoints and traces are sealed with the run's key and id, as in a run.
    os.environ.setdefault(KEY_ENV, new_key())
    os.environ.setdefault(RUN_ID_ENV, new_run_id())

    state = make_state(args.mb)
    nbytes = state_bytes(state)
    server = seaweedfs_server() if args.server == "seaweedfs" else moto_server()
    with (server as endpoint, tempfile.TemporaryDirectory(prefix="rq-s3ckpt-") as t,
          process_group(Path(t))):
        tmp = Path(t)
        raw = raw_client(endpoint)
        raw.create_bucket(Bucket=BUCKET)
        xfer = transfer_config()
        manager = CheckpointManager(s3_root(endpoint, tmp), rank=0, world_size=1, attempt=0,
                                    keep_last=1)
        # The raw side moves the same files: a local DCP copy of the same state.
        local = tmp / "local-dcp"
        down = tmp / "raw-down"
        down.mkdir()
        rank_state = BenchRankState(step=0, rng=torch.get_rng_state().numpy().tobytes())

        def local_write() -> None:
            shutil.rmtree(local, ignore_errors=True)
            dcp.save(state, storage_writer=dcp.FileSystemWriter(str(local)))

        local_write()
        files = sorted(p for p in local.rglob("*") if p.is_file())
        total_mb = sum(p.stat().st_size for p in files) / 1e6
        print(f"state: {len(state)} float32 tensors, {nbytes / 1e6:.0f} MB "
              f"(largest {max(t.numel() for t in state.values()) * 4 / 1e6:.1f} MB, smallest "
              f"{min(t.numel() for t in state.values()) * 4 / 1e3:.1f} kB); DCP files "
              f"{len(files)}, {total_mb:.0f} MB; {os.cpu_count()} CPUs; "
              f"{args.server} at {endpoint}")

        def raw_upload() -> None:
            for p in files:
                raw.upload_file(str(p), BUCKET, f"raw/{p.relative_to(local)}", Config=xfer)

        def raw_download() -> None:
            for p in files:
                rel = p.relative_to(local)
                (down / rel).parent.mkdir(parents=True, exist_ok=True)
                raw.download_file(BUCKET, f"raw/{rel}", str(down / rel), Config=xfer)

        saves: list[tuple[float, float, float]] = []
        loads: list[tuple[float, float]] = []
        for r in range(-1, args.rounds):  # round -1 warms up, untimed
            position = Position(r + 2)

            def ours_save(position: Position = position) -> None:
                manager.save(position, state, rank_state)

            def ours_load(position: Position = position) -> None:
                name = manager.newest()
                assert name == position.name, (name, position)
                loaded = manager.load(name, lambda _: zeros_like_state(state), BenchRankState)
                assert torch.equal(loaded.tensors["g0.t00"], state["g0.t00"])

            # The local write (moto idle) opens every round, so it sits before whichever
            # side saves first, never between one side and what came before it. Who goes
            # first alternates, and rounds are compared in pairs (see the docstring).
            s_local = timed(local_write)
            if r % 2 == 0:
                s_ours, s_raw = timed(ours_save, "save"), timed(raw_upload, "upload")
                l_ours, l_raw = timed(ours_load, "load"), timed(raw_download, "download")
            else:
                s_raw, s_ours = timed(raw_upload, "upload"), timed(ours_save, "save")
                l_raw, l_ours = timed(raw_download, "download"), timed(ours_load, "load")
            if r < 0:
                CPU.clear()  # the warm-up's CPU (imports, first connections) is not counted
                continue
            saves.append((s_ours, s_raw, s_local))
            loads.append((l_ours, l_raw))
            first = "resumequal" if r % 2 == 0 else "boto3"
            print(f"  round {r + 1} ({first} first, load {os.getloadavg()[0]:.1f}): save "
                  f"{s_ours:.2f}s (local DCP write {s_local:.2f}s), boto3 upload {s_raw:.2f}s; "
                  f"resume {l_ours:.2f}s, boto3 download {l_raw:.2f}s")

        print(f"median of {args.rounds} rounds ({args.rounds // 2} pairs), {total_mb:.0f} MB "
              "(ratio = boto3 time / resumequal time per pair; 1.00 = as fast as the bare "
              "transfer):")
        report("save (DCP write+upload+commit)", total_mb, [s[0] for s in saves],
               [s[1] for s in saves], "boto3 upload_file",
               f"   (local DCP write alone {total_mb / statistics.median(s[2] for s in saves):.1f}"
               " MB/s, not in either)")
        report("resume (newest+verify+load)", total_mb, [x[0] for x in loads],
               [x[1] for x in loads], "boto3 download_file")
        cpu = {name: statistics.median(values) for name, values in CPU.items()}
        print(f"  client CPU (this process, median s): save {cpu['save']:.2f} / boto3 upload "
              f"{cpu['upload']:.2f}; resume {cpu['load']:.2f} / boto3 download "
              f"{cpu['download']:.2f}")


if __name__ == "__main__":
    main()

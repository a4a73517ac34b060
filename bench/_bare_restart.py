"""A trivial elastic worker: the floor that ``bench/restart_latency.py`` measures against.

Run under torchrun with 2 ranks and ``--max-restarts 1``. Every attempt joins a gloo group
through a store namespaced by the attempt (as ``resumequal.train.distributed`` does, so a
restarted group connects cleanly), all-reduces once, and records its timings in
``OUT/attempt-A-rank-R.json``. On attempt 0, rank 1 then publishes its pid in
``OUT/pid-rank-1.json`` and sleeps until it is killed, while rank 0 waits in a second
all-reduce, as a leg's other ranks wait in a collective for the armed rank.

    torchrun --nproc-per-node 2 --max-restarts 1 bench/_bare_restart.py --out DIR
"""

from __future__ import annotations

import time

STARTED_AT = time.time()  # before any import that takes time

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

HOLD_SECONDS = 60


def process_started_at() -> float:
    """This process's creation time from /proc, the same clock a leg's StartupRecord uses."""
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def publish(path: Path, body: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(body))
    tmp.rename(path)


def join_group(namespace: str) -> tuple[int, int]:
    """Join this attempt's gloo group through torchrun's store, namespaced by the attempt;
    this rank and the attempt."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    timeout = timedelta(seconds=120)
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         world_size=None, is_master=False, timeout=timeout,
                         wait_for_workers=False)
    store = dist.PrefixStore(f"{namespace}/attempt-{attempt}", base)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=timeout)
    return rank, attempt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    out: Path = parser.parse_args().out

    rank, attempt = join_group("bare")
    dist.all_reduce(torch.ones(1))
    joined_at = time.time()
    publish(out / f"attempt-{attempt}-rank-{rank}.json", {
        "rank": rank, "attempt": attempt, "pid": os.getpid(),
        "process_started_at": process_started_at(), "started_at": STARTED_AT,
        "joined_at": joined_at,
    })
    if attempt == 0:
        if rank == 1:
            publish(out / "pid-rank-1.json", {"pid": os.getpid()})
            time.sleep(HOLD_SECONDS)
            raise SystemExit(f"rank 1 was not killed within {HOLD_SECONDS}s")
        dist.all_reduce(torch.ones(1))  # fails when rank 1 dies
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""AWS s3torchconnector's DCP writer/reader next to resumequal's stage-and-upload design.

Against a moto server on loopback (see ``s3_checkpoint.py``), in a single-process gloo
group:

(a) throughput, median of rounds: ``dcp.save`` with ``S3StorageWriter`` next to
    ``CheckpointManager.save`` of the same state; ``dcp.load`` with ``S3StorageReader``
    next to ``newest()`` + ``load()``.
(b) correctness under a kill: a child process saves a large state with each design and is
    SIGKILLed mid-save; the bucket is listed and each design's reader is asked to load:
    - fresh: the save goes to a new prefix (no earlier checkpoint there);
    - overwrite: the save replaces a complete checkpoint at the same prefix
      (s3torchconnector) / re-saves after a committed older one (resumequal);
    - corrupt: one byte of a committed shard object is flipped (same size).

s3torchconnector is optional: if it cannot be imported, or cannot reach moto (the CRT
client takes the endpoint from ``AWS_ENDPOINT_URL``; path style from
``S3ClientConfig(force_path_style=True)``), this says so and exits 0 after what it could
measure.

    python bench/s3torchconnector_eval.py [--mb 300] [--rounds 3] [--kill-mb 600]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from resumequal.checkpoint import CheckpointManager, Position
from resumequal.errors import CheckpointError

# The sibling bench module (bench/ is on sys.path when this runs as a script).
from s3_checkpoint import (
    BUCKET,
    REGION,
    dummy_credentials,
    make_state,
    moto_server,
    process_group,
    quiet,
    raw_client,
    s3_root,
    state_bytes,
    timed,
    zeros_like_state,
)

THREADS = 4  # S3StorageWriter thread_count in the kill test: several shard objects


def connector() -> tuple[Any, Any, Any] | str:
    """(S3StorageWriter, S3StorageReader, S3ClientConfig), or why they are unusable."""
    try:
        from s3torchconnector import S3ClientConfig
        from s3torchconnector.dcp import S3StorageReader, S3StorageWriter
    except ImportError as e:
        return f"cannot import s3torchconnector.dcp: {e}"
    return S3StorageWriter, S3StorageReader, S3ClientConfig


def tc_writer(uri: str, threads: int = 1) -> Any:
    writer, _, config = connector()  # type: ignore[misc]
    return writer(REGION, uri, s3client_config=config(force_path_style=True),
                  thread_count=threads)


def tc_reader(uri: str) -> Any:
    _, reader, config = connector()  # type: ignore[misc]
    return reader(REGION, uri, s3client_config=config(force_path_style=True))


def listing(client: Any, prefix: str) -> dict[str, tuple[int, str]]:
    """key (relative to prefix) -> (size, etag)."""
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for obj in page.get("Contents", []):
            out[obj["Key"][len(prefix):]] = (obj["Size"], obj["ETag"])
    return out


def delete_prefix(client: Any, prefix: str) -> None:
    keys = list(listing(client, prefix))
    for i in range(0, len(keys), 1000):
        client.delete_objects(Bucket=BUCKET, Delete={
            "Objects": [{"Key": prefix + k} for k in keys[i:i + 1000]]})


def compare(loaded: dict[str, torch.Tensor], old: dict[str, torch.Tensor],
            new: dict[str, torch.Tensor]) -> str:
    """How many tensors equal the old save, the new one, or neither."""
    o = sum(torch.equal(loaded[k], old[k]) for k in loaded)
    n = sum(torch.equal(loaded[k], new[k]) for k in loaded)
    return f"{o} tensors = old save, {n} = new save, {len(loaded) - o - n} = neither"


# -- child processes for the kill test ----------------------------------------------------

def child(args: argparse.Namespace) -> None:
    """Save state ``seed`` with one design, printing 'go' first; the parent kills us."""
    state = make_state(args.kill_mb, seed=args.seed)
    print("go", flush=True)
    if args.child == "tc":
        dcp.save(state, storage_writer=tc_writer(args.uri, THREADS))
    else:
        with tempfile.TemporaryDirectory() as t, process_group(Path(t)):
            manager = CheckpointManager(s3_root(args.endpoint, Path(args.run_dir)), rank=0,
                                        world_size=1, attempt=1, keep_last=5)
            manager.save(Position(args.seed), state, {"step": args.seed})
    print("done", flush=True)


def run_and_kill(argv: list[str], client: Any, prefix: str,
                 torn: Callable[[dict[str, tuple[int, str]]], bool]) -> str:
    """Start a child save, SIGKILL it once ``torn(listing)`` holds; what happened."""
    proc = subprocess.Popen([sys.executable, __file__, *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()  # "go": the state is built, the save starts now
    start = time.monotonic()
    try:
        while proc.poll() is None and time.monotonic() - start < 300:
            if torn(listing(client, prefix)):
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return f"SIGKILLed {time.monotonic() - start:.1f}s into the save"
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return "save finished before the kill condition was seen (nothing torn)"


def describe(objs: dict[str, tuple[int, str]]) -> str:
    return ", ".join(f"{k} ({s / 1e6:.1f} MB)" for k, (s, _) in sorted(objs.items())) or "none"


def try_tc_load(uri: str, template: dict[str, torch.Tensor]) -> tuple[str, dict[str, Any]]:
    out = zeros_like_state(template)
    try:
        dcp.load(out, storage_reader=tc_reader(uri))
    except (Exception, CheckpointException) as e:  # a BaseException in torch 2.13
        first = str(e).strip().splitlines()
        return f"FAILS: {type(e).__name__}: {first[-1][:140] if first else ''}", {}
    return "LOADS", out


def try_rq_load(manager: CheckpointManager,
                template: dict[str, torch.Tensor]) -> tuple[str, dict[str, Any]]:
    try:
        manager.collect_garbage()
        name = manager.newest()
        if name is None:
            return "no committed checkpoint", {}
        loaded = manager.load(name, lambda _: zeros_like_state(template))
    except (CheckpointError, CheckpointException) as e:  # the latter escapes manager.load
        return f"REFUSES: {type(e).__name__}: {str(e)[:160]}", {}
    return f"loads {name}", loaded.tensors


# -- main -----------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=300, help="state size (throughput), MB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kill-mb", type=int, default=600, help="state size (kill test)")
    parser.add_argument("--child", choices=["tc", "rq"], help=argparse.SUPPRESS)
    parser.add_argument("--uri", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    quiet()
    if args.child:
        child(args)
        return
    dummy_credentials()
    found = connector()
    if isinstance(found, str):
        print(f"s3torchconnector: NOT USABLE — {found}")
        print("  install it with `pip install 's3torchconnector[dcp]'` (not a project "
              "dependency); only resumequal's side is measured, by bench/s3_checkpoint.py")
        return

    state = make_state(args.mb)
    total_mb = state_bytes(state) / 1e6
    with (moto_server() as endpoint, tempfile.TemporaryDirectory(prefix="rq-s3tc-") as t,
          process_group(Path(t))):
        # The CRT client has no endpoint argument on the DCP writer/reader; it reads this.
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        tmp = Path(t)
        client = raw_client(endpoint)
        client.create_bucket(Bucket=BUCKET)
        print(f"state {total_mb:.0f} MB ({len(state)} tensors), {os.cpu_count()} CPUs, "
              f"moto at {endpoint}")

        # Can the CRT client talk to moto at all? A small save/load, in a child with a
        # timeout would be safer; the CRT fails fast on refused connections in practice.
        probe = {"x": torch.arange(1000, dtype=torch.float32)}
        try:
            dcp.save(probe, storage_writer=tc_writer(f"s3://{BUCKET}/probe"))
            back = {"x": torch.zeros(1000)}
            dcp.load(back, storage_reader=tc_reader(f"s3://{BUCKET}/probe"))
            assert torch.equal(back["x"], probe["x"])
        except Exception as e:
            print(f"s3torchconnector: CANNOT TALK TO MOTO — {type(e).__name__}: {e}")
            return
        print("s3torchconnector: installed and talking to moto "
              "(AWS_ENDPOINT_URL + force_path_style)")

        # (a) throughput
        manager = CheckpointManager(s3_root(endpoint, tmp / "tp"), rank=0, world_size=1,
                                    attempt=0, keep_last=1)
        rows: list[tuple[float, float, float, float]] = []
        for r in range(args.rounds):
            position = Position(r + 1)
            uri = f"s3://{BUCKET}/tc/{position.name}"

            def tc_save(uri: str = uri) -> None:
                dcp.save(state, storage_writer=tc_writer(uri))

            def tc_load(uri: str = uri) -> None:
                out = zeros_like_state(state)
                dcp.load(out, storage_reader=tc_reader(uri))
                assert torch.equal(out["g0.t00"], state["g0.t00"])

            def rq_save(position: Position = position) -> None:
                manager.save(position, state, {"step": 0})

            def rq_load(position: Position = position) -> None:
                name = manager.newest()
                assert name == position.name
                loaded = manager.load(name, lambda _: zeros_like_state(state))
                assert torch.equal(loaded.tensors["g0.t00"], state["g0.t00"])

            if r % 2 == 0:
                ts, rs, tl, rl = timed(tc_save), timed(rq_save), timed(tc_load), timed(rq_load)
            else:
                rs, ts, rl, tl = timed(rq_save), timed(tc_save), timed(rq_load), timed(tc_load)
            rows.append((ts, rs, tl, rl))
            delete_prefix(client, f"tc/{position.name}/")
            print(f"  round {r + 1}: save tc {ts:.2f}s rq {rs:.2f}s; "
                  f"load tc {tl:.2f}s rq {rl:.2f}s")
        med = [statistics.median(x[i] for x in rows) for i in range(4)]
        save_ratio = statistics.median(x[1] / x[0] for x in rows)
        load_ratio = statistics.median(x[3] / x[2] for x in rows)
        print(f"(a) throughput, median of {args.rounds} rounds, {total_mb:.0f} MB "
              "(ratio = resumequal time / s3torchconnector time; >1: resumequal slower):")
        print(f"  save: S3StorageWriter {total_mb / med[0]:7.1f} MB/s   resumequal save "
              f"{total_mb / med[1]:7.1f} MB/s   ratio {save_ratio:.2f}")
        print(f"  load: S3StorageReader {total_mb / med[2]:7.1f} MB/s   resumequal resume "
              f"{total_mb / med[3]:7.1f} MB/s   ratio {load_ratio:.2f}")

        kill_table(args, endpoint, client, tmp)


def kill_table(args: argparse.Namespace, endpoint: str, client: Any, tmp: Path) -> None:
    """(b): kill each design mid-save; what is in the bucket and what each reader does."""
    print(f"(b) correctness under SIGKILL mid-save ({args.kill_mb} MB state, "
          f"S3StorageWriter thread_count={THREADS}):")
    old, new = make_state(args.kill_mb, seed=1), make_state(args.kill_mb, seed=2)
    rows: list[tuple[str, str, str, str, str]] = []

    def shards(objs: dict[str, tuple[int, str]]) -> list[str]:
        return [k for k in objs if k.endswith(".distcp")]

    # s3torchconnector, fresh prefix: kill once some shard objects exist.
    base = ["--kill-mb", str(args.kill_mb), "--endpoint", endpoint]
    prefix = "kill/tc-fresh/"
    what = run_and_kill([*base, "--child", "tc", "--seed", "2", "--uri",
                         f"s3://{BUCKET}/{prefix}"], client, prefix,
                        lambda o: len(shards(o)) >= 1)
    objs = listing(client, prefix)
    verdict, _ = try_tc_load(f"s3://{BUCKET}/{prefix}", new)
    rows.append(("tc", "fresh prefix", what, describe(objs), verdict))

    # s3torchconnector, overwrite in place: a complete old save, then a new one killed
    # once some (not all) shard objects have been replaced.
    prefix = "kill/tc-overwrite/"
    dcp.save(old, storage_writer=tc_writer(f"s3://{BUCKET}/{prefix}", THREADS))
    before = listing(client, prefix)

    def replaced(o: dict[str, tuple[int, str]]) -> bool:
        changed = [k for k in shards(before) if k in o and o[k][1] != before[k][1]]
        return len(changed) >= 1
    what = run_and_kill([*base, "--child", "tc", "--seed", "2", "--uri",
                         f"s3://{BUCKET}/{prefix}"], client, prefix, replaced)
    objs = listing(client, prefix)
    changed = sorted(k for k in objs if k in before and objs[k][1] != before[k][1])
    verdict, loaded = try_tc_load(f"s3://{BUCKET}/{prefix}", old)
    if loaded:
        verdict += f" ({compare(loaded, old, new)})"
    rows.append(("tc", "overwrite in place", what,
                 f"{describe(objs)}; replaced: {', '.join(changed) or 'none'}", verdict))

    # s3torchconnector, one flipped byte in a shard of a complete checkpoint.
    key = f"{prefix}{sorted(shards(objs))[0]}"
    dcp.save(old, storage_writer=tc_writer(f"s3://{BUCKET}/{prefix}", THREADS))
    flip(client, key)
    verdict, loaded = try_tc_load(f"s3://{BUCKET}/{prefix}", old)
    if loaded:
        verdict += f" ({compare(loaded, old, new)})"
    rows.append(("tc", "1 byte flipped", "-", key, verdict))
    delete_prefix(client, "kill/")

    # resumequal: committed step 1 (old), then a save of step 2 (new) killed mid-upload.
    run_dir = tmp / "rq-kill"
    manager = CheckpointManager(s3_root(endpoint, run_dir), rank=0, world_size=1, attempt=2,
                                keep_last=5)
    manager.save(Position(1), old, {"step": 1})
    root_uri = manager.root.uri()
    root_prefix = root_uri.removeprefix(f"s3://{BUCKET}/")
    rq_prefix = f"{root_prefix}/step-00000002/"
    what = run_and_kill([*base, "--child", "rq", "--seed", "2", "--run-dir", str(run_dir)],
                        client, rq_prefix, lambda o: any(k.endswith(".distcp") for k in o))
    objs = listing(client, rq_prefix)
    verdict, loaded = try_rq_load(manager, old)
    if loaded:
        verdict += f" ({compare(loaded, old, new)})"
    rows.append(("rq", "new step, killed in upload", what, describe(objs), verdict))

    # resumequal, one flipped byte in a shard of the committed checkpoint.
    step1 = listing(client, f"{root_prefix}/step-00000001/")
    key = f"{root_prefix}/step-00000001/" + sorted(k for k in step1 if k.endswith(".distcp"))[0]
    flip(client, key)
    verdict, loaded = try_rq_load(manager, old)
    if loaded:
        verdict += f" ({compare(loaded, old, new)})"
    rows.append(("rq", "1 byte flipped", "-", key.split("/", 3)[-1], verdict))

    names = {"tc": "s3torchconnector", "rq": "resumequal"}
    for who, case, what, objs_text, verdict in rows:
        print(f"  [{names[who]}] {case}: {what}")
        print(f"      in bucket: {objs_text}")
        print(f"      reader:    {verdict}")


def flip(client: Any, key: str) -> None:
    """Flip one byte in the middle of an object, keeping its size."""
    body = bytearray(client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    client.put_object(Bucket=BUCKET, Key=key, Body=bytes(body))


if __name__ == "__main__":
    main()

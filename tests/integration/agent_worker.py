"""A worker for ``tests/integration/test_agent.py``, run with ``-m``: it records what it
finds at its start (its parent, what was loaded before it ran, its environment and argv),
joins its group, and plays out the failure its arguments ask of its attempt. What it
registered to run at exit leaves a file when it runs; what its failure holds, when it is
torn down."""

from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import sys
import threading
import time
from pathlib import Path

# Before this module imports anything of its own: what its process had loaded already.
LOADED = {name: name in sys.modules
          for name in ("torch", "torch.distributed.checkpoint", "torch._dynamo",
                       "resumequal.train.worker")}


class _Held:
    """Stands for a failed attempt's training state: leaves ``path`` when torn down."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __del__(self) -> None:
        self.path.write_text("torn down")


def main() -> None:
    out = Path(sys.argv[1])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = int(os.environ["RANK"])
    what = sys.argv[2]
    # "kill": each worker of the attempt that is cut starts a child, as a DataLoader starts
    # its workers (its default start method, a daemon), which outlives its parent's death.
    child = None
    if attempt == 0 and what == "kill":
        child = multiprocessing.Process(target=time.sleep, args=(600,), daemon=True)
        child.start()
    record = {"attempt": attempt, "rank": rank, "pid": os.getpid(), "ppid": os.getppid(),
              "loaded": LOADED, "argv": sys.argv,
              "start_method": multiprocessing.get_start_method(),
              "own_session": os.getsid(0) == os.getpid(),
              "child": child.pid if child is not None else None,
              "env": {k: os.environ.get(k) for k in (
                  "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "PYTHONUNBUFFERED",
                  "AGENT_TEST_MARK", "TORCHINDUCTOR_CACHE_DIR")}}
    (out / f"attempt-{attempt}-rank-{rank}.json").write_text(json.dumps(record))
    atexit.register((out / f"atexit-{attempt}-{rank}").write_text, "ran")
    import torch.distributed as dist

    from resumequal.train.distributed import init_process_group

    # A per-attempt group, as a leg joins it: the agent's store outlives an attempt.
    init_process_group("gloo", 60)
    # "ok", "exit 3" or "raise" (rank 1 of attempt 0), "kill" (the test kills it)
    if attempt == 0 and rank == 1 and what == "exit 3":
        sys.exit(3)
    if attempt == 0 and rank == 1 and what == "raise":
        held = _Held(out / f"torn-down-{attempt}-{rank}")  # noqa: F841 (held by the frame)
        raise RuntimeError("a collective failed")
    if attempt == 0 and rank == 1 and what == "kill":
        (out / "pid").write_text(str(os.getpid()))
        time.sleep(120)
    dist.barrier()
    dist.destroy_process_group()
    if what == "ok":
        _leave_work_for_the_exit(out / f"late-{attempt}-{rank}")


# A file this module opened and never closed: the interpreter's end flushes it.
_UNCLOSED: list[object] = []


def _leave_work_for_the_exit(path: Path) -> None:
    """What ``python -m`` finishes at its end: a non-daemon thread's last write (joined
    before the exit functions run), and a buffered file never closed."""
    unclosed = open(f"{path}.unclosed", "w")  # noqa: SIM115 (never closed, on purpose)
    unclosed.write("8 bytes!")
    _UNCLOSED.append(unclosed)

    def late() -> None:
        time.sleep(0.5)
        path.with_suffix(".thread").write_text("done")

    threading.Thread(target=late).start()
    atexit.register(lambda: path.with_suffix(".atexit").write_text(
        "after the thread" if path.with_suffix(".thread").exists() else "before the thread"))


if __name__ == "__main__":
    main()

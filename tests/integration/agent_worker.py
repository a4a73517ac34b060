"""A worker for ``tests/integration/test_agent.py``, run with ``-m``: it records what it
finds at its start (its parent, what was loaded before it ran, its environment and argv),
joins its group, and plays out the failure its arguments ask of its attempt. What it
registered to run at exit leaves a file when it runs; what its failure holds, when it is
torn down."""

from __future__ import annotations

import atexit
import json
import os
import sys
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
    record = {"attempt": attempt, "rank": rank, "pid": os.getpid(), "ppid": os.getppid(),
              "loaded": LOADED, "argv": sys.argv,
              "env": {k: os.environ.get(k) for k in (
                  "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "PYTHONUNBUFFERED",
                  "AGENT_TEST_MARK")}}
    (out / f"attempt-{attempt}-rank-{rank}.json").write_text(json.dumps(record))
    atexit.register((out / f"atexit-{attempt}-{rank}").write_text, "ran")
    import torch.distributed as dist

    from resumequal.train.distributed import init_process_group

    # A per-attempt group, as a leg joins it: the agent's store outlives an attempt.
    init_process_group("gloo", 60)
    # "ok", "exit 3" or "raise" (rank 1 of attempt 0), "kill" (the test kills it)
    what = sys.argv[2]
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


if __name__ == "__main__":
    main()

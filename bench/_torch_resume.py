"""The same resume with torch alone: the floor under a leg's restart in
``bench/restart_latency.py``.

What a leg of the default spec does to resume, written as a torch user would without
resumequal: a decoder-only transformer of tiny-gpt's size (vocab 256, width 128, 2 layers,
4 heads, sequence 64) under DDP on gloo, AdamW on its single-tensor path, deterministic
algorithms, gradient clipping, 3 microbatches of 8 per step, checkpointed with DCP through
``torch.distributed.checkpoint.state_dict``. No spec, no trace, no verification or
signature of the checkpoint, no beacon: what is left is what torch itself loads and runs.

Run under torchrun with 2 ranks and ``--max-restarts 1``. Attempt 0 takes one step, saves
the checkpoint, then rank 1 publishes its pid in ``OUT/pid-rank-1.json`` and sleeps until
it is killed while rank 0 waits in an all-reduce. Attempt 1 joins a group namespaced by
the attempt (as ``resumequal.train.distributed`` does), builds, restores and takes one
step, recording when each ended in ``OUT/attempt-1-rank-R.json``.

    torchrun --nproc-per-node 2 --max-restarts 1 bench/_torch_resume.py --out DIR
"""

from __future__ import annotations

import time

STARTED_AT = time.time()  # before any import that takes time

import argparse  # noqa: E402
import os  # noqa: E402
from contextlib import nullcontext  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

from _bare_restart import HOLD_SECONDS, join_group, process_started_at, publish  # noqa: E402

VOCAB, WIDTH, LAYERS, HEADS, SEQ = 256, 128, 2, 4, 64
MICROBATCHES, MICROBATCH = 3, 8


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Embedding(SEQ, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.1,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1]))
        return self.head(self.blocks(x, mask=self.mask, is_causal=True))


def step(model: DDP, optimizer: torch.optim.Optimizer, generator: torch.Generator) -> None:
    """One optimizer step over MICROBATCHES microbatches (gradients synchronised on the
    last), clipped as a leg clips them."""
    for micro in range(MICROBATCHES):
        tokens = torch.randint(VOCAB, (MICROBATCH, SEQ + 1), generator=generator)
        last = micro == MICROBATCHES - 1
        with nullcontext() if last else model.no_sync():
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            (loss / MICROBATCHES).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    out: Path = parser.parse_args().out

    rank, attempt = join_group("torch")
    joined_at = time.time()

    torch.use_deterministic_algorithms(True)
    torch.manual_seed(1234)
    model = DDP(TinyGPT())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    generator = torch.Generator().manual_seed(1234 + rank)
    built_at = time.time()
    checkpoint = out / "checkpoint"

    if attempt == 0:
        step(model, optimizer, generator)
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=checkpoint)
        if rank == 1:
            publish(out / "pid-rank-1.json", {"pid": os.getpid()})
            time.sleep(HOLD_SECONDS)
            raise SystemExit(f"rank 1 was not killed within {HOLD_SECONDS}s")
        dist.all_reduce(torch.ones(1))  # fails when rank 1 dies
        return

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=checkpoint)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    restored_at = time.time()
    step(model, optimizer, generator)
    first_step_at = time.time()
    publish(out / f"attempt-{attempt}-rank-{rank}.json", {
        "rank": rank, "attempt": attempt, "pid": os.getpid(),
        "process_started_at": process_started_at(), "started_at": STARTED_AT,
        "joined_at": joined_at, "built_at": built_at, "restored_at": restored_at,
        "first_step_at": first_step_at,
    })
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

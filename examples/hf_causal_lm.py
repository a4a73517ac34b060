"""Qualifying your own model: a Hugging Face causal LM fed by a StatefulDataLoader.

A workload factory, named in the spec as ``workload.name: "hf_causal_lm:build"`` (with this
folder on ``PYTHONPATH``; see ``hf_causal_lm.yaml`` beside it). It builds a small GPT-2
from a config (random initial weights: nothing is downloaded), tokenises synthetic text
with a word-level ``tokenizers`` tokenizer it builds itself, and loads it through
torchdata's ``StatefulDataLoader`` with a ``DistributedSampler`` and worker processes,
the way a training script would. resumequal does the rest: DDP, accumulation, the
checkpoint (model, optimizer, scheduler, RNGs, the loader's ``state_dict`` per rank),
the kill, the resume and the comparison.

What makes it resumable, and what resumequal checks:

- every rank builds the model after resumequal seeded the RNGs, so the initial weights
  agree; dropout draws from the global torch RNG, which is checkpointed;
- each sample is a pure function of ``(seed, sample_id)`` and carries its id under
  ``"sample_id"``, which is what the ``inputs`` boundary compares;
- the loader is built with ``ctx.loader`` (``workload.loader`` in the spec): workers,
  prefetch, persistent workers.

Needs ``pip install 'resumequal[hf]'`` (transformers, torchdata).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.utils.data import Dataset, DistributedSampler

from resumequal.workloads.base import Microbatch, Workload, WorkloadContext, parse_params
from resumequal.workloads.loader import loader_options
from resumequal.workloads.optim import build_optimizer, build_scheduler
from resumequal.workloads.stream import sample_generator

# The tokenizer runs in the loader's worker processes, which are forked: its own thread
# pool must not have started in the parent. Never reach for the Hub.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast  # noqa: E402

SPECIALS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]
ARTICLES = ["the", "a", "every", "some"]
ADJECTIVES = ["small", "quick", "grey", "quiet", "bright", "old", "warm", "tired"]
NOUNS = ["cat", "dog", "bird", "fox", "node", "pod", "worker", "checkpoint"]
VERBS = ["sees", "follows", "restarts", "resumes", "loads", "saves", "finds", "waits"]
WORDS = SPECIALS + ARTICLES + ADJECTIVES + NOUNS + VERBS + ["and", "."]


class Params(BaseModel):
    """``workload.params`` of this example."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n_layer: int = Field(default=2, ge=1)
    n_embd: int = Field(default=64, ge=8)
    n_head: int = Field(default=4, ge=1)
    seq_len: int = Field(default=32, ge=4)
    dropout: float = Field(default=0.1, ge=0, lt=1)
    num_samples: int = Field(default=2048, ge=1)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the synthetic vocabulary (built here, not downloaded)."""
    vocab = {word: i for i, word in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]",
                                   unk_token="[UNK]", bos_token="[BOS]", eos_token="[EOS]")


class SyntheticText(Dataset[dict[str, Any]]):
    """Sample ``i``: sentences from a small grammar, drawn from a generator seeded by
    ``(seed, i)`` and tokenised to ``seq_len`` tokens. Labels ignore the padding."""

    def __init__(self, num_samples: int, seq_len: int, seed: int) -> None:
        self.num_samples = num_samples
        self.seq_len = seq_len
        self.seed = seed
        self.tokenizer = build_tokenizer()

    def __len__(self) -> int:
        return self.num_samples

    def text(self, index: int) -> str:
        g = sample_generator(self.seed, index)

        def pick(words: list[str]) -> str:
            return words[int(torch.randint(len(words), (), generator=g))]

        sentences = []
        for _ in range(1 + int(torch.randint(4, (), generator=g))):
            sentences.append(f"{pick(ARTICLES)} {pick(ADJECTIVES)} {pick(NOUNS)} "
                             f"{pick(VERBS)} {pick(ARTICLES)} {pick(NOUNS)} .")
        return "[BOS] " + " and ".join(sentences) + " [EOS]"

    def __getitem__(self, index: int) -> dict[str, Any]:
        enc = self.tokenizer(self.text(index), padding="max_length", truncation=True,
                             max_length=self.seq_len, return_tensors="pt")
        input_ids = enc["input_ids"][0]
        attention_mask = enc["attention_mask"][0]
        labels = input_ids.masked_fill(attention_mask == 0, -100)
        return {"sample_id": index, "input_ids": input_ids,
                "attention_mask": attention_mask, "labels": labels}


def loss_fn(model: nn.Module, microbatch: Microbatch) -> torch.Tensor:
    """The model's own causal-LM loss (``labels`` are shifted inside the model)."""
    device = next(model.parameters()).device
    out = model(**{k: v.to(device) for k, v in microbatch.data.items()})
    loss: torch.Tensor = out.loss
    return loss


def build(ctx: WorkloadContext) -> Workload:
    """The factory resumequal calls on every rank."""
    params = parse_params(Params, ctx.params)
    training = ctx.training
    tokenizer = build_tokenizer()
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=params.seq_len, n_embd=params.n_embd,
        n_layer=params.n_layer, n_head=params.n_head, resid_pdrop=params.dropout,
        embd_pdrop=params.dropout, attn_pdrop=params.dropout,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # One attention code path everywhere: the eager one.
    config._attn_implementation = "eager"
    model = GPT2LMHeadModel(config).to(ctx.device)
    optimizer = build_optimizer(model.parameters(), training.optimizer)

    dataset = SyntheticText(params.num_samples, params.seq_len, training.seed)
    sampler: DistributedSampler[int] = DistributedSampler(
        dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True,
        seed=training.seed, drop_last=True)
    options = loader_options(ctx.loader) if ctx.loader is not None else {}
    loader = StatefulDataLoader(dataset, batch_size=training.microbatch_size, sampler=sampler,
                                drop_last=True, **options)
    return Workload(
        model=model,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, training.schedule, training.steps),
        dataset=loader,
        loss_fn=loss_fn,
        description={
            "name": "hf-gpt2",
            "params": params.model_dump(),
            "parameters": sum(p.numel() for p in model.parameters()),
        },
    )

"""tiny-gpt: a small decoder-only transformer language model on a synthetic Markov chain.

The token source is a fixed random Markov chain over the vocabulary (each token has a few
likely successors), drawn from the dataset seed. Sample ``i`` is a walk of ``seq_len + 1``
tokens whose start and steps come from a generator seeded by (seed, i), so it is a pure
function of the two. Its randomness during training is dropout.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from resumequal.workloads.base import Microbatch, Workload, WorkloadContext, parse_params
from resumequal.workloads.builtin import builtin_workload
from resumequal.workloads.stream import Sample, sample_generator

# How likely each of a token's successors is: low entropy, so the loss visibly falls.
_SUCCESSOR_PROBS = (0.55, 0.25, 0.12, 0.08)


class TinyGPTParams(BaseModel):
    """Parameters of ``tiny-gpt`` (``workload.params``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(default=256, ge=2)
    d_model: int = Field(default=128, ge=1)
    n_layers: int = Field(default=2, ge=1)
    n_heads: int = Field(default=4, ge=1)
    seq_len: int = Field(default=64, ge=1)
    dropout: float = Field(default=0.1, ge=0, lt=1)
    num_samples: int = Field(default=8192, ge=1)

    @model_validator(mode="after")
    def _heads_divide_width(self) -> TinyGPTParams:
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}"
            )
        return self


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, written out so one code path runs everywhere."""

    def __init__(self, p: TinyGPTParams) -> None:
        super().__init__()
        self.n_heads = p.n_heads
        self.qkv = nn.Linear(p.d_model, 3 * p.d_model)
        self.proj = nn.Linear(p.d_model, p.d_model)
        self.attn_dropout = nn.Dropout(p.dropout)
        self.resid_dropout = nn.Dropout(p.dropout)
        mask = torch.ones(p.seq_len, p.seq_len, dtype=torch.bool).tril()
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        mask: torch.Tensor = self.causal_mask  # type: ignore[assignment]
        scores = scores.masked_fill(~mask[:t, :t], float("-inf"))
        att = self.attn_dropout(scores.softmax(dim=-1))
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        out: torch.Tensor = self.resid_dropout(self.proj(y))
        return out


class Block(nn.Module):
    """Pre-LayerNorm transformer block: attention, then a GELU MLP."""

    def __init__(self, p: TinyGPTParams) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(p.d_model)
        self.attn = CausalSelfAttention(p)
        self.ln2 = nn.LayerNorm(p.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(p.d_model, 4 * p.d_model), nn.GELU(),
            nn.Linear(4 * p.d_model, p.d_model), nn.Dropout(p.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class TinyGPT(nn.Module):
    """Token and position embeddings, ``n_layers`` blocks, final LayerNorm, LM head."""

    def __init__(self, p: TinyGPTParams) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(p.vocab_size, p.d_model)
        self.pos_emb = nn.Embedding(p.seq_len, p.d_model)
        self.dropout = nn.Dropout(p.dropout)
        self.blocks = nn.ModuleList(Block(p) for _ in range(p.n_layers))
        self.ln_f = nn.LayerNorm(p.d_model)
        self.head = nn.Linear(p.d_model, p.vocab_size)
        self.apply(_init_weights)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.size(1), device=tokens.device)
        x = self.dropout(self.tok_emb(tokens) + self.pos_emb(positions))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.ln_f(x))
        return logits


def _init_weights(module: nn.Module) -> None:
    # GPT-2 style: small normal weights keep the first steps' loss near log(vocab).
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


class MarkovTokens:
    """Builds sample ``i``: (inputs, targets) from a walk of ``seq_len + 1`` tokens."""

    def __init__(self, params: TinyGPTParams, seed: int) -> None:
        self.params = params
        self.seed = seed
        chain = torch.Generator().manual_seed(seed)
        successors = torch.randint(
            params.vocab_size, (params.vocab_size, len(_SUCCESSOR_PROBS)), generator=chain
        )
        self.successors: list[list[int]] = successors.tolist()
        self.probs = torch.tensor(_SUCCESSOR_PROBS)

    def __call__(self, sample_id: int) -> Sample:
        g = sample_generator(self.seed, sample_id)
        token = int(torch.randint(self.params.vocab_size, (), generator=g))
        choices = torch.multinomial(self.probs, self.params.seq_len, replacement=True, generator=g)
        walk = [token]
        for choice in choices.tolist():
            token = self.successors[token][choice]
            walk.append(token)
        tokens = torch.tensor(walk)
        return tokens[:-1], tokens[1:]

    def blank(self) -> Sample:
        """A fixed sample for synthetic microbatches."""
        tokens = torch.arange(self.params.seq_len + 1) % self.params.vocab_size
        return tokens[:-1], tokens[1:]


def loss_fn(model: nn.Module, microbatch: Microbatch) -> torch.Tensor:
    """Mean next-token cross entropy over every position of the microbatch."""
    device = next(model.parameters()).device
    inputs, targets = (t.to(device) for t in microbatch.data)
    logits = model(inputs)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def build(ctx: WorkloadContext) -> Workload:
    """The ``tiny-gpt`` reference workload."""
    params = parse_params(TinyGPTParams, ctx.params)
    return builtin_workload("tiny-gpt", ctx, params, num_samples=params.num_samples,
                            model=TinyGPT(params).to(ctx.device),
                            samples=MarkovTokens(params, ctx.training.seed), loss_fn=loss_fn)

"""A workload whose resume depends on the process: data cursors saved in ``set`` order.

``dropout-mlp`` fed from several named sources, each a :class:`ShardedStream` with its own
permutation. Microbatches come from the sources in a fixed (sorted) order, so training is
the same in every process. But the data state is saved positionally, one cursor per
source in the iteration order of a ``set`` of the source names, and restored into the
sources in the set order of the process that loads it: a plausible user bug. A set of
strings iterates in an order that depends on the process's str-hash secret, which every
fresh interpreter draws anew (unless ``PYTHONHASHSEED`` is set). A resumed process that is
fresh gives each source another source's cursor, so the inputs of the first step after
the resume differ; a process forked from the one that saved keeps its secret, and the
same bug resumes exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from resumequal.workloads import dropout_mlp
from resumequal.workloads.base import Microbatch, Workload, WorkloadContext, parse_params
from resumequal.workloads.dropout_mlp import DropoutMLPParams, GaussianClasses
from resumequal.workloads.stream import ShardedStream

# Eight sources: two fresh processes order a set of eight strings alike about once in
# tens of thousands of draws.
SOURCES = ("books", "code", "forums", "math", "news", "papers", "web", "wiki")


class SetOrderSources:
    """Round-robin over named streams; its state is a list in ``set`` order (the bug)."""

    def __init__(self, streams: dict[str, ShardedStream]) -> None:
        self.streams = streams
        self.names = set(streams)  # the bug: a set's order is the process's
        self.order = sorted(streams)  # what training reads: the same in every process
        self.turn = 0

    def next_microbatch(self) -> Microbatch:
        name = self.order[self.turn % len(self.order)]
        self.turn += 1
        return self.streams[name].next_microbatch()

    def synthetic_microbatch(self) -> Microbatch:
        return self.streams[self.order[0]].synthetic_microbatch()

    def state_dict(self) -> dict[str, Any]:
        return {"turn": self.turn,
                "cursors": [self.streams[name].state_dict() for name in self.names]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.turn = state["turn"]
        for name, cursor in zip(self.names, state["cursors"], strict=True):
            self.streams[name].load_state_dict(cursor)


def build(ctx: WorkloadContext) -> Workload:
    """``dropout-mlp`` fed by :class:`SetOrderSources`, one stream per name in SOURCES."""
    base = dropout_mlp.build(ctx)
    params = parse_params(DropoutMLPParams, ctx.params)
    t = ctx.training
    samples = GaussianClasses(params, t.seed)
    streams = {
        name: ShardedStream(num_samples=params.num_samples, microbatch_size=t.microbatch_size,
                            rank=ctx.rank, world_size=ctx.world_size, seed=t.seed + 1000 * i,
                            make_sample=samples, blank_sample=samples.blank)
        for i, name in enumerate(SOURCES)
    }
    return dataclasses.replace(base, dataset=SetOrderSources(streams),
                               description={**base.description, "name": "set-order-sources"})

"""Unit tests for a resize's pieces: the spec's rules, which controls apply, where a rank's
microbatches come from at any world size, and samples by global position."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from resumequal.qualify.plan import qualification_plan
from resumequal.spec import SpecError, parse_spec
from resumequal.train.globaldata import GlobalData, microbatch_seed
from resumequal.workloads.stream import ShardedStream

TOLERANCES = {"loss": 1e-4, "grad_norm": 1e-4, "params": 1e-4}


def _resize(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "world": {"nnodes": 2, "nprocPerNode": 1},
        "preemption": {"target": "pod", "resize": {"toNodes": 1, "growAfterStep": 8}},
        "comparison": {"mode": "tolerance", "tolerances": dict(TOLERANCES)},
    }
    for path, value in changes.items():
        node = data
        *parents, last = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return data


def _error(data: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return str(info.value)


def test_a_resize_spec_validates_and_counts_its_global_microbatches() -> None:
    spec = parse_spec(_resize())
    assert spec.preemption.resize is not None
    assert spec.preemption.resize.grow_after_step == 8
    assert spec.global_microbatches == 3 * 2


@pytest.mark.parametrize(("changes", "words"), [
    ({"preemption.target": "process"}, "needs preemption.target: pod and mode: hard"),
    ({"preemption.mode": "graceful"}, "needs preemption.target: pod and mode: hard"),
    ({"preemption.resize": {"toNodes": 2}}, "toNodes=2: a kill takes one node"),
    ({"world.nnodes": 3, "preemption.resize": {"toNodes": 2}},
     "9 microbatches (training.accumulationSteps x world size) do not divide among 2"),
    ({"preemption.resize": {"toNodes": 1, "growAfterStep": 5}},
     "growAfterStep=5 must be from preemption.step=6"),
    ({"preemption.resize": {"toNodes": 1, "growAfterStep": 12}},
     "growAfterStep=12 must be from preemption.step=6 to training.steps-1=11"),
    ({"preemption.resize": {"toNodes": 1, "growAfterStep": 9}},
     "no checkpoint is saved after step 9"),
    ({"comparison": {"mode": "exact"}}, "needs comparison.mode: tolerance"),
    ({"comparison": {"mode": "tolerance", "tolerances": {"loss": 1e-3}}},
     "missing: grad_norm, params"),
    ({"workload.loader": {"workers": 0}}, "remove workload.loader"),
    ({"matrix.seeds": [1, 2]}, "remove matrix.seeds"),
])
def test_a_resize_that_cannot_work_is_refused_naming_why(changes: dict[str, Any],
                                                         words: str) -> None:
    assert words in _error(_resize(**changes))


def test_the_digest_tells_a_resize_run_from_a_plain_one() -> None:
    resized = parse_spec(_resize())
    plain = parse_spec({**_resize(), "preemption": {"target": "pod"}})
    assert resized.digest() != plain.digest()


def test_the_rank_keyed_controls_run_only_with_a_resize() -> None:
    plain = qualification_plan(parse_spec({}))
    not_run = {n.omission: n.evidence for n in plain.not_run}
    assert "rank_cursor" in not_run and "rank_rng" in not_run
    assert "preemption.resize is not set" in not_run["rank_rng"]

    resized = qualification_plan(parse_spec(_resize()))
    run = {p.omit[0] for p in resized.negative_controls}
    assert {"rank_cursor", "rank_rng", "scheduler", "optimizer"} <= run
    skipped = {n.omission for n in resized.not_run}
    assert {"rng", "data_cursor", "pending_grads"} <= skipped
    assert not run & skipped


def _data(world: int, rank: int, **kw: bool) -> GlobalData:
    return GlobalData(global_microbatches=6, spec_world_size=2, world_size=world, rank=rank,
                      microbatch_size=4, seed=7, **kw)


@pytest.mark.parametrize("world", [1, 2, 3, 6])
def test_every_world_runs_each_global_microbatch_of_a_step_once(world: int) -> None:
    ranks = [_data(world, r) for r in range(world)]
    indexes = sorted(d.slot(m).index for d in ranks for m in range(d.microsteps))
    assert indexes == list(range(6))
    assert all(d.microsteps == 6 // world for d in ranks)


def test_a_slot_reads_its_own_samples_and_streams_unless_keyed_by_rank() -> None:
    plain = _data(1, 0).slot(3)
    assert (plain.index, plain.data_index, plain.rng_index) == (3, 3, 3)
    cursor = _data(1, 0, rank_cursor=True).slot(3)
    assert (cursor.index, cursor.data_index, cursor.rng_index) == (3, 6, 3)
    rng = _data(1, 0, rank_rng=True).slot(3)
    assert (rng.index, rng.data_index, rng.rng_index) == (3, 3, 6)
    # In the world the spec names, keyed by rank is keyed by position: nothing differs.
    for m in range(3):
        keyed = _data(2, 1, rank_cursor=True, rank_rng=True).slot(m)
        assert keyed.index == keyed.data_index == keyed.rng_index


def test_positions_follow_steps_and_microbatches() -> None:
    d = _data(2, 0)
    assert d.position(1, 0) == 0
    assert d.position(1, 5) == 20
    assert d.position(2, 0) == 24
    seeds = {d.seed_of(s, j) for s in (1, 2) for j in range(6)}
    assert len(seeds) == 12
    assert microbatch_seed(7, 1, 0) == d.seed_of(1, 0)
    assert all(0 <= s < 2**63 for s in seeds)


def _stream(rank: int = 0, world: int = 1) -> ShardedStream:
    return ShardedStream(num_samples=10, microbatch_size=2, rank=rank, world_size=world,
                         seed=3, make_sample=lambda i: (torch.tensor([float(i)]),),
                         blank_sample=lambda: (torch.tensor([0.0]),))


def test_samples_by_global_position_walk_the_epoch_permutations() -> None:
    stream = _stream()
    first = [i for p in range(0, 10, 2) for i in stream.microbatch_at(p, 2).sample_ids]
    assert sorted(first) == list(range(10))  # one epoch: every id once
    again = [i for p in range(10, 20, 2) for i in stream.microbatch_at(p, 2).sample_ids]
    assert sorted(again) == list(range(10)) and again != first  # the next epoch, reshuffled
    across = stream.microbatch_at(9, 2).sample_ids
    assert across == [first[-1], again[0]]
    mb = stream.microbatch_at(4, 2)
    assert [float(x) for x in mb.data[0].flatten()] == [float(i) for i in mb.sample_ids]


def test_samples_by_position_are_the_same_on_every_rank_and_move_no_cursor() -> None:
    a, b = _stream(0, 2), _stream(1, 2)
    before = a.state_dict()
    assert a.microbatch_at(6, 3).sample_ids == b.microbatch_at(6, 3).sample_ids
    assert a.state_dict() == before
    # The epoch permutation is the one the per-rank shards are cut from.
    shards = a.next_sample_ids() + b.next_sample_ids()
    assert set(shards) <= set(a.microbatch_at(0, 10).sample_ids)
    with pytest.raises(ValueError, match="no microbatch"):
        a.microbatch_at(-1, 2)

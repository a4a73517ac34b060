"""Unit tests for the StatefulDataLoader path: the plain-value codec, LoaderStream (in the
training process: no workers here, the integration tier runs them), its state round trip
through a rank state, the loader_state omission, load_workload's checks and the plan."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from resumequal.errors import CheckpointError, TrainingError
from resumequal.qualify.plan import qualification_plan
from resumequal.spec import (
    LoaderSpec,
    QualificationSpec,
    TrainingSpec,
    WorkloadSpec,
    apply_overrides,
)
from resumequal.train.state import LiveState, RankState, rank_state, restore, tensor_state
from resumequal.workloads import Workload, WorkloadContext, load_workload
from resumequal.workloads.loader import LoaderStream, SampleDataset, split_batch
from resumequal.workloads.plainstate import decode, encode

INLINE = LoaderSpec(workers=0)  # no processes in the unit tier


# --- the codec ---------------------------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def test_a_state_dict_round_trips_through_json() -> None:
    state = {
        "samples_yielded": 6, "flag": True, "none": None, "lr": 0.1, "name": "x",
        "tuple": (1, (2, 3), [4]), "int_keys": {0: "a", 1: "b"}, "$odd": {"$tensor": 1},
        "bytes": b"\x00\xff", "nan": float("nan"), "inf": -math.inf,
        "generator": torch.Generator().manual_seed(3).get_state(),
        "bf16": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
        "empty": torch.empty(0, 4, dtype=torch.int64), "scalar": torch.tensor(2.5),
        "strided": torch.arange(12).reshape(3, 4).t(),
        "array": np.arange(5, dtype=np.uint32), "np_int": np.int64(7),
    }
    text = json.dumps(encode(state), allow_nan=False)
    back = decode(json.loads(text))
    expected = {**state, "np_int": 7}
    assert _same(back, expected)


@pytest.mark.parametrize(("value", "named"), [
    ({"a": [1, object()]}, r"state\.a\[1\]: a builtins\.object cannot be stored"),
    ({"f": len}, r"state\.f: a builtins\.builtin_function_or_method"),
    ({"t": torch.zeros(2, dtype=torch.complex64)}, "dtype complex64 cannot be stored"),
    ({"a": np.array(["x"])}, "NumPy array of dtype <U1 cannot be stored"),
])
def test_what_json_cannot_hold_is_refused_naming_its_path(value: Any, named: str) -> None:
    with pytest.raises(TypeError, match=named):
        encode(value)


@pytest.mark.parametrize("bad", [
    {"$pickle": "gASV"}, {"$tensor": {"dtype": "object", "shape": [1], "data": ""}},
    {"$tuple": [1], "extra": 2}, {"$ndarray": {"dtype": "O", "shape": [1], "data": ""}},
])
def test_a_bad_tag_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"state\.x: "):
        decode({"x": bad})


# --- batches and the stream ---------------------------------------------------------------------


def test_a_batch_carries_its_ids_first_or_under_sample_id() -> None:
    mb = split_batch((torch.tensor([4, 2]), torch.ones(2, 3), torch.zeros(2)))
    assert mb.sample_ids == [4, 2] and len(mb.data) == 2
    mb = split_batch({"sample_id": torch.tensor([7]), "input_ids": torch.ones(1, 5)})
    assert mb.sample_ids == [7] and list(mb.data) == ["input_ids"]
    with pytest.raises(TrainingError, match="under 'sample_id'; it has 'input_ids'"):
        split_batch({"input_ids": torch.ones(1, 5)})
    with pytest.raises(TrainingError, match="1-D integer tensor"):
        split_batch((torch.ones(2), torch.ones(2)))


def _sample(i: int) -> tuple[torch.Tensor, ...]:
    # Draws from the global torch RNG, as augmentation in a training process does.
    return torch.full((3,), float(i)) + torch.rand(3), torch.tensor(i % 2)


def _stream(num_samples: int = 24, batch_size: int = 4, rank: int = 0,
            world_size: int = 2) -> LoaderStream:
    dataset = SampleDataset(num_samples, _sample)
    sampler: DistributedSampler[int] = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=5, drop_last=True)
    return LoaderStream(StatefulDataLoader(dataset, batch_size=batch_size, sampler=sampler,
                                           drop_last=True))


def _take(stream: LoaderStream, n: int) -> list[list[int]]:
    return [stream.next_microbatch().sample_ids for _ in range(n)]


def _flat(batches: list[list[int]]) -> list[int]:
    return [i for ids in batches for i in ids]


def test_the_stream_crosses_epochs_with_a_new_permutation() -> None:
    stream = _stream(num_samples=12, world_size=1)  # 3 batches an epoch
    epoch0, epoch1 = _take(stream, 3), _take(stream, 3)
    assert stream.state_dict() == {"epoch": 1}
    assert sorted(_flat(epoch0)) == sorted(_flat(epoch1)) == list(range(12))
    assert epoch0 != epoch1
    # Two ranks read disjoint halves of an epoch.
    ranks = [_flat(_take(_stream(rank=r), 3)) for r in (0, 1)]
    assert sorted(ranks[0] + ranks[1]) == list(range(24))


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value))


@pytest.mark.parametrize("taken", [2, 3, 4, 7])  # mid-epoch, at the end of one, past it
def test_the_state_round_trip_continues_with_the_same_samples(taken: int) -> None:
    torch.manual_seed(0)
    stream = _stream()
    _take(stream, taken)
    cursor, loader = _json(stream.state_dict()), _json(stream.loader_state_dict())
    rng = torch.get_rng_state()
    expected = [stream.next_microbatch() for _ in range(4)]

    torch.manual_seed(99)
    resumed = _stream()
    resumed.load_state_dict(cursor)
    resumed.load_loader_state_dict(loader)
    torch.set_rng_state(rng)
    got = [resumed.next_microbatch() for _ in range(4)]
    assert [m.sample_ids for m in got] == [m.sample_ids for m in expected]
    for a, b in zip(got, expected, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a.data, b.data, strict=True))


def test_without_the_loader_state_the_epoch_starts_over() -> None:
    stream = _stream()
    first = _take(stream, 1)
    second = _take(stream, 1)
    resumed = _stream()
    resumed.load_state_dict(_json(stream.state_dict()))  # the epoch, not the loader
    assert _take(resumed, 1) == first != second


def test_making_an_iterator_leaves_the_global_rngs_where_they_were() -> None:
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    dataset = SampleDataset(8, lambda i: (torch.tensor(float(i)),))
    stream = LoaderStream(StatefulDataLoader(dataset, batch_size=2))
    before = random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state()
    stream.loader_state_dict()  # makes the loader's iterator (a base-seed draw)
    stream.next_microbatch()
    assert random.getstate() == before[0]
    assert np.array_equal(np.random.get_state()[1], before[1])
    assert torch.equal(torch.get_rng_state(), before[2])


def test_the_synthetic_microbatch_moves_no_cursor_and_no_rng() -> None:
    stream = _stream()
    torch.manual_seed(3)
    rng = torch.get_rng_state()
    mb = stream.synthetic_microbatch()
    assert mb.sample_ids == [] and mb.data[0].shape == (4, 3)
    assert torch.equal(torch.get_rng_state(), rng)
    assert stream.state_dict() == {"epoch": 0}
    assert _take(stream, 1) == _take(_stream(), 1)


def test_the_cursor_is_read_strictly() -> None:
    stream = _stream()
    with pytest.raises(KeyError, match="expected \\['epoch'\\]"):
        stream.load_state_dict({"epoch": 0, "position": 3})
    with pytest.raises(ValueError, match="int >= 0"):
        stream.load_state_dict({"epoch": -1})


def test_a_plain_dataloader_is_refused() -> None:
    with pytest.raises(TrainingError, match=r"has no state_dict.*StatefulDataLoader"):
        LoaderStream(DataLoader(SampleDataset(4, _sample)))


# --- through the rank state, with omissions ----------------------------------------------------


def _live(spec: WorkloadSpec) -> LiveState:
    ctx = WorkloadContext(params={}, training=TrainingSpec(microbatch_size=4), rank=0,
                          world_size=1, device=torch.device("cpu"))
    torch.manual_seed(0)
    workload = load_workload(spec, ctx)
    return LiveState(workload=workload, model=workload.model, rank=0, world_size=1)


_LOADER_WORKLOAD = WorkloadSpec(name="dropout-mlp", params={"num_samples": 40},
                                loader=INLINE)


@pytest.mark.usefixtures("single_process_group")
@pytest.mark.parametrize(("omit", "continues"), [
    (frozenset(), True), (frozenset({"loader_state"}), False),
    (frozenset({"data_cursor"}), False), (frozenset({"rng"}), True),
])
def test_a_rank_state_restores_the_loader_unless_left_out(omit: frozenset[str],
                                                           continues: bool) -> None:
    live = _live(_LOADER_WORKLOAD)
    stream = live.workload.dataset
    assert isinstance(stream, LoaderStream) and stream.loader.num_workers == 0
    _take(stream, 3)
    saved = RankState.model_validate_json(rank_state(live).model_dump_json())
    assert saved.loader is not None and saved.data_cursor == {"epoch": 0}
    tensors = tensor_state(live, with_pending_grads=False)
    expected = _take(stream, 2)

    fresh = _live(_LOADER_WORKLOAD)
    restore(fresh, tensors, saved, omit, source="step-3")
    got = _take(fresh.workload.dataset, 2)  # type: ignore[arg-type]
    assert (got == expected) is continues


@pytest.mark.usefixtures("single_process_group")
def test_a_loader_state_without_a_loader_is_refused() -> None:
    plain = _live(WorkloadSpec(name="dropout-mlp", params={"num_samples": 40}))
    # The plain stream's own cursor, plus a loader's state.
    saved = rank_state(plain).model_copy(
        update={"loader": rank_state(_live(_LOADER_WORKLOAD)).loader})
    with pytest.raises(CheckpointError, match="has no StatefulDataLoader but the checkpoint "
                                              "saved loader state"):
        restore(plain, tensor_state(plain, False), saved, frozenset(), source="step-1")


# --- load_workload and the spec ----------------------------------------------------------------


def _ctx() -> WorkloadContext:
    return WorkloadContext(params={}, training=TrainingSpec(microbatch_size=2), rank=0,
                           world_size=1, device=torch.device("cpu"))


def test_builtins_keep_their_own_stream_unless_the_spec_asks_for_a_loader() -> None:
    plain = load_workload(WorkloadSpec(name="tiny-gpt", params={"num_samples": 16}), _ctx())
    assert not isinstance(plain.dataset, LoaderStream)
    spec = WorkloadSpec(name="tiny-gpt", params={"num_samples": 16}, loader=INLINE)
    assert isinstance(load_workload(spec, _ctx()).dataset, LoaderStream)


def build_loader_factory(ctx: WorkloadContext) -> Workload:
    """A user factory whose data source is a StatefulDataLoader of dict batches."""
    model = nn.Linear(3, 1)

    class Rows(torch.utils.data.Dataset[dict[str, Any]]):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"sample_id": i, "x": torch.full((3,), float(i))}

    workers = int(ctx.params.get("workers", 0))
    loader = StatefulDataLoader(Rows(), batch_size=2, num_workers=workers,
                                prefetch_factor=2 if workers else None)
    return Workload(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                    scheduler=None, dataset=loader,  # type: ignore[arg-type]
                    loss_fn=lambda m, mb: m(mb.data["x"]).sum())


FACTORY = f"{__name__}:build_loader_factory"


def test_a_factory_may_return_a_stateful_dataloader() -> None:
    w = load_workload(WorkloadSpec(name=FACTORY, loader=INLINE), _ctx())
    assert isinstance(w.dataset, LoaderStream)
    mb = w.dataset.next_microbatch()
    assert mb.sample_ids == [0, 1] and list(mb.data) == ["x"]


@pytest.mark.parametrize(("spec", "message"), [
    (WorkloadSpec(name=FACTORY), "returned a StatefulDataLoader: set workload.loader"),
    (WorkloadSpec(name=FACTORY, loader=LoaderSpec(workers=2)),
     "workload.loader.workers=2 but the loader has 0"),
    (WorkloadSpec(name="tests.unit.sample_factory:build", loader=INLINE),
     "workload.loader is set but .* returned a ShardedStream"),
])
def test_a_loader_that_does_not_match_the_spec_is_refused(spec: WorkloadSpec,
                                                          message: str) -> None:
    with pytest.raises(TrainingError, match=message):
        load_workload(spec, _ctx())


def test_the_loader_state_control_is_planned_only_for_a_loader() -> None:
    def controls(spec: QualificationSpec) -> list[str]:
        return [leg.name for leg in qualification_plan(spec).negative_controls]

    plain = QualificationSpec()
    assert "nc-loader-state" not in controls(plain)
    [not_run] = [n for n in qualification_plan(plain).not_run if n.omission == "loader_state"]
    assert "workload.loader is not set" in not_run.evidence
    with_loader = apply_overrides(plain, ["workload.loader.workers=2"])
    assert with_loader.workload.loader == LoaderSpec(workers=2)
    assert controls(with_loader)[-1] == "nc-loader-state"
    assert with_loader.digest() != plain.digest()

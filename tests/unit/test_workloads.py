"""Unit tests for the workloads package: the stream cursor, augmentation RNG use, the
reference workloads, load_workload errors, optimizers and schedules."""

from __future__ import annotations

import math
import pickle
import random
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from resumequal.built import BuiltOptimizer
from resumequal.errors import TrainingError
from resumequal.spec import (
    OptimizerSpec,
    ScheduleSpec,
    SpecError,
    TrainingSpec,
    WorkloadSpec,
)
from resumequal.workloads import Workload, WorkloadContext, load_workload
from resumequal.workloads.base import StatefulDataset
from resumequal.workloads.optim import build_optimizer, build_scheduler, describe_built
from resumequal.workloads.stream import ShardedStream

RngStates = tuple[Any, Any, torch.Tensor]


def _rng_states() -> RngStates:
    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def _assert_same_rng(a: RngStates, b: RngStates) -> None:
    assert a[0] == b[0], "Python random state changed"
    name_a, keys_a, *rest_a = a[1]
    name_b, keys_b, *rest_b = b[1]
    assert name_a == name_b and np.array_equal(keys_a, keys_b) and rest_a == rest_b, (
        "NumPy RNG state changed"
    )
    assert torch.equal(a[2], b[2]), "torch CPU RNG state changed"


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _id_sample(sample_id: int) -> tuple[torch.Tensor, ...]:
    return (torch.tensor(sample_id),)


def _stream(
    num_samples: int = 20, microbatch_size: int = 3, rank: int = 0, world_size: int = 1,
    seed: int = 5,
) -> ShardedStream:
    return ShardedStream(
        num_samples=num_samples, microbatch_size=microbatch_size, rank=rank,
        world_size=world_size, seed=seed, make_sample=_id_sample,
        blank_sample=lambda: (torch.tensor(-1),),
    )


def _ctx(params: dict[str, Any] | None = None, rank: int = 0, world_size: int = 1,
         **training: Any) -> WorkloadContext:
    return WorkloadContext(
        params=params or {}, training=TrainingSpec(**training), rank=rank,
        world_size=world_size, device=torch.device("cpu"),
    )


def _load(name: str, params: dict[str, Any] | None = None, **training: Any) -> Workload:
    _seed_all(1234)
    return load_workload(WorkloadSpec(name=name, params=params or {}), _ctx(**training))


# --- ShardedStream -----------------------------------------------------------------------


def test_stream_is_a_stateful_dataset() -> None:
    assert isinstance(_stream(), StatefulDataset)


def test_cursor_round_trip_yields_the_same_next_microbatches() -> None:
    stream = _stream()
    for _ in range(4):
        stream.next_microbatch()
    state = stream.state_dict()
    expected = [stream.next_microbatch() for _ in range(10)]

    resumed = _stream()
    resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
    got = [resumed.next_microbatch() for _ in range(10)]

    assert [m.sample_ids for m in got] == [m.sample_ids for m in expected]
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a.data[0], b.data[0])
        assert all(type(i) is int for i in a.sample_ids)


def test_state_dict_is_plain_and_a_copy() -> None:
    stream = _stream()
    stream.next_microbatch()
    state = stream.state_dict()
    assert state == {"epoch": 0, "permutation_seed": 5, "position": 3}
    state["position"] = 0
    assert stream.state_dict()["position"] == 3


def test_epoch_wraps_into_the_next_permutation() -> None:
    stream = _stream(num_samples=10, microbatch_size=4, seed=9)
    ids = [i for _ in range(3) for i in stream.next_microbatch().sample_ids]

    perm0 = torch.randperm(10, generator=torch.Generator().manual_seed(9)).tolist()
    perm1 = torch.randperm(10, generator=torch.Generator().manual_seed(10)).tolist()
    assert ids == perm0 + perm1[:2]
    assert stream.state_dict() == {"epoch": 1, "permutation_seed": 9, "position": 2}


def test_exact_end_of_shard_moves_cursor_to_next_epoch() -> None:
    stream = _stream(num_samples=6, microbatch_size=3)
    stream.next_microbatch()
    stream.next_microbatch()
    assert stream.state_dict() == {"epoch": 1, "permutation_seed": 5, "position": 0}


def test_microbatch_larger_than_shard_spans_epochs() -> None:
    stream = _stream(num_samples=4, microbatch_size=10, world_size=2)
    batch = stream.next_microbatch()
    assert len(batch.sample_ids) == 10
    assert stream.state_dict()["epoch"] == 5


def test_rank_shards_are_disjoint_and_equal_length() -> None:
    world = 3
    streams = [_stream(num_samples=10, microbatch_size=3, rank=r, world_size=world)
               for r in range(world)]
    shards = [s.next_microbatch().sample_ids for s in streams]
    assert {len(s) for s in shards} == {3}
    assert all(s.shard_length == 3 for s in streams)
    flat = [i for shard in shards for i in shard]
    assert len(set(flat)) == len(flat)
    # The shard is now used up on every rank at the same time: all move on together.
    assert {s.state_dict()["epoch"] for s in streams} == {1}


def test_permutation_uses_no_global_rng() -> None:
    stream = _stream()
    before = _rng_states()
    for _ in range(12):
        stream.next_microbatch()
    _assert_same_rng(before, _rng_states())


@pytest.mark.parametrize(
    ("state", "error", "words"),
    [
        ({"epoch": 0, "permutation_seed": 5}, KeyError, "position"),
        ({"epoch": 0, "permutation_seed": 5, "position": 0, "sampler": 1}, KeyError, "sampler"),
        ({"epoch": "0", "permutation_seed": 5, "position": 0}, TypeError, "epoch"),
        ({"epoch": 0, "permutation_seed": 5.0, "position": 0}, TypeError, "permutation_seed"),
        ({"epoch": True, "permutation_seed": 5, "position": 0}, TypeError, "epoch"),
        ({"epoch": -1, "permutation_seed": 5, "position": 0}, ValueError, "epoch"),
        ({"epoch": 0, "permutation_seed": 5, "position": 20}, ValueError, "position"),
    ],
)
def test_load_state_dict_is_strict(state: dict[str, Any], error: type[Exception],
                                   words: str) -> None:
    stream = _stream()
    with pytest.raises(error, match=words):
        stream.load_state_dict(state)
    assert stream.state_dict() == {"epoch": 0, "permutation_seed": 5, "position": 0}


@pytest.mark.parametrize("name", ["dropout-mlp", "tiny-gpt"])
def test_synthetic_microbatch_touches_no_rng_and_no_cursor(name: str) -> None:
    workload = _load(name)
    dataset = workload.dataset
    dataset.next_microbatch()
    cursor = dataset.state_dict()
    rng = _rng_states()

    synthetic = dataset.synthetic_microbatch()

    _assert_same_rng(rng, _rng_states())
    assert dataset.state_dict() == cursor
    assert synthetic.sample_ids == []
    real = dataset.next_microbatch()
    for s, r in zip(synthetic.data, real.data, strict=True):
        assert s.shape == r.shape and s.dtype == r.dtype
    assert torch.isfinite(workload.loss_fn(workload.model, synthetic))


# --- dropout-mlp augmentation --------------------------------------------------------------


def _first_inputs(workload: Workload, perturb: str | None) -> torch.Tensor:
    """Inputs of the first microbatch with every RNG seeded alike, then one re-seeded."""
    workload.dataset.load_state_dict({"epoch": 0, "permutation_seed": 1234, "position": 0})
    _seed_all(7)
    if perturb == "python":
        random.seed(8)
    elif perturb == "numpy":
        np.random.seed(8)
    elif perturb == "torch":
        torch.manual_seed(8)
    features: torch.Tensor = workload.dataset.next_microbatch().data[0]
    return features


def test_dropout_mlp_inputs_repeat_with_identical_rng_state() -> None:
    workload = _load("dropout-mlp")
    assert torch.equal(_first_inputs(workload, None), _first_inputs(workload, None))


@pytest.mark.parametrize("rng", ["python", "numpy", "torch"])
def test_dropout_mlp_augmentation_draws_from_each_global_rng(rng: str) -> None:
    workload = _load("dropout-mlp")
    assert not torch.equal(_first_inputs(workload, None), _first_inputs(workload, rng))


def test_dropout_mlp_without_augmentation_ignores_global_rngs() -> None:
    workload = _load("dropout-mlp", {"augment": False})
    base = _first_inputs(workload, None)
    for rng in ("python", "numpy", "torch"):
        assert torch.equal(base, _first_inputs(workload, rng))


def test_dropout_mlp_labels_do_not_depend_on_rng() -> None:
    workload = _load("dropout-mlp")
    labels = []
    for seed in (1, 2):
        workload.dataset.load_state_dict({"epoch": 0, "permutation_seed": 1234, "position": 0})
        _seed_all(seed)
        labels.append(workload.dataset.next_microbatch().data[1])
    assert torch.equal(labels[0], labels[1])


# --- reference workloads ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dropout-mlp", "tiny-gpt"])
def test_builtin_workload_trains_one_microbatch(name: str) -> None:
    workload = _load(name, microbatch_size=4)
    assert workload.description["name"] == name
    assert all(p.device == torch.device("cpu") for p in workload.model.parameters())
    batch = workload.dataset.next_microbatch()
    assert len(batch.sample_ids) == 4
    loss = workload.loss_fn(workload.model, batch)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in workload.model.parameters())
    workload.optimizer.step()
    assert workload.scheduler is not None
    workload.scheduler.step()


def test_builtin_workload_uses_the_training_section() -> None:
    workload = _load("dropout-mlp", seed=77, optimizer={"name": "sgd", "lr": 0.5},
                     schedule={"kind": "constant"})
    assert isinstance(workload.optimizer, torch.optim.SGD)
    assert workload.optimizer.param_groups[0]["lr"] == 0.5
    assert workload.dataset.state_dict()["permutation_seed"] == 77


def test_builtin_model_initialisation_follows_the_global_seed() -> None:
    a, b = _load("tiny-gpt"), _load("tiny-gpt")
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_tiny_gpt_samples_are_shifted_windows_and_pure() -> None:
    workload = _load("tiny-gpt", {"seq_len": 16, "vocab_size": 32})
    batch = workload.dataset.next_microbatch()
    inputs, targets = batch.data
    assert inputs.shape == (8, 16) and inputs.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    assert int(inputs.max()) < 32
    again = _load("tiny-gpt", {"seq_len": 16, "vocab_size": 32}).dataset.next_microbatch()
    assert again.sample_ids == batch.sample_ids
    assert torch.equal(again.data[0], inputs)


def test_user_factory_loads() -> None:
    spec = WorkloadSpec(name="tests.unit.sample_factory:build", params={"width": 3})
    workload = load_workload(spec, _ctx(params={"ignored": True}))
    # The spec's params win over whatever the context carried.
    assert workload.description == {"name": "sample-linear", "params": {"width": 3}}
    loss = workload.loss_fn(workload.model, workload.dataset.next_microbatch())
    assert torch.isfinite(loss)


# --- load_workload errors --------------------------------------------------------------------


def test_unknown_workload() -> None:
    spec = WorkloadSpec.model_construct(name="resnet", params={})
    with pytest.raises(SpecError, match=r"workload\.name: unknown workload 'resnet'.*tiny-gpt"):
        load_workload(spec, _ctx())


def test_factory_module_not_importable() -> None:
    spec = WorkloadSpec(name="tests.unit.no_such_module:build")
    with pytest.raises(SpecError) as info:
        load_workload(spec, _ctx())
    message = str(info.value)
    assert "cannot import module 'tests.unit.no_such_module'" in message
    assert "No module named 'tests.unit.no_such_module'" in message


def test_factory_attribute_missing() -> None:
    spec = WorkloadSpec(name="tests.unit.sample_factory:nothing_here")
    with pytest.raises(SpecError, match="has no attribute 'nothing_here'"):
        load_workload(spec, _ctx())


def test_factory_not_callable() -> None:
    spec = WorkloadSpec(name="tests.unit.sample_factory:NOT_A_FUNCTION")
    with pytest.raises(SpecError, match=r"is not callable; it is of type int"):
        load_workload(spec, _ctx())


def test_factory_returns_something_else() -> None:
    spec = WorkloadSpec(name="tests.unit.sample_factory:returns_a_dict")
    with pytest.raises(TrainingError, match=r"returned a dict, not a .*\.Workload"):
        load_workload(spec, _ctx())


def test_factory_returns_a_dataset_without_a_cursor() -> None:
    spec = WorkloadSpec(name="tests.unit.sample_factory:returns_a_list_dataset")
    with pytest.raises(TrainingError, match=r"dataset \(list\) without the StatefulDataset"):
        load_workload(spec, _ctx())


def test_unknown_param_lists_the_allowed_ones() -> None:
    with pytest.raises(SpecError) as info:
        _load("dropout-mlp", {"width": 3})
    assert str(info.value) == (
        "workload.params.width: unknown parameter; allowed: augment, classes, dropout, "
        "hidden, in_features, num_samples"
    )


def test_bad_param_value_names_the_field() -> None:
    with pytest.raises(SpecError) as info:
        _load("tiny-gpt", {"dropout": "lots", "n_layers": 0})
    lines = str(info.value).splitlines()
    assert lines[0].startswith("workload.params.n_layers: Input should be greater than or equal")
    assert lines[1].startswith("workload.params.dropout: Input should be a valid number")
    assert "'lots'" in lines[1]


def test_heads_must_divide_width() -> None:
    with pytest.raises(SpecError, match=r"workload\.params: d_model=100 .* n_heads=3"):
        _load("tiny-gpt", {"d_model": 100, "n_heads": 3})


# --- optimizers and schedules ----------------------------------------------------------------


def _params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.ones(3))]


@pytest.mark.parametrize(
    ("name", "cls"),
    [("adamw", torch.optim.AdamW), ("adam", torch.optim.Adam), ("sgd", torch.optim.SGD)],
)
def test_build_optimizer(name: str, cls: type[torch.optim.Optimizer]) -> None:
    spec = OptimizerSpec(name=name, lr=0.02, weight_decay=0.1, momentum=0.8)
    optimizer = build_optimizer(_params(), spec)
    assert type(optimizer) is cls
    group = optimizer.param_groups[0]
    assert group["lr"] == 0.02 and group["weight_decay"] == 0.1 and group["foreach"] is False
    if name == "sgd":
        assert group["momentum"] == 0.8
    else:
        assert group["betas"] == (0.9, 0.95) and group["eps"] == 1e-8


def _lrs(schedule: ScheduleSpec, total: int, steps: int, lr: float = 0.1) -> list[float]:
    """lr in force before each of ``steps`` optimizer steps."""
    optimizer = build_optimizer(_params(), OptimizerSpec(name="sgd", lr=lr))
    scheduler = build_scheduler(optimizer, schedule, total)
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_warmup_cosine_matches_closed_form() -> None:
    spec = ScheduleSpec(kind="warmup-cosine", warmup_steps=3, min_lr_ratio=0.1)
    lrs = _lrs(spec, total=12, steps=16)

    def closed_form(done: int) -> float:
        if done < 3:
            return 0.1 * (done + 1) / 4
        progress = min(1.0, (done - 3) / 9)
        return 0.1 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    for done in (0, 1, 2, 3, 5, 8, 11, 12, 15):
        assert lrs[done] == pytest.approx(closed_form(done), rel=1e-12, abs=0)
    assert lrs[3] == pytest.approx(0.1) and lrs[12] == pytest.approx(0.01)


def test_step_and_constant_schedules() -> None:
    step = _lrs(ScheduleSpec(kind="step", step_size=2, gamma=0.5), total=8, steps=6)
    assert step == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.025])
    assert _lrs(ScheduleSpec(kind="constant"), total=8, steps=4) == [0.1] * 4


def test_a_factorys_own_sgd_and_lambdalr_are_described_as_built_not_as_the_specs() -> None:
    optimizer = torch.optim.SGD(_params(), lr=0.05, momentum=0.9, foreach=False)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 ** step)
    made = describe_built(optimizer, scheduler, TrainingSpec())
    assert (made.optimizer, made.scheduler, made.groups) == ("SGD", "LambdaLR", 1)
    h = made.hyperparameters
    assert (h["lr"], h["initial_lr"], h["momentum"], h["nesterov"]) == (0.05, 0.05, 0.9, False)
    assert not made.optimizer_from_spec and not made.schedule_from_spec
    # The same class with the spec's hyperparameters is the spec's; a lambda never is.
    spec = TrainingSpec(optimizer=OptimizerSpec(name="sgd", lr=0.05, momentum=0.9,
                                                weight_decay=0))
    assert describe_built(optimizer, scheduler, spec).optimizer_from_spec
    assert not describe_built(optimizer, scheduler, spec).schedule_from_spec


@pytest.mark.parametrize("kind", ["constant", "step", "warmup-cosine"])
def test_what_build_optimizer_and_build_scheduler_make_is_the_specs(kind: str) -> None:
    training = TrainingSpec(schedule=ScheduleSpec(kind=kind))
    optimizer = build_optimizer(_params(), training.optimizer)
    made = describe_built(optimizer, build_scheduler(optimizer, training.schedule,
                                                     training.steps), training)
    assert made.optimizer == "AdamW" and made.base_lr() == training.optimizer.lr
    assert made.hyperparameters["betas"] == [0.9, 0.95]
    assert made.optimizer_from_spec and made.schedule_from_spec
    assert not describe_built(optimizer, None, training).schedule_from_spec


@pytest.mark.parametrize("kind", ["step", "warmup-cosine"])
def test_a_schedule_with_other_settings_is_not_the_specs(kind: str) -> None:
    training = TrainingSpec(schedule=ScheduleSpec(kind=kind))
    other = ScheduleSpec(kind=kind, gamma=0.25, warmup_steps=5, step_size=7)
    optimizer = build_optimizer(_params(), training.optimizer)
    made = describe_built(optimizer, build_scheduler(optimizer, other, 30), training)
    assert made.optimizer_from_spec and not made.schedule_from_spec


def test_the_record_of_what_was_built_is_bounded_and_reads_back_from_json() -> None:
    optimizer = build_optimizer(_params(), OptimizerSpec())
    made = describe_built(optimizer, None, TrainingSpec())
    assert BuiltOptimizer.model_validate_json(made.model_dump_json()) == made
    fields = made.model_dump()
    for bad in ({"optimizer": "x" * 201}, {"groups": -1},
                {"hyperparameters": {f"k{i}": i for i in range(33)}},
                {"hyperparameters": {"betas": [0.5] * 9}},
                {"hyperparameters": {"note": "x" * 201}}):
        with pytest.raises(ValidationError):
            BuiltOptimizer.model_validate({**fields, **bad})


class _Lion(torch.optim.SGD):
    """An optimizer class of the user's own."""


def test_a_class_outside_torch_optim_is_named_with_its_module() -> None:
    made = describe_built(_Lion(_params(), lr=0.1), None, TrainingSpec())
    assert made.optimizer == f"{__name__}._Lion" and made.scheduler is None
    assert made.words() == f"{__name__}._Lion (lr 0.1, momentum 0, weight_decay 0), " \
                           "schedule none"


@pytest.mark.parametrize("kind", ["constant", "step", "warmup-cosine"])
def test_scheduler_state_pickles_and_continues_identically(kind: str) -> None:
    spec = ScheduleSpec(kind=kind, step_size=2)
    opt_spec = OptimizerSpec(lr=0.1)

    def make() -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
        optimizer = build_optimizer(_params(), opt_spec)
        return optimizer, build_scheduler(optimizer, spec, total_steps=10)

    opt_a, sched_a = make()
    for _ in range(4):
        opt_a.step()
        sched_a.step()
    blob = pickle.dumps((opt_a.state_dict(), sched_a.state_dict()))

    opt_b, sched_b = make()
    opt_state, sched_state = pickle.loads(blob)
    opt_b.load_state_dict(opt_state)
    sched_b.load_state_dict(sched_state)
    for _ in range(8):
        assert opt_b.param_groups[0]["lr"] == opt_a.param_groups[0]["lr"]
        for opt, sched in ((opt_a, sched_a), (opt_b, sched_b)):
            opt.step()
            sched.step()
    assert sched_b.last_epoch == sched_a.last_epoch == 12

"""parallelism.kind: fsdp2 — the spec and what it refuses, which modules are sharded, the
optimizer rebound to the sharded parameters, digests of local shards, and the unsharded
pending gradients of a mid-accumulation cut (on a single-rank gloo group)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from torch import nn
from torch.distributed.tensor import DTensor

from resumequal import cli
from resumequal.errors import TrainingError
from resumequal.spec import SpecError, TrainingSpec, WorkloadSpec, parse_spec
from resumequal.trace.digest import named_tensors_digest, sharding, tensor_digest
from resumequal.trace.records import StepRecord, boundary_value
from resumequal.train import precision
from resumequal.train.precision import check_precision, dtensor_agrees_on_found_inf
from resumequal.train.recording import parameter_names
from resumequal.train.sharding import (
    ReduceScatterRecorder,
    rebind_optimizer,
    shard_model,
    shard_units,
)
from resumequal.train.state import _set_pending_grads, pending_grads
from resumequal.train.update import no_sync
from resumequal.workloads import load_workload
from resumequal.workloads.base import Workload, WorkloadContext

# --- the spec --------------------------------------------------------------------------------


def test_ddp_is_the_default_and_keeps_the_digests_of_older_specs() -> None:
    assert parse_spec({}).parallelism.kind == "ddp"
    assert parse_spec({"parallelism": {"kind": "ddp"}}).digest() == parse_spec({}).digest() == (
        "2e5a240062b23c200a66a0ecffe436de197a8b73a3d11927812ddf4bc175350e")
    assert parse_spec({"parallelism": {"kind": "fsdp2"}}).digest() != parse_spec({}).digest()


@pytest.mark.parametrize(("ddp", "field"), [({"bucketCapMb": 10}, "ddp.bucketCapMb"),
                                            ({"reducer_prime": False}, "ddp.reducerPrime")])
def test_fsdp2_refuses_ddp_settings_naming_the_field(ddp: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"parallelism": {"kind": "fsdp2"}, "ddp": ddp})
    assert f"{field} is set but parallelism.kind is fsdp2" in str(info.value)


def test_fp16_under_fsdp2_needs_dtensor_to_agree_on_the_scalers_inf_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = parse_spec({"parallelism": {"kind": "fsdp2"}, "training": {"precision": "fp16"}})
    assert dtensor_agrees_on_found_inf()  # this torch: the plain GradScaler serves
    check_precision(spec.training, "cpu", "fsdp2")

    monkeypatch.setattr(precision, "dtensor_agrees_on_found_inf", lambda: False)
    check_precision(spec.training, "cpu", "ddp")  # DDP's gradients are whole on every rank
    with pytest.raises(TrainingError, match=r"^training\.precision=fp16: torch .* with "
                       r"parallelism\.kind=fsdp2: each rank holds only its shard"):
        check_precision(spec.training, "cpu", "fsdp2")


def test_unknown_kinds_are_refused_listing_the_allowed_ones() -> None:
    with pytest.raises(SpecError, match=r"parallelism\.kind: .*'ddp' or 'fsdp2'"):
        parse_spec({"parallelism": {"kind": "fsdp1"}})


def test_run_refuses_a_ddp_setting_under_fsdp2_before_anything_starts(tmp_path: Path) -> None:
    run_dir = tmp_path / "q"
    result = CliRunner().invoke(cli.main, ["run", "--run-dir", str(run_dir), "--set",
                                           "parallelism.kind=fsdp2", "--set",
                                           "ddp.bucketCapMb=10"])
    assert result.exit_code == 2
    assert "ddp.bucketCapMb is set but parallelism.kind is fsdp2" in result.stderr
    assert not run_dir.exists()


def test_a_step_record_without_buckets_reads_and_compares_as_none() -> None:
    record = StepRecord(rank=0, attempt=0, step=1, microsteps=[], rng={}, local_grads="d",
                        reduced_grads="d", grad_norm=1.0, lr=[0.1], params="d",
                        optimizer_state="d", started_at=0.0, finished_at=1.0)
    back = StepRecord.model_validate_json(record.model_dump_json())
    assert (back.bucket_layout, back.buckets) == (None, [])
    assert boundary_value(back, "bucket_layout") is None


# --- which modules are sharded ---------------------------------------------------------------


def _workload(name: str, params: dict[str, Any] | None = None) -> Workload:
    ctx = WorkloadContext(params={}, training=TrainingSpec(), rank=0, world_size=1,
                          device=torch.device("cpu"))
    torch.manual_seed(0)
    return load_workload(WorkloadSpec(name=name, params=params or {}), ctx)


def test_tiny_gpt_shards_its_transformer_blocks() -> None:
    model = _workload("tiny-gpt", {"n_layers": 3}).model
    assert [name for name, _ in shard_units(model)] == ["blocks.0", "blocks.1", "blocks.2"]


def test_lists_inside_a_block_stay_in_the_block() -> None:
    class Experts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.experts = nn.ModuleList(nn.Linear(2, 2) for _ in range(2))

    model = nn.Module()
    model.layers = nn.ModuleList([Experts(), Experts(), nn.ReLU()])
    assert [name for name, _ in shard_units(model)] == ["layers.0", "layers.1"]


def test_without_repeated_blocks_each_child_with_parameters_is_sharded() -> None:
    model = _workload("dropout-mlp").model
    assert [name for name, _ in shard_units(model)] == ["0", "3", "6"]  # the Linears
    assert shard_units(nn.Sequential(nn.ReLU())) == []


# --- on a single-rank group ------------------------------------------------------------------


@pytest.mark.usefixtures("single_process_group")
def test_sharding_rebinds_the_optimizer_and_digests_local_shards() -> None:
    w = _workload("tiny-gpt", {"n_layers": 2, "d_model": 32, "vocab_size": 64})
    names = parameter_names(w.model)
    recorder = ReduceScatterRecorder()
    model = shard_model(w.model, torch.device("cpu"), 1, recorder)
    rebind_optimizer(w.optimizer, names, model)
    params = dict(model.named_parameters())
    assert all(isinstance(p, DTensor) for p in params.values())
    assert {id(p) for g in w.optimizer.param_groups for p in g["params"]} == \
        {id(p) for p in params.values()}

    weight = params["head.weight"]
    assert isinstance(weight, DTensor)
    assert sharding(weight) == ("global=(64, 32)|placements=(Shard(dim=0),)|mesh=(1,)"
                                "|coordinate=(0,)")
    # What identifies the sharding is part of the digest, besides the local shard's bytes.
    assert tensor_digest(weight) != tensor_digest(weight.to_local())

    # Mid-accumulation: unsharded gradients wait on FSDP2's unsharded parameters.
    mb = w.dataset.next_microbatch()
    with no_sync(model):
        w.loss_fn(model, mb).backward()
    pending = pending_grads(model)
    assert set(pending) == set(params)
    assert all(not isinstance(g, DTensor) and g.shape == params[n].shape
               for n, g in pending.items())
    assert all(p.grad is None for p in params.values())

    # Put back (as a restore does), they are what the next backward adds to.
    saved = {n: g.clone() for n, g in pending.items()}
    _set_pending_grads(model, {n: torch.zeros_like(g) for n, g in saved.items()})
    assert all(torch.equal(g, torch.zeros_like(g)) for g in pending_grads(model).values())
    _set_pending_grads(model, saved)
    assert named_tensors_digest(sorted(pending_grads(model).items())) == \
        named_tensors_digest(sorted(saved.items()))

    # The last microbatch reduces: the sharded parameters get their gradients.
    w.loss_fn(model, w.dataset.next_microbatch()).backward()
    assert all(isinstance(p.grad, DTensor) for p in params.values())
    assert pending_grads(model) == {}
    # One rank: FSDP2 copies instead of reduce-scattering, so nothing went through the comm.
    assert recorder.local == {}

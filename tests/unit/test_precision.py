"""training.precision: autocast and the fp16 loss scaler, what the plan runs for them, what
the trace records, and what is refused before anything starts."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from resumequal import cli
from resumequal.checkpoint import FolderRoot
from resumequal.errors import TrainingError
from resumequal.qualify.plan import qualification_plan
from resumequal.run.location import RunLocation
from resumequal.spec import parse_spec
from resumequal.store.log import FileSink
from resumequal.trace.records import LossScaleRecord, StepRecord, boundary_value
from resumequal.train.distributed import Placement
from resumequal.train.loop import Trainer
from resumequal.train.precision import Precision, check_precision, scaler_state
from resumequal.workloads.base import Microbatch

# --- the plan --------------------------------------------------------------------------------


def test_the_scaler_control_runs_with_fp16_only() -> None:
    fp16 = qualification_plan(parse_spec({"training": {"precision": "fp16"}}))
    control = fp16.leg("nc-scaler")
    assert (control.role, control.omit) == ("negative_control", ("scaler",))
    assert control.spec.preemption.mode == "hard"  # the main leg's kill: nothing else needed
    assert [n for n in fp16.not_run if n.omission == "scaler"] == []

    for precision in ("fp32", "bf16"):
        plan = qualification_plan(parse_spec({"training": {"precision": precision}}))
        assert "nc-scaler" not in [leg.name for leg in plan.legs]
        (not_run,) = [n for n in plan.not_run if n.omission == "scaler"]
        assert not_run.evidence == (f"training.precision is {precision}: there is no "
                                    "GradScaler, so no scaler state to leave out")
        assert not_run.mechanism == "not run: the omitted state does not exist in this precision"


def test_controls_without_the_scaler_omission_plan_none_for_it() -> None:
    plan = qualification_plan(parse_spec({"controls": {"omissions": ["rng"]}}))
    assert [leg.name for leg in plan.negative_controls] == ["nc-rng"] and plan.not_run == []


# --- autocast and the scaler ----------------------------------------------------------------


def _matmul(model: nn.Module, mb: Microbatch) -> torch.Tensor:
    out: torch.Tensor = model(mb.data)
    return out


@pytest.mark.parametrize(("precision", "dtype"),
                         [("fp32", torch.float32), ("bf16", torch.bfloat16),
                          ("fp16", torch.float16)])
def test_the_loss_runs_in_the_precision_and_backward_reaches_fp32_params(
    precision: str, dtype: torch.dtype
) -> None:
    training = parse_spec({"training": {"precision": precision}}).training
    p = Precision.of(training, torch.device("cpu"))
    model = nn.Linear(4, 3)
    out = p.loss(_matmul, model, Microbatch(sample_ids=[0], data=torch.ones(2, 4)))
    assert out.dtype == dtype
    assert not torch.is_autocast_enabled("cpu")  # only inside the loss
    out.float().sum().backward()
    assert model.weight.grad is not None and model.weight.grad.dtype == torch.float32


def test_only_fp16_has_a_scaler_made_from_the_spec() -> None:
    for precision in ("fp32", "bf16"):
        training = parse_spec({"training": {"precision": precision}}).training
        assert Precision.of(training, torch.device("cpu")).new_scaler() is None
    training = parse_spec({"training": {"precision": "fp16", "gradScaler": {
        "initScale": 1024, "growthFactor": 4, "backoffFactor": 0.25,
        "growthInterval": 3}}}).training
    scaler = Precision.of(training, torch.device("cpu")).new_scaler()
    assert scaler is not None
    state = scaler.state_dict()
    assert state == {"scale": 1024.0, "growth_factor": 4.0, "backoff_factor": 0.25,
                     "growth_interval": 3, "_growth_tracker": 0}
    assert scaler_state(scaler) == (1024.0, 0)
    json.dumps(state)  # the rank state stores it as JSON


def test_the_scaler_grows_backs_off_and_skips_an_overflowing_update() -> None:
    training = parse_spec({"training": {"precision": "fp16", "gradScaler": {
        "initScale": 1024, "growthInterval": 1}}}).training
    p = Precision.of(training, torch.device("cpu"))
    scaler = p.new_scaler()
    assert scaler is not None
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for big in (1.0, 1.0, 1e30):
        with p.autocast():
            loss = model(torch.full((1, 4), big)).sum()
        scaler.scale(loss).backward()
        before = model.weight.detach().clone()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        seen.append((scaler_state(scaler), torch.equal(before, model.weight)))
    # fp16 holds 65504 at most: 1e30 is inf there, and so are the gradients.
    assert seen == [((2048.0, 0), False), ((4096.0, 0), False), ((2048.0, 0), True)]


def test_an_unavailable_autocast_is_refused_naming_the_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    training = parse_spec({"training": {"precision": "bf16"}}).training
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda device_type: False)
    with pytest.raises(TrainingError, match=r"^training\.precision=bf16: torch .* on cpu has "
                                            r"no autocast$"):
        check_precision(training, "cpu")
    check_precision(parse_spec({}).training, "cpu")  # fp32 needs none


def test_an_autocast_that_torch_disables_is_refused_not_run_in_fp32(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What an older torch does with a dtype its CPU autocast lacks: warn and run in fp32.
    real = torch.get_autocast_dtype

    def disabled(device_type: str) -> torch.dtype:
        warnings.warn("In CPU autocast, but the target dtype is not supported. Disabling "
                      "autocast.", UserWarning, stacklevel=1)
        return torch.float32 if device_type == "cpu" else real(device_type)

    monkeypatch.setattr(torch, "get_autocast_dtype", disabled)
    training = parse_spec({"training": {"precision": "fp16"}}).training
    with pytest.raises(TrainingError) as info:
        Precision.of(training, torch.device("cpu"))
    assert str(info.value).startswith("training.precision=fp16: torch ")
    assert "cannot autocast to torch.float16 (In CPU autocast, but the target dtype is not " \
           "supported. Disabling autocast.); use fp32" in str(info.value)


def test_run_refuses_an_impossible_precision_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda device_type: False)
    run_dir = tmp_path / "q1"
    result = CliRunner().invoke(cli.main, ["run", "--run-dir", str(run_dir),
                                           "--set", "training.precision=fp16"])
    assert result.exit_code == 2
    assert "error: training.precision=fp16: torch" in result.stderr
    assert not run_dir.exists()


def test_a_leg_that_cannot_train_in_its_precision_fails_for_good(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Refused when the trainer is made, before any global setting, group or checkpoint,
    # and marked failed so the launcher's restart does not meet it again.
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda device_type: False)
    spec = parse_spec({"training": {"precision": "bf16"}})
    files = RunLocation.open(str(tmp_path / "run")).leg("preempted")
    placement = Placement(rank=1, local_rank=1, world_size=2, attempt=0, backend="gloo",
                          device=torch.device("cpu"), host="h", joined_at=0.0)
    with pytest.raises(TrainingError, match=r"^training\.precision=bf16: "):
        Trainer(spec, "preempted", files, placement, checkpoint_root=FolderRoot(tmp_path / "c"),
                trace=FileSink(tmp_path / "trace.jsonl"), scratch=tmp_path / "s")
    failure = files.failure()
    assert failure is not None and failure.startswith("rank 1: training.precision=bf16: torch ")
    assert not (tmp_path / "c").exists()


# --- the trace -------------------------------------------------------------------------------

_STEP = {"kind": "step", "rank": 0, "attempt": 0, "step": 1, "microsteps": [],
         "rng": {}, "local_grads": "d", "bucket_layout": "d", "buckets": [],
         "reduced_grads": "d", "grad_norm": 1.0, "lr": [0.1], "params": "d",
         "optimizer_state": "d", "started_at": 0.0, "finished_at": 1.0}


def test_a_step_record_without_a_loss_scale_still_reads_and_compares_as_none() -> None:
    old = StepRecord.model_validate_json(json.dumps(_STEP))  # written before precision
    assert old.loss_scale is None and boundary_value(old, "loss_scale") is None
    new = old.model_copy(update={"loss_scale": LossScaleRecord(scale=65536.0,
                                                               growth_tracker=1)})
    line = new.model_dump_json()
    assert '"loss_scale":{"scale":65536.0,"growth_tracker":1}' in line
    back = StepRecord.model_validate_json(line)
    assert boundary_value(back, "loss_scale") == {"scale": 65536.0, "growth_tracker": 1}

"""The trial build's own side: what it builds and what it says when that fails."""

from __future__ import annotations

import pytest
import torch

from resumequal.errors import TrainingError
from resumequal.spec import QualificationSpec, SpecError
from resumequal.train.trial import build, failure


def test_a_failure_of_the_factory_names_the_workload_and_the_exceptions_last_line() -> None:
    error = ValueError("hidden must be even,\nnot 7")
    assert failure("pkg.mod:build", error) == (
        "workload.name 'pkg.mod:build': building the workload raised ValueError: not 7")
    assert failure("pkg.mod:build", KeyError()) == (
        "workload.name 'pkg.mod:build': building the workload raised KeyError")


def test_our_own_errors_are_told_as_they_are() -> None:
    said = "workload factory 'pkg.mod:build' returned a dict, not a Workload"
    assert failure("pkg.mod:build", TrainingError(said)) == said


def test_a_module_that_is_not_there_is_a_spec_error_naming_it() -> None:
    spec = QualificationSpec.model_validate({"workload": {"name": "tests.no_such_module:build"}})
    with pytest.raises(SpecError, match=r"cannot import module 'tests.no_such_module'"):
        build(spec)


def test_the_built_in_workload_builds_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # this process's to keep
    build(QualificationSpec.model_validate({"workload": {"name": "dropout-mlp"}}))


def test_a_model_with_sync_batchnorm_is_refused_where_the_legs_train_on_the_cpu() -> None:
    import torch
    from torch import nn

    from resumequal.spec import SpecError
    from resumequal.train.devices import check_trains_on

    model = nn.SyncBatchNorm.convert_sync_batchnorm(
        nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()))
    with pytest.raises(SpecError, match=r"workload.name 'mine:build': the model has "
                       r"SyncBatchNorm \(1\), which torch runs on CUDA devices only, and the "
                       r"legs train on cpu here: .*sync_buffers_after_step"):
        check_trains_on(model, torch.device("cpu"), "mine:build")
    check_trains_on(model, torch.device("cuda", 0), "mine:build")
    check_trains_on(nn.BatchNorm2d(4), torch.device("cpu"), "mine:build")

"""The first factory of docs/own-model.md, as the page shows it: it loads through the
factory-loading path a leg uses, builds on every rank, and trains a step."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from resumequal.spec import QualificationSpec, spec_from_text
from resumequal.workloads import Workload, WorkloadContext, load_workload
from resumequal.workloads.base import PositionalDataset, StatefulDataset
from resumequal.workloads.optim import describe_built

PAGE = Path(__file__).resolve().parents[2] / "docs/own-model.md"
MODULE = "my_model"  # the file name the page tells the reader to save it under


def _between(marker: str, language: str) -> str:
    """The fenced ``language`` block between ``<!-- marker:start -->`` and ``:end``."""
    text = PAGE.read_text()
    found = re.search(rf"<!-- {marker}:start -->\n```{language}\n(.*?)```\n<!-- {marker}:end -->",
                      text, re.DOTALL)
    assert found is not None, f"{PAGE.name} has no {language} block marked {marker}"
    return found.group(1)


@pytest.fixture
def spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[QualificationSpec]:
    """The page's spec, with the page's factory importable as the page says to save it."""
    (tmp_path / f"{MODULE}.py").write_text(_between("first-factory", "python"))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield spec_from_text(_between("first-factory-spec", "yaml"), source=PAGE.name)
    sys.modules.pop(MODULE, None)


def _build(spec: QualificationSpec, rank: int = 0, world_size: int = 1) -> Workload:
    torch.manual_seed(spec.training.seed)
    ctx = WorkloadContext(params=dict(spec.workload.params), training=spec.training, rank=rank,
                          world_size=world_size, device=torch.device("cpu"))
    return load_workload(spec.workload, ctx)


def test_the_factory_is_about_twenty_lines() -> None:
    code = [line for line in _between("first-factory", "python").splitlines() if line.strip()]
    assert len(code) <= 25


def test_the_spec_names_the_factory(spec: QualificationSpec) -> None:
    assert spec.workload.name == f"{MODULE}:build"
    assert spec.workload.is_factory


def test_the_factory_loads_and_trains_a_step(spec: QualificationSpec) -> None:
    workload = _build(spec)
    assert isinstance(workload.dataset, StatefulDataset)
    assert isinstance(workload.dataset, PositionalDataset)  # a resize can run it too
    batch = workload.dataset.next_microbatch()
    assert len(batch.sample_ids) == spec.training.microbatch_size
    before = [p.detach().clone() for p in workload.model.parameters()]
    workload.loss_fn(workload.model, batch).backward()
    workload.optimizer.step()
    assert workload.scheduler is not None
    workload.scheduler.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, workload.model.parameters(),
                                                     strict=True))


def test_the_optimizer_and_schedule_are_the_specs(spec: QualificationSpec) -> None:
    workload = _build(spec)
    assert isinstance(workload.optimizer, torch.optim.AdamW)
    assert workload.optimizer.param_groups[0]["lr"] == spec.training.optimizer.lr
    assert workload.optimizer.param_groups[0]["foreach"] is False
    # So the report keeps the spec's training.optimizer and training.schedule.
    made = describe_built(workload.optimizer, workload.scheduler, spec.training)
    assert made.optimizer_from_spec and made.schedule_from_spec


def test_ranks_build_the_same_model_and_read_their_own_samples(
        spec: QualificationSpec) -> None:
    workloads = [_build(spec, rank, world_size=2) for rank in (0, 1)]
    for a, b in zip(*(w.model.parameters() for w in workloads), strict=True):
        assert torch.equal(a, b)
    ids = [set(w.dataset.next_microbatch().sample_ids) for w in workloads]
    assert not ids[0] & ids[1]


def test_the_cursor_resumes_exactly(spec: QualificationSpec) -> None:
    first, second = _build(spec).dataset, _build(spec).dataset
    first.next_microbatch()
    second.load_state_dict(first.state_dict())
    a, b = first.next_microbatch(), second.next_microbatch()
    assert a.sample_ids == b.sample_ids
    assert all(torch.equal(x, y) for x, y in zip(a.data, b.data, strict=True))
    blank = first.synthetic_microbatch()
    assert blank.data[0].shape == a.data[0].shape

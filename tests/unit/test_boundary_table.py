"""One table of boundaries (resumequal.spec.boundaries), and every list of them derived from it:
the spec's names, the trace's fields, the comparator's kinds, tolerances and labels, the
per-tensor digests and a zoom replay's stages and rules."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest

from resumequal.compare import controls, tensors, walk
from resumequal.results.verdict import ZoomStage
from resumequal.spec import ComparisonSpec
from resumequal.spec.boundaries import BOUNDARIES, BY_NAME, TABLE, Boundary, of_kind
from resumequal.trace.capture import STAGES, STAGES_BEFORE
from resumequal.trace.records import (
    BOUNDARY_FIELDS,
    BucketRecord,
    LossScaleRecord,
    MicrostepRecord,
    StepRecord,
    TensorDigests,
    boundary_value,
)
from resumequal.zoom import captures

DOCS = Path(__file__).resolve().parents[2] / "docs"
ALL = set(get_args(Boundary))


def test_the_table_names_the_literals_boundaries_in_execution_order() -> None:
    assert get_args(Boundary) == BOUNDARIES
    assert len({b.label for b in TABLE}) == len(TABLE)  # no two read alike in a sentence


def test_every_derived_table_covers_every_boundary() -> None:
    assert set(BOUNDARY_FIELDS) == ALL
    assert set(controls._NAMES) == ALL
    numeric, tensor, exact = of_kind("numeric"), of_kind("tensors"), of_kind("exact")
    assert sorted(numeric + tensor + exact) == sorted(ALL)
    assert set(numeric) == walk.NUMERIC
    assert tensors.PER_TENSOR == set(tensor) == set(walk._DIGEST_GROUP)
    assert set(TensorDigests.model_fields) == set(tensor)
    # A zoom replay captures every tensor boundary, and judges each stage but the first.
    assert {b.stage for b in TABLE if b.kind == "tensors"} <= set(STAGES)
    assert [stage for stage, _ in captures._RULES] == [s for s in STAGES if s not in STAGES_BEFORE]
    assert all(rule is not None for _, rule in captures._RULES[1:])


def test_each_boundary_is_read_from_a_field_a_step_record_has() -> None:
    for b in TABLE:
        assert b.field in StepRecord.model_fields, b.name
        if b.item is not None:
            assert b.item in MicrostepRecord.model_fields, b.name


def _full_record() -> StepRecord:
    digests = {n: {"w": f"d-{n}"} for n in TensorDigests.model_fields}
    return StepRecord(
        rank=0, attempt=0, step=1,
        microsteps=[MicrostepRecord(index=0, sample_ids=[3, 4], loss=0.5)],
        rng={"torch": "d-rng"}, loss_scale=LossScaleRecord(scale=2.0, growth_tracker=1),
        local_grads="d-lg", bucket_layout="d-bl",
        buckets=[BucketRecord(index=0, params=["w"], numel=1)], reduced_grads="d-rg",
        grad_norm=1.5, clipped_grads="d-cg", lr=[0.1], params="d-pa", optimizer_state="d-op",
        started_at=0.0, finished_at=1.0, tensors=TensorDigests(**digests))


def test_every_boundary_has_a_value_in_a_step_record() -> None:
    record = _full_record()
    values = {b: boundary_value(record, b) for b in BOUNDARIES}
    assert values["inputs"] == [[3, 4]] and values["loss"] == [0.5]
    assert values["loss_scale"] == {"scale": 2.0, "growth_tracker": 1}
    assert values["clipped_grads"] == "d-cg" and values["lr"] == [0.1]
    assert all(v is not None for v in values.values())
    with pytest.raises(ValueError, match="unknown boundary 'gradients'; allowed: inputs, rng"):
        boundary_value(record, "gradients")  # type: ignore[arg-type]


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_declared_tolerance_relaxes_every_boundary_but_the_exact_ones(boundary: str) -> None:
    own = walk.Rules(ComparisonSpec(mode="tolerance", tolerances={boundary: 0.5}))
    assert own.tolerance(boundary) == (None if BY_NAME[boundary].kind == "exact" else 0.5)
    # Gradients without a tolerance of their own are held to the parameters'.
    params = walk.Rules(ComparisonSpec(mode="tolerance", tolerances={"params": 0.25}))
    expected = 0.25 if boundary == "params" or BY_NAME[boundary].gradient else None
    assert params.tolerance(boundary) == expected


def test_the_mode_field_says_which_boundaries_stay_exact() -> None:
    description = ComparisonSpec.model_fields["mode"].description or ""
    assert "(inputs, rng, loss_scale and bucket_layout stay exact)" in description
    assert of_kind("exact") == ("inputs", "rng", "loss_scale", "bucket_layout")


def test_a_sentence_names_each_boundary_by_its_label() -> None:
    assert controls._NAMES["clipped_grads"] == "clipped gradients"
    assert {controls._NAMES[b.name] for b in TABLE} == {b.label for b in TABLE}


def _stages(differ: dict[str, int]) -> list[ZoomStage]:
    return [ZoomStage(name=name, total=2, differ=differ.get(name, 0), max_abs_diff=None,
                      tensors=[]) for name in STAGES]


@pytest.mark.parametrize("boundary", [b.name for b in TABLE if b.zoom is not None])
def test_a_zoom_names_where_a_stage_first_differs_after_an_equal_one(boundary: str) -> None:
    info = BY_NAME[boundary]
    assert info.stage is not None
    later = STAGES[STAGES.index(info.stage):]
    origin, stages = captures._stage_origin(_stages(dict.fromkeys(later, 1)))
    assert origin == info.zoom
    assert stages == [s for s in later if BY_NAME[s].zoom == info.zoom]


def test_a_zoom_blames_the_state_a_step_began_from_before_any_stage() -> None:
    assert captures._stage_origin(_stages(dict.fromkeys(STAGES, 1))) == (
        "state", list(STAGES_BEFORE))
    # A difference from the first stage on (no stage before it equal) names no stage.
    assert captures._stage_origin(_stages(dict.fromkeys(STAGES[2:], 1))) == ("none", [])
    # The reduction is named only where the local gradients were captured, and equal.
    no_local = [s for s in _stages({"reduced_grads": 1}) if s.name != "local_grads"]
    assert captures._stage_origin(no_local) == ("none", [])


def test_the_verdict_page_lists_every_boundary_in_execution_order() -> None:
    text = (DOCS / "verdict.md").read_text()
    table = text[text.index("| boundary | what is compared |"):]
    rows = re.findall(r"^\| `(\w+)` \|", table.split("\n\n")[0], flags=re.MULTILINE)
    assert tuple(rows) == BOUNDARIES
    adding = text[text.index("### Adding a boundary"):]
    assert "service/resumequal/spec/boundaries.py" in adding and "BoundaryInfo(" in adding

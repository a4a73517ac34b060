"""One descriptor per negative control (resumequal.spec.omissions), read by the restore, the
data of a resized world, the plan and the comparator."""

from __future__ import annotations

from typing import Any, get_args

import pytest

from resumequal.compare.controls import _blind
from resumequal.qualify.plan import qualification_plan
from resumequal.spec import OMISSIONS, Omission, QualificationSpec, parse_spec
from resumequal.spec.boundaries import BOUNDARIES
from resumequal.spec.omissions import CONTROLS, StatePart, control, left_out, planted
from resumequal.trace.records import StepRecord
from resumequal.train.globaldata import GlobalData
from resumequal.train.state import omitted_parts

RESIZE: dict[str, Any] = {
    "world": {"nnodes": 2, "nprocPerNode": 1},
    "preemption": {"target": "pod", "resize": {"toNodes": 1}},
    "comparison": {"mode": "tolerance",
                   "tolerances": {"loss": 1e-4, "grad_norm": 1e-4, "params": 1e-4}},
}


def test_the_table_covers_the_omission_literal_in_order() -> None:
    assert tuple(c.omission for c in CONTROLS) == OMISSIONS == get_args(Omission)
    assert all(c.shows_at in BOUNDARIES for c in CONTROLS)
    # Every part of the state a restore may leave out is some control's.
    assert set().union(*(c.leaves_out for c in CONTROLS)) == set(get_args(StatePart))


def test_a_restore_leaves_out_what_the_descriptors_say() -> None:
    for c in CONTROLS:
        assert omitted_parts(frozenset({c.omission})) == c.leaves_out
    assert omitted_parts(frozenset({"rng", "scheduler"})) == {"rng", "scheduler"}
    assert left_out(frozenset({"rank_cursor", "rank_rng"})) == frozenset()
    with pytest.raises(ValueError, match="unknown omission 'optimiser'; allowed: rng, "):
        control("optimiser")


def test_a_resized_worlds_data_plants_what_the_rank_keyed_controls_say() -> None:
    spec = parse_spec(RESIZE)
    data = GlobalData.of(spec, rank=0, world_size=1, omit=frozenset({"rank_cursor"}))
    assert (data.rank_cursor, data.rank_rng) == (True, False)
    assert planted(frozenset({"rank_rng", "rng"}), "rng")
    assert not planted(frozenset({"rng", "data_cursor"}), "data")


def _planned(data: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    plan = qualification_plan(parse_spec(data))
    return ({leg.omit[0]: leg.spec.preemption.mode for leg in plan.negative_controls},
            {n.omission: n.mechanism for n in plan.not_run})


def test_the_plan_runs_a_leg_for_each_control_that_applies_and_says_why_not() -> None:
    legs, not_run = _planned({"preemption": {"mode": "hard", "microstep": 1}})
    assert legs == {"rng": "hard", "data_cursor": "hard", "scheduler": "hard",
                    "optimizer": "hard", "model_optimizer_only": "hard",
                    "pending_grads": "graceful"}  # only an emergency checkpoint holds them
    assert not_run == {
        "scaler": "not run: the omitted state does not exist in this precision",
        "loader_state": "not run: the omitted state does not exist in this workload",
        "rank_cursor": "not run: the omitted state plays no part in this run",
        "rank_rng": "not run: the omitted state plays no part in this run"}

    legs, not_run = _planned({"training": {"precision": "fp16"},
                              "workload": {"loader": {"workers": 0}},
                              "preemption": {"microstep": 0}})
    assert {"scaler", "loader_state"} <= set(legs)
    assert not_run == {"pending_grads": "not run: the omitted state cannot exist at this cut",
                       "rank_cursor": "not run: the omitted state plays no part in this run",
                       "rank_rng": "not run: the omitted state plays no part in this run"}

    legs, not_run = _planned(RESIZE)
    assert set(legs) == {"scheduler", "optimizer", "model_optimizer_only", "rank_cursor",
                         "rank_rng"}
    assert set(not_run) == {"rng", "data_cursor", "pending_grads", "scaler", "loader_state"}


def test_a_control_named_twice_runs_once() -> None:
    spec = parse_spec({"controls": {"omissions": ["rng", "scheduler", "rng"]}})
    assert spec.controls.omissions == ["rng", "scheduler"]
    assert [leg.name for leg in qualification_plan(spec).negative_controls] == [
        "nc-rng", "nc-scheduler"]


def _steps(lrs: list[float]) -> dict[int, dict[int, StepRecord]]:
    return {0: {s: StepRecord(rank=0, attempt=0, step=s, microsteps=[], rng={"t": "same"},
                              local_grads="", reduced_grads="", grad_norm=0.0, lr=[lr],
                              params="", optimizer_state="same", started_at=0.0,
                              finished_at=0.0)
                for s, lr in enumerate(lrs, start=1)}}


@pytest.mark.parametrize("omission", ["rng", "scheduler", "optimizer", "model_optimizer_only"])
def test_evidence_that_a_state_never_changed_needs_two_steps(omission: str) -> None:
    evidence = control(omission).evidence
    assert evidence is not None
    spec = QualificationSpec()
    assert evidence(_steps([0.1, 0.1]), [], spec)
    assert evidence(_steps([0.1]), [], spec) is None  # one step never changes anything


def test_a_blind_control_names_where_it_shows_first_when_that_is_not_compared() -> None:
    spec = parse_spec({"comparison": {"boundaries": ["lr", "params"]}})
    assert _blind("rng", spec) == (
        "no compared boundary differed: the comparator is blind to rng (RNG states, where "
        "leaving it out shows first, is not among comparison.boundaries)")
    assert _blind("scheduler", spec) == ("no compared boundary differed: the comparator is "
                                         "blind to scheduler")

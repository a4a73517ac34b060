"""The zoom comparison (pure: hand-built captures), its report section and metrics."""

from __future__ import annotations

import math
from typing import Any

import torch
from prometheus_client import CollectorRegistry, generate_latest

from resumequal.report.html import render_html
from resumequal.report.zoom import zoom_lines
from resumequal.results.metrics import QualificationMetrics
from resumequal.results.verdict import Result, ZoomReplay
from resumequal.trace.capture import CAPTURE_FORMAT, ROOT
from resumequal.zoom.captures import compare_captures, summary, tensor_diff
from tests.unit.report_samples import make_report, make_zoom, with_forensics

T = torch.tensor


def _call(module: str, phase: str, inputs: list[Any], outputs: list[Any],
          microstep: int = 0) -> dict[str, Any]:
    return {"module": module, "phase": phase, "microstep": microstep, "call": 0,
            "inputs": inputs, "outputs": outputs}


def _capture(calls: list[dict[str, Any]], stages: dict[str, dict[str, torch.Tensor]] | None = None,
             buckets: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"format": CAPTURE_FORMAT, "step": 5, "rank": 0, "calls": calls,
            "stages": stages or {}, "buckets": buckets or [],
            "module_params": {"a": ["a.w"], "outer.b": [], "c": ["c.w"], "outer": [], ROOT: []}}


def _chain(mid_out: torch.Tensor, end_out: torch.Tensor, *,
           a_in: torch.Tensor | None = None, back: torch.Tensor | None = None,
           params: torch.Tensor | None = None) -> dict[str, Any]:
    """Modules a -> outer.b -> c (b inside ``outer``) in the root, forward then backward."""
    x = a_in if a_in is not None else T([1.0, 2.0])
    g = back if back is not None else T([0.5, 0.5])
    calls = [
        _call("a", "forward", [x], [T([2.0, 4.0])]),
        _call("outer.b", "forward", [T([2.0, 4.0])], [mid_out]),
        _call("outer", "forward", [T([2.0, 4.0])], [mid_out]),
        _call("c", "forward", [mid_out], [end_out]),
        _call(ROOT, "forward", [x], [end_out]),
        _call(ROOT, "backward", [T([1.0])], [None]),
        _call("c", "backward", [T([1.0])], [g]),
        _call("outer", "backward", [g], [g]),
        _call("outer.b", "backward", [g], [g]),
        _call("a", "backward", [g], [None]),
    ]
    stages = {"params_before": {"a.w": params if params is not None else T([1.0]),
                                "c.w": T([3.0])},
              "local_grads": {"a.w": g.sum().reshape(1), "c.w": end_out.sum().reshape(1)},
              "reduced_grads": {"a.w": g.sum().reshape(1), "c.w": end_out.sum().reshape(1)}}
    return _capture(calls, stages)


def _kinds(result: Any) -> dict[str, str]:
    return {m.module: m.kind for m in result.modules}


def test_a_module_whose_equal_inputs_give_different_outputs_is_the_single_origin() -> None:
    control = _chain(T([3.0, 5.0]), T([6.0, 10.0]))
    resumed = _chain(T([3.0, 5.000001]), T([6.0, 10.000002]), back=T([0.5, 0.4]))
    found = compare_captures({0: control}, {0: resumed})
    assert found.origin_kind == "module" and found.origins == ["outer.b"]
    kinds = _kinds(found)
    # c takes b's output; outer holds b; a only sees different gradients from above.
    assert kinds == {"outer.b": "origin", "outer": "encloses_origin", "c": "propagation",
                     ROOT: "encloses_origin", "a": "propagation"}
    b = next(m for m in found.modules if m.module == "outer.b")
    assert not b.inputs_differ and b.outputs_differ and b.phase == "forward"
    assert b.tensors[0].differ == 1 and b.max_abs_diff is not None
    assert math.isclose(b.max_abs_diff, 1e-6, rel_tol=0.1)
    a = next(m for m in found.modules if m.module == "a")
    assert a.phase == "backward" and a.grads_in_differ and not a.inputs_differ
    # In execution order: b first.
    assert found.modules[0].module == "outer.b"
    assert found.modules_total == 5


def test_equal_replays_have_no_origin() -> None:
    control = _chain(T([3.0, 5.0]), T([6.0, 10.0]))
    found = compare_captures({0: control}, {0: _chain(T([3.0, 5.0]), T([6.0, 10.0]))})
    assert found.modules == [] and found.origin_kind == "none" and found.origins == []
    assert all(s.differ == 0 for s in found.stages)


def test_a_module_whose_parameters_differ_before_the_step_is_state() -> None:
    control = _chain(T([3.0, 5.0]), T([6.0, 10.0]))
    resumed = _chain(T([3.0, 5.0]), T([6.0, 10.0]), params=T([1.5]))
    resumed["calls"][0]["outputs"] = [T([2.0, 4.5])]
    found = compare_captures({0: control}, {0: resumed})
    assert found.origin_kind == "state" and found.origins == ["a"]
    assert _kinds(found)["a"] == "state"


def test_equal_modules_and_local_gradients_with_different_reduced_ones_is_the_reduction() -> None:
    control = _chain(T([3.0, 5.0]), T([6.0, 10.0]))
    resumed = _chain(T([3.0, 5.0]), T([6.0, 10.0]))
    resumed["stages"]["reduced_grads"] = {"a.w": T([1.0000001]), "c.w": T([16.0])}
    control["buckets"] = [{"index": 0, "params": ["c.w", "a.w"], "numel": 2}]
    resumed["buckets"] = [{"index": 0, "params": ["c.w"], "numel": 1},
                          {"index": 1, "params": ["a.w"], "numel": 1}]
    found = compare_captures({0: control}, {0: resumed})
    assert found.modules == []
    assert found.origin_kind == "reduction" and found.origins == ["reduced_grads"]
    stages = {s.name: s for s in found.stages}
    assert stages["local_grads"].differ == 0 and stages["reduced_grads"].differ == 1
    assert found.buckets is not None
    assert [len(found.buckets[k]) for k in ("control", "preempted")] == [1, 2]


def test_a_parameter_gradient_that_differs_with_everything_received_equal_is_an_origin() -> None:
    control = _chain(T([3.0, 5.0]), T([6.0, 10.0]))
    resumed = _chain(T([3.0, 5.0]), T([6.0, 10.0]))
    resumed["stages"]["local_grads"] = {"a.w": T([1.5]), "c.w": T([16.0])}
    found = compare_captures({0: control}, {0: resumed})
    assert found.origins == ["a"] and _kinds(found)["a"] == "origin"
    assert next(m for m in found.modules if m.module == "a").phase == "backward"


def test_tensor_diff_counts_elements_and_treats_matching_nans_as_equal() -> None:
    nan = float("nan")
    assert tensor_diff("x", 0, T([1.0, nan]), T([1.0, nan])) is None
    d = tensor_diff("x", 0, T([1.0, 2.0, 3.0]), T([1.0, 2.5, 2.0]))
    assert d is not None and d.differ == 2 and d.max_abs_diff == 1.0
    one_sided = tensor_diff("x", 0, T([nan]), T([1.0]))
    assert one_sided is not None and one_sided.max_abs_diff == math.inf
    shape = tensor_diff("x", 0, T([1.0]), T([1.0, 2.0]))
    assert shape is not None and shape.max_abs_diff is None and shape.differ == 2
    assert tensor_diff("x", 0, None, None) is None


def test_the_report_shows_the_zoom_section_escaped() -> None:
    html = render_html(with_forensics(make_report(Result.FAIL)))
    assert 'id="zoom"' in html
    assert "blocks.1.&lt;mix&gt;" in html and "blocks.1.<mix>" not in html
    assert "encloses the origin" in html and "DDP bucket layouts differ" in html
    assert "num_threads" in html
    lines = zoom_lines(make_zoom())
    assert lines[0].startswith("zoom of step 7:") and any("origin" in ln for ln in lines)


def test_metrics_carry_the_differing_tensors_and_one_origin_series_per_run() -> None:
    registry = CollectorRegistry()
    metrics = QualificationMetrics(registry)
    report = with_forensics(make_report(Result.FAIL))
    metrics.record(report, namespace="ml")
    text = generate_latest(registry).decode()
    assert "resumequal_first_divergence_differing_tensors{" in text
    assert 'origin="blocks.1.<mix>",origin_kind="module"' in text
    # Recorded again with another origin: the old series goes.
    zoom = report.zoom
    assert zoom is not None
    moved = report.model_copy(update={"zoom": zoom.model_copy(update={
        "origin_kind": "reduction", "origins": ["reduced_grads"]})})
    metrics.record(moved, namespace="ml")
    text = generate_latest(registry).decode()
    assert text.count("resumequal_zoom_origin_info{") == 1 and 'origin="reduced_grads"' in text
    metrics.forget("ml", report.run)
    assert "resumequal_zoom_origin_info{" not in generate_latest(registry).decode()


def test_microsteps_only_one_replay_ran_are_not_compared() -> None:
    """A replay from a mid-step checkpoint runs the step's later microsteps only."""
    control = _chain(T([3.0, 5.0]), T([6.0, 10.0]))
    early = [dict(c, microstep=0) for c in control["calls"]]
    late = [dict(c, microstep=1) for c in control["calls"]]
    control["calls"] = early + late
    resumed = _chain(T([3.0, 5.0]), T([6.0, 10.0]))
    resumed["calls"] = [dict(c, microstep=1) for c in resumed["calls"]]
    found = compare_captures({0: control}, {0: resumed})
    assert found.modules == [] and found.origin_kind == "none"


# -- the headline: where the difference enters ----------------------------------------------

REPLAYS = [ZoomReplay(leg=leg, attempt=a, start=None, world_size=1, reproduced=True,
                      detail="") for leg, a in (("control", 0), ("preempted", 1))]
EQUAL = _chain(T([3.0, 5.0]), T([6.0, 10.0]))


def _headline(resumed: dict[str, Any], control: dict[str, Any] | None = None,
              replays: list[ZoomReplay] = REPLAYS) -> tuple[str, str]:
    found = compare_captures({0: control or EQUAL}, {0: resumed})
    return found.origin_kind, summary(5, found, replays)


def test_inputs_that_already_differ_put_the_difference_before_the_model() -> None:
    # A different batch: the model's (and a's) inputs differ, and everything after them.
    resumed = _chain(T([3.0, 5.5]), T([6.0, 11.0]), a_in=T([1.0, 2.5]), back=T([0.5, 0.6]))
    resumed["calls"][0]["outputs"] = [T([2.0, 5.0])]
    for forward in resumed["calls"][1:3]:
        forward["inputs"] = [T([2.0, 5.0])]
    kind, text = _headline(resumed)
    assert kind == "input"
    assert "the difference enters before the model" in text
    assert "data path" in text and "loss_fn" in text
    assert "equal in every captured tensor" not in text
    assert not any(name in text for name in ("outer.b", "module (", "origin"))


def test_equal_outputs_with_different_gradients_back_put_it_in_loss_fn() -> None:
    resumed = _chain(T([3.0, 5.0]), T([6.0, 10.0]), back=T([0.5, 0.7]))
    for backward in resumed["calls"][5:7]:  # the model's and c's: what reaches c's outputs
        backward["inputs"] = [T([1.5])]
    kind, text = _headline(resumed)
    assert kind == "loss_fn"
    assert "the difference enters in loss_fn" in text and "outputs are equal" in text
    assert "equal in every captured tensor" not in text


def test_a_module_origin_is_named() -> None:
    kind, text = _headline(_chain(T([3.0, 5.000001]), T([6.0, 10.000002]),
                                  back=T([0.5, 0.4])))
    assert kind == "module"
    assert text.startswith("step 5 first differs in 1 module (outer.b): its inputs were equal")


def test_equal_model_and_gradients_with_different_parameters_after_is_the_optimizer() -> None:
    control = _chain(T([3.0, 5.0]), T([6.0, 10.0]))
    resumed = _chain(T([3.0, 5.0]), T([6.0, 10.0]))
    for capture, after in ((control, 0.8), (resumed, 0.9)):
        capture["stages"]["clipped_grads"] = dict(capture["stages"]["reduced_grads"])
        capture["stages"]["params"] = {"a.w": T([after]), "c.w": T([2.0])}
    kind, text = _headline(resumed, control)
    assert kind == "optimizer" and "the difference enters in the optimizer" in text
    assert "the model and the gradients it took are equal" in text


def test_equal_replays_say_so_and_unplaced_differences_do_not() -> None:
    kind, text = _headline(_chain(T([3.0, 5.0]), T([6.0, 10.0])))
    assert (kind, text) == ("none", "the replays of step 5 are equal in every captured tensor")
    # Gradients of a parameter no module owns differ from the first stage on: nothing the
    # replays captured says where that starts, and the headline does not claim equality.
    control, resumed = (_chain(T([3.0, 5.0]), T([6.0, 10.0])) for _ in range(2))
    for capture, value in ((control, 1.0), (resumed, 2.0)):
        for stage in ("local_grads", "reduced_grads", "clipped_grads"):
            capture["stages"][stage] = {**capture["stages"].get(stage, {}), "x.w": T([value])}
    kind, text = _headline(resumed, control)
    assert kind == "none" and "equal in every captured tensor" not in text
    assert "differ (local_grads 1/3, reduced_grads 1/3, clipped_grads 1/1)" in text


def test_a_replay_that_did_not_reproduce_the_step_says_so_first() -> None:
    replays = [REPLAYS[0], REPLAYS[1].model_copy(update={"reproduced": False})]
    _, text = _headline(_chain(T([3.0, 5.0]), T([6.0, 10.0])), replays=replays)
    assert text.startswith("the replay of the preempted leg did not reproduce step 5 as "
                           "recorded; the replays of step 5 are equal")


def test_stages_with_nothing_differing_show_a_dash_and_the_table_says_why() -> None:
    from resumequal.report.zoom import EQUAL, LEGEND, SHAPES, zoom_section
    from resumequal.results.verdict import ZoomStage, ZoomTensor

    shaped = ZoomTensor(name="w", rank=0, numel=4, differ=4, max_abs_diff=None)
    z = make_zoom().model_copy(update={"stages": [
        ZoomStage(name="local_grads", total=6, differ=0, max_abs_diff=None),
        ZoomStage(name="params", total=6, differ=1, max_abs_diff=None, tensors=[shaped]),
        ZoomStage(name="optimizer_state", total=6, differ=2, max_abs_diff=0.5)]})
    html = zoom_section(z)
    rows = html.split("<h3>Stages</h3>")[1].split("</table>")[0]
    assert f"<code>local_grads</code></td><td class=\"num\">0</td><td class=\"num\">6</td>" \
           f"<td class=\"num\">{EQUAL}</td>" in rows
    assert f"<td class=\"num\">{SHAPES}</td>" in rows and "0.5" in rows
    assert LEGEND.split(";")[0] in html

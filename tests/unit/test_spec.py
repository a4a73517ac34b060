"""Unit tests for the qualification spec: defaults, cross-field rules, error messages that
name the field, and loading from files."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from resumequal.spec import (
    BUILTIN_WORKLOADS,
    CheckpointSpec,
    QualificationSpec,
    SpecError,
    WorkloadSpec,
    apply_overrides,
    load_spec,
    parse_spec,
    with_preemption,
)


def _error(data: Any) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return str(info.value)


# --- defaults and digest ---------------------------------------------------------------------


def test_defaults_validate_and_describe_a_runnable_qualification() -> None:
    spec = parse_spec({})
    assert spec == QualificationSpec()
    assert parse_spec(None) == spec
    # The defaults satisfy the rules they are checked against.
    assert spec.preemption.step <= spec.training.steps
    assert spec.preemption.microstep < spec.training.accumulation_steps
    assert spec.preemption.rank < spec.world.world_size
    assert any(spec.checkpoint.saves_after(s, spec.training.steps)
               for s in range(1, spec.preemption.step))
    assert spec.timeouts.arm_seconds < spec.timeouts.process_group_seconds
    assert spec.workload.name in BUILTIN_WORKLOADS
    # A dump of the defaults validates back to the same spec.
    assert parse_spec(spec.model_dump(mode="json")) == spec


def test_preemption_kills_the_worker_process_unless_told_to_delete_its_pod() -> None:
    assert QualificationSpec().preemption.target == "process"
    assert parse_spec({"preemption": {"target": "pod"}}).preemption.target == "pod"


def test_digest_is_stable_and_ignores_key_order() -> None:
    a = parse_spec({"training": {"steps": 10, "seed": 3}, "world": {"nprocPerNode": 2}})
    b = parse_spec({"world": {"nprocPerNode": 2}, "training": {"seed": 3, "steps": 10}})
    assert a.digest() == a.digest() == b.digest()
    assert len(a.digest()) == 64 and int(a.digest(), 16) >= 0


@pytest.mark.parametrize(
    "change",
    [
        {"training": {"seed": 1235}},
        {"training": {"optimizer": {"lr": 1e-3}}},
        {"world": {"nprocPerNode": 3}},
        {"workload": {"params": {"hidden": 16}}},
        {"checkpoint": {"atSteps": [2]}},
        {"ddp": {"reducerPrime": False}},
    ],
)
def test_digest_changes_when_a_field_changes(change: dict[str, Any]) -> None:
    assert parse_spec(change).digest() != parse_spec({}).digest()


def test_fp32_digests_are_those_of_specs_written_before_precision_existed() -> None:
    # Run folders made before training.precision existed still belong to their spec.
    assert parse_spec({}).digest() == (
        "2e5a240062b23c200a66a0ecffe436de197a8b73a3d11927812ddf4bc175350e")
    assert parse_spec({"training": {"steps": 10}}).digest() == (
        "6dcb720a4f6809d420a94c198fff5e6ed4cf79a9d5924349a2209e64864c4a0c")
    digests = {parse_spec({"training": t}).digest() for t in (
        {}, {"precision": "bf16"}, {"precision": "fp16"},
        {"precision": "fp16", "gradScaler": {"growthInterval": 3}})}
    assert len(digests) == 4


def test_compile_is_off_by_default_and_keeps_the_digests_of_specs_without_it() -> None:
    spec = parse_spec({})
    assert (spec.compile.enabled, spec.compile.mode, spec.compile.cache) == (
        False, "default", "shared")
    assert parse_spec({"compile": {"enabled": False}}).digest() == (
        "2e5a240062b23c200a66a0ecffe436de197a8b73a3d11927812ddf4bc175350e")
    digests = {parse_spec({"compile": c}).digest() for c in (
        {}, {"enabled": True}, {"enabled": True, "mode": "max-autotune"},
        {"enabled": True, "cache": "fresh"}, {"enabled": True, "cache": "per-rank"})}
    assert len(digests) == 5
    assert apply_overrides(spec, ["compile.enabled=true", "compile.cache=per-rank"]) \
        .compile.cache == "per-rank"


@pytest.mark.parametrize(("field", "value"), [("mode", "max-autotune"), ("cache", "fresh")])
def test_compile_settings_without_enabled_are_refused_naming_the_field(
        field: str, value: str) -> None:
    msg = _error({"compile": {field: value}})
    assert msg.startswith(f"spec: compile: compile.{field} is set but compile.enabled is false")


def test_an_unknown_compile_cache_lists_the_policies() -> None:
    msg = _error({"compile": {"enabled": True, "cache": "global"}})
    assert msg.startswith("spec: compile.cache: ")
    for policy in ("shared", "per-rank", "fresh"):
        assert f"'{policy}'" in msg


# --- precision -------------------------------------------------------------------------------


def test_precision_is_fp32_by_default_and_reads_in_either_spelling() -> None:
    assert QualificationSpec().training.precision == "fp32"
    spec = parse_spec({"training": {"precision": "fp16",
                                    "grad_scaler": {"init_scale": 256, "growthInterval": 5}}})
    s = spec.training.grad_scaler
    assert (spec.training.precision, s.init_scale, s.growth_interval) == ("fp16", 256.0, 5)
    dumped = spec.model_dump(mode="json")["training"]
    assert dumped["precision"] == "fp16" and dumped["gradScaler"]["initScale"] == 256.0
    assert parse_spec(spec.model_dump(mode="json")) == spec
    assert apply_overrides(QualificationSpec(), ["training.precision=bf16"]) \
        .training.precision == "bf16"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_grad_scaler_without_fp16_is_refused_naming_both_fields(precision: str) -> None:
    msg = _error({"training": {"precision": precision, "gradScaler": {"growthInterval": 9}}})
    assert msg.startswith("spec: training: training.gradScaler is set but "
                          f"training.precision is {precision}")
    # The scaler's defaults (what every dump writes) are fine with any precision.
    parse_spec({"training": {"precision": precision, "gradScaler": {"growthInterval": 2}}})


@pytest.mark.parametrize(
    ("field", "value"),
    [("initScale", 0), ("initScale", 2.0**65), ("growthFactor", 1.0), ("backoffFactor", 1.0),
     ("backoffFactor", 0), ("growthInterval", 0), ("initScale", float("inf"))],
)
def test_grad_scaler_bounds_name_the_field(field: str, value: float) -> None:
    msg = _error({"training": {"precision": "fp16", "gradScaler": {field: value}}})
    assert msg.startswith(f"spec: training.gradScaler.{field}: ")


@pytest.mark.parametrize(
    "change",
    [
        {"preemption": {"mode": "graceful"}},
        {"preemption": {"target": "pod"}},
        {"timeouts": {"armSeconds": 5}},
        {"comparison": {"boundaries": ["loss"]}},
        {"controls": {"enabled": False}},
        {"matrix": {"seeds": [1, 2]}},
    ],
)
def test_digest_ignores_what_legs_of_one_run_differ_in(change: dict[str, Any]) -> None:
    assert parse_spec(change).digest() == parse_spec({}).digest()


def test_comparison_boundaries_keep_execution_order_and_need_one() -> None:
    spec = parse_spec({"comparison": {"boundaries": ["params", "inputs"]}})
    assert spec.comparison.boundaries == ["inputs", "params"]
    assert "at least one boundary" in _error({"comparison": {"boundaries": []}})


def test_matrix_seeds_must_be_distinct() -> None:
    assert "matrix.seeds" in _error({"matrix": {"seeds": [3, 3]}})


def test_matrix_scenarios_must_be_distinct() -> None:
    # Each scenario's legs run in a folder named after it: one twice would share it.
    error = _error({"matrix": {"seeds": [1], "scenarios": ["mid-hard", "mid-hard"]}})
    assert "matrix.scenarios" in error and "repeated: mid-hard" in error


def test_every_builtin_workload_the_spec_accepts_has_a_factory() -> None:
    from resumequal.workloads import BUILTIN_FACTORIES

    assert set(BUILTIN_WORKLOADS) == set(BUILTIN_FACTORIES)


def test_with_preemption_validates_the_new_cut() -> None:
    spec = parse_spec({})
    assert with_preemption(spec, mode="graceful").preemption.mode == "graceful"
    with pytest.raises(SpecError, match="after the last step"):
        with_preemption(spec, step=99)


# --- cross-field rules -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "words"),
    [
        pytest.param(
            {"training": {"steps": 5}, "preemption": {"step": 6}},
            "preemption.step=6 is after the last step (training.steps=5)",
            id="step-after-last",
        ),
        pytest.param(
            {"training": {"accumulationSteps": 2}, "preemption": {"microstep": 2}},
            "preemption.microstep=2 must be < training.accumulationSteps=2",
            id="microstep-not-in-window",
        ),
        pytest.param(
            {"world": {"nnodes": 2, "nprocPerNode": 2}, "preemption": {"rank": 4}},
            "preemption.rank=4 does not exist in a world of 4",
            id="rank-outside-world",
        ),
        pytest.param(
            {"checkpoint": {"everySteps": 4}, "preemption": {"step": 4, "microstep": 0}},
            "preemption.step=4: a hard kill there lands before the first committed checkpoint",
            id="hard-kill-before-first-checkpoint",
        ),
        pytest.param(
            {"checkpoint": {"everySteps": None}, "preemption": {"step": 6}},
            "preemption.step=6: a hard kill there lands before the first committed checkpoint",
            id="hard-kill-without-periodic-checkpoints",
        ),
        pytest.param(
            {"preemption": {"at": "checkpoint_commit", "step": 8, "microstep": 1}},
            "preemption.microstep must be 0 with at: checkpoint_commit",
            id="commit-cut-mid-accumulation",
        ),
        pytest.param(
            {"preemption": {"at": "checkpoint_commit", "step": 6, "microstep": 0}},
            "preemption.at=checkpoint_commit: no checkpoint is saved after step 6",
            id="commit-cut-without-checkpoint",
        ),
        pytest.param(
            {"timeouts": {"armSeconds": 90, "processGroupSeconds": 90}},
            "timeouts.armSeconds must be < timeouts.processGroupSeconds",
            id="arm-not-shorter-than-process-group",
        ),
        pytest.param(
            {"comparison": {"tolerances": {"loss": 1e-6}}},
            "comparison: tolerances are only used with mode: tolerance",
            id="tolerances-without-mode",
        ),
        pytest.param(
            {"comparison": {"mode": "tolerance", "tolerances": {"params": -1.0}}},
            "comparison.tolerances.params: Input should be greater than or equal to 0",
            id="negative-tolerance",
        ),
    ],
)
def test_cross_field_rule_names_the_field(data: dict[str, Any], words: str) -> None:
    assert words in _error(data)


@pytest.mark.parametrize(
    "data",
    [
        # The neighbours of each rejected case above are accepted.
        {"training": {"steps": 6}, "preemption": {"step": 6}},
        {"training": {"accumulationSteps": 3}, "preemption": {"microstep": 2}},
        {"world": {"nnodes": 2, "nprocPerNode": 2}, "preemption": {"rank": 3}},
        {"checkpoint": {"everySteps": 4}, "preemption": {"step": 5, "microstep": 0}},
        {"checkpoint": {"everySteps": None, "atSteps": [2]}, "preemption": {"step": 3}},
        # A graceful kill writes an emergency checkpoint, so no earlier one is needed.
        {"checkpoint": {"everySteps": None}, "preemption": {"mode": "graceful", "step": 2}},
        {"preemption": {"at": "checkpoint_commit", "step": 8, "microstep": 0}},
        {"checkpoint": {"atSteps": [6]},
         "preemption": {"at": "checkpoint_commit", "step": 6, "microstep": 0}},
        {"timeouts": {"armSeconds": 89.5, "processGroupSeconds": 90}},
        {"comparison": {"mode": "tolerance", "tolerances": {"loss": 0.0, "params": 1e-6}}},
    ],
)
def test_neighbouring_valid_specs_pass(data: dict[str, Any]) -> None:
    spec = parse_spec(data)
    assert spec.model_dump(mode="json") == parse_spec(spec.model_dump(mode="json")).model_dump(
        mode="json"
    )


def test_commit_cut_on_the_last_step_is_allowed_without_periodic_checkpoints() -> None:
    spec = parse_spec({
        "training": {"steps": 6},
        "checkpoint": {"everySteps": None, "atSteps": [2]},
        "preemption": {"at": "checkpoint_commit", "step": 6, "microstep": 0},
    })
    assert spec.checkpoint.saves_after(6, 6)


def test_unknown_tolerance_boundary_lists_the_boundaries() -> None:
    msg = _error({"comparison": {"mode": "tolerance", "tolerances": {"weights": 0.1}}})
    assert "comparison.tolerances.weights" in msg
    for boundary in ("inputs", "loss", "local_grads", "params", "optimizer_state"):
        assert f"'{boundary}'" in msg


# --- field errors ----------------------------------------------------------------------------


def test_unknown_top_level_field_lists_the_sections() -> None:
    msg = _error({"trainig": {"steps": 3}})
    assert msg == (
        "spec: trainig: unknown field; allowed: checkpoint, comparison, compile, controls, ddp, "
        "matrix, parallelism, preemption, timeouts, training, workload, world, zoom"
    )


def test_unknown_nested_field_lists_that_sections_fields() -> None:
    msg = _error({"training": {"optimizer": {"beta1": 0.9}}})
    assert msg == (
        "spec: training.optimizer.beta1: unknown field; allowed: betas, eps, lr, momentum, "
        "name, weightDecay"
    )


def test_every_bad_field_is_reported_on_its_own_line() -> None:
    lines = _error({"training": {"steps": 0, "seedd": 1}, "world": {"backend": "mpi"}})
    paths = sorted(line.split(": ")[1] for line in lines.splitlines())
    assert paths == ["training.seedd", "training.steps", "world.backend"]


@pytest.mark.parametrize(
    ("data", "path", "allowed"),
    [
        ({"world": {"backend": "mpi"}}, "world.backend", ("auto", "gloo", "nccl")),
        ({"preemption": {"mode": "soft"}}, "preemption.mode", ("hard", "graceful")),
        ({"preemption": {"at": "step"}}, "preemption.at", ("microbatch", "checkpoint_commit")),
        ({"preemption": {"target": "node"}}, "preemption.target", ("process", "pod")),
        ({"comparison": {"mode": "approx"}}, "comparison.mode", ("exact", "tolerance")),
        ({"training": {"optimizer": {"name": "lion"}}}, "training.optimizer.name",
         ("adamw", "adam", "sgd")),
        ({"training": {"precision": "fp8"}}, "training.precision", ("fp32", "bf16", "fp16")),
    ],
)
def test_literal_error_lists_allowed_values(
    data: dict[str, Any], path: str, allowed: tuple[str, ...]
) -> None:
    msg = _error(data)
    assert msg.startswith(f"spec: {path}: ")
    for value in allowed:
        assert f"'{value}'" in msg


def test_range_error_names_the_field() -> None:
    assert _error({"training": {"steps": 0}}).startswith("spec: training.steps: ")
    assert _error({"checkpoint": {"atSteps": [3, 0]}}) == (
        "spec: checkpoint.atSteps.1: Input should be greater than or equal to 1"
    )


def test_bad_workload_name_lists_builtins() -> None:
    msg = _error({"workload": {"name": "resnet"}})
    assert msg.startswith("spec: workload.name: unknown workload 'resnet'")
    for name in BUILTIN_WORKLOADS:
        assert name in msg
    assert "module:function" in msg


@pytest.mark.parametrize("name", ["my_pkg.train:build", "m:f", "a.b.c:make_workload_2"])
def test_factory_names_are_accepted(name: str) -> None:
    spec = WorkloadSpec(name=name)
    assert spec.is_factory and spec.name == name


@pytest.mark.parametrize("name", ["mod:", ":build", "mod:1build", "mod:a.b", "mod:build-it"])
def test_malformed_factory_names_are_rejected(name: str) -> None:
    msg = _error({"workload": {"name": name}})
    assert msg == (
        f"spec: workload.name: factory must look like 'package.module:function', got {name!r}"
    )


def test_builtin_workload_is_not_a_factory() -> None:
    assert not WorkloadSpec(name="dropout-mlp").is_factory


@pytest.mark.parametrize("data", [[1, 2], "steps: 3", 7])
def test_non_mapping_spec_is_rejected(data: Any) -> None:
    assert _error(data) == f"spec: the spec must be a mapping, got {type(data).__name__}"


# --- spellings: camelCase written, both read -------------------------------------------------


def _keys(value: Any, path: str = "") -> list[str]:
    if isinstance(value, dict):
        return [k for key, v in value.items() for k in [f"{path}{key}", *_keys(v, f"{path}{key}.")]]
    return []


def test_every_field_is_written_in_camel_case() -> None:
    # Every section and field, nested ones included: a field added later gets its camelCase
    # spelling from the alias generator, or this fails.
    spec = parse_spec({"checkpoint": {"store": "s3://b/p", "s3": {"endpointUrl": "http://h:9"}}})
    keys = _keys(spec.model_dump(mode="json"))
    assert "world.nprocPerNode" in keys and "checkpoint.s3.endpointUrl" in keys
    assert [k for k in keys if "_" in k] == []


def test_snake_case_and_camel_case_read_the_same() -> None:
    snake = parse_spec({"world": {"nproc_per_node": 3, "threads_per_rank": 2},
                        "checkpoint": {"every_steps": 2, "keep_last": 1, "async_save": True},
                        "timeouts": {"arm_seconds": 30}})
    camel = parse_spec({"world": {"nprocPerNode": 3, "threadsPerRank": 2},
                        "checkpoint": {"everySteps": 2, "keepLast": 1, "async": True},
                        "timeouts": {"armSeconds": 30}})
    assert snake == camel
    assert snake.world.nproc_per_node == 3 and snake.checkpoint.async_save


def test_a_field_given_in_both_spellings_is_refused() -> None:
    assert _error({"world": {"nprocPerNode": 2, "nproc_per_node": 3}}) == (
        "spec: world.nproc_per_node: given twice, as nprocPerNode and nproc_per_node")


def test_errors_name_fields_in_camel_case_whichever_spelling_was_read() -> None:
    for key in ("nproc_per_node", "nprocPerNode"):
        assert _error({"world": {key: 0}}).startswith("spec: world.nprocPerNode: ")
    assert _error({"checkpoint": {"store": "s3://b/p", "s3": {"max_attempts": 99}}}).startswith(
        "spec: checkpoint.s3.maxAttempts: ")


def test_set_takes_either_spelling_and_writes_one_key() -> None:
    spec = parse_spec({})
    for path in ("world.nproc_per_node", "world.nprocPerNode"):
        assert apply_overrides(spec, [f"{path}=3"]).world.nproc_per_node == 3
    # Both spellings name one field: the later override wins, nothing is given twice.
    both = apply_overrides(spec, ["world.nproc_per_node=3", "world.nprocPerNode=4"])
    assert both.world.nproc_per_node == 4
    with pytest.raises(SpecError, match=r"--set: world.nprocs: unknown field; allowed: "
                                        r"backend, launcher, maxRestarts, nnodes, nprocPerNode"):
        apply_overrides(spec, ["world.nprocs=3"])


def test_with_preemption_takes_python_names() -> None:
    spec = parse_spec({})
    cut = with_preemption(spec, mode="graceful", grace_seconds=5)
    assert (cut.preemption.mode, cut.preemption.grace_seconds) == ("graceful", 5)


# --- CheckpointSpec.saves_after --------------------------------------------------------------


def _saves(spec: CheckpointSpec, last: int) -> list[int]:
    return [s for s in range(1, last + 1) if spec.saves_after(s, last)]


def test_saves_after_every_steps_and_the_last_step() -> None:
    assert _saves(CheckpointSpec(every_steps=4), 12) == [4, 8, 12]
    assert _saves(CheckpointSpec(every_steps=5), 12) == [5, 10, 12]


def test_saves_after_at_steps_only() -> None:
    spec = CheckpointSpec(every_steps=None, at_steps=[5, 3, 3])
    assert spec.at_steps == [3, 5]
    assert _saves(spec, 9) == [3, 5, 9]


def test_saves_after_at_steps_and_every_steps_combine() -> None:
    assert _saves(CheckpointSpec(every_steps=6, at_steps=[1, 6]), 13) == [1, 6, 12, 13]


def test_last_step_is_always_saved() -> None:
    assert _saves(CheckpointSpec(every_steps=None), 7) == [7]


# --- load_spec -------------------------------------------------------------------------------


_DATA: dict[str, Any] = {
    "workload": {"name": "dropout-mlp", "params": {"hidden": 16}},
    "training": {"steps": 8, "accumulationSteps": 2},
    "preemption": {"step": 5, "microstep": 1, "rank": 0},
}


def test_load_spec_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(_DATA))
    spec = load_spec(path)
    assert spec == parse_spec(_DATA)
    assert spec.workload.params == {"hidden": 16}
    assert (spec.training.steps, spec.preemption.step) == (8, 5)


def test_load_spec_from_json(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(_DATA))
    assert load_spec(str(path)) == parse_spec(_DATA)


def test_empty_file_is_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_spec(path) == QualificationSpec()


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(SpecError, match=re.escape(f"spec file not found: {path}")):
        load_spec(path)


def test_directory_is_not_readable(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=re.escape(f"cannot read spec file {tmp_path}")):
        load_spec(tmp_path)


def test_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("training: {steps: [1, 2\n")
    with pytest.raises(SpecError, match=re.escape(f"{path}: not valid YAML/JSON")):
        load_spec(path)


def test_binary_file_is_a_spec_error(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage\x80")
    with pytest.raises(SpecError, match=re.escape(f"{path}: not valid YAML/JSON")):
        load_spec(path)


def test_non_mapping_file(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- training\n- world\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(info.value) == f"{path}: the spec must be a mapping, got list"


def test_field_errors_from_a_file_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("training:\n  steps: 4\npreemption:\n  step: 9\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(info.value).startswith(f"{path}: ")
    assert "preemption.step=9 is after the last step (training.steps=4)" in str(info.value)

"""tools/compat.py, the parts that need no venv: each feature's spec, how a run's outcome is
read (a refusal is not a failure), and the table. `make compat` runs the rest for real."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from resumequal.spec import QualificationSpec, apply_overrides
from resumequal.spec.capabilities import NotSupported, TorchInfo, check_supported

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compat_tool", ROOT / "tools/compat.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def test_every_feature_is_a_valid_spec_that_turns_on_what_it_names(tool: ModuleType) -> None:
    specs = {name: apply_overrides(QualificationSpec(), list(sets))
             for name, sets in tool.FEATURES.items()}
    assert specs["default"] == QualificationSpec()
    assert specs["fsdp2-bf16"].parallelism.kind == "fsdp2"
    assert specs["fsdp2-bf16"].training.precision == "bf16"
    assert specs["compile"].compile.enabled
    assert specs["loader"].workload.loader is not None
    assert specs["resize"].preemption.resize is not None
    assert specs["async-save"].checkpoint.async_save
    assert specs["fp16"].training.precision == "fp16"


def test_a_refusal_is_told_from_an_error_by_resumequals_own_message(
    tool: ModuleType, tmp_path: Path
) -> None:
    spec = apply_overrides(QualificationSpec(), list(tool.FEATURES["fsdp2-bf16"]))
    with pytest.raises(NotSupported) as caught:
        check_supported(spec, TorchInfo.of_version("2.6.0"))
    said = f"error: {caught.value}\n"  # what `resumequal run` prints
    assert tool._result(2, tmp_path / "run", said) == "refused"
    assert tool._result(2, tmp_path / "run", "error: spec file not found\n") == "error"
    assert tool._result(1, tmp_path / "run", said) == "error"  # a refusal exits 2


def test_a_run_that_judged_is_what_its_verdict_says(tool: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "verdict.json").write_text(json.dumps({"result": "INVALID",
                                                       "reason": "LegFailed: control"}))
    assert tool._result(2, tmp_path, "") == "INVALID"
    assert tool._detail(tmp_path, "") == "LegFailed: control"


def test_only_pass_or_a_refused_feature_passes_and_the_default_must_pass(
    tool: ModuleType,
) -> None:
    refused, passing = tool.Outcome("refused", 5.0), tool.Outcome("PASS", 200.0)
    assert tool.passed("fsdp2-bf16", refused) and tool.passed("default", passing)
    assert not tool.passed("default", refused)
    for result in ("FAIL", "INVALID", "NONDETERMINISTIC", "error"):
        assert not tool.passed("compile", tool.Outcome(result, 1.0))


def test_the_table_has_a_row_per_pin_and_notes_what_did_not_pass(tool: ModuleType) -> None:
    results = {"2.6.0": {"default": tool.Outcome("PASS", 202.4),
                         "fsdp2-bf16": tool.Outcome("refused", 5.0, "error: no fsdp2")}}
    assert tool.table(results, ["default", "fsdp2-bf16"]) == (
        "| torch | default | fsdp2-bf16 |\n"
        "|---|---|---|\n"
        "| 2.6.0 | PASS 3m22s | refused 0m05s |\n"
        "\n"
        "- 2.6.0 fsdp2-bf16: error: no fsdp2\n")

"""tools/spec_docs.py: the committed spec reference and JSON Schemas are what the models
give, every spec field is described, and what resumequal writes validates against them."""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest

from resumequal.report.files import REPORT_JSON, VERDICT_JSON, write_reports
from resumequal.results.verdict import Report, Result
from tests.unit.report_samples import (
    make_controls_report,
    make_matrix_report,
    make_report,
    make_resize_report,
    make_zoom,
)

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs/reference"


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spec_docs_tool", ROOT / "tools/spec_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def _schema(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((REFERENCE / name).read_text())
    return schema


def test_the_committed_spec_reference_is_what_the_models_give(tool: ModuleType) -> None:
    committed = (REFERENCE / "spec.md").read_text()
    assert committed == tool.render_spec(), "stale: run python tools/spec_docs.py"


@pytest.mark.parametrize("name", ["verdict.schema.json", "report.schema.json"])
def test_the_committed_schemas_are_what_the_models_give(tool: ModuleType, name: str) -> None:
    committed = (REFERENCE / name).read_text()
    assert committed == tool.render_schema(tool.SCHEMAS[name]), \
        "stale: run python tools/spec_docs.py"


def test_nothing_is_stale(tool: ModuleType) -> None:
    assert tool.stale() == []


def test_every_spec_field_has_a_description(tool: ModuleType) -> None:
    rows = tool.all_rows()
    undescribed = [row.path for row in rows if not row.description.strip()]
    assert undescribed == []
    # Every field of the spec is in the reference, nested sections included.
    paths = {row.path for row in rows}
    assert {"world.nprocPerNode", "preemption.step", "preemption.rank", "preemption.mode",
            "preemption.target", "checkpoint.everySteps", "checkpoint.async",
            "preemption.resize.toNodes", "workload.loader.workers", "spec.stack.image",
            "spec.tolerations[].key"} <= paths


def test_the_reference_names_types_and_defaults(tool: ModuleType) -> None:
    rows = {row.path: row for row in tool.all_rows()}
    assert rows["preemption.mode"].type == "one of `hard`, `graceful`"
    assert rows["preemption.mode"].default == "`hard`"
    assert rows["checkpoint.everySteps"].type == "integer or null"
    assert rows["preemption.resize.toNodes"].default == "required"
    assert rows["training.optimizer"].default == "(section)"


REPORTS: dict[str, Callable[[], Report]] = {
    **{result.value: functools.partial(make_report, result) for result in Result},
    "zoom": lambda: make_report(Result.FAIL).model_copy(update={"zoom": make_zoom()}),
    "controls": make_controls_report,
    "matrix": make_matrix_report,
    "resize": make_resize_report,
}


@pytest.mark.parametrize("name", REPORTS)
def test_what_resumequal_writes_validates_against_the_schemas(
        tmp_path: Path, name: str) -> None:
    paths = write_reports(REPORTS[name](), tmp_path / "run")
    for filename, schema_name in ((REPORT_JSON, "report.schema.json"),
                                  (VERDICT_JSON, "verdict.schema.json")):
        schema = _schema(schema_name)
        jsonschema.Draft202012Validator.check_schema(schema)
        # NaN and Infinity are written as JSON constants, which json.loads reads.
        document = json.loads(paths[filename].read_text())
        jsonschema.Draft202012Validator(schema).validate(document)


def test_the_schema_refuses_what_is_not_a_report() -> None:
    validator = jsonschema.Draft202012Validator(_schema("verdict.schema.json"))
    document = json.loads(make_report(Result.PASS).verdict.model_dump_json())
    document["result"] = "MAYBE"
    assert not validator.is_valid(document)
    del document["result"]
    assert not validator.is_valid(document)

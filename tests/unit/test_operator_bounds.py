"""A QualificationRun is bounded like a spec, in the model and in the CRD the API server
checks; ``resumequal-operator render`` reads YAML as the CLI does and exits 2 on bad input."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from resumequal_operator.main import main
from resumequal_operator.validation import RunSpecError, parse_run_spec
from testing.k8s_schemas import validate_qualificationrun
from tests.unit.test_spec_bounds import ALIAS_BOMB, DEEP

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qualificationrun.yaml"


@pytest.fixture
def run() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return loaded


def _set(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    node = out
    *parents, last = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return out


def _problems(spec: Any) -> dict[str, str]:
    with pytest.raises(RunSpecError) as info:
        parse_run_spec(spec)
    return {p.path: p.message for p in info.value.problems}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("spec.world.nnodes", 2**31),
        ("spec.training.steps", 10**14),
        ("spec.training.seed", 2**63),
        ("spec.timeouts.legSeconds", 1e300),
        ("spec.timeouts.armSeconds", 1e300),
        ("spec.preemption.graceSeconds", 1e300),
        ("spec.tolerations", [{"key": "k", "operator": "Exists"}] * 100),
        ("spec.nodeSelector", {f"k{i}": "v" for i in range(100)}),
        ("spec.stack.image", "x" * 5000),
    ],
)
def test_each_bound_names_its_field_in_the_model_and_the_crd(
        run: dict[str, Any], path: str, value: Any) -> None:
    bad = _set(run, path, value)
    assert path in _problems(bad["spec"])
    with pytest.raises(AssertionError, match=path.replace(".", r"\.")):
        validate_qualificationrun(bad)


def test_infinite_floats_are_refused(run: dict[str, Any]) -> None:
    bad = _set(run, "spec.comparison", {"mode": "tolerance",
                                        "tolerances": {"loss": float("inf")}})
    assert "spec.comparison.tolerances.loss" in _problems(bad["spec"])


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("s3://b-bucket/x/../y", "a '..' segment"),
        ("s3://b-bucket/x/./y", "a '.' segment"),
        ("s3://b-bucket/x//y", "an empty segment"),
        ("s3://B_Bad/x", "is not a valid S3 bucket name"),
    ],
)
def test_store_uri_segments_are_refused_naming_the_field(
        run: dict[str, Any], uri: str, words: str) -> None:
    problems = _problems(_set(run, "spec.store.uri", uri)["spec"])
    assert words in problems["spec.store.uri"]


def test_store_uri_is_normalised(run: dict[str, Any]) -> None:
    spec = parse_run_spec(_set(run, "spec.store.uri", "s3://runs-bucket/q/")["spec"])
    assert spec.store.uri == "s3://runs-bucket/q"


def test_credentials_in_a_store_uri_are_never_echoed(run: dict[str, Any]) -> None:
    for uri in ("s3://AKIARQTESTDUMMYKEY00:s3cr3t@bucket/x", "gs://user:s3cr3t@bucket/x"):
        with pytest.raises(RunSpecError) as info:
            parse_run_spec(_set(run, "spec.store.uri", uri)["spec"])
        assert "s3cr3t" not in str(info.value)
        assert "AKIARQTESTDUMMYKEY00" not in str(info.value)
        assert [p.path for p in info.value.problems] == ["spec.store.uri"]


# --- render -----------------------------------------------------------------------------------


def _render(text: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["render", "-"], input=text)
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        result.exception
    return result.exit_code, result.stderr


@pytest.mark.timeout(20)
def test_render_refuses_aliases_and_deep_nesting(run: dict[str, Any]) -> None:
    head = yaml.safe_dump(run)
    code, err = _render(head.replace("workload:\n", "workload:\n  params:\n" + "".join(
        f"  {line}\n" for line in ALIAS_BOMB.splitlines()[2:]), 1))
    assert code == 2 and "YAML aliases" in err
    code, err = _render(DEEP)
    assert code == 2 and "nested deeper" in err


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("metadata.name", "a/b", "metadata.name"),
        ("metadata.name", "x" * 300, "metadata.name"),
        ("metadata.namespace", "../kube-system", "metadata.namespace"),
        ("metadata.uid", "a/../b", "metadata.uid"),
    ],
)
def test_render_checks_the_names_that_become_paths(
        run: dict[str, Any], path: str, value: str, field: str) -> None:
    code, err = _render(yaml.safe_dump(_set(run, path, value)))
    assert code == 2, err
    assert f"{field}: must be" in err


def test_render_of_bytes_that_are_not_text_exits_2() -> None:
    result = CliRunner().invoke(main, ["render", "-"], input=b"\xff\xfe\x00kind")
    assert result.exit_code == 2 and "not UTF-8" in result.stderr

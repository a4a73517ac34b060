"""Property-based fuzzing of everything that reads a spec a user wrote: the spec loader
(YAML text, mappings, ``--set`` overrides), the QualificationRun model and
``resumequal-operator render``. Whatever the input: a result or our own error
(SpecError, of which RunSpecError is one), never another exception, never a hang.

Inputs follow the models' own fields (so that they get past the first check and reach the
checks across fields) with edge values mixed in: ints at and beyond every int64 bound,
inf and NaN, URIs with '..' and credentials, YAML aliases and deep nesting, plain junk.
Runs are derandomized so CI sees the same EXAMPLES examples per test every time; each
example must finish within DEADLINE.
"""

from __future__ import annotations

import math
import types
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from resumequal.spec import (
    QualificationSpec,
    SpecError,
    apply_overrides,
    parse_spec,
    spec_from_text,
)
from resumequal_operator.render import render_yaml
from resumequal_operator.resource import QualificationRunSpec
from resumequal_operator.validation import parse_run_spec

EXAMPLES = 200
DEADLINE = timedelta(seconds=5)

fuzz = settings(max_examples=EXAMPLES, deadline=DEADLINE, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
pytestmark = pytest.mark.timeout(120)

JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=8,
)
INTS = st.sampled_from([0, 1, 2, 3, 6, 12, -1, 2**31, 2**63 - 1, 2**63, 2**64, 10**14,
                        10**300]) | st.integers()
FLOATS = st.sampled_from([0.0, -0.0, 1e-300, 1e300, math.inf, -math.inf, math.nan]) | \
    st.floats() | INTS
STRINGS = st.sampled_from([
    "", "tiny-gpt", "dropout-mlp", "pkg.mod:fn", ":", "s3://b/x/../y", "s3://b//y",
    "s3://AKIARQTESTDUMMYKEY00:secret@bucket/x", "s3://runs-bucket/q", "file:///tmp/x",
    "file:///", "http://user:pass@minio:9000", "http://minio:9000", "4Gi", "500m", "x" * 300,
    "\x1b[2J", "ghcr.io/acme/train:1",
]) | st.text(max_size=30)


def for_type(tp: Any) -> st.SearchStrategy[Any]:
    """Plausible values of a field's type, and now and then anything at all."""
    origin = get_origin(tp)
    if origin is Annotated:
        return for_type(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        return st.one_of(*(for_type(a) for a in get_args(tp)))
    if origin is Literal:
        return st.sampled_from(get_args(tp)) | STRINGS
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return for_model(tp)
    if origin in (list, tuple):
        return st.lists(for_type(get_args(tp)[0]), max_size=4)
    if origin is dict:
        key, value = get_args(tp)
        keys = st.sampled_from(get_args(key)) if get_origin(key) is Literal else st.nothing()
        return st.dictionaries(keys | STRINGS, for_type(value), max_size=4)
    simple: dict[Any, st.SearchStrategy[Any]] = {
        int: INTS, float: FLOATS, bool: st.booleans(), str: STRINGS,
        type(None): st.none(),
    }
    return (simple[tp] | JUNK) if tp in simple else JUNK


def for_model(model: type[BaseModel]) -> st.SearchStrategy[dict[str, Any]]:
    required, optional = {}, {}
    for name, field in model.model_fields.items():
        key = field.alias or name
        (required if field.is_required() else optional)[key] = for_type(field.annotation)
    return st.fixed_dictionaries(required, optional=optional)


def one_field_changed(model: type[BaseModel], base: dict[str, Any]) -> st.SearchStrategy[Any]:
    """``base`` (valid) with one field, or one field of one section, set to a fuzzed value:
    what gets past the first checks into the checks across fields and into render."""
    def change(name: str) -> st.SearchStrategy[Any]:
        field = model.model_fields[name]
        key, tp = field.alias or name, field.annotation
        section = base.get(key)
        if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(section, dict):
            inner = one_field_changed(tp, section)
            return inner.map(lambda value: {**base, key: value})
        return for_type(tp).map(lambda value: {**base, key: value})
    return st.sampled_from(sorted(model.model_fields)).flatmap(change)


EXAMPLE = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "examples" / "qualificationrun.yaml").read_text())
SPECS = for_model(QualificationSpec) | one_field_changed(
    QualificationSpec, {k: v for k, v in EXAMPLE["spec"].items()
                        if k in QualificationSpec.model_fields})
RUN_SPECS = for_model(QualificationRunSpec) | one_field_changed(
    QualificationRunSpec, EXAMPLE["spec"])


def _yaml_text(data: Any) -> str:
    return yaml.safe_dump(data, allow_unicode=True)


MUTATIONS = st.sampled_from([
    lambda t: t,
    lambda t: "x: &a [1, 2]\ny: [*a, *a]\n" + t,
    lambda t: "[" * 200 + "]" * 200,
    lambda t: t.replace(": ", ": !!python/object:os.system ", 1),
    lambda t: t[: len(t) // 2],
    lambda t: t + "\n---\n" + t,
])


def _ours_only(call: Any, *args: Any) -> None:
    """The call returns, or raises our error with a message; any other exception fails."""
    try:
        call(*args)
    except SpecError as e:
        assert str(e).strip()


@fuzz
@given(SPECS | JUNK)
def test_parse_spec_raises_only_spec_errors(data: Any) -> None:
    _ours_only(parse_spec, data)


@fuzz
@given(SPECS, MUTATIONS)
def test_spec_text_raises_only_spec_errors(data: dict[str, Any], mutate: Any) -> None:
    _ours_only(spec_from_text, mutate(_yaml_text(data)))


@fuzz
@given(st.text(max_size=200) | st.binary(max_size=200))
def test_arbitrary_text_raises_only_spec_errors(text: str | bytes) -> None:
    _ours_only(spec_from_text, text)


@fuzz
@given(st.lists(st.tuples(
    st.sampled_from(["training.steps", "preemption.step", "world.nnodes", "training.seed",
                     "timeouts.legSeconds", "checkpoint.store", "workload.params",
                     "comparison.tolerances.loss", "a..b", "", "training", "world.x.y"])
    | st.text(max_size=20),
    st.sampled_from(["1e14", ".inf", ".nan", "9223372036854775808", "[*a]", "&a 1",
                     "[" * 100, "s3://b/../x", "{a: 1}", "null"]) | st.text(max_size=20),
), max_size=3))
def test_overrides_raise_only_spec_errors(items: list[tuple[str, str]]) -> None:
    _ours_only(apply_overrides, QualificationSpec(), [f"{p}={v}" for p, v in items])


@fuzz
@given(RUN_SPECS | JUNK)
def test_qualification_run_model_raises_only_run_spec_errors(data: Any) -> None:
    _ours_only(parse_run_spec, data)


@fuzz
@given(RUN_SPECS, st.sampled_from([{"name": "run", "namespace": "ns"}, {"name": "a/b"},
                                   {"name": "r", "uid": "../x"}, {}, None]), MUTATIONS)
def test_render_raises_only_run_spec_errors(spec: dict[str, Any], meta: Any,
                                            mutate: Any) -> None:
    doc = {"apiVersion": "resumequal.dev/v1alpha1", "kind": "QualificationRun",
           "metadata": meta, "spec": spec}
    _ours_only(render_yaml, mutate(_yaml_text(doc)))

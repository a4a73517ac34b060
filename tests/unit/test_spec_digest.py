"""The spec digest: the digests of specs written before are what they were, and every field
added to a digested section since v1 is in the digest's table of later fields."""

from __future__ import annotations

from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import pytest
from pydantic import BaseModel

from resumequal.spec import QualificationSpec, load_spec, parse_spec
from resumequal.spec.digest import ADDED_AFTER_V1, DIGESTED

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# The leaves of the digested sections in v1: digested whatever their value.
V1_FIELDS = frozenset({
    "checkpoint.async", "checkpoint.atSteps", "checkpoint.everySteps", "checkpoint.keepLast",
    "checkpoint.s3.addressingStyle", "checkpoint.s3.connectTimeoutSeconds",
    "checkpoint.s3.endpointUrl", "checkpoint.s3.maxAttempts",
    "checkpoint.s3.readTimeoutSeconds", "checkpoint.s3.region", "checkpoint.s3.signPayloads",
    "checkpoint.store",
    "ddp.bucketCapMb", "ddp.reducerPrime",
    "training.accumulationSteps", "training.deterministicAlgorithms", "training.gradClipNorm",
    "training.microbatchSize", "training.optimizer.betas", "training.optimizer.eps",
    "training.optimizer.lr", "training.optimizer.momentum", "training.optimizer.name",
    "training.optimizer.weightDecay", "training.schedule.gamma", "training.schedule.kind",
    "training.schedule.minLrRatio", "training.schedule.stepSize",
    "training.schedule.warmupSteps", "training.seed", "training.steps",
    "workload.name", "workload.params",
    "world.backend", "world.maxRestarts", "world.nnodes", "world.nprocPerNode",
    "world.threadsPerRank",
})

_RESIZE = {"world": {"nnodes": 2}, "preemption": {"target": "pod", "resize": {"toNodes": 1}},
           "comparison": {"mode": "tolerance",
                          "tolerances": {"loss": 0.1, "grad_norm": 0.1, "params": 0.1}},
           "controls": {"omissions": ["rng"]}}


@pytest.mark.parametrize(("data", "digest"), [
    pytest.param({}, "2e5a240062b23c200a66a0ecffe436de197a8b73a3d11927812ddf4bc175350e",
                 id="defaults"),
    pytest.param({"training": {"steps": 10}},
                 "6dcb720a4f6809d420a94c198fff5e6ed4cf79a9d5924349a2209e64864c4a0c", id="steps"),
    pytest.param({"training": {"precision": "fp16"}},
                 "d9c0d8aad43540f30c5779be31ebf4d5542021e7549cf8a85618dad5fa7a6e21", id="fp16"),
    pytest.param({"training": {"precision": "bf16"}},
                 "df47ef25205ea43156d336cf38ac867980aaf25a4e40d318f79344d135c1d708", id="bf16"),
    pytest.param({"training": {"precision": "fp16", "gradScaler": {"growthInterval": 5}}},
                 "8fd3602de16ad63f8b42402de377e01b42bebc27ae1ddd7bc13547a0a63b76b9",
                 id="scaler"),
    pytest.param({"parallelism": {"kind": "fsdp2"}},
                 "4af8501b41efddc896455fc169f04d7ad51ee5fc773b53844315236a72fcb5fc", id="fsdp2"),
    pytest.param({"compile": {"enabled": True}},
                 "e96949334463fb3fcb9e23ccd5098617bde1f64e28913ef0c5122bfa1bad790a",
                 id="compile"),
    pytest.param({"workload": {"loader": {}}},
                 "a010956cffa28e0ff71b8dd2bbb3ac7acc86231e2044c153132995ff76ec65c7", id="loader"),
    pytest.param({"world": {"launcher": "forked"}},
                 "827794230f408c86184bf2424b7f74fbbba512f1a8c305151c82f63f29f587b6", id="forked"),
    pytest.param(_RESIZE, "209f54c6e53991f7b44cc77d14c531a9a2552d88549e179e094692499e3c3f6a",
                 id="resize"),
    pytest.param({"checkpoint": {"store": "s3://bucket/prefix", "s3": {}}},
                 "4b5d15796c884486ee4737ab3786b0fa3040698486ed3aa46fab2d2719c5328e", id="s3"),
    pytest.param({"training": {"optimizer": {"name": "sgd"}, "schedule": {"kind": "constant"}},
                  "ddp": {"bucketCapMb": 1}},
                 "bf8416ce22e30d0e601798d77303997cf972003c551c1695182466766fc26439", id="sgd"),
])
def test_the_digests_of_specs_written_before_are_unchanged(data: dict[str, Any],
                                                           digest: str) -> None:
    assert parse_spec(data).digest() == digest


def test_the_example_specs_digest_is_unchanged() -> None:
    assert load_spec(EXAMPLES / "hf_causal_lm.yaml").digest() == (
        "6fe3aad2786997af488049be114d69bf7a6d793a36d8d8e7a82e1111c885dc13")


def _model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (through Annotated and ``| None``), or None for a value."""
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) in (Union, UnionType):
        options = [a for a in get_args(annotation) if a is not type(None)]
        annotation = options[0] if len(options) == 1 else None
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) \
        else None


def _leaves(model: type[BaseModel], prefix: str, later: set[str]) -> set[str]:
    """The camelCase paths of ``model``'s value fields, a path in ``later`` as one leaf."""
    found = set()
    for name, field in model.model_fields.items():
        path = f"{prefix}{field.alias or name}"
        inner = _model(field.annotation)
        found |= {path} if inner is None or path in later else _leaves(inner, path + ".", later)
    return found


def test_every_field_added_to_a_digested_section_since_v1_is_in_the_table() -> None:
    later = {path for added in ADDED_AFTER_V1 for path in added}
    fields = QualificationSpec.model_fields
    leaves = {leaf for section in DIGESTED for leaf in (
        _leaves(_model(fields[section].annotation) or BaseModel, section + ".", later)
        if section not in later else {section})}
    unknown = leaves - later - V1_FIELDS
    assert not unknown, (f"{sorted(unknown)}: new fields change the digest of every spec "
                         "written before them; add each to digest.ADDED_AFTER_V1")
    assert (later | V1_FIELDS) <= leaves  # neither names a field that is gone


def test_the_table_holds_the_models_defaults() -> None:
    defaults = QualificationSpec().model_dump(mode="json")
    for added in ADDED_AFTER_V1:
        for path, v1 in added.items():
            *parents, leaf = path.split(".")
            node = defaults
            for key in parents:
                node = node[key]
            # A field left out of dumps while unset (checkpoint.gcs) reads as absent.
            assert node.get(leaf) == v1, path


def test_a_later_field_set_away_from_its_v1_value_changes_the_digest() -> None:
    base = parse_spec({}).digest()
    assert parse_spec({"world": {"launcher": "forked"}}).digest() != base
    assert parse_spec({"training": {"precision": "fp16"}}).digest() != parse_spec(
        {"training": {"precision": "fp16", "gradScaler": {"growthInterval": 3}}}).digest()

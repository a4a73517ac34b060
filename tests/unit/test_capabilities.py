"""Features some torch versions lack: the table, the probes, and the refusals of the CLI and
the leg worker, before anything launches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch.distributed.fsdp import FSDPModule

from resumequal import cli
from resumequal.errors import ResumequalError
from resumequal.spec import QualificationSpec, SpecError, apply_overrides, capabilities
from resumequal.spec.capabilities import (
    FEATURES,
    NotSupported,
    TorchInfo,
    check_supported,
    missing_features,
    version_key,
)
from resumequal.train import probes, worker

FSDP2 = apply_overrides(QualificationSpec(), ["parallelism.kind=fsdp2",
                                              "training.precision=bf16"])
OLD = TorchInfo("2.6.0+cu124", frozenset({"fsdp2"}))
FSDP2_REFUSAL = (
    "parallelism.kind=fsdp2 (fsdp2) is not supported by torch 2.6.0+cu124: it needs FSDP2's "
    "custom reduce-scatter (FSDPModule.set_custom_reduce_scatter), first in torch 2.9.0")


@pytest.fixture
def old_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's torch probed as one without FSDP2's custom reduce-scatter."""
    monkeypatch.setattr(probes, "installed_torch", lambda: OLD)


# --- the table -------------------------------------------------------------------------------


def test_a_spec_needs_only_the_features_it_turns_on() -> None:
    everything = TorchInfo("0.0", frozenset(f.name for f in FEATURES))
    assert missing_features(QualificationSpec(), everything) == []
    assert [f.name for f in missing_features(FSDP2, everything)] == ["fsdp2"]


def test_a_torch_that_has_a_feature_runs_a_spec_that_needs_it() -> None:
    assert missing_features(FSDP2, TorchInfo("2.9.1", frozenset())) == []
    check_supported(FSDP2, TorchInfo("2.9.1", frozenset()))


def test_the_refusal_names_the_feature_its_field_the_torch_and_the_first_version() -> None:
    with pytest.raises(NotSupported) as caught:
        check_supported(FSDP2, OLD)
    assert str(caught.value) == FSDP2_REFUSAL
    assert caught.value.features == ("fsdp2",)
    # One of the spec errors: whatever reports a bad spec reports this one too.
    assert isinstance(caught.value, SpecError) and isinstance(caught.value, ResumequalError)


def test_the_refusal_writes_a_field_as_a_spec_does() -> None:
    feature = capabilities.Feature("async", ("checkpoint.async",), lambda s: True, "9.0", "x")
    spec = apply_overrides(QualificationSpec(), ["checkpoint.async=true"])
    assert capabilities.refusal(feature, spec, OLD).startswith(
        "checkpoint.async=true (async) is not supported by torch 2.6.0+cu124")


@pytest.mark.parametrize(("version", "lacks"), [
    ("2.6.0", {"fsdp2"}), ("2.8.0", {"fsdp2"}), ("2.8.0a0+git1234", {"fsdp2"}),
    ("2.9.0", set()), ("2.9.1+cu128", set()), ("2.13.0+cpu", set()), ("2.14", set()),
    ("3.0.0", set()),
])
def test_a_version_lacks_what_came_after_it(version: str, lacks: set[str]) -> None:
    assert TorchInfo.of_version(version).lacks == lacks


def test_versions_compare_as_numbers_not_as_text() -> None:
    assert version_key("2.10.0") > version_key("2.9.1")
    assert version_key("2.6") == (2, 6, 0)
    with pytest.raises(ValueError, match="'latest' is not a torch version"):
        version_key("latest")


# --- the probes ------------------------------------------------------------------------------


def test_every_feature_has_a_probe_and_every_probe_a_feature() -> None:
    assert set(probes.PROBES) == {f.name for f in FEATURES}


def test_the_probes_of_this_torch_agree_with_the_table_for_its_version() -> None:
    # What the operator judges by version is what a leg finds by probing.
    assert probes.installed_torch().lacks == TorchInfo.of_version(torch.__version__).lacks


def test_a_missing_api_is_found_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(FSDPModule, "set_custom_reduce_scatter", raising=False)
    assert probes.installed_torch().lacks == frozenset({"fsdp2"})


# --- refused before anything launches --------------------------------------------------------


def test_validate_exits_2_naming_the_feature_this_torch_lacks(
    old_torch: None, tmp_path: Path, trial_builds: list[str]
) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("parallelism: {kind: fsdp2}\n")
    result = CliRunner().invoke(cli.main, ["validate", str(path)])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == f"error: {FSDP2_REFUSAL}\n"
    # The same spec validates where torch has the feature.
    path.write_text("parallelism: {kind: ddp}\n")
    assert CliRunner().invoke(cli.main, ["validate", str(path)]).exit_code == 0


def test_run_exits_2_naming_the_feature_before_anything_launches(
    old_torch: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from resumequal.local import runner

    launched: list[QualificationSpec] = []
    monkeypatch.setattr(runner, "qualify_here", lambda spec, *_: launched.append(spec))
    result = CliRunner().invoke(cli.main, [
        "run", "--run-dir", str(tmp_path / "q"), "--set", "parallelism.kind=fsdp2"])
    assert result.exit_code == 2
    assert result.stderr == f"error: {FSDP2_REFUSAL}\n"
    assert launched == []
    assert not (tmp_path / "q").exists()


def test_a_leg_refuses_a_feature_its_torch_lacks_before_it_joins_the_group(
    old_torch: None, tmp_path: Path
) -> None:
    # A unit test may open no socket: a leg that went on to its process group would fail
    # with another error than this one.
    with pytest.raises(NotSupported) as caught:
        worker.run_leg(FSDP2, "control", str(tmp_path / "run"), frozenset())
    assert str(caught.value) == FSDP2_REFUSAL
    assert not (tmp_path / "run").exists()


# --- the operator, which cannot probe the image ----------------------------------------------


@pytest.mark.parametrize(("torch_version", "parallelism", "refused"), [
    ("2.6.0", "fsdp2", True), ("2.9.0", "fsdp2", False), (None, "fsdp2", False),
    ("2.6.0", "ddp", False),
])
def test_the_operator_judges_a_run_by_the_torch_its_image_carries(
    torch_version: str | None, parallelism: str, refused: bool
) -> None:
    from resumequal_operator.support import unsupported
    from resumequal_operator.validation import parse_run_spec

    stack = {"image": "ghcr.io/acme/train:1", "torchVersion": torch_version}
    spec = parse_run_spec({"stack": stack, "store": {"uri": "s3://bucket/runs"},
                           "parallelism": {"kind": parallelism}})
    problems = [str(p) for p in unsupported(spec)]
    assert problems == ([f"spec.stack.torchVersion: {FSDP2_REFUSAL}".replace(
        "2.6.0+cu124", "2.6.0")] if refused else [])

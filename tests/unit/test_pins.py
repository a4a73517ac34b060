"""A pin becomes a metrics label that alert templates query by: it is label-safe wherever
one is accepted (a QualificationRun's stack.pin or the image it defaults to, the CRD,
``resumequal run|compare --pin``), and the pins stacks are really named by still are."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from resumequal.cli import main
from resumequal_operator.resource import pin_of
from resumequal_operator.validation import RunSpecError, parse_run_spec
from testing.k8s_schemas import validate_qualificationrun
from testing.operator.harness import run_manifest

STORE = {"uri": "s3://bucket/runs"}
INJECTIONS = [
    "x'} or on() other_team_secret or {__name__='none",
    'x"} or vector(1) or {a="',
    "a b",
    "torch 2.13",
    "-leading-dash",
    "ok\nnext",
    "p" * 129,
]
LEGITIMATE = ["2.13.0+cpu", "pt-2.6-cu124", "torch==2.13.0+cpu", "train:2026-11-29",
              "train@sha256:0123456789ab", "nightly-2026-11-29", "torch-2.13-cu128",
              "2.13.0a0+git1234abc", "torch-nightly", "torch==test", "e2e-nightly"]


@pytest.mark.parametrize("pin", INJECTIONS)
def test_a_pin_that_is_not_label_safe_is_refused_naming_the_field(pin: str) -> None:
    run = run_manifest("r", STORE, stack={"image": "ghcr.io/acme/train:1", "pin": pin})
    with pytest.raises(RunSpecError) as info:
        parse_run_spec(run["spec"])
    assert [p.path for p in info.value.problems] == ["spec.stack.pin"]
    with pytest.raises(AssertionError, match="pin"):  # and so does the API server
        validate_qualificationrun(run)


@pytest.mark.parametrize("pin", LEGITIMATE)
def test_pins_as_stacks_are_named_are_accepted(pin: str) -> None:
    run = run_manifest("r", STORE, stack={"image": "ghcr.io/acme/train:1", "pin": pin})
    assert parse_run_spec(run["spec"]).stack.effective_pin == pin
    validate_qualificationrun(run)


@pytest.mark.parametrize("image", [
    "ghcr.io/acme/train:2026-11-29", "registry.local:5000/team/train:2.13.0-cu124",
    "train@sha256:" + "0123456789abcdef" * 4, "localhost/train", "ghcr.io/acme/train:v1.2_rc3",
])
def test_the_pin_an_image_gives_is_label_safe(image: str) -> None:
    spec = parse_run_spec(run_manifest("r", STORE, stack={"image": image})["spec"])
    assert spec.stack.effective_pin == pin_of(image)


def test_an_unpinned_image_whose_name_is_no_pin_needs_a_pin() -> None:
    image = "ghcr.io/acme/train:v1'}"  # stack.image admits any character but space
    with pytest.raises(RunSpecError) as info:
        parse_run_spec(run_manifest("r", STORE, stack={"image": image})["spec"])
    [problem] = info.value.problems
    assert problem.path == "spec.stack.pin" and "set stack.pin" in problem.message
    pinned = run_manifest("r", STORE, stack={"image": image, "pin": "train-v1"})
    assert parse_run_spec(pinned["spec"]).stack.effective_pin == "train-v1"


@pytest.mark.parametrize("command", ["run", "compare"])
def test_the_cli_refuses_a_pin_that_is_not_label_safe(command: str, tmp_path: Path) -> None:
    args = [command, "--pin", INJECTIONS[0]]
    if command == "compare":
        args.insert(1, str(tmp_path))
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "--pin" in result.output and "a pin is" in result.output
    assert "other_team_secret" not in result.output  # not echoed

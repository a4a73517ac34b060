"""A spec is bounded: every number has a ceiling, floats are finite, checks across fields
do arithmetic rather than walk the steps, store URIs have one spelling, and the YAML a
spec is read from can neither expand nor nest without limit. Bad input exits 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from resumequal import cli
from resumequal.spec import (
    MAX_SEED,
    MAX_STEPS,
    CheckpointSpec,
    SpecError,
    apply_overrides,
    load_spec,
    parse_spec,
    spec_from_text,
    store_uri,
)
from resumequal.spec.yamlread import MAX_CHARS, MAX_DEPTH, YAMLInputError, load_yaml

# 379 bytes that stand for 9**9 strings once expanded.
ALIAS_BOMB = """\
workload:
  params:
    a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
    b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
    c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
    d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
    e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
    f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
    g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
    h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
    i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""
DEEP = "[" * 5000 + "]" * 5000


def _error(data: Any) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return str(info.value)


# --- bounds ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "field"),
    [
        pytest.param({"training": {"steps": 10**14}}, "training.steps", id="steps"),
        pytest.param({"world": {"nnodes": 2**31}}, "world.nnodes", id="nnodes"),
        pytest.param({"world": {"nprocPerNode": 2**31}}, "world.nprocPerNode", id="nproc"),
        pytest.param({"training": {"seed": 2**53}}, "training.seed", id="seed"),
        pytest.param({"matrix": {"seeds": [1, 2**64]}}, "matrix.seeds.1", id="matrix-seed"),
        pytest.param({"timeouts": {"legSeconds": 1e300}}, "timeouts.legSeconds", id="timeout"),
        pytest.param({"timeouts": {"backendErrorSeconds": 1e300}},
                     "timeouts.backendErrorSeconds", id="backend-error-timeout"),
        pytest.param({"preemption": {"graceSeconds": 1e300}}, "preemption.graceSeconds",
                     id="grace"),
        pytest.param({"preemption": {"rank": 2**40}}, "preemption.rank", id="rank"),
        pytest.param({"training": {"accumulationSteps": 10**9}}, "training.accumulationSteps",
                     id="accumulation"),
        pytest.param({"training": {"microbatchSize": 10**12}}, "training.microbatchSize",
                     id="microbatch"),
        pytest.param({"checkpoint": {"atSteps": [10**14]}}, "checkpoint.atSteps.0",
                     id="at-steps"),
        pytest.param({"checkpoint": {"atSteps": list(range(1, 2000))}}, "checkpoint.atSteps",
                     id="at-steps-length"),
        pytest.param({"checkpoint": {"everySteps": 10**14}}, "checkpoint.everySteps",
                     id="every-steps"),
        pytest.param({"ddp": {"bucketCapMb": 1e300}}, "ddp.bucketCapMb", id="bucket"),
        pytest.param({"workload": {"params": {f"p{i}": i for i in range(100)}}},
                     "workload.params", id="params"),
    ],
)
def test_each_bound_names_its_field(data: dict[str, Any], field: str) -> None:
    assert _error(data).startswith(f"spec: {field}: "), _error(data)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        pytest.param("comparison: {mode: tolerance, tolerances: {loss: .inf}}",
                     "comparison.tolerances.loss", id="inf-tolerance"),
        pytest.param("comparison: {mode: tolerance, tolerances: {params: .nan}}",
                     "comparison.tolerances.params", id="nan-tolerance"),
        pytest.param("timeouts: {armSeconds: .inf}", "timeouts.armSeconds", id="inf-timeout"),
        pytest.param("training: {optimizer: {lr: .nan}}", "training.optimizer.lr", id="nan-lr"),
        pytest.param("training: {optimizer: {betas: [0.9, .inf]}}",
                     "training.optimizer.betas.1", id="inf-beta"),
        pytest.param("training: {gradClipNorm: .inf}", "training.gradClipNorm", id="inf-clip"),
    ],
)
def test_floats_are_finite(text: str, field: str) -> None:
    with pytest.raises(SpecError) as info:
        spec_from_text(text)
    assert str(info.value).startswith(f"spec: {field}: "), str(info.value)


def test_the_bounds_themselves_are_accepted() -> None:
    spec = parse_spec({"training": {"steps": MAX_STEPS, "seed": MAX_SEED},
                       "matrix": {"seeds": [0, MAX_SEED]},
                       "timeouts": {"legSeconds": 7 * 24 * 3600}})
    assert spec.training.seed == 2**53 - 1


# --- no work proportional to a field's value -------------------------------------------------


@pytest.mark.timeout(10)
def test_a_cut_at_a_huge_step_without_checkpoints_is_refused_at_once() -> None:
    # It used to walk every step before the cut looking for a checkpoint.
    msg = _error({"training": {"steps": 10**14}, "preemption": {"step": 10**14},
                  "checkpoint": {"everySteps": None}})
    assert "training.steps" in msg


def test_the_hard_kill_check_does_not_walk_the_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = CheckpointSpec.saves_after

    def counting(self: CheckpointSpec, step: int, last_step: int) -> bool:
        calls.append(step)
        return real(self, step, last_step)

    monkeypatch.setattr(CheckpointSpec, "saves_after", counting)
    msg = _error({"training": {"steps": MAX_STEPS}, "preemption": {"step": MAX_STEPS},
                  "checkpoint": {"everySteps": None}})
    assert "lands before the first committed checkpoint" in msg
    assert len(calls) < 10


@pytest.mark.parametrize("every", [None, 1, 3, 4, 7])
@pytest.mark.parametrize("at", [[], [2], [5, 9], [1, 11, 12]])
def test_last_save_before_agrees_with_a_walk(every: int | None, at: list[int]) -> None:
    ck = CheckpointSpec(every_steps=every, at_steps=at)
    last = 12
    for step in range(1, last + 2):
        walked = [s for s in range(1, step) if ck.saves_after(s, last)]
        assert ck.last_save_before(step, last) == (walked[-1] if walked else None), step


# --- store URIs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("s3://b/x/../y", "a '..' segment"),
        ("s3://b/x/./y", "a '.' segment"),
        ("s3://b/x//y", "an empty segment"),
        ("s3://b/..", "a '..' segment"),
        ("file:///tmp/../etc", "a '..' segment"),
        ("s3:///x", "names a bucket"),
        ("s3://b/x?versionId=1", "'?' or '#'"),
        ("s3://b/x\x1b[2J", "control characters"),
        ("az://b/x", "use file:///abs/path, gs://bucket/prefix or s3://bucket/prefix"),
        ("gs:///x", "names a bucket"),
        ("file://host/x", "no host"),
    ],
)
def test_store_uris_name_one_place(uri: str, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("?", r"\?")):
        store_uri(uri)
    msg = _error({"checkpoint": {"store": uri}})
    assert msg.startswith("spec: checkpoint.store: "), msg


def test_store_uris_have_one_spelling() -> None:
    assert store_uri("s3://b/x/") == "s3://b/x"
    assert store_uri("s3://b/") == "s3://b"
    assert store_uri("file:///") == "file:///"
    assert store_uri("file:///tmp/runs/") == "file:///tmp/runs"
    assert parse_spec({"checkpoint": {"store": "s3://b/p/"}}).checkpoint.store == "s3://b/p"
    # A local path stays as written: relative folders are what a laptop run uses.
    assert parse_spec({"checkpoint": {"store": "../runs//x"}}).checkpoint.store == "../runs//x"


def test_a_store_uri_with_credentials_is_refused_without_echoing_them() -> None:
    msg = _error({"checkpoint": {"store": "s3://AKIARQTESTDUMMYKEY00:s3cr3t@bucket/x"}})
    assert msg.startswith("spec: checkpoint.store: holds user:password")
    assert "s3cr3t" not in msg and "AKIARQTESTDUMMYKEY00" not in msg
    msg = _error({"checkpoint": {"store": "gs://user:s3cr3t@bucket/x"}})
    assert "s3cr3t" not in msg


def test_store_options_of_the_cli_are_checked_first(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli.main, ["run", "--store", "s3://b/x/../y"])
    assert result.exit_code == 2
    assert "a '..' segment" in result.output
    result = CliRunner().invoke(cli.main, ["compare", "s3://u:s3cr3t@b/run"])
    assert result.exit_code == 2 and "s3cr3t" not in result.output


# --- YAML ------------------------------------------------------------------------------------


def test_aliases_are_refused_before_anything_expands() -> None:
    assert len(ALIAS_BOMB.encode()) < 400
    with pytest.raises(YAMLInputError, match=r"line 4: YAML aliases \(\*a\) are not accepted"):
        load_yaml(ALIAS_BOMB)
    # An anchor alone expands nothing.
    assert load_yaml("a: &x 1") == {"a": 1}


def test_nesting_is_bounded() -> None:
    assert load_yaml("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    with pytest.raises(YAMLInputError, match=f"nested deeper than {MAX_DEPTH} levels"):
        load_yaml("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    with pytest.raises(YAMLInputError, match="nested deeper"):
        load_yaml(DEEP)
    with pytest.raises(YAMLInputError, match="nested deeper"):
        load_yaml("a:\n" + "".join(f"{'  ' * i}- \n" for i in range(1, 200)))


def test_size_and_odd_values_are_our_errors() -> None:
    with pytest.raises(YAMLInputError, match="longer than"):
        load_yaml("#" * (MAX_CHARS + 1))
    with pytest.raises(YAMLInputError, match="not valid YAML"):
        load_yaml("a: " + "1" * 5000)  # more digits than Python converts to an int
    with pytest.raises(YAMLInputError, match="not valid YAML"):
        load_yaml("a: !!python/object:os.system {}")


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("content", "words"),
    [
        pytest.param(ALIAS_BOMB, "YAML aliases", id="alias-bomb"),
        pytest.param(DEEP, "nested deeper than", id="deep"),
        pytest.param("\xff\xfe\x00", "not valid YAML", id="binary"),
        pytest.param("training: {steps: 1e400}", "training.steps", id="huge-float"),
    ],
)
def test_bad_spec_files_exit_2_without_a_traceback(tmp_path: Path, content: str,
                                                   words: str) -> None:
    path = tmp_path / "spec.yaml"
    path.write_bytes(content.encode("latin-1") if content.startswith("\xff") else
                     content.encode())
    for args in (["validate", str(path)], ["run", "--spec", str(path)]):
        result = CliRunner().invoke(cli.main, args)
        assert result.exit_code == 2, (args, result.output, result.exception)
        assert words in result.output
        assert "Traceback" not in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_folder_or_a_huge_file_is_not_a_spec(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli.main, ["validate", str(tmp_path)])
    assert result.exit_code == 2 and "cannot read spec file" in result.output
    big = tmp_path / "big.yaml"
    big.write_text("#" * (MAX_CHARS + 10))
    with pytest.raises(SpecError, match="longer than"):
        load_spec(big)


def test_set_values_are_read_by_the_same_reader() -> None:
    with pytest.raises(SpecError, match=r"--set 'workload.params=.*nested deeper"):
        apply_overrides(parse_spec({}), ["workload.params=" + DEEP])
    with pytest.raises(SpecError, match="aliases"):
        apply_overrides(parse_spec({}), ["workload.params={a: &a [1], b: *a}"])

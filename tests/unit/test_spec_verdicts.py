"""Every spec the schema accepts ends in a verdict; every spec it refuses, in a SpecError.

Specs are drawn from the schema's own fields — boundary subsets, comparison modes and
tolerances, controls and their subsets, resizes, precisions, accumulation, checkpoint
cadences, cuts and world sizes — with a value now and then that a check across fields
refuses, and read as ``resumequal validate`` reads them (YAML text) or as ``--set`` sets
them. A refused spec must be refused with our SpecError, naming the field (exit code 2 at
the CLI). For an accepted one, the files every leg of its plan would leave are written
(:mod:`tests.unit.synthetic_runs`) as a stack that resumes exactly leaves them, or with a
difference planted in the main leg; the comparator judges them and the report is assembled
and published as the comparator Job does (:func:`resumequal.jobs.comparator.
compare_location`). Never an exception; PASS where the legs agree (or agree within the
declared tolerances); FAIL naming the planted step and boundary; NONDETERMINISTIC for a
difference before the kill; INVALID only where a negative control could not be seen, with
the sentence that says so.

Runs are derandomized; regressions found by the property are kept as examples.
"""

from __future__ import annotations

import json
import random
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

# The CLI's validate loads the trial build (and with it lifeline, which asks ldconfig where
# libc is, a process) on first use: import it here, before the unit guard refuses processes.
import resumequal.local.trial  # noqa: F401
from resumequal import cli
from resumequal.exitcodes import ExitCode, for_error
from resumequal.jobs.comparator import compare_location
from resumequal.qualify.plan import qualification_plan
from resumequal.report.files import read_report
from resumequal.results.verdict import Result, Verdict
from resumequal.spec import (
    OMISSIONS,
    QualificationSpec,
    SpecError,
    apply_overrides,
    spec_from_text,
)
from resumequal.spec.boundaries import BOUNDARIES, BY_NAME, Boundary
from tests.unit.synthetic_runs import (
    OVER,
    Case,
    Plant,
    Resume,
    expected_control,
    write_run,
)

EXAMPLES = 300
pytestmark = [pytest.mark.timeout(240),
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")]

# Hypothesis leans to the first of a list: a tolerance that relaxes something.
TOLERANCES = [1e-3, 0.25, 1e-6, 0.0]
SECTIONS = ("workload", "world", "training", "checkpoint", "preemption", "ddp", "parallelism",
            "comparison", "controls", "matrix", "timeouts", "compile")


# --------------------------------------------------------------------------- specs


def _sometimes(draw: st.DrawFn, p: float) -> bool:
    """True about once in 1/``p`` draws (hypothesis leans to the first of a list: False)."""
    return draw(st.sampled_from([False] * (round(1 / p) - 1) + [True]))


@st.composite
def spec_data(draw: st.DrawFn) -> dict[str, Any]:
    """A spec as a user writes one: mostly consistent, with now and then a value that one
    of the spec's checks across fields must refuse."""
    resize = draw(st.sampled_from([False, False, True]))
    nnodes = draw(st.integers(2, 3) if resize else st.integers(1, 3))
    nproc = draw(st.integers(1, 2))
    world = nnodes * nproc
    steps, accumulation = draw(st.integers(1, 8)), draw(st.integers(1, 4))
    precision = draw(st.sampled_from(["fp32", "bf16", "fp16"]))
    training: dict[str, Any] = {
        "steps": steps, "accumulationSteps": accumulation, "precision": precision,
        "schedule": {"kind": draw(st.sampled_from(["constant", "step", "warmup-cosine"]))},
        "gradClipNorm": draw(st.sampled_from([None, 1.0])),
    }
    if precision == "fp16" or _sometimes(draw, 0.05):
        training["gradScaler"] = {"growthInterval": draw(st.integers(1, 4))}

    at = "microbatch" if resize or _sometimes(draw, 0.75) else "checkpoint_commit"
    step = draw(st.integers(1, steps + (1 if _sometimes(draw, 0.05) else 0)))
    if at == "checkpoint_commit" and not _sometimes(draw, 0.05):
        microstep = 0
    else:
        microstep = draw(st.integers(0, accumulation - (0 if _sometimes(draw, 0.05) else 1)))
    # A hard kill in step 1 lands before any save: mostly graceful there.
    hard = ["hard", "graceful"] if step > 1 or _sometimes(draw, 0.2) else ["graceful"]
    mode = "hard" if resize else draw(st.sampled_from(hard))
    preemption: dict[str, Any] = {
        "at": at, "step": step, "microstep": microstep, "mode": mode,
        "rank": draw(st.integers(0, world - (0 if _sometimes(draw, 0.05) else 1))),
        "target": "pod" if resize else draw(st.sampled_from(["process", "pod"])),
    }

    every = draw(st.sampled_from([None, 1, 2, 3, 4]))
    at_steps = draw(st.lists(st.integers(1, steps), max_size=2))
    if mode == "hard" and step > 1 and not _sometimes(draw, 0.1):
        at_steps.append(draw(st.integers(1, step - 1)))  # a save to resume from
    if at == "checkpoint_commit":
        at_steps.append(step)
    checkpoint: dict[str, Any] = {"everySteps": every, "atSteps": at_steps,
                                  "async": _sometimes(draw, 0.15)}

    comparison: dict[str, Any] = {}
    if resize or draw(st.sampled_from([False, True, True])):
        comparison["mode"] = "tolerance"
        named = draw(st.permutations(BOUNDARIES))[:draw(st.integers(0, 4))]
        if resize and not _sometimes(draw, 0.05):
            named = ["loss", "grad_norm", "params", *named]
        elif draw(st.sampled_from([True, False])):
            named = ["params", *named]  # the gradients' tolerance too, where they have none
        named = list(dict.fromkeys(named))
        comparison["tolerances"] = {b: draw(st.sampled_from(TOLERANCES)) for b in named}
    elif _sometimes(draw, 0.03):
        comparison["tolerances"] = {"loss": 1e-3}  # without mode: tolerance
    subset = draw(st.sampled_from(["all", "some", "clipped", "none"]))
    if subset == "some":
        comparison["boundaries"] = draw(st.lists(st.sampled_from(BOUNDARIES), min_size=1,
                                                 max_size=5))
    elif subset == "clipped":
        comparison["boundaries"] = ["clipped_grads"]
    elif subset == "none" and _sometimes(draw, 0.1):
        comparison["boundaries"] = []

    controls: dict[str, Any] = {"enabled": not _sometimes(draw, 0.2)}
    if not _sometimes(draw, 0.15):  # else every omission, the default
        controls["omissions"] = draw(st.lists(st.sampled_from(OMISSIONS), max_size=4))

    data: dict[str, Any] = {
        "workload": {"name": draw(st.sampled_from(["dropout-mlp", "tiny-gpt"]))},
        "world": {"nnodes": nnodes, "nprocPerNode": nproc},
        "training": training, "checkpoint": checkpoint, "preemption": preemption,
        "comparison": comparison, "controls": controls,
        "parallelism": {"kind": draw(st.sampled_from(["ddp", "ddp", "fsdp2"]))},
    }
    if (not resize and _sometimes(draw, 0.15)) or _sometimes(draw, 0.03):
        data["workload"]["loader"] = {"workers": 0}
    if resize:
        grow = None
        if step < steps and draw(st.booleans()):
            grow = draw(st.integers(step, steps - 1))
            checkpoint["atSteps"].append(grow)
        preemption["resize"] = {"toNodes": nnodes - (1 if not _sometimes(draw, 0.05) else 0),
                                "growAfterStep": grow}
    if _sometimes(draw, 0.05):
        data["ddp"] = {"bucketCapMb": 5.0}
    if _sometimes(draw, 0.05):
        data["matrix"] = {"seeds": [11, 17]}
    return data


def _overrides(data: dict[str, Any]) -> list[str]:
    """The spec as ``--set`` items, one per field of each section (values as JSON)."""
    return [f"{section}.{key}={json.dumps(value)}"
            for section, fields in data.items() for key, value in fields.items()]


def load(data: dict[str, Any], route: str) -> QualificationSpec:
    """Read the spec as ``resumequal validate`` reads a file, or as ``--set`` sets it."""
    if route == "text":
        return spec_from_text(yaml.safe_dump(data), source="spec.yaml")
    return apply_overrides(QualificationSpec(), _overrides(data))


def check_refusal(error: SpecError, data: dict[str, Any], route: str, work: Path) -> None:
    """A refusal names the field it refuses; a spec file's ends ``resumequal validate``
    with exit code 2, saying the same."""
    assert for_error(error) == ExitCode.SPEC_ERROR
    for line in str(error).splitlines():
        source, _, rest = line.partition(": ")
        path, _, message = rest.partition(": ")
        assert source in ("spec.yaml", "--set") and message, line
        named = path.split(".")[0] in SECTIONS or any(
            f"{section}." in message for section in SECTIONS)
        assert named, f"names no field: {line}"
    if route != "text":
        return
    spec_file = work / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(cli.main, ["validate", str(spec_file)])
    assert result.exit_code == ExitCode.SPEC_ERROR, result.output
    assert str(error).splitlines()[0].partition(": ")[2] in result.stderr


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Expected:
    """The main leg's verdict a case must end in, and where its difference is."""

    result: Result
    step: int | None = None
    boundary: Boundary | None = None
    rank: int | None = None
    at_restore: bool = False


def _tolerance(spec: QualificationSpec, boundary: Boundary) -> float | None:
    """The tolerance that relaxes ``boundary`` (its own, else the one it falls back to)."""
    c = spec.comparison
    info = BY_NAME[boundary]
    if c.mode != "tolerance" or info.kind == "exact":
        return None
    tol = c.tolerances.get(boundary)
    if tol is None and info.tolerance_from is not None:
        tol = c.tolerances.get(info.tolerance_from)
    return tol


def choose_case(spec: QualificationSpec, pick: int) -> tuple[str, Case, Expected]:
    """One of the cases that apply to ``spec``, chosen by ``pick``, and what it must end in."""
    rng = random.Random(pick)
    resume = Resume(spec)
    steps, world = spec.training.steps, spec.world.world_size
    resized = spec.preemption.resize is not None
    compared = spec.comparison.boundaries
    resumed_steps = list(range(resume.first_resumed, steps + 1))
    kinds = ["exact"]
    if resumed_steps:
        kinds += ["fail", "fail"]
        if spec.comparison.mode == "tolerance":
            kinds += ["within"] * 3
    if not resized and resume.restored.step > 0:
        kinds.append("restore")
    unrelaxed = [b for b in compared if resized or _tolerance(spec, b) is None
                 or BY_NAME[b].kind == "numeric"]
    if resume.completed >= 1 and unrelaxed:
        kinds.append("nondeterministic")
    kind = rng.choice(kinds)

    if kind == "exact":
        return kind, Case(), Expected(Result.PASS)
    if kind == "restore":
        rank = rng.randrange(world)
        return kind, Case(restore_rank=rank), Expected(
            Result.FAIL, resume.restored.step, "params", rank, at_restore=True)
    if kind == "nondeterministic":
        step, boundary = rng.randint(1, resume.completed), rng.choice(unrelaxed)
        rank = rng.randrange(world)
        plant = Plant(boundary, frozenset({step}), frozenset({rank}), before_kill=True)
        return kind, Case([plant]), Expected(Result.NONDETERMINISTIC, step, boundary, rank)
    step = rng.choice(resumed_steps)
    if kind == "fail":
        if resized:
            # After a resize the legs are compared by data ledger and drift, not rank.
            boundary = rng.choice(["inputs", "loss", "grad_norm"])
            plant = Plant(boundary, frozenset({step}))
            return kind, Case([plant]), Expected(Result.FAIL, step, boundary)
        boundary, rank = rng.choice(compared), rng.randrange(world)
        case = Case([Plant(boundary, frozenset({step}), frozenset({rank}))])
        group = BY_NAME[boundary].drift_group
        if _tolerance(spec, boundary) is not None and group is not None:
            # Its digests say only "not equal": the final drift says by how much.
            setattr(case, f"{group}_delta", OVER)
        return kind, case, Expected(Result.FAIL, step, boundary, rank)
    return kind, within_tolerance(spec, step, rng), Expected(Result.PASS)


def within_tolerance(spec: QualificationSpec, step: int, rng: random.Random) -> Case:
    """Differences each within the tolerance that relaxes its boundary."""
    case = Case()
    tol = spec.comparison.tolerances
    if spec.preemption.resize is not None:
        for b in ("loss", "grad_norm"):
            case.plants.append(Plant(b, frozenset({step}), delta=tol[b] / 2))
        case.model_delta = tol["params"] / 2
        case.optimizer_delta = tol.get("optimizer_state", tol["params"]) / 2
        return case
    for b in spec.comparison.boundaries:
        relaxed = _tolerance(spec, b)
        if relaxed:  # a tolerance of 0 relaxes nothing
            delta = relaxed / 2 if BY_NAME[b].kind == "numeric" else OVER
            case.plants.append(Plant(b, frozenset({step}), delta=delta))
    if "params" in tol and tol["params"] > 0 and rng.random() < 0.5:
        # The final parameters drift too, within every tolerance the model's digests use.
        uses = [t for b in spec.comparison.boundaries
                if BY_NAME[b].drift_group == "model" and (t := _tolerance(spec, b))]
        case.model_delta = min([tol["params"], *uses]) / 2
    return case


def expected_verdict(spec: QualificationSpec, main: Expected) -> tuple[Result, dict[str, str]]:
    """The qualification's result and each control's status, from the main leg's."""
    plan = qualification_plan(spec)
    statuses = {n.omission: "not_applicable" for n in plan.not_run}
    if main.result == Result.NONDETERMINISTIC:
        statuses |= {leg.omit[0]: "not_judged" for leg in plan.negative_controls}
        return Result.NONDETERMINISTIC, statuses
    statuses |= {leg.omit[0]: expected_control(spec, leg) for leg in plan.negative_controls}
    if "blind" in statuses.values():
        return Result.INVALID, statuses
    return main.result, statuses


def check_verdict(v: Verdict, spec: QualificationSpec, kind: str, main: Expected) -> None:
    result, statuses = expected_verdict(spec, main)
    assert v.result == result, (kind, v.reason)
    assert v.reason.strip()
    assert {c.omission: c.status for c in v.controls} == statuses, [
        (c.omission, c.status, c.mechanism) for c in v.controls]
    assert len(v.controls) == len(statuses)  # one outcome per control, none twice
    for c in v.controls:
        assert c.mechanism.strip()
        if c.status == "not_applicable":
            assert c.evidence, c
    if result == Result.INVALID:
        # The main leg's verdict stands under the INVALID: its divergence, its result named.
        blind = [o for o, s in statuses.items() if s == "blind"]  # in the plan's order
        assert v.reason.startswith(f"invalid: comparator blind to {', '.join(blind)}"), v.reason
        assert f"so this {main.result.value} has not been shown" in v.reason, v.reason
    d = v.first_divergence
    if main.result == Result.PASS:
        assert d is None, (kind, v.reason)
        return
    assert d is not None, (kind, v.reason)
    assert (d.step, d.boundary) == (main.step, main.boundary), (kind, v.reason)
    if main.rank is not None:
        assert d.rank == main.rank, (kind, v.reason)
    assert d.at_restore == main.at_restore


# --------------------------------------------------------------------------- the property


# The gradients the optimizer takes drift within the params tolerance that relaxes them
# (clipped_grads once had none, and FAILed a run within its tolerances).
CLIPPED_WITHIN_TOLERANCE: dict[str, Any] = {
    "workload": {"name": "tiny-gpt"}, "world": {"nnodes": 1, "nprocPerNode": 1},
    "training": {"steps": 8, "accumulationSteps": 1, "precision": "fp32",
                 "schedule": {"kind": "warmup-cosine"}, "gradClipNorm": 1.0},
    "checkpoint": {"everySteps": 4, "atSteps": [1], "async": False},
    "preemption": {"at": "microbatch", "step": 3, "microstep": 0, "mode": "hard", "rank": 0,
                   "target": "pod"},
    "comparison": {"mode": "tolerance", "tolerances": {"params": 0.001},
                   "boundaries": ["clipped_grads"]},
    "controls": {"enabled": True, "omissions": ["optimizer", "loader_state"]},
}
# A control named twice (its leg, one folder, was planned twice).
TWICE: dict[str, Any] = {
    "world": {"nnodes": 2, "nprocPerNode": 1},
    "training": {"steps": 6, "accumulationSteps": 3},
    "checkpoint": {"everySteps": 4, "atSteps": [4]},
    "preemption": {"at": "checkpoint_commit", "step": 4, "microstep": 0, "mode": "graceful",
                   "rank": 0},
    "controls": {"omissions": ["rng", "scaler", "rng", "loader_state", "scaler"]},
}
# One step: a reference trace of one step shows no state that never changed, so a control
# the compared boundaries miss is blind (it was "not applicable" on that one step).
ONE_STEP: dict[str, Any] = {
    "training": {"steps": 1, "accumulationSteps": 3},
    "preemption": {"at": "microbatch", "step": 1, "microstep": 2, "mode": "graceful"},
    "comparison": {"boundaries": ["clipped_grads"]},
    "controls": {"omissions": ["scheduler", "rng"]},
}


@example(CLIPPED_WITHIN_TOLERANCE, "text", 92)
@example(TWICE, "text", 0)
@example(ONE_STEP, "set", 0)
@settings(max_examples=EXAMPLES, deadline=timedelta(seconds=5), derandomize=True,
          database=None, suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.data_too_large])
@given(spec_data(), st.sampled_from(["text", "set"]), st.integers(0, 2**16))
def test_every_accepted_spec_ends_in_a_verdict(data: dict[str, Any], route: str,
                                               pick: int) -> None:
    with tempfile.TemporaryDirectory(prefix="spec-verdict-") as tmp:
        work = Path(tmp)
        try:
            spec = load(data, route)
        except SpecError as e:
            event("refused")
            check_refusal(e, data, route, work)
            return
        kind, case, main = choose_case(spec, pick)
        event(f"accepted: {kind}")
        event(f"mode: {spec.comparison.mode}"
              + (", resize" if spec.preemption.resize is not None else ""))
        root = work / "q"
        write_run(root, spec, case)
        judged = compare_location(str(root), write=True, pin="torch==test")
        check_verdict(judged.verdict, spec, kind, main)
        report = read_report(root / "report.json")
        assert report.verdict == judged.verdict
        assert (root / "report.html").is_file() and (root / "metrics.prom").is_file()

"""``bisect.json``: what a bisection concluded, and every probe it ran to get there.

Pure data (pydantic), versioned; its JSON Schema (docs/reference/bisect.schema.json) is
generated from these models by tools/spec_docs.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from resumequal.results.verdict import Result
from resumequal.spec.boundaries import Boundary

SCHEMA_VERSION = "resumequal.dev/bisect/v1"

Mode = Literal["changes", "ordered"]
Conclusion = Literal["flip", "no-flip", "undecided"]
ProbeOutcome = Literal["same", "flip", "unresolved"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PinChange(_Model):
    """One package that differs between two pins."""

    package: str = Field(description="the package's normalised name")
    good: str | None = Field(description="its version (or URL) in the good pin; null: absent")
    bad: str | None = Field(description="its version (or URL) in the bad pin; null: absent")
    label: str = Field(description="as a person reads it: `torchdata 0.10.1 → 0.11.0`")


class FirstDivergence(_Model):
    step: int
    boundary: Boundary
    rank: int


class RunRef(_Model):
    """A QualificationRun a probe created on the cluster."""

    namespace: str
    name: str
    uid: str | None = Field(description="its metadata.uid (null: never created)")
    deleted: bool = Field(description="deleted by the bisection (--delete-runs, a timeout, "
                          "an interruption); otherwise kept, with its status")


class Attempt(_Model):
    """One qualification of a probe (a probe ending INVALID or NONDETERMINISTIC is
    qualified again, up to ``--retries`` more times)."""

    result: Result | None = Field(description="the verdict; null when the qualification "
                                  "wrote none (see error)")
    reason: str = Field(description="the verdict's reason, or the qualification's last "
                        "error line")
    first_divergence: FirstDivergence | None = None
    exit_code: int = Field(description="what `resumequal run` exits with for this result "
                           "(docs/exit-codes.md)")
    seconds: float
    run_dir: str = Field(description="the run folder; on a cluster, the run location in the "
                         "store (the status' runUri; empty before one)")
    run: RunRef | None = Field(default=None, description="on a cluster: the QualificationRun")


class ProbeEnv(_Model):
    """The venv a probe ran in."""

    key: str = Field(description="digest of the interpreter, the common layer and the "
                     "exact requirement lines: the venv's folder name in the cache")
    path: str
    reused: bool = Field(description="built by an earlier probe or bisection")
    build_seconds: float = Field(description="to build it, or to find it ready when reused")
    packages: list[str] = Field(description="the requirement lines of its probe layer (the "
                                "packages that differ between the pins)")
    pulled_in: list[str] = Field(
        default_factory=list,
        description="name==version of what pip installed beyond those lines: a dependency "
        "the pins leave out (pip freeze omits setuptools), at the version pip chose, or one "
        "a left-out change names, at the version its pin gives")


class Probe(_Model):
    """One point of the search: an environment, then a qualification in it."""

    number: int = Field(description="1, 2, ... in the order the probes ran")
    role: Literal["good", "bad", "mix", "pin"] = Field(
        description="good, bad: confirming an end; mix: the good pin with some changes of "
        "the bad one; pin: one pin of an ordered list")
    label: str = Field(description="what the probe holds, for a person")
    applied: list[str] = Field(default_factory=list, description="the changes (package "
                               "names) taken from the bad pin; the rest is the good pin's")
    pin_index: int | None = Field(default=None, description="ordered: the pin's position "
                                  "in the list (0-based)")
    env: ProbeEnv | None = Field(default=None, description="the venv (null on a cluster)")
    image: str | None = Field(default=None, description="on a cluster: the image qualified")
    status: Literal["judged", "unresolvable", "error", "unjudged"] = Field(
        description="judged: a PASS or FAIL verdict; unresolvable: pip's resolver refused "
        "the mix (no qualification ran); error: the qualification wrote no verdict; "
        "unjudged: INVALID or NONDETERMINISTIC on every attempt")
    outcome: ProbeOutcome = Field(description="same: ends as the good pin; flip: as the bad "
                                  "pin; unresolved: neither, or not judged (never blamed)")
    why: str = Field(description="why the probe counts as it does")
    attempts: list[Attempt] = Field(default_factory=list)
    seconds: float = Field(description="building (or finding) the venv and every attempt")


class FlipPin(_Model):
    """Ordered bisection: the first pin that flips."""

    index: int = Field(description="its position in the list (0-based)")
    path: str = Field(description="the pin file, or the image")
    previous: str = Field(description="the pin before it, which does not flip")


class ClusterTarget(_Model):
    """Where a bisection over images ran its QualificationRuns."""

    namespace: str
    bisection: str = Field(description="the value of label resumequal.dev/bisection on "
                           "every run it created")
    delete_runs: bool = Field(description="runs deleted once their verdict was read")


class BisectResult(_Model):
    """The result of ``resumequal bisect``."""

    schema_version: str = SCHEMA_VERSION
    mode: Mode = Field(description="changes: delta debugging over the packages two pins "
                       "differ in; ordered: binary search over pins in order")
    conclusion: Conclusion = Field(
        description="flip: the change (set) or the pin that flips the verdict is named; "
        "no-flip: the ends end alike; undecided: the probes could not decide")
    summary: str = Field(description="one sentence a person can act on")
    exit_code: int = Field(description="what the command exits with (docs/exit-codes.md)")
    pins: list[str] = Field(description="the pin files: good then bad, or the ordered list "
                            "(images, on a cluster)")
    assumed: list[Literal["good", "bad"]] = Field(
        default_factory=list, description="ends taken as known instead of qualified")
    spec: str | None = Field(description="the spec every probe ran (null: the defaults); on "
                             "a cluster, the QualificationRun manifest")
    cluster: ClusterTarget | None = Field(default=None, description="images qualified on a "
                                          "cluster (null: pins in probe venvs)")
    sets: list[str] = Field(default_factory=list, description="--set overrides of every probe")
    common_packages: int = Field(description="packages every pin holds alike (the common "
                                 "layer)")
    common_build_seconds: float | None = Field(
        default=None, description="to build the common layer's venv, or to find it ready "
        "(0 with --base-env); in no probe's build_seconds. null: no common layer (images)")
    changes: list[PinChange] = Field(description="changes: between good and bad; ordered: "
                                     "between the first flipping pin and the one before it")
    culprits: list[PinChange] = Field(
        description="the smallest set of changes found to flip the verdict (more than one: "
        "they flip only together); ordered: the changes into the first flipping pin")
    decided: bool = Field(description="the culprits are proven needed: without any one of "
                          "them a probe ended as the good pin")
    first_flip: FlipPin | None = None
    probes: list[Probe]
    qualifications: int = Field(description="qualifications run, retries included")
    unresolvable: int = Field(description="mixes the resolver refused (no qualification)")
    started: str = Field(description="UTC, ISO 8601")
    seconds: float


__all__ = ["SCHEMA_VERSION", "Attempt", "BisectResult", "ClusterTarget", "Conclusion",
           "FirstDivergence", "FlipPin", "Mode", "PinChange", "Probe", "ProbeEnv",
           "ProbeOutcome", "RunRef"]

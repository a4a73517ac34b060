"""The QualificationRun's status as pydantic models: what the operator writes under
``.status`` (phase, conditions, legs, preemption, verdict, zoom), camelCase on the wire as
the spec is, credentials redacted; and the whole object, spec and status.

The models only: what goes into them is :mod:`.status`'s.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
)
from pydantic.alias_generators import to_camel

from resumequal.qualify.machine import Phase
from resumequal.redact import redact_tree
from resumequal.results.verdict import Result
from resumequal.run.beacons import MAX_EPOCH_SECONDS
from resumequal_operator.resource import Backend, QualificationRunSpec

log = logging.getLogger(__name__)


class _Status(BaseModel):
    # camelCase from the same generator as the spec: ``run_uri`` is ``runUri``.
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, validate_by_name=True,
                              validate_by_alias=True, serialize_by_alias=True)


def _time(value: Any) -> Any:
    """Epoch seconds (what the qualification machine records) become UTC datetimes. The
    machine also keeps times read from the store (a resume's, from a trace record): one no
    timestamp can hold is clamped into range with a warning rather than raised, which
    would fail every reconcile of the run."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not 0 <= value <= MAX_EPOCH_SECONDS:  # NaN too
            clamped = MAX_EPOCH_SECONDS if value > 0 else 0.0
            log.warning("a status time of %.6g epoch seconds is out of range; shown as %s",
                        value, datetime.fromtimestamp(clamped, tz=UTC).isoformat())
            value = clamped
        return datetime.fromtimestamp(value, tz=UTC)
    return value


def _finite(value: Any) -> Any:
    """A JSON number cannot be NaN or infinite; such drift is reported as unknown (null)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


Time = Annotated[datetime, BeforeValidator(_time)]
Drift = Annotated[float | None, BeforeValidator(_finite)]


class Condition(_Status):
    """A Kubernetes condition: Ready (finished?) or Qualified (passed?)."""

    type: Literal["Ready", "Qualified"] = Field(
        description="Ready: True once finished with a verdict, False when the run failed, "
        "Unknown meanwhile. Qualified: True for a PASS, False for any other verdict or a "
        "failure, Unknown before a verdict.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str | None = Field(
        default=None, description="One word: the phase, the verdict, NoVerdict, or what ended "
        "the run (Timeout, Error, InvalidSpec, NotAllowed, ...).")
    message: str | None = Field(default=None, description="The same in words, redacted.")
    last_transition_time: Time | None = Field(
        default=None, description="When status last changed.")
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation it was computed from.")


class LegStatus(_Status):
    """One leg's progress: control, preempted, or a negative control's leg."""

    job: str | None = Field(default=None, description="the leg's PyTorchJob or TrainJob")
    attempts: int = Field(default=0, description="Attempts seen in its trace: 1 + restarts.")
    steps: int = Field(default=0, description="Steps every rank has finished.")
    launched_at: Time | None = Field(default=None, description="When it was launched.")
    killed_at: Time | None = Field(default=None, description="When its armed rank was killed.")
    resumed_at: Time | None = Field(
        default=None, description="When every rank had finished its first step after the "
        "restart.")
    finished_at: Time | None = Field(
        default=None, description="When the leg was seen done: every rank had written its "
        "completion marker.")
    restart_seconds: Drift = Field(default=None, description="kill -> first resumed step")


class PreemptionStatus(_Status):
    """The kill delivered to the preempted leg's armed rank."""

    leg: str = Field(description="The leg that was cut.")
    pod: str | None = Field(default=None, description="The armed rank's pod, from its beacon.")
    rank: int = Field(description="The armed rank.")
    mode: Literal["hard", "graceful"] = Field(description="spec.preemption.mode.")
    injected_at: Time | None = Field(default=None, description="When the kill was delivered.")


class FirstDivergence(_Status):
    """Where the legs first differ."""

    step: int = Field(description="The optimizer step.")
    boundary: str = Field(description="The boundary, one of spec.comparison.boundaries.")
    rank: int = Field(description="The rank.")


class VerdictStatus(_Status):
    """A summary of the verdict.json the comparator wrote into the run location."""

    result: Result = Field(
        description="PASS, FAIL, NONDETERMINISTIC or INVALID (INVALID too for a run that "
        "failed before its comparison).")
    reason: str | None = Field(default=None, description="One sentence a person can act on.")
    first_divergence: FirstDivergence | None = None
    first_divergence_summary: str | None = Field(
        default=None, description="'step 6 lr rank 1', or 'none'")
    exact_through_step: int | None = Field(
        default=None, description="The last step up to which every boundary on every rank "
        "was equal (0: none).")
    param_max_abs_diff: Drift = Field(
        default=None, description="Final model parameters: the largest absolute difference.")
    param_rel_l2_diff: Drift = Field(
        default=None, description="Final model parameters: ||a-b||_2 / ||a||_2.")
    param_mismatch_fraction: Drift = Field(
        default=None, description="Final model parameters: the fraction of elements whose "
        "bits differ.")
    loss_max_abs_diff: Drift = Field(
        default=None, description="The largest difference of a step's loss between the legs.")
    controls_detected: int | None = Field(default=None,
                                          description="Negative controls detected.")
    controls_total: int | None = Field(
        default=None, description="Negative controls owed a detection (not applicable and "
        "not judged ones left out).")


class ZoomStatus(_Status):
    """The zoom Job of a FAIL (``spec.zoom: onFail``) and what it found."""

    job: str = Field(description="The zoom Job.")
    state: Literal["Running", "Succeeded", "Failed"] = Field(
        description="Running, Succeeded or Failed.")
    origin_kind: str | None = Field(default=None, description="input (before the model: the "
                                    "data path or loss_fn), loss_fn, module, reduction, "
                                    "clipping, optimizer, state or none")
    origins: list[str] = Field(default_factory=list, max_length=8,
                               description="Origin modules, or the stage, in execution order.")
    summary: str | None = Field(default=None, description="One sentence a person can act on.")
    url: str | None = Field(default=None, description="zoom.json in the run location")


class QualificationRunStatus(_Status):
    """What the operator reports; ``machine`` lets a restarted operator continue."""

    phase: Phase | None = Field(
        default=None, description="Pending, LegsRunning, Armed, Preempted, Resumed, "
        "Comparing, then Succeeded or Failed.")
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation the status was computed from.")
    conditions: list[Condition] = Field(default_factory=list,
                                        description="Ready and Qualified.")
    backend: Backend | None = Field(default=None, description="what runs the legs")
    launcher: str | None = Field(
        default=None, description="what started the legs' workers (spec.world.launcher): "
        "torchrun, every worker a fresh interpreter; or forked from one warm process")
    launcher_caveats: list[str] | None = Field(
        default=None,
        description="what a verdict under this launcher cannot see (none for torchrun)")
    pin: str | None = Field(default=None,
                            description="The label it is reported under: spec.stack.pin, or from "
                            "the image.")
    run_uri: str | None = Field(
        default=None, description="The run location: <store.uri>/<namespace>/<name>/<uid>.")
    report_url: str | None = Field(
        default=None, description="report.html in the run location, once there is a verdict.")
    legs: dict[str, LegStatus] = Field(default_factory=dict,
                                       description="Each leg's progress, by leg name.")
    preemption: PreemptionStatus | None = None
    comparator_job: str | None = Field(default=None, description="The comparator Job.")
    checkpoint_key_secret: str | None = Field(
        default=None, max_length=253,
        description="The Secret holding the run's checkpoint key, named by the API server "
        "when the run started (recorded before any pod names it)")
    verdict: VerdictStatus | None = None
    zoom: ZoomStatus | None = None
    started_at: Time | None = Field(default=None,
                                    description="When the qualification started.")
    completed_at: Time | None = Field(default=None,
                                      description="When it reached Succeeded or Failed.")
    machine: dict[str, Any] = Field(
        default_factory=dict,
        description="The serialised qualification state machine (resumequal.qualify.machine."
        "QualificationStatus); kept as is.",
    )

    def to_k8s(self) -> dict[str, Any]:
        """The status as the API stores it: camelCase, RFC 3339 times, no nulls, and no
        credential in any message (:func:`~resumequal.redact.redact`)."""
        status: dict[str, Any] = redact_tree(
            self.model_dump(mode="json", by_alias=True, exclude_none=True))
        return status


class QualificationRun(BaseModel):
    """A whole QualificationRun object (for examples and tests; the API holds metadata)."""

    model_config = ConfigDict(extra="forbid")
    api_version: Literal["resumequal.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["QualificationRun"]
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: QualificationRunSpec
    status: QualificationRunStatus | None = None

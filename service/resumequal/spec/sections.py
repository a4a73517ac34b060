"""The sections of a qualification besides what trains: where checkpoints are committed and
kept, where a leg is cut, time limits, how legs are compared, the negative controls and the
seed matrix; and :class:`SpecSections`, every section together."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from resumequal.redact import redact
from resumequal.spec.boundaries import BOUNDARIES, Boundary, of_kind
from resumequal.spec.section import (
    MAX_ACCUMULATION,
    MAX_LIST,
    MAX_NODES,
    MAX_NPROC_PER_NODE,
    MAX_SEED,
    MAX_SEEDS,
    MAX_URI,
    Seconds,
    Section,
    Steps,
)
from resumequal.spec.training import (
    CompileSpec,
    DDPSpec,
    ParallelismSpec,
    TrainingSpec,
    WorkloadSpec,
    WorldSpec,
)
from resumequal.store.gcssettings import GCSSettings
from resumequal.store.registry import store_class, supported
from resumequal.store.s3settings import S3Settings
from resumequal.store.settings import StoreSettings, settings_problem

# The negative controls, each a resume that leaves one part of the training state out (or,
# under preemption.resize, a rank-keyed bug). What each leaves out, when it applies and
# how its absence is shown is its descriptor's (resumequal.spec.omissions.CONTROLS).
Omission = Literal[
    "rng", "data_cursor", "scheduler", "optimizer", "model_optimizer_only", "pending_grads",
    "scaler", "loader_state", "rank_cursor", "rank_rng"
]
OMISSIONS: tuple[Omission, ...] = get_args(Omission)


_URI_CHARS = re.compile(r"^[^\x00-\x20\x7f?#]*$")
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]{0,15}$")


def store_uri(value: str) -> str:
    """A store URI of a registered scheme (``s3://bucket/prefix``, ``file:///abs/path``, ...)
    in one spelling (no trailing '/'), or ValueError saying why not. Segments are what
    object keys and folders are made of, so none may be empty, '.' or '..' (``s3://b/x/../y``
    names no one place). Credentials (``s3://key:secret@bucket``) are refused, and the value
    is echoed only redacted."""
    # The store registry is the one list of schemes; it loads the stores (and their SDKs)
    # on this first lookup, never when the spec is imported.
    shown = repr(redact(value))
    scheme, sep, rest = value.partition("://")
    found = store_class(scheme) if sep and _SCHEME.match(scheme) else None
    if found is None:
        named = f"scheme {scheme!r} is not supported; " if _SCHEME.match(scheme) else ""
        raise ValueError(f"{shown}: {named}use {supported()}")
    if not _URI_CHARS.match(value):
        raise ValueError(f"{shown}: no spaces, control characters, '?' or '#' in a store URI")
    authority, _, path = rest.partition("/")
    if "@" in authority:
        raise ValueError("holds user:password; credentials come from the store's own chain "
                         "(AWS's, Google's Application Default Credentials), never from the "
                         "store URI")
    problem = found.authority_problem(authority)
    if problem is not None:
        raise ValueError(f"{shown}: {problem}")
    segments = path.removesuffix("/").split("/") if path.removesuffix("/") else []
    bad = next((seg for seg in segments if seg in ("", ".", "..")), None)
    if bad is not None:
        what = "an empty segment ('//')" if bad == "" else f"a {bad!r} segment"
        raise ValueError(f"{shown}: {what}; write the path without it")
    # Without an authority the root keeps its '/' (``file:///``), as ``scheme://`` is no URI.
    return f"{scheme}://{authority}/" + "/".join(segments) if segments or not authority \
        else f"{scheme}://{authority}"


class CheckpointSpec(Section):
    """When each leg commits a checkpoint, how many it keeps, and where they live."""

    # ``async`` is a Python keyword, so the field is ``async_save`` with the YAML key as its
    # explicit alias (which wins over the generated ``asyncSave``).

    every_steps: Steps | None = Field(
        default=4,
        description="Commit a checkpoint after every step that is a multiple of this; null: "
        "no periodic ones. The last step is always saved.",
    )
    at_steps: list[Steps] = Field(
        default_factory=list, max_length=MAX_LIST,
        description="More steps after which a checkpoint is committed (e.g. the one "
        "preemption.at: checkpoint_commit holds in).",
    )
    keep_last: int = Field(
        default=3, ge=1, le=MAX_LIST,
        description="Committed checkpoints a leg keeps: after each commit rank 0 deletes "
        "older ones.",
    )
    store: str | None = Field(
        default=None, max_length=MAX_URI,
        description="Where checkpoints live: a path, file:///abs/path, s3://bucket/prefix or "
        "gs://bucket/prefix (legs under <store>/<leg>/checkpoints/); default: the leg's run "
        "directory.",
    )
    # One section per store with settings, each its store's own model: at most the one of
    # checkpoint.store's scheme is set (store_settings). Unset sections stay out of dumps, so
    # a spec's digest is what it was before its store had a section.
    s3: S3Settings | None = Field(
        default=None, description="How to reach an s3:// store (endpoint, region, retries)."
    )
    gcs: GCSSettings | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="How to reach a gs:// store (endpoint, retries).",
    )
    async_save: bool = Field(
        default=False,
        alias="async",
        description="Write checkpoints in the background (DCP async_save) while training "
        "goes on; the commit waits until every rank's write has finished. A save is "
        "committed before the step after next begins.",
    )

    @field_validator("store")
    @classmethod
    def _store_scheme(cls, value: str | None) -> str | None:
        if value is None or "://" not in value:
            return value
        return store_uri(value)

    @model_validator(mode="after")
    def _settings_of_the_store(self) -> CheckpointSpec:
        # Each store's settings, checked against its scheme: not a branch on the medium.
        for name, value in self:
            problem = settings_problem(f"checkpoint.{name}", value, self.store)
            if problem is not None:
                raise ValueError(problem)
        return self

    @property
    def store_settings(self) -> StoreSettings | None:
        """How to reach ``store``: its scheme's settings section, if set."""
        return next((v for _, v in self if isinstance(v, StoreSettings)), None)

    def with_store(self, store: str, settings: StoreSettings | None) -> CheckpointSpec:
        """This section with checkpoints in ``store``, reached with ``settings`` (in the
        section of their model; the others unset)."""
        update: dict[str, Any] = {"store": store}
        for name, field in type(self).model_fields.items():
            kinds = get_args(field.annotation)
            if any(isinstance(k, type) and issubclass(k, StoreSettings) for k in kinds):
                update[name] = settings if type(settings) in kinds else None
        return self.model_copy(update=update)

    @field_validator("at_steps")
    @classmethod
    def _sorted(cls, value: list[int]) -> list[int]:
        return sorted(set(value))

    def saves_after(self, step: int, last_step: int) -> bool:
        """Whether a periodic checkpoint is committed once ``step`` has completed."""
        if step == last_step or step in self.at_steps:
            return True
        return self.every_steps is not None and step % self.every_steps == 0

    def last_save_before(self, step: int, last_step: int) -> int | None:
        """The last step before ``step`` after which a checkpoint is committed (None: no
        save before it). Arithmetic, not a walk: ``step`` may be large."""
        found = [s for s in (last_step, *self.at_steps) if s < step]
        if self.every_steps is not None and step > self.every_steps:
            found.append((step - 1) // self.every_steps * self.every_steps)
        return max(found, default=None)


class ResizeSpec(Section):
    """An elastic resize: the killed node is not replaced, and the leg continues on
    ``toNodes`` nodes with new ranks and a smaller world, resumed by resharding the newest
    checkpoint; with ``growAfterStep`` a new node joins once the checkpoint after that step
    is committed, and the leg continues at the full world from it.

    Every leg of a resize run (the reference leg too) defines its data and randomness
    globally: global step ``s`` consumes the same ``accumulationSteps x world size``
    microbatches at any world size, each drawn from (seed, global position), and a rank
    runs more microbatches per step in a smaller world. Bitwise equality is not expected
    after the resize (the reduction order changes with the world): the steps before it must
    be exact, the handoff (the state restored, gathered) and the data ledger exact, and the
    drift within ``comparison.tolerances``.
    """

    to_nodes: int = Field(ge=1, le=MAX_NODES,
                          description="nodes the leg continues on after the kill")
    grow_after_step: Steps | None = Field(
        default=None,
        description="grow back to world.nnodes once the checkpoint after this step is "
        "committed (none: the leg finishes at toNodes)")


class PreemptionSpec(Section):
    """The cut point: before microbatch ``microstep`` of optimizer step ``step`` on ``rank``.

    microstep 0 cuts at an optimizer-step boundary; microstep > 0 cuts mid-accumulation,
    after that many microbatches have run backward. With ``at: checkpoint_commit`` the
    rank instead holds inside the commit protocol of the checkpoint saved after ``step``:
    its shards are written (with ``checkpoint.async``: handed to the background writer,
    finished or not), the commit has not happened.

    ``mode`` says how the armed worker dies: ``hard``, at once and saving nothing (SIGKILL;
    a SIGTERM, which a pod deletion sends first, is not handled either); ``graceful``, by
    SIGTERM, on which every rank commits an emergency checkpoint, with SIGKILL after
    ``grace_seconds``. ``target`` says what is killed: ``process``, the armed worker
    process dies inside its pod and torchrun restarts the group in place; ``pod``, the pod
    is deleted like a lost node and recreated (locally: the armed rank's node, its torchrun
    agent with every worker, dies and a new agent takes its place).
    """

    at: Literal["microbatch", "checkpoint_commit"] = Field(
        default="microbatch",
        description="microbatch: the rank holds before microbatch microstep of step; "
        "checkpoint_commit: inside the commit of the checkpoint saved after step (shards "
        "written, not committed; microstep 0).",
    )

    step: Steps = Field(default=6,
                        description="Optimizer step the cut lands in (1 to training.steps).")
    microstep: int = Field(
        default=1, ge=0, le=MAX_ACCUMULATION,
        description="Microbatch of that step the cut lands before: 0 at the optimizer-step "
        "boundary, 1 or more mid-accumulation (below training.accumulationSteps).",
    )
    rank: int = Field(default=1, ge=0, le=MAX_NODES * MAX_NPROC_PER_NODE,
                      description="Global rank that arms at the cut and is killed.")
    mode: Literal["hard", "graceful"] = Field(
        default="hard",
        description="hard: SIGKILL, nothing saved (SIGTERM is not handled either); graceful: "
        "SIGTERM, every rank commits an emergency checkpoint with its pending gradients, "
        "SIGKILL after graceSeconds.",
    )
    target: Literal["process", "pod"] = Field(
        default="process",
        description="process: the armed worker dies and torchrun restarts the group in place; "
        "pod: the armed rank's node dies (its pod is deleted; locally its torchrun agent and "
        "workers) and a new one takes its place.",
    )
    grace_seconds: Seconds = Field(
        default=20.0,
        description="graceful: how long the killed worker, or the deleted pod, may take to "
        "stop before SIGKILL.",
    )
    resize: ResizeSpec | None = Field(
        default=None,
        description="the killed node is not replaced: the leg continues at a smaller world "
        "size, and may grow back (target: pod, mode: hard)")


class TimeoutSpec(Section):
    """Time limits in seconds: the process group's, each phase's (past one the run fails
    with reason Timeout) and that of an error that persists."""

    process_group_seconds: Seconds = Field(
        default=120.0,
        description="Timeout of each worker's process group (store, collectives, checkpoint "
        "barriers) and, with restartSeconds, of torchrun's rendezvous. Above armSeconds: the "
        "other ranks wait in a collective while the armed rank holds.",
    )
    arm_seconds: Seconds = Field(default=60.0, description="cut reached -> killed")
    restart_seconds: Seconds = Field(default=120.0, description="killed -> resumed")
    leg_seconds: Seconds = Field(default=900.0, description="whole leg")
    backend_error_seconds: Seconds = Field(
        default=300.0,
        description="an API or store error that persists this long ends the run (Error)")
    build_seconds: Seconds = Field(
        default=120.0,
        description="Limit of the trial build resumequal validate and run make before "
        "anything launches (the factory imported and called once, on the CPU, in a process of "
        "its own); past it the spec is refused. The operator makes none: it cannot import "
        "the training image.")


# Held equal whatever the tolerances.
_EXACT = of_kind("exact")


# How a trace digests tensors (resumequal.trace.digest): xxh3-128 over bytes copied to the
# host, or the wsum128 fingerprint computed where the tensor lives.
DigestAlgorithm = Literal["xxh3_128", "wsum128"]
DIGEST_ALGORITHMS: tuple[DigestAlgorithm, ...] = get_args(DigestAlgorithm)


class ComparisonSpec(Section):
    """How the legs' traces and final checkpoints are compared."""

    mode: Literal["exact", "tolerance"] = Field(
        default="exact",
        description="exact: every compared boundary bitwise equal; tolerance: boundaries with "
        f"a declared tolerance may differ within it ({', '.join(_EXACT[:-1])} and {_EXACT[-1]} "
        "stay exact).",
    )
    tolerances: dict[Boundary, Annotated[float, Field(ge=0)]] = Field(
        default_factory=dict,
        description="tolerance mode: max abs difference per boundary (finite, >= 0)",
    )
    boundaries: list[Boundary] = Field(
        default_factory=lambda: list(BOUNDARIES), max_length=4 * len(BOUNDARIES),
        description="Boundaries the comparator looks at (all by default). Fewer boundaries "
        "make it blind to some faults; the negative controls show which.",
    )

    digest: Literal["auto", "xxh3_128", "wsum128"] = Field(
        default="auto",
        description="How the trace digests tensors (both legs alike): xxh3_128 hashes their "
        "bytes on the host; wsum128 fingerprints them on their device, so that only 16 bytes "
        "per tensor leave a GPU; auto: wsum128 where the leg trains on a GPU, else xxh3_128.",
    )

    def digest_on(self, device_type: str) -> DigestAlgorithm:
        """The algorithm a leg training on ``device_type`` digests with."""
        if self.digest != "auto":
            return self.digest
        return "wsum128" if device_type == "cuda" else "xxh3_128"

    @field_validator("boundaries")
    @classmethod
    def _some(cls, value: list[Boundary]) -> list[Boundary]:
        if not value:
            raise ValueError("at least one boundary must be compared")
        return [b for b in BOUNDARIES if b in value]

    @model_validator(mode="after")
    def _tolerances_need_mode(self) -> ComparisonSpec:
        if self.tolerances and self.mode != "tolerance":
            raise ValueError("tolerances are only used with mode: tolerance")
        return self


Scenario = Literal["boundary-hard", "boundary-graceful", "mid-hard", "mid-graceful"]
SCENARIOS: tuple[Scenario, ...] = ("boundary-hard", "boundary-graceful", "mid-hard", "mid-graceful")


class ControlsSpec(Section):
    """Negative controls: deliberately broken resumes the comparator must catch."""

    enabled: bool = Field(
        default=True,
        description="Run the negative controls after the main legs; each must be detected "
        "(or shown not applicable), or the qualification is INVALID.",
    )
    omissions: list[Omission] = Field(
        default_factory=lambda: list(OMISSIONS), max_length=4 * len(OMISSIONS),
        description="Which broken resumes to run; each is a real preempted-and-restarted leg.",
    )

    @field_validator("omissions")
    @classmethod
    def _once_each(cls, value: list[Omission]) -> list[Omission]:
        # Each control is one leg, its folder named after it: one named twice runs once.
        return list(dict.fromkeys(value))


class MatrixSpec(Section):
    """Repeat positive scenarios across seeds (a seed matrix); empty seeds: no matrix."""

    seeds: list[Annotated[int, Field(ge=0, le=MAX_SEED)]] = Field(
        default_factory=list, max_length=MAX_SEEDS,
        description="Each seed runs the scenarios with a control leg of its own (folder "
        "seed-N); empty: no matrix. resumequal run only: a QualificationRun refuses it.",
    )
    scenarios: list[Scenario] = Field(
        default_factory=lambda: list(SCENARIOS), max_length=len(SCENARIOS),
        description="boundary-*: cut at microstep 0 of preemption.step; mid-*: at "
        "preemption.microstep (1 if that is 0); hard or graceful kill.",
    )

    @field_validator("seeds", "scenarios")
    @classmethod
    def _distinct(cls, value: list[Any]) -> list[Any]:
        # A scenario or seed twice would run its legs twice under one name (its folder).
        repeated = sorted({str(v) for v in value if value.count(v) > 1})
        if repeated:
            raise ValueError(f"must be distinct; repeated: {', '.join(repeated)}")
        return value


class SpecSections(Section):
    """The sections of a qualification, spelled once: a spec file (:class:`QualificationSpec`)
    and a QualificationRun's spec (the operator's model) are both made of them."""

    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    world: WorldSpec = Field(default_factory=WorldSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    preemption: PreemptionSpec = Field(default_factory=PreemptionSpec)
    timeouts: TimeoutSpec = Field(default_factory=TimeoutSpec)
    ddp: DDPSpec = Field(default_factory=DDPSpec)
    parallelism: ParallelismSpec = Field(default_factory=ParallelismSpec)
    compile: CompileSpec = Field(default_factory=CompileSpec)
    comparison: ComparisonSpec = Field(default_factory=ComparisonSpec)
    controls: ControlsSpec = Field(default_factory=ControlsSpec)
    matrix: MatrixSpec = Field(default_factory=MatrixSpec)

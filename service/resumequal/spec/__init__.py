"""The qualification spec: its models, their cross-field checks, loading and the digest.

Owns what a qualification says (the sections of a spec file and of a QualificationRun's
spec) and the vocabulary it is written in. Must not import torch, the training, the
comparator, the reports or the runner: every command and the operator read it.
"""

from resumequal.spec.sections import (
    BUILTIN_WORKLOADS,
    MAX_NODES,
    MAX_SECONDS,
    MAX_SEED,
    MAX_STEPS,
    MAX_URI,
    OMISSIONS,
    PIN_PATTERN,
    REFERENCE_LEG,
    SCENARIOS,
    SECTION_CONFIG,
    CheckpointSpec,
    ComparisonSpec,
    CompileSpec,
    ControlsSpec,
    DDPSpec,
    GradScalerSpec,
    LoaderSpec,
    MatrixSpec,
    Omission,
    OptimizerSpec,
    ParallelismSpec,
    Precision,
    PreemptionSpec,
    QualificationSpec,
    ResizeSpec,
    Scenario,
    ScheduleSpec,
    SpecError,
    SpecSections,
    TimeoutSpec,
    TrainingSpec,
    WorkloadSpec,
    WorldSpec,
    apply_overrides,
    check_leg_name,
    check_pin,
    error_lines,
    format_validation_error,
    load_spec,
    parse_spec,
    spec_from_text,
    store_uri,
)

__all__ = [
    "BUILTIN_WORKLOADS", "MAX_NODES", "MAX_SECONDS", "MAX_SEED", "MAX_STEPS",
    "MAX_URI", "OMISSIONS", "PIN_PATTERN", "REFERENCE_LEG", "SCENARIOS", "SECTION_CONFIG",
    "CheckpointSpec", "ComparisonSpec", "CompileSpec", "ControlsSpec",
    "DDPSpec", "GradScalerSpec", "LoaderSpec", "MatrixSpec", "Omission", "OptimizerSpec",
    "ParallelismSpec", "Precision", "PreemptionSpec", "QualificationSpec", "ResizeSpec",
    "Scenario", "ScheduleSpec", "SpecError", "SpecSections", "TimeoutSpec", "TrainingSpec",
    "WorkloadSpec", "WorldSpec", "apply_overrides", "check_leg_name", "check_pin",
    "error_lines", "format_validation_error", "load_spec", "parse_spec", "spec_from_text",
    "store_uri",
]

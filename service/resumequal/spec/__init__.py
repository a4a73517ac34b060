"""The qualification spec: one pydantic model per component, shared by the CLI and the CRD,
with the checks across them, loading, the digest, and the vocabulary a spec is written in.

Every field has a default that runs on a 2-core CPU machine. Unknown fields are rejected;
errors name the field path and, where there is a closed set, the allowed values.

The package's modules: :mod:`~resumequal.spec.section` (what every section shares),
:mod:`~resumequal.spec.training` and :mod:`~resumequal.spec.sections` (the sections),
:mod:`~resumequal.spec.checks`, :mod:`~resumequal.spec.digest`,
:mod:`~resumequal.spec.qualification` (the whole spec), :mod:`~resumequal.spec.load`,
:mod:`~resumequal.spec.legs`; and the vocabulary: :mod:`~resumequal.spec.boundaries`,
:mod:`~resumequal.spec.omissions`, :mod:`~resumequal.spec.launchers`,
:mod:`~resumequal.spec.capabilities`, :mod:`~resumequal.spec.yamlread`.

Every command, every worker and the operator read the spec, so it must not import torch,
nor anything of ours but the error base, redaction, and the store's registry and
settings models (an import-linter contract checks it): it never trains, compares, reports or runs.
"""

from resumequal.spec.legs import REFERENCE_LEG, check_leg_name
from resumequal.spec.load import (
    apply_overrides,
    error_lines,
    format_validation_error,
    load_spec,
    parse_spec,
    spec_from_text,
    with_preemption,
)
from resumequal.spec.qualification import QualificationSpec
from resumequal.spec.section import (
    MAX_NODES,
    MAX_SECONDS,
    MAX_SEED,
    MAX_STEPS,
    MAX_URI,
    PIN_PATTERN,
    SECTION_CONFIG,
    SpecError,
    check_pin,
)
from resumequal.spec.sections import (
    OMISSIONS,
    SCENARIOS,
    CheckpointSpec,
    ComparisonSpec,
    ControlsSpec,
    MatrixSpec,
    Omission,
    PreemptionSpec,
    ResizeSpec,
    Scenario,
    SpecSections,
    TimeoutSpec,
    store_uri,
)
from resumequal.spec.training import (
    BUILTIN_WORKLOADS,
    CompileSpec,
    DDPSpec,
    GradScalerSpec,
    LoaderSpec,
    OptimizerSpec,
    ParallelismSpec,
    Precision,
    ScheduleSpec,
    TrainingSpec,
    WorkloadSpec,
    WorldSpec,
)

__all__ = [
    "BUILTIN_WORKLOADS", "MAX_NODES", "MAX_SECONDS", "MAX_SEED", "MAX_STEPS", "MAX_URI",
    "OMISSIONS", "PIN_PATTERN", "REFERENCE_LEG", "SCENARIOS", "SECTION_CONFIG",
    "CheckpointSpec", "ComparisonSpec", "CompileSpec", "ControlsSpec", "DDPSpec",
    "GradScalerSpec", "LoaderSpec", "MatrixSpec", "Omission", "OptimizerSpec",
    "ParallelismSpec", "Precision", "PreemptionSpec", "QualificationSpec", "ResizeSpec",
    "Scenario", "ScheduleSpec", "SpecError", "SpecSections", "TimeoutSpec", "TrainingSpec",
    "WorkloadSpec", "WorldSpec", "apply_overrides", "check_leg_name", "check_pin",
    "error_lines", "format_validation_error", "load_spec", "parse_spec", "spec_from_text",
    "store_uri", "with_preemption",
]

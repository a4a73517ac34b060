"""What every section of a spec shares: its wire spelling, the bounds on its numbers, and
the error a spec that does not validate raises.

Field names are camelCase, as in every Kubernetes resource (``world.nprocPerNode``), and
spelt so wherever a spec is written: spec files, run directories (``spec.json``,
``run.json``), reports and the QualificationRun CRD. A spec read from YAML, JSON or
``--set`` may also use the snake_case Python names (``world.nproc_per_node``); error
messages name fields in camelCase whichever spelling was read.

Every number has an upper bound and floats are finite (a spec is read by an operator that
must not hang on ``training.steps: 1e14`` or overflow on a timeout of 1e300), and checks
across fields do arithmetic, never a walk over steps. The bounds are generous for a
qualification and appear in the CRD schema too.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from resumequal.errors import ResumequalError

# Upper bounds. A qualification is short: these leave room for any real one while keeping
# every number an int64 and every derived figure (deadlines, world size) far from overflow.
MAX_STEPS = 1_000_000
MAX_ACCUMULATION = 4096
MAX_MICROBATCH = 1 << 20
MAX_NODES = 1024
MAX_NPROC_PER_NODE = 256
# The largest integer every JSON reader keeps exact (float64's): the API server reads a
# QualificationRun's numbers, and its CRD's bounds, as float64, and refuses an integer
# bound it cannot hold (2**63 - 1 rounds up past int64). torch.manual_seed takes it.
MAX_SEED = 2**53 - 1
MAX_SECONDS = 7 * 24 * 3600.0  # any timeout or grace period: a week
MAX_BUCKET_MB = 65536.0
MAX_LIST = 1000  # checkpoint.atSteps and other lists
MAX_SEEDS = 64
MAX_PARAMS = 64  # workload.params entries
MAX_URI = 2048
# A pin labels metrics, the status and reports, and alert templates put it into PromQL:
# label-safe characters only, as image tags and versions are spelled (train:2026-11-29,
# train@sha256:0123abcd4567, pt-2.6-cu124, torch==2.13.0+cpu).
PIN_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+:@=-]{0,127}$"
_PIN = re.compile(PIN_PATTERN)

# The bounds of a step (or of a number of steps, at least one) and of a timeout or grace
# period, said once for every section that holds one.
Steps = Annotated[int, Field(ge=1, le=MAX_STEPS)]
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]


def check_pin(value: str) -> str:
    """``value`` if it can be a pin, else ValueError saying what a pin is (not echoing it:
    what is not label-safe is not printed either)."""
    if not _PIN.match(value):
        raise ValueError("a pin is 1-128 of letters, digits and . _ + : @ = -, starting "
                         "with a letter or digit (e.g. torch==2.13.0+cpu, train:2026-11-29)")
    return value


class SpecError(ResumequalError, ValueError):
    """A spec that cannot be loaded or does not validate; the message names the field.
    (A ValueError too, for code that validates values of any origin.)"""


# Every section: camelCase on the wire (read and written), snake_case names also read.
# Floats are finite: YAML's .inf and .nan are refused where they are read. Inputs stay out
# of pydantic's own messages (a misplaced secret must not be echoed).
SECTION_CONFIG = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel,
                            validate_by_name=True, validate_by_alias=True,
                            serialize_by_alias=True, allow_inf_nan=False,
                            hide_input_in_errors=True)


class Section(BaseModel):
    """The base of every section: :data:`SECTION_CONFIG`."""

    model_config = SECTION_CONFIG

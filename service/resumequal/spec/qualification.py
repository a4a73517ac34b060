"""A whole qualification (:class:`QualificationSpec`): every section, the zoom setting, the
checks across sections and the digest that ties a run to it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from resumequal.spec.checks import check_qualification
from resumequal.spec.digest import spec_digest
from resumequal.spec.sections import SpecSections


class QualificationSpec(SpecSections):
    """A whole qualification: what trains, where it is cut, and how legs are compared."""

    zoom: Literal["never", "onFail"] = Field(
        default="never",
        description="onFail: when the verdict is FAIL, replay the first divergent step of "
        "both legs with every module hooked (resumequal zoom) and add zoom.json and a zoom "
        "section to the report",
    )

    @model_validator(mode="after")
    def _consistent(self) -> QualificationSpec:
        check_qualification(self)
        return self

    @property
    def global_microbatches(self) -> int:
        """Microbatches of one optimizer step over all ranks, whatever the world size."""
        return self.training.accumulation_steps * self.world.world_size

    def digest(self) -> str:
        """A stable sha256 of what decides the numerics of training (:func:`spec_digest`)."""
        return spec_digest(self)

"""A rank state for checkpoint tests that do not train: any plain fields, stored as JSON."""

from pydantic import BaseModel, ConfigDict


class Plain(BaseModel):
    model_config = ConfigDict(extra="allow")

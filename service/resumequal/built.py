"""What a workload built: its optimizer and learning-rate scheduler, as they stood before
the first step, and whether they are what the spec's ``training.optimizer`` and
``training.schedule`` build.

Workers write it into their inventory (:mod:`resumequal.trace.inventory`); the report reads
it back from a store, so every field is bounded. Pure data: no torch, nothing of ours.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

__all__ = ["KEY_CHARS", "MAX_HYPERPARAMETERS", "MAX_NUMBERS", "NAME_CHARS", "SHOWN",
           "TEXT_CHARS", "BuiltOptimizer", "Hyperparameter"]

NAME_CHARS: Final = 200
TEXT_CHARS: Final = 200
KEY_CHARS: Final = 64
MAX_HYPERPARAMETERS: Final = 32
MAX_NUMBERS: Final = 8

Name = Annotated[str, StringConstraints(max_length=NAME_CHARS)]
# bool first: a JSON true is a bool, never the int 1.
Hyperparameter = (bool | int | float | Annotated[str, StringConstraints(max_length=TEXT_CHARS)]
                  | Annotated[list[float], Field(max_length=MAX_NUMBERS)])
# The hyperparameters the summaries show, in this order; the HTML shows every one.
SHOWN: Final = ("lr", "momentum", "betas", "eps", "weight_decay")


class BuiltOptimizer(BaseModel):
    """The optimizer and scheduler a workload built, and whether each is the spec's."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    optimizer: Name = Field(description="its class: SGD for torch.optim.SGD, module-qualified "
                            "outside torch.optim (my_pkg.opt.Lion)")
    groups: int = Field(ge=0, le=1_000_000, description="its param groups")
    hyperparameters: dict[Annotated[str, StringConstraints(max_length=KEY_CHARS)],
                          Hyperparameter] = Field(
        max_length=MAX_HYPERPARAMETERS,
        description="the first param group's, without its params: numbers, flags and "
                    "strings (tuples of numbers as lists); initial_lr is the base lr a "
                    "scheduler scales")
    scheduler: Name | None = Field(description="its lr scheduler's class, named likewise "
                                   "(LambdaLR); None: the workload built none")
    optimizer_from_spec: bool = Field(
        description="it is what training.optimizer builds (build_optimizer): class and "
                    "hyperparameters")
    schedule_from_spec: bool = Field(
        description="the scheduler is what training.schedule builds (build_scheduler)")

    def base_lr(self) -> Hyperparameter | None:
        """The lr before any schedule scales it: ``initial_lr`` where a scheduler set it."""
        h = self.hyperparameters
        return h.get("initial_lr", h.get("lr"))

    def words(self) -> str:
        """'SGD (lr 0.05, momentum 0.9, weight_decay 0), schedule LambdaLR'."""
        h = {**self.hyperparameters, "lr": self.base_lr()}
        shown = ", ".join(f"{k} {_value(h[k])}" for k in SHOWN if h.get(k) is not None)
        groups = f"; {self.groups} param groups, the first's" if self.groups != 1 else ""
        return (f"{self.optimizer} ({shown}{groups}), "
                f"schedule {self.scheduler or 'none'}")


def _value(value: Hyperparameter | None) -> str:
    if isinstance(value, list):
        return "(" + ", ".join(f"{v:g}" for v in value) + ")"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)

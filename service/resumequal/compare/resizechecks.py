"""The validity checks of a resize run (``preemption.resize``): do the traces show what its
verdict (:mod:`resumequal.compare.resize`) claims?

Every step of both legs recorded by every rank of the world it ran on, each microbatch with
its global index; each resume restored the resize's checkpoint on every rank of its world;
every restore, the step that saved it and the control carry a handoff digest. A failed
check makes the run INVALID.
"""

from __future__ import annotations

from resumequal.checkpoint.layout import Position
from resumequal.compare.files import LegTrace
from resumequal.compare.ledger import StepRecords, authoritative
from resumequal.compare.resize import Shape, handoffs, restores_of
from resumequal.results.verdict import ValidityCheck
from resumequal.spec import QualificationSpec
from resumequal.words import count


def _ok(name: str, detail: str) -> ValidityCheck:
    return ValidityCheck(name=name, ok=True, detail=detail)


def _failed(name: str, detail: str) -> ValidityCheck:
    return ValidityCheck(name=name, ok=False, detail=detail)


def _step_problem(leg: str, s: StepRecords | None, step: int, world: int,
                  global_microbatches: int | None) -> str | None:
    if s is None:
        return f"the {leg} leg has no record of step {step}"
    ranks = sorted(s.records)
    if ranks != list(range(world)):
        return (f"the {leg} leg's step {step} (attempt {s.attempt}) has records of ranks "
                f"{ranks}, expected one from each of {count(world, 'rank')}")
    if any(r.world_size not in (None, world) for r in s.records.values()):
        return (f"the {leg} leg's step {step} (attempt {s.attempt}) says it ran on "
                f"{s.world_size or 'differing world sizes'}, expected {world}")
    if any(m.global_index is None for _, m in s.microbatches()):
        return (f"the {leg} leg's step {step} (attempt {s.attempt}) has microbatches without "
                "a global index, so its data ledger cannot be read")
    if global_microbatches is not None:
        indices = sorted(m.global_index for _, m in s.microbatches() if m.global_index is not None)
        if indices != list(range(global_microbatches)):
            return (f"the {leg} leg's step {step} does not run global microbatches "
                    f"0..{global_microbatches - 1} once each, so it is no reference")
    return None


def check_resize_steps(shape: Shape, control: dict[int, StepRecords],
                       preempted: dict[int, StepRecords]) -> ValidityCheck:
    """Every step of both legs has one authoritative record per rank of the world it must
    have run on, each microbatch with its global index."""
    for step in range(1, shape.steps + 1):
        problem = (_step_problem("control", control.get(step), step, shape.full,
                                 shape.global_microbatches)
                   or _step_problem("preempted", preempted.get(step), step,
                                    shape.world_at(step), None))
        if problem is not None:
            return _failed("steps", problem)
    spans = _spans(shape)
    return _ok("steps", f"steps 1..{shape.steps} recorded by every rank of the world each ran "
                        f"on: the control at {shape.full} ranks, the preempted leg {spans}")


def _spans(shape: Shape) -> str:
    """E.g. "steps 1..4 at 2 ranks, 5..8 at 1, 9..12 at 2"."""
    out: list[str] = []
    start = 1
    for step in range(1, shape.steps + 1):
        if step == shape.steps or shape.world_at(step + 1) != shape.world_at(step):
            out.append(f"{start}..{step} at {shape.world_at(step)}")
            start = step + 1
    return "steps " + ", ".join(out) + " ranks"


def check_resize_restores(shape: Shape, preempted: LegTrace,
                          records: dict[int, StepRecords]) -> ValidityCheck:
    """The attempt that ran the step after the resize's checkpoint restored it on every
    rank of the smaller world; after a grow, likewise at the full world."""
    name = "restored_checkpoint"
    resumes = [(shape.resize_step, shape.small, shape.full)]
    if shape.grow_step is not None:
        resumes.append((shape.grow_step, shape.full, shape.small))
    done = []
    for step, world, saved_by in resumes:
        expected = Position(step).name
        after = records.get(step + 1)
        if after is None or after.attempt == 0:
            return _failed(name, f"no resumed attempt ran step {step + 1}, so nothing resumed "
                                 f"from {expected}")
        attempt = after.attempt
        restores = restores_of(preempted, attempt)
        if sorted(restores) != list(range(world)):
            return _failed(name, f"attempt {attempt}, which ran step {step + 1}, restored on "
                                 f"ranks {sorted(restores)}, expected every one of "
                                 f"{count(world, 'rank')}")
        for rank, r in restores.items():
            if r.checkpoint != expected:
                return _failed(name, f"attempt {attempt} restored {r.checkpoint} (rank {rank}), "
                                     f"expected {expected}")
            if r.world_size not in (None, world) or r.saved_world_size not in (None, saved_by):
                return _failed(name, f"attempt {attempt} restored {expected} on rank {rank} in "
                                     f"a world of {r.world_size} saved by {r.saved_world_size}, "
                                     f"expected {world} saved by {saved_by}")
        done.append(f"attempt {attempt} restored {expected} on {count(world, 'rank')} "
                    f"(saved by {saved_by})")
    return _ok(name, "; ".join(done))


def check_handoff_digests(control: LegTrace, preempted: LegTrace) -> ValidityCheck:
    """Every restore, the step record that saved it, and the control carry a handoff."""
    h = handoffs(control, preempted)
    if h.missing is not None:
        return _failed("handoff_digests", h.missing)
    return _ok("handoff_digests", f"{count(len(h.rows), 'restore')} and the steps that saved "
                                  "them carry handoff digests")


def resize_checks(spec: QualificationSpec, control: LegTrace,
                  preempted: LegTrace) -> list[ValidityCheck]:
    """The validity checks a fixed world would make, for a leg whose world changes."""
    shape = Shape.of(spec)
    records = authoritative(preempted)
    return [check_resize_restores(shape, preempted, records),
            check_handoff_digests(control, preempted),
            check_resize_steps(shape, authoritative(control), records)]

"""Validity checks: did the experiment test what it claims?

Each check is a :class:`~resumequal.results.verdict.ValidityCheck`; any failed check makes the
verdict INVALID with that check's detail as the reason, before any boundary is compared.
The details are written to follow "invalid: " in a sentence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from resumequal.checkpoint.layout import Position
from resumequal.checkpoint.reading import VerifiedCheckpoint
from resumequal.compare.files import LegTrace
from resumequal.results.verdict import ValidityCheck
from resumequal.run.location import RunLocation
from resumequal.spec import QualificationSpec
from resumequal.trace.records import ArmRecord, InventoryRecord, RestoreRecord
from resumequal.words import count


def _ok(name: str, detail: str) -> ValidityCheck:
    return ValidityCheck(name=name, ok=True, detail=detail)


def _failed(name: str, detail: str) -> ValidityCheck:
    return ValidityCheck(name=name, ok=False, detail=detail)


def expected_checkpoint(spec: QualificationSpec) -> str | None:
    """The checkpoint the resumed attempt must restore, by kill mode and cut point.

    A hard kill resumes from the newest checkpoint committed after a step before the cut's
    step (at ``checkpoint_commit`` the cut's own checkpoint was never committed). A
    graceful stop commits an emergency checkpoint at the cut: mid-accumulation that is
    ``step-(step-1)+microstep``, inside a commit it is the checkpoint being committed.
    None when a hard kill lands before any checkpoint (the spec rejects that).
    """
    p, t = spec.preemption, spec.training
    if p.mode == "graceful":
        if p.at == "checkpoint_commit":
            return Position(p.step, 0).name
        return Position(p.step - 1, p.microstep).name
    saved = [s for s in range(1, p.step) if spec.checkpoint.saves_after(s, t.steps)]
    return Position(saved[-1]).name if saved else None


def check_traces(control: LegTrace, preempted: LegTrace) -> ValidityCheck:
    problems = control.problems + preempted.problems
    if problems:
        return _failed("traces", "; ".join(problems))
    return _ok("traces", f"both legs have a trace of each of "
                         f"{count(control.world_size, 'rank')}")


def check_armed(spec: QualificationSpec, preempted: LegTrace,
                location: RunLocation) -> ValidityCheck:
    """The target rank reached the requested cut on attempt 0 and published its beacon."""
    p = spec.preemption
    want = (p.step, p.microstep)
    arms = [a for a in preempted.of(ArmRecord, p.rank) if a.attempt == 0]
    if not arms:
        return _failed(
            "armed",
            f"the preempted leg was never armed: rank {p.rank} wrote no arm record on "
            "attempt 0, so no kill landed at the cut",
        )
    arm = arms[0]
    if (arm.step, arm.microstep) != want:
        return _failed(
            "armed",
            f"rank {p.rank} was armed at step {arm.step} microstep {arm.microstep}, "
            f"expected step {p.step} microstep {p.microstep}",
        )
    files = location.leg(preempted.leg)
    beacon = files.beacon_key(p.rank, 0)
    if not files.store.exists(beacon):
        return _failed("armed", f"rank {p.rank} was armed but left no beacon at "
                                f"{files.store.uri(beacon)}")
    return _ok("armed", f"rank {p.rank} armed at step {p.step} microstep {p.microstep} "
                        f"({p.at}) on attempt 0, pid {arm.pid}")


def resumed_attempt(preempted: LegTrace) -> int | None:
    """The attempt the launcher started after the kill: the first one after attempt 0."""
    later = [a for a in preempted.attempts() if a >= 1]
    return later[0] if later else None


def check_control_uninterrupted(control: LegTrace) -> ValidityCheck:
    """The control leg trained in one attempt: a control its launcher restarted (a worker
    that died, even after its last step) is not the uninterrupted run it stands for."""
    attempts = control.attempts()
    if len(attempts) > 1:
        return _failed("control_uninterrupted",
                       f"the control leg restarted (attempts {attempts}), so it is not an "
                       "uninterrupted run; its log says why its launcher restarted it")
    return _ok("control_uninterrupted", f"the control leg ran attempt {attempts[0]} alone"
               if attempts else "the control leg wrote no attempt")


def check_restarted(preempted: LegTrace) -> ValidityCheck:
    attempt = resumed_attempt(preempted)
    if attempt is None:
        return _failed(
            "restarted", "the preempted leg never restarted: its traces hold only attempt 0"
        )
    return _ok("restarted", f"the preempted leg ran attempts {preempted.attempts()}")


def _restores(preempted: LegTrace, attempt: int) -> dict[int, RestoreRecord]:
    return {r.rank: r for r in preempted.of(RestoreRecord) if r.attempt == attempt}


def check_restored_checkpoint(
    spec: QualificationSpec, preempted: LegTrace, attempt: int | None, run: str | None = None
) -> ValidityCheck:
    """Every rank of the resumed attempt restored the checkpoint the plan names: the one
    the cut implies, of this run (``run``, when known) and leg, holding that step's state,
    one and the same manifest on every rank. Whether it gave each rank back its own state
    is for the comparison to judge (:mod:`resumequal.compare.restore`)."""
    name = "restored_checkpoint"
    if attempt is None:
        return _failed(name, "there is no resumed attempt to have restored anything")
    expected = expected_checkpoint(spec)
    if expected is None:
        return _failed(name, "no checkpoint is committed before the cut, so the restart "
                             "cannot be a resume")
    restores = _restores(preempted, attempt)
    for rank in range(spec.world.world_size):
        got = restores.get(rank)
        if got is None:
            return _failed(
                name,
                f"rank {rank} of the resumed attempt {attempt} restored no checkpoint "
                f"(it started from scratch), expected {expected}",
            )
        problem = _not_planned(got, expected, preempted.leg, run)
        if problem is not None:
            return _failed(name, problem)
    manifests = {r.manifest for r in restores.values()}
    if len(manifests) > 1:
        shown = ", ".join(f"{(r.manifest or 'none')[:12]}… on rank {k}"
                          for k, r in sorted(restores.items()))
        return _failed(name, f"the ranks of attempt {attempt} restored different checkpoints "
                             f"named {expected} (manifests {shown})")
    return _ok(name, f"every rank of attempt {attempt} restored {expected}"
                     + (f" (manifest {next(iter(manifests))})" if None not in manifests else ""))


def _not_planned(got: RestoreRecord, expected: str, leg: str, run: str | None) -> str | None:
    """Why the checkpoint one rank restored is not the one the plan names, if it is not."""
    rank = got.rank
    if got.checkpoint != expected:
        return f"the resumed attempt restored {got.checkpoint} (rank {rank}), expected {expected}"
    if run is not None and got.run is not None and got.run != run:
        return (f"rank {rank} restored a {expected} of run {got.run or '(none)'}, not of this "
                f"run ({run})")
    if got.leg is not None and got.leg != leg:
        return f"rank {rank} restored the {got.leg} leg's {expected}, not the {leg} leg's"
    position = Position.parse(got.checkpoint)
    if position is not None and (got.step, got.microstep) != (position.step,
                                                               position.microstep):
        return (f"rank {rank} restored a checkpoint named {expected} that holds the state of "
                f"step {got.step} microbatch {got.microstep}: another step's checkpoint, "
                "filed under the expected name")
    if got.params is None or got.optimizer_state is None:
        return (f"rank {rank}'s restore record carries no state digests, so nothing shows "
                "the restore loaded what was saved")
    return None


def check_steps(control: LegTrace, preempted: LegTrace, steps: int) -> ValidityCheck:
    want = set(range(1, steps + 1))
    for leg in (control, preempted):
        for rank in range(leg.world_size):
            have = set(leg.effective.get(rank, {}))
            missing = sorted(want - have)
            if missing:
                shown = ", ".join(map(str, missing[:5])) + (" …" if len(missing) > 5 else "")
                return _failed("steps", f"the {leg.leg} leg has no record of step(s) {shown} "
                                        f"on rank {rank}")
    return _ok("steps", f"steps 1..{steps} recorded by every rank of both legs")


def _diff_keys(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, Mapping) and isinstance(vb, Mapping):
            out += _diff_keys(va, vb, f"{prefix}{key}.")
        elif va != vb or (key in a) != (key in b):
            out.append(f"{prefix}{key}")
    return out


def _lookup(d: Mapping[str, Any], dotted: str) -> Any:
    value: Any = d
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def check_inventory(control: LegTrace, preempted: LegTrace) -> ValidityCheck:
    """Each rank's runtime inventory is the same in both legs and every attempt."""
    name = "inventory"
    differences: list[str] = []
    for rank in range(control.world_size):
        mine = {leg.leg: list(leg.of(InventoryRecord, rank)) for leg in (control, preempted)}
        for trace in (control, preempted):
            if not mine[trace.leg]:
                return _failed(
                    name, f"the {trace.leg} leg recorded no runtime inventory on rank {rank}"
                )
        ref = mine[control.leg][0].comparable()
        for leg, records in mine.items():
            for record in records:
                keys = _diff_keys(ref, record.comparable())
                if keys:
                    where = f"{leg} rank {rank} attempt {record.attempt}"
                    shown = ", ".join(
                        f"{k} ({_lookup(ref, k)!r} vs {_lookup(record.comparable(), k)!r})"
                        for k in keys
                    )
                    differences.append(f"{where}: {shown}")
    if differences:
        return _failed(name, "runtime inventories differ from the control's first attempt "
                             "on the same rank: " + "; ".join(differences))
    return _ok(name, "runtime inventories equal on every rank and attempt of both legs")


@dataclass(frozen=True)
class FinalCheckpoints:
    """The two legs' checkpoints after the last step, their manifests authenticated."""

    control: VerifiedCheckpoint
    preempted: VerifiedCheckpoint


def check_final_checkpoints(
    finals: Mapping[str, VerifiedCheckpoint | None], steps: int
) -> tuple[ValidityCheck, FinalCheckpoints | None]:
    """Both legs committed ``step-T``: each opened (:func:`final_checkpoint`) with its
    manifest authenticated and its files listed with their sizes; their bytes are checked
    as the drift reads them."""
    name = "final_checkpoints"
    final = Position(steps).name
    opened: dict[str, VerifiedCheckpoint] = {}
    for leg, checkpoint in finals.items():
        if checkpoint is None:
            return _failed(name, f"the {leg} leg's checkpoint store cannot be read "
                                 "here"), None
        if checkpoint.name != final:
            return _failed(name, f"the {leg} leg's final checkpoint is {checkpoint.name}, "
                                 f"not {final}"), None
        opened[leg] = checkpoint
    return (
        _ok(name, f"both legs committed {final} under manifests of this run; every byte "
                  "compared is checked against them as it is read"),
        FinalCheckpoints(opened["control"], opened["preempted"]),
    )

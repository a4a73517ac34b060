"""The restore judged by what was restored: did each rank get back the state it saved?

A resumed rank records, right after its restore, a digest per parameter, buffer and
optimizer-state tensor (:class:`~resumequal.trace.records.RestoreRecord`). Once the
validity checks have shown that the right checkpoint was restored (its name, run, leg,
manifest and step: :func:`resumequal.compare.validity.check_restored_checkpoint`), any
tensor that differs from what the same rank held when it saved is a defect of the resume,
not of the experiment: a FAIL at the restore, naming the tensors, the ranks, why and the fix.

A checkpoint taken in the middle of an accumulation window (a graceful stop's) is compared
with what each rank recorded saving (a ``SavedRecord``); in traces without one, with the
record of the step before it, which holds its parameters and optimizer state but not its
buffers (the window's forwards have moved those since: they are left to the walk).

Why, from the traces alone: a tensor whose saved digests differ between the ranks, and that
every rank got back as one rank's copy, is rank-local state of which the checkpoint keeps
one copy (DCP deduplicates what every rank saves under one name); a buffer the model's
``state_dict`` leaves out was never saved; anything else was restored unlike any rank's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from resumequal.compare.files import LegTrace
from resumequal.compare.tensors import MAX_LISTED, module_of
from resumequal.results.verdict import (
    Divergence,
    ModuleDifference,
    RestoreCause,
    RestoredTensor,
    TensorDifference,
)
from resumequal.trace.records import RestoreRecord, SavedRecord, StepRecord

__all__ = ["restore_divergence", "restore_words", "saved_records"]

_Boundary = Literal["params", "optimizer_state"]
_BOUNDARIES: Final[tuple[_Boundary, ...]] = ("params", "optimizer_state")

# What fixes each cause, by the kind of tensor.
_FIXES: Final[Mapping[tuple[RestoreCause, str], str]] = {
    ("per_rank", "buffer"): (
        "keep the buffers equal on every rank (torch.nn.SyncBatchNorm."
        "convert_sync_batchnorm for BatchNorm), or make them equal before each save "
        "(broadcast them from rank 0, or average them), or save them per rank under "
        "rank-keyed names"),
    ("per_rank", "parameter"): (
        "keep the parameters equal on every rank (every rank must take the same update), "
        "or save them per rank under rank-keyed names"),
    ("per_rank", "optimizer_state"): (
        "keep the optimizer state equal on every rank, or save it per rank under "
        "rank-keyed names"),
    ("not_saved", "buffer"): (
        "register the buffer persistent (register_buffer(name, tensor, persistent=True)), "
        "or rebuild it on load from state the checkpoint holds"),
}
# Each kind of tensor in words: (one, several).
_KIND_WORDS: Final = {"parameter": ("parameter", "parameters"), "buffer": ("buffer", "buffers"),
                      "optimizer_state": ("optimizer state", "optimizer state")}
_OTHER_FIX: Final = ("check what the model's or optimizer's load_state_dict (and its "
                     "hooks) do with the saved value")


@dataclass(frozen=True)
class _Found:
    """One tensor of one rank that was not restored as saved."""

    boundary: _Boundary
    name: str
    rank: int


Saved = StepRecord | SavedRecord


def saved_records(control: LegTrace, preempted: LegTrace, restores: Mapping[int, RestoreRecord]
                  ) -> dict[int, Saved]:
    """Per rank, the record of the state it put into the restored checkpoint: what it
    recorded saving it mid-step (:class:`SavedRecord`), else its own attempt 0's record of
    the checkpoint's step, else the control's (a rank whose first attempt left none)."""
    own = preempted.attempt_steps(0)
    out: dict[int, Saved] = {}
    for rank, restore in restores.items():
        said = [r for r in preempted.of(SavedRecord, rank)
                if r.checkpoint == restore.checkpoint and r.attempt < restore.attempt]
        record = said[-1] if said else own.get(rank, {}).get(restore.step) \
            or control.effective.get(rank, {}).get(restore.step)
        if record is not None:
            out[rank] = record
    return out


def _digests(record: Saved | RestoreRecord, boundary: _Boundary) -> dict[str, str] | None:
    if record.tensors is None:
        return None
    found: dict[str, str] = getattr(record.tensors, boundary)
    return found


def _whole(record: Saved | RestoreRecord, boundary: _Boundary) -> str | None:
    return record.params if boundary == "params" else record.optimizer_state


def _compared(restore: RestoreRecord) -> tuple[_Boundary, ...]:
    # A control that leaves the optimizer out restores the model into a fresh optimizer.
    return ("params",) if "optimizer" in restore.omitted else _BOUNDARIES


def _differences(restores: Mapping[int, RestoreRecord],
                 saved: Mapping[int, Saved]) -> tuple[list[_Found], list[tuple[_Boundary,
                                                                                     int]]]:
    """Tensors not restored as saved; and (boundary, rank) pairs that differ as a whole
    where a record has no per-tensor digests (traces written before they existed)."""
    found: list[_Found] = []
    whole: list[tuple[_Boundary, int]] = []
    for rank, restore in sorted(restores.items()):
        record = saved.get(rank)
        if record is None or restore.step == 0:
            continue
        for boundary in _compared(restore):
            mine, theirs = _digests(restore, boundary), _digests(record, boundary)
            if mine is None or theirs is None:
                if _whole(restore, boundary) != _whole(record, boundary):
                    whole.append((boundary, rank))
                continue
            names = list(theirs) + [n for n in mine if n not in theirs]
            if boundary == "params" and restore.microstep and isinstance(record, StepRecord):
                # Saved mid-step, recorded only by the step before: the forwards since moved
                # the buffers (traces written before SavedRecord existed).
                names = [n for n in names if n not in restore.buffers]
            found += [_Found(boundary, n, rank) for n in names if mine.get(n) != theirs.get(n)]
    return found, whole


def _kind(boundary: _Boundary, name: str, restore: RestoreRecord
          ) -> Literal["parameter", "buffer", "optimizer_state"]:
    if boundary == "optimizer_state":
        return "optimizer_state"
    return "buffer" if name in restore.buffers else "parameter"


def _cause(f: _Found, restores: Mapping[int, RestoreRecord],
           saved: Mapping[int, Saved]) -> tuple[RestoreCause, int | None]:
    """Why rank ``f.rank`` did not get ``f.name`` back, and whose copy it got."""
    restore = restores[f.rank]
    if f.boundary == "params" and f.name in restore.unsaved:
        return "not_saved", None
    got = (_digests(restore, f.boundary) or {}).get(f.name)
    copies = {r: (_digests(rec, f.boundary) or {}).get(f.name) for r, rec in saved.items()}
    if len(set(copies.values())) > 1:
        kept = [r for r, d in sorted(copies.items()) if d == got and r != f.rank]
        if kept:
            return "per_rank", kept[0]
    return "not_as_saved", None


def _restored(found: Sequence[_Found], restores: Mapping[int, RestoreRecord],
              saved: Mapping[int, Saved]) -> list[RestoredTensor]:
    by: dict[tuple[_Boundary, str], RestoredTensor] = {}
    for f in found:
        cause, kept = _cause(f, restores, saved)
        key = (f.boundary, f.name)
        known = by.get(key)
        if known is None:
            by[key] = RestoredTensor(name=f.name, kind=_kind(f.boundary, f.name,
                                                              restores[f.rank]),
                                     ranks=[f.rank], cause=cause, kept_rank=kept)
        else:
            known.ranks.append(f.rank)
    return list(by.values())[:MAX_LISTED]


def _tensor_difference(boundary: _Boundary, rank: int, found: Sequence[_Found],
                       saved: Saved, restore: RestoreRecord) -> TensorDifference | None:
    names_saved, names_restored = _digests(saved, boundary), _digests(restore, boundary)
    if names_saved is None or names_restored is None:
        return None
    names = list(names_saved) + [n for n in names_restored if n not in names_saved]
    differing = [f.name for f in found if f.boundary == boundary and f.rank == rank]
    modules: dict[str, list[int]] = {}
    for name in names:
        counts = modules.setdefault(module_of(name), [0, 0])
        counts[1] += 1
        counts[0] += name in differing
    return TensorDifference(
        total=len(names), differ=len(differing), order="parameter",
        first=differing[0] if differing else None, differing=differing[:MAX_LISTED],
        modules=[ModuleDifference(module=m, differ=d, total=t) for m, (d, t) in modules.items()
                 if d])


def _cause_words(restored: Sequence[RestoredTensor], checkpoint: str) -> str:
    """'buffers features.1.running_mean, features.1.running_var differed between the ranks
    when step-00000004 was saved; the checkpoint keeps one copy (rank 1's), which every
    rank got back'."""
    parts: list[str] = []
    for cause in ("per_rank", "not_saved", "not_as_saved"):
        these = [t for t in restored if t.cause == cause]
        if not these:
            continue
        many = len(these) > 1
        kinds = sorted({_KIND_WORDS[t.kind][many] for t in these})
        what = f"{'/'.join(kinds)} {', '.join(t.name for t in these[:6])}" + (
            f" and {len(these) - 6} more" if len(these) > 6 else "")
        if cause == "per_rank":
            kept = sorted({t.kept_rank for t in these if t.kept_rank is not None})
            whose = ", ".join(f"rank {r}'s" for r in kept)
            parts.append(f"{what} differed between the ranks when {checkpoint} was saved; "
                         f"the checkpoint keeps one copy ({whose}), which every rank got back")
        elif cause == "not_saved":
            parts.append(f"{what}: not in the checkpoint (non-persistent: the model's "
                         "state_dict leaves it out), so a resumed rank has what the workload "
                         "built")
        else:
            parts.append(f"{what}: restored unlike what any rank saved")
    return "; ".join(parts)


def _fix_words(restored: Sequence[RestoredTensor]) -> str:
    fixes: list[str] = []
    for t in restored:
        fix = _FIXES.get((t.cause, t.kind), _OTHER_FIX)
        if fix not in fixes:
            fixes.append(fix)
    return "; ".join(fixes)


def restore_divergence(restores: Mapping[int, RestoreRecord],
                       saved: Mapping[int, Saved]) -> Divergence | None:
    """The first difference between the state each rank restored and the state it saved
    (``saved``: :func:`saved_records`), with its cause and fix; None when every rank got
    its own state back."""
    found, whole = _differences(restores, saved)
    if not found and not whole:
        return None
    firsts = [(_BOUNDARIES.index(f.boundary), f.rank, f.boundary) for f in found] + \
             [(_BOUNDARIES.index(b), r, b) for b, r in whole]
    _, rank, boundary = min(firsts)
    restore, record = restores[rank], saved[rank]
    restored = _restored(found, restores, saved)
    tensors = _tensor_difference(boundary, rank, found, record, restore)
    return Divergence(
        step=restore.step, boundary=boundary, rank=rank,
        control=f"saved after step {restore.step}: {_whole(record, boundary)}",
        preempted=f"restored from {restore.checkpoint}: {_whole(restore, boundary)}",
        before_cut=False, tensors=tensors, at_restore=True, restored=restored,
        cause=_cause_words(restored, restore.checkpoint) or None,
        fix=_fix_words(restored) if restored else None)


def restore_words(d: Divergence, checkpoint: str) -> str:
    """A FAIL reason for a divergence at the restore: what, which ranks, why, the fix."""
    ranks = sorted({r for t in d.restored for r in t.ranks}) or [d.rank]
    which = f" ({d.tensor_words()})" if d.tensors is not None else ""
    why = f": {d.cause}" if d.cause else ""
    fix = f"; fix: {d.fix}" if d.fix else ""
    on = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
    return (f"the state restored from {checkpoint} is not the state the ranks saved: "
            f"{d.boundary} differ on {on}{which}{why}{fix}")

"""The verdict of a resize run (``preemption.resize``): four parts, each checked and reported.

1. Before the resize, bitwise exact: every step attempt 0 of the preempted leg completed
   (on the full world, before the kill) equals the control's on every compared boundary;
   a difference there is NONDETERMINISTIC, as for any run.
2. Handoff exact: every resumed attempt restored, on every rank, the handoff digest (the
   whole training state gathered over the ranks, world-size free) that the attempt which
   saved the checkpoint recorded; the resize's restore also equals the control's.
3. Data ledger exact: every step's authoritative records (see :mod:`.ledger`) ran each
   global microbatch once, with the control's samples at each index, so the step consumed
   the control's sample ids, as often.
4. Drift within ``comparison.tolerances`` from the resize on: the loss per global
   microbatch, the gradient norm per step, and the final checkpoints' drift.

A failed part 2, 3 or 4 is FAIL (in that order). Missing world sizes, global indices or
handoff digests make the run INVALID: the traces do not show what the verdict claims.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Final

from resumequal.checkpoint.layout import Position
from resumequal.compare.drift import is_exact
from resumequal.compare.files import LegTrace
from resumequal.compare.ledger import (
    LedgerStep,
    StepRecords,
    Worst,
    as_steps,
    authoritative,
    consumed,
    grad_norm_diff,
    ledger_step,
    loss_diff,
    within,
)
from resumequal.compare.walk import Rules, Walk, divergence, loss_deltas, walk
from resumequal.spec import QualificationSpec
from resumequal.spec.boundaries import BOUNDARIES
from resumequal.trace.records import RestoreRecord, StepRecord
from resumequal.verdict import (
    BoundaryRow,
    Cut,
    Divergence,
    DriftSummary,
    ResizeHandoff,
    ResizeOutcome,
    ResizePart,
    ResizeStepRow,
    Result,
    ValidityCheck,
    Verdict,
)
from resumequal.words import count

_SHOWN: Final = 3  # failing steps a part's detail names


@dataclass(frozen=True)
class Shape:
    """The figures of one resize, from the spec: worlds, steps and the checkpoints used."""

    full: int  # ranks before the kill (and after a grow)
    small: int  # ranks after the kill
    global_microbatches: int
    steps: int
    resize_step: int  # the checkpoint the smaller world resumes from
    grow_step: int | None  # the checkpoint the grown world resumes from

    @classmethod
    def of(cls, spec: QualificationSpec) -> Shape:
        resize = spec.preemption.resize
        assert resize is not None
        t, w = spec.training, spec.world
        # The spec allows a resize with hard kills only, after a committed checkpoint.
        saved = spec.checkpoint.last_save_before(spec.preemption.step, t.steps)
        assert saved is not None
        return cls(full=w.world_size, small=resize.to_nodes * w.nproc_per_node,
                   global_microbatches=t.accumulation_steps * w.world_size, steps=t.steps,
                   resize_step=saved, grow_step=resize.grow_after_step)

    def world_at(self, step: int) -> int:
        """The ranks the preempted leg's step must finally have run on."""
        if step <= self.resize_step or (self.grow_step is not None and step > self.grow_step):
            return self.full
        return self.small

    @property
    def worlds(self) -> list[int]:
        return [self.full, self.small] + ([self.full] if self.grow_step is not None else [])


def _ok(name: str, detail: str) -> ValidityCheck:
    return ValidityCheck(name=name, ok=True, detail=detail)


def _failed(name: str, detail: str) -> ValidityCheck:
    return ValidityCheck(name=name, ok=False, detail=detail)


# --------------------------------------------------------------------------- validity


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


def _restores(leg: LegTrace, attempt: int) -> dict[int, RestoreRecord]:
    return {r.rank: r for r in leg.of(RestoreRecord) if r.attempt == attempt}


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
        restores = _restores(preempted, attempt)
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


@dataclass(frozen=True)
class Handoffs:
    """Every resumed attempt's restore against the saved handoff, or what is missing."""

    rows: list[ResizeHandoff]
    missing: str | None
    disagreeing: dict[int, list[str]]  # attempt -> its ranks' differing digests


def _saved(leg: LegTrace, step: int, attempt: int) -> tuple[int, set[str | None]] | None:
    """The latest attempt up to ``attempt`` that recorded a handoff at ``step``, and the
    digests its ranks recorded there."""
    by_attempt: dict[int, set[str | None]] = {}
    for r in leg.of(StepRecord):
        if r.step == step and r.attempt <= attempt:
            by_attempt.setdefault(r.attempt, set()).add(r.handoff)
    found = [a for a, digests in by_attempt.items() if digests - {None}]
    return (max(found), by_attempt[max(found)]) if found else None


def handoffs(control: LegTrace, preempted: LegTrace) -> Handoffs:
    """The handoff of every resumed attempt (each attempt after 0 that restored)."""
    rows: list[ResizeHandoff] = []
    disagreeing: dict[int, list[str]] = {}
    attempts = sorted({r.attempt for r in preempted.of(RestoreRecord) if r.attempt >= 1})
    for i, attempt in enumerate(attempts):
        restores = _restores(preempted, attempt)
        first = restores[min(restores)]
        lacking = sorted(rank for rank, r in restores.items() if r.handoff is None)
        if lacking:
            return Handoffs(rows, f"the restore of {first.checkpoint} by attempt {attempt} "
                                  f"carries no handoff digest (rank {lacking[0]}), so nothing "
                                  "shows the smaller world took over the state saved", {})
        digests = {r.handoff for r in restores.values()}
        if len(digests) > 1:
            disagreeing[attempt] = sorted(d for d in digests if d is not None)
        saved = _saved(preempted, first.step, attempt)
        if saved is None:
            return Handoffs(rows, f"no record of step {first.step} in the preempted leg carries "
                                  f"the handoff digest of the checkpoint attempt {attempt} "
                                  "restored", {})
        equal_control = None
        if i == 0:
            ctrl = {r.handoff for r in control.of(StepRecord) if r.step == first.step}
            if None in ctrl:
                return Handoffs(rows, f"the control's record of step {first.step} carries no "
                                      "handoff digest to check the resize's restore against", {})
            equal_control = digests == ctrl and len(ctrl) == 1
        rows.append(ResizeHandoff(
            attempt=attempt, checkpoint=first.checkpoint, step=first.step,
            saved_world_size=first.saved_world_size, world_size=first.world_size,
            handoff=first.handoff, equal_to_saved=digests == saved[1] and len(digests) == 1,
            equal_to_control=equal_control))
    return Handoffs(rows, None, disagreeing)


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


# --------------------------------------------------------------------------- the parts


@dataclass(frozen=True)
class _StepFigures:
    row: ResizeStepRow
    ledger: LedgerStep
    loss: Worst | None
    grad_norm: Worst | None


def _figures(shape: Shape, tolerances: dict[str, float], control: dict[int, StepRecords],
             preempted: dict[int, StepRecords]) -> list[_StepFigures]:
    out = []
    for step in range(1, shape.steps + 1):
        a, b = control[step], preempted[step]
        ledger = ledger_step(a, b, shape.global_microbatches)
        loss, norm = loss_diff(a, b), grad_norm_diff(a, b)
        ok = within(loss, tolerances["loss"]) and within(norm, tolerances["grad_norm"])
        out.append(_StepFigures(ResizeStepRow(
            step=step, world_size=len(b.records), attempt=b.attempt, ledger_ok=ledger.ok,
            loss_max_abs_diff=loss.diff if loss else None,
            grad_norm_abs_diff=norm.diff if norm else None, within_tolerance=ok),
            ledger, loss, norm))
    return out


def _before_part(shape: Shape, early: Walk, precut_steps: list[int]) -> ResizePart:
    if early.first is not None:
        p = early.first
        return ResizePart(name="before_resize", ok=False, detail=(
            f"the legs differ at step {p.step} ({p.boundary}, rank {p.rank}) before the kill"))
    span = f"1..{precut_steps[-1]}" if precut_steps else "none"
    return ResizePart(name="before_resize", ok=True, detail=(
        f"attempt 0's {count(len(precut_steps), 'step')} ({span}) on {shape.full} ranks equal "
        "the control's on every compared boundary"))


def _handoff_part(h: Handoffs) -> ResizePart:
    for row in h.rows:
        if row.attempt in h.disagreeing:
            return ResizePart(name="handoff", ok=False, detail=(
                f"the ranks of attempt {row.attempt} restored different handoffs from "
                f"{row.checkpoint}"))
        if not row.equal_to_saved:
            return ResizePart(name="handoff", ok=False, detail=(
                f"attempt {row.attempt} restored a handoff from {row.checkpoint} other than "
                f"the one saved after step {row.step}"))
        if row.equal_to_control is False:
            return ResizePart(name="handoff", ok=False, detail=(
                f"attempt {row.attempt} restored a handoff from {row.checkpoint} other than "
                f"the control's after step {row.step}"))
    shown = ", ".join(f"{r.checkpoint} on {count(r.world_size or 0, 'rank')}" for r in h.rows)
    return ResizePart(name="handoff", ok=True, detail=(
        f"{count(len(h.rows), 'restore')} took over the state saved ({shown}); the resize's "
        "equals the control's"))


def _ledger_part(shape: Shape, figures: list[_StepFigures], samples: Counter[int]) -> ResizePart:
    """Every step's ledger exact; then the run consumed the control's ids too, as often."""
    failing = [f.ledger for f in figures if not f.ledger.ok]
    if failing:
        words = "; ".join(f.words() for f in failing[:_SHOWN])
        if len(failing) > _SHOWN:
            words += f"; and {len(failing) - _SHOWN} more step(s)"
        return ResizePart(name="data_ledger", ok=False, detail=words)
    return ResizePart(name="data_ledger", ok=True, detail=(
        f"{count(shape.steps, 'step')}, {_samples(samples)}: every step ran global "
        f"microbatches 0..{shape.global_microbatches - 1} once each with the control's "
        "samples at each index"))


def _samples(samples: Counter[int]) -> str:
    """E.g. "576 samples each once", or "576 samples (288 distinct)"."""
    once = len(samples) == samples.total()
    return (f"{count(samples.total(), 'sample')} each once" if once
            else f"{count(samples.total(), 'sample')} ({len(samples)} distinct)")


def _largest(values: list[Worst | None]) -> float:
    # NaN compares false with everything: a NaN figure is over any tolerance anyway.
    return max((w.diff for w in values if w is not None), default=0.0)


def _final_tolerance(group: str, tolerances: dict[str, float]) -> float:
    # The optimizer's moments drift with the parameters: without a tolerance of their own
    # they are held to the params tolerance.
    if group == "optimizer":
        return tolerances.get("optimizer_state", tolerances["params"])
    return tolerances["params"]


def _final_fault(drift: list[DriftSummary], rules: Rules,
                 tolerances: dict[str, float]) -> DriftSummary | None:
    for d in drift:
        boundary = "params" if d.group == "model" else "optimizer_state"
        if is_exact(d) or not rules.compares(boundary):
            continue
        if not rules.group_within(d.group, _final_tolerance(d.group, tolerances)):
            return d
    return None


def _drift_part(
    shape: Shape, figures: list[_StepFigures], drift: list[DriftSummary], rules: Rules,
    tolerances: dict[str, float],
) -> tuple[ResizePart, _StepFigures | None, DriftSummary | None]:
    """The first step after the resize over a tolerance, else the final drift's fault."""
    after = [f for f in figures if f.row.step > shape.resize_step]
    over = next((f for f in after if not f.row.within_tolerance), None)
    if over is not None:
        loss_over = not within(over.loss, tolerances["loss"])
        what, w, tol = (("loss", over.loss, tolerances["loss"]) if loss_over
                        else ("grad norm", over.grad_norm, tolerances["grad_norm"]))
        figure = "not measured" if w is None else f"|Δ| {w.diff:.3g}"
        return ResizePart(name="drift", ok=False, detail=(
            f"step {over.row.step} ({count(over.row.world_size, 'rank')}): {what} {figure} "
            f"over the tolerance {tol:g}")), over, None
    fault = _final_fault(drift, rules, tolerances)
    if fault is not None:
        tol = _final_tolerance(fault.group, tolerances)
        extra = (f", {len(fault.values_differ) + len(fault.unmatched)} item(s) differ or "
                 "unmatched" if fault.values_differ or fault.unmatched else "")
        return ResizePart(name="drift", ok=False, detail=(
            f"final {fault.group} max abs diff {fault.max_abs_diff:.3g} over the tolerance "
            f"{tol:g}{extra}")), None, fault
    finals = ", ".join(f"{d.group} ≤ {d.max_abs_diff:.3g}" for d in drift)
    return ResizePart(name="drift", ok=True, detail=(
        f"from step {shape.resize_step + 1}: loss ≤ {_largest([f.loss for f in after]):.3g} "
        f"(tolerance {tolerances['loss']:g}), grad norm ≤ "
        f"{_largest([f.grad_norm for f in after]):.3g} (tolerance {tolerances['grad_norm']:g}); "
        f"final {finals} (params tolerance {tolerances['params']:g})")), None, None


# --------------------------------------------------------------------------- divergences


def _ledger_divergence(ledger: LedgerStep, control: StepRecords,
                       preempted: StepRecords) -> Divergence:
    missing = sorted(ledger.missing)[:_SHOWN]
    over = sorted(ledger.duplicated + ledger.foreign)[:_SHOWN]
    return Divergence(step=ledger.step, boundary="inputs", rank=ledger.first_rank or 0,
                      control=f"{count(sum(consumed(control).values()), 'sample id')}; "
                              f"missing from the preempted leg: {missing}",
                      preempted=f"{count(sum(consumed(preempted).values()), 'sample id')} on "
                                f"{count(len(preempted.records), 'rank')}; in excess: {over}",
                      before_cut=False)


def _drift_divergence(f: _StepFigures, tolerances: dict[str, float]) -> Divergence:
    if not within(f.loss, tolerances["loss"]) and f.loss is not None:
        w = f.loss
        return Divergence(step=f.row.step, boundary="loss", rank=w.rank,
                          control=f"global microbatch {w.index}: {w.control!r}",
                          preempted=f"global microbatch {w.index}: {w.resized!r} "
                                    f"(|Δ| {w.diff:.3g} > {tolerances['loss']:g})",
                          before_cut=False)
    w2 = f.grad_norm
    return Divergence(step=f.row.step, boundary="grad_norm", rank=w2.rank if w2 else 0,
                      control=repr(w2.control) if w2 else "-",
                      preempted=(f"{w2.resized!r} (|Δ| {w2.diff:.3g} > "
                                 f"{tolerances['grad_norm']:g})" if w2 else "not measured"),
                      before_cut=False)


def _final_divergence(fault: DriftSummary, steps: int) -> Divergence:
    names = [t.name for t in fault.worst] + fault.values_differ + fault.unmatched
    return Divergence(step=steps, boundary="params" if fault.group == "model"
                      else "optimizer_state", rank=0,
                      control=f"{Position(steps).name}: {names[0] if names else fault.group}",
                      preempted=f"max abs diff {fault.max_abs_diff:.3g}", before_cut=False)


def _handoff_divergence(h: Handoffs) -> Divergence:
    row = next(r for r in h.rows if r.attempt in h.disagreeing or not r.equal_to_saved
               or r.equal_to_control is False)
    return Divergence(step=row.step, boundary="params", rank=0,
                      control=f"handoff saved after step {row.step}",
                      preempted=f"attempt {row.attempt} restored handoff {row.handoff}",
                      before_cut=False)


# --------------------------------------------------------------------------- the verdict


def _resized_rows(figures: list[_StepFigures], tolerances: dict[str, float],
                  rules: Rules, first_step: int) -> list[BoundaryRow]:
    """Boundary-table rows of the steps after the resize: what is comparable there."""
    rows = []
    for f in figures:
        if f.row.step < first_step:
            continue
        status: dict[str, str] = dict.fromkeys(BOUNDARIES, "not_compared")
        if rules.compares("inputs"):
            status["inputs"] = "equal" if f.ledger.ok else "differs"
        for boundary, w in (("loss", f.loss), ("grad_norm", f.grad_norm)):
            if rules.compares(boundary):
                status[boundary] = ("equal" if w is not None and w.diff == 0
                                    else "within_tolerance" if within(w, tolerances[boundary])
                                    else "differs")
        rows.append(BoundaryRow.model_validate({"step": f.row.step, "attempt": f.row.attempt,
                                                "status": status}))
    return rows


def judge_resize(spec: QualificationSpec, control: LegTrace, preempted: LegTrace,
                 drift: list[DriftSummary], checks: list[ValidityCheck], cut: Cut) -> Verdict:
    """The verdict of a valid resize run (its checks passed, its final drift measured)."""
    shape = Shape.of(spec)
    tolerances: dict[str, float] = {str(k): v for k, v in spec.comparison.tolerances.items()}
    ctrl, pre = authoritative(control), authoritative(preempted)
    ctrl_steps = as_steps(ctrl)
    # Before the resize the legs ran the same world: bitwise, whatever the tolerances.
    exact = Rules(spec.comparison.model_copy(update={"mode": "exact", "tolerances": {}}))
    precut = preempted.attempt_steps(0)
    precut_steps = sorted({s for r in precut.values() for s in r})
    early = walk(ctrl_steps, precut, precut_steps, range(shape.full), exact, skip_missing=True)
    rules = Rules(spec.comparison, {d.group: d for d in drift})
    figures = _figures(shape, tolerances, ctrl, pre)
    h = handoffs(control, preempted)
    before = _before_part(shape, early, precut_steps)
    handoff = _handoff_part(h)
    # Equal per step, so equal over the run: the run's total is what the control consumed.
    samples = sum((consumed(s) for s in pre.values()), Counter[int]())
    ledger = _ledger_part(shape, figures, samples)
    drifted, over, fault = _drift_part(shape, figures, drift, rules, tolerances)
    outcome = ResizeOutcome(
        world_sizes=shape.worlds, resize_step=shape.resize_step, grow_step=shape.grow_step,
        parts=[before, handoff, ledger, drifted], handoffs=h.rows,
        steps=[f.row for f in figures])
    exact_through = min(early.exact_through, shape.resize_step)
    table = ([r for r in early.rows if r.step <= shape.resize_step]
             + _resized_rows(figures, tolerances, rules, shape.resize_step + 1))
    resumed = h.rows[0].checkpoint if h.rows else None

    def verdict(result: Result, reason: str, first: Divergence | None) -> Verdict:
        return Verdict(result=result, reason=reason, cut=cut, resumed_from=resumed,
                       first_divergence=first, exact_through_step=exact_through,
                       checks=checks, drift=drift,
                       loss_deltas=loss_deltas(ctrl_steps, as_steps(pre),
                                               range(1, shape.steps + 1)),
                       boundary_table=table, steps_compared=shape.steps,
                       ranks_compared=shape.full, resize=outcome)

    worlds = "→".join(map(str, shape.worlds))
    if early.first is not None:
        p = early.first
        div = divergence(p, ctrl_steps, precut, before_cut=True)
        words = div.tensor_words() or div.spread_words()
        which = f"; {words}" if words else ""
        return verdict(Result.NONDETERMINISTIC, (
            f"not run-to-run deterministic: legs already differ at step {p.step} "
            f"({p.boundary}, rank {p.rank}{which}) before the kill, at the full world"), div)
    failed = [part for part in (handoff, ledger, drifted) if not part.ok]
    if failed:
        first = failed[0]
        if first is handoff:
            div = _handoff_divergence(h)
        elif first is ledger:
            bad = next(f for f in figures if not f.ledger.ok)
            div = _ledger_divergence(bad.ledger, ctrl[bad.row.step], pre[bad.row.step])
        elif over is not None:
            div = _drift_divergence(over, tolerances)
        else:
            assert fault is not None
            div = _final_divergence(fault, shape.steps)
        return verdict(Result.FAIL, _fail_reason(worlds, failed), div)
    return verdict(Result.PASS, _pass_reason(shape, exact_through, h, figures, drift, samples),
                   None)


def _fail_reason(worlds: str, failed: list[ResizePart]) -> str:
    """E.g. "resize 2→1→2 ranks: data ledger not exact: step 5: ...; also drift"."""
    first = failed[0]
    also = "; also " + ", ".join(p.words() for p in failed[1:]) if len(failed) > 1 else ""
    reason = (f"resize {worlds} ranks: {first.words()} not exact"
              if first.name != "drift" else f"resize {worlds} ranks: drift over tolerance")
    return reason + f": {first.detail}{also}"


def _pass_reason(shape: Shape, exact_through: int, h: Handoffs, figures: list[_StepFigures],
                 drift: list[DriftSummary], samples: Counter[int]) -> str:
    """E.g. "resize: 2→1→2 ranks; exact through step 4 before the resize; handoff exact
    (2 restores); ledger exact (12 steps, 576 samples each once); drift within ..."."""
    after = [f for f in figures if f.row.step > shape.resize_step]
    params = next((d.max_abs_diff for d in drift if d.group == "model"), 0.0)
    return (f"resize: {'→'.join(map(str, shape.worlds))} ranks; exact through step "
            f"{exact_through} before the resize; handoff exact "
            f"({count(len(h.rows), 'restore')}); ledger exact "
            f"({count(shape.steps, 'step')}, {_samples(samples)}); drift within tolerance (loss ≤ "
            f"{_largest([f.loss for f in after]):.3g}, grad norm ≤ "
            f"{_largest([f.grad_norm for f in after]):.3g}, params ≤ {params:.3g})")

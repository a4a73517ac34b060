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
handoff digests make the run INVALID (:mod:`.resizechecks`): the traces do not show what
the verdict claims.
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
from resumequal.compare.walk import Rules, Steps, Walk, divergence, loss_deltas, walk
from resumequal.results.verdict import (
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
from resumequal.spec import QualificationSpec
from resumequal.spec.boundaries import BOUNDARIES
from resumequal.trace.records import RestoreRecord, StepRecord
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


# --------------------------------------------------------------------------- handoffs


def restores_of(leg: LegTrace, attempt: int) -> dict[int, RestoreRecord]:
    return {r.rank: r for r in leg.of(RestoreRecord) if r.attempt == attempt}


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
        restores = restores_of(preempted, attempt)
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


@dataclass(frozen=True)
class _BeforeResize:
    """Attempt 0 of the preempted leg, on the full world, walked against the control."""

    walk: Walk
    precut: Steps  # rank -> step -> attempt 0's record
    steps: list[int]

    @classmethod
    def of(cls, spec: QualificationSpec, shape: Shape, ctrl_steps: Steps,
           preempted: LegTrace) -> _BeforeResize:
        """The walk of attempt 0's steps: the legs ran the same world, so it is bitwise,
        whatever the tolerances."""
        exact = Rules(spec.comparison.model_copy(update={"mode": "exact", "tolerances": {}}))
        precut = preempted.attempt_steps(0)
        steps = sorted({s for r in precut.values() for s in r})
        return cls(walk(ctrl_steps, precut, steps, range(shape.full), exact, skip_missing=True),
                   precut, steps)

    def part(self, shape: Shape) -> ResizePart:
        """Part 1: bitwise exact before the resize."""
        if self.walk.first is not None:
            p = self.walk.first
            return ResizePart(name="before_resize", ok=False, detail=(
                f"the legs differ at step {p.step} ({p.boundary}, rank {p.rank}) before the kill"))
        span = f"1..{self.steps[-1]}" if self.steps else "none"
        return ResizePart(name="before_resize", ok=True, detail=(
            f"attempt 0's {count(len(self.steps), 'step')} ({span}) on {shape.full} ranks equal "
            "the control's on every compared boundary"))

    def nondeterministic(self, ctrl_steps: Steps) -> tuple[str, Divergence] | None:
        """The reason and the divergence when the legs differ before the kill, else None."""
        p = self.walk.first
        if p is None:
            return None
        div = divergence(p, ctrl_steps, self.precut, before_cut=True)
        words = div.tensor_words() or div.spread_words()
        which = f"; {words}" if words else ""
        return (f"not run-to-run deterministic: legs already differ at step {p.step} "
                f"({p.boundary}, rank {p.rank}{which}) before the kill, at the full world"), div


@dataclass(frozen=True)
class _Parts:
    """Parts 2 to 4 (handoff, data ledger, drift) and the figures they were judged on."""

    handoffs: Handoffs
    figures: list[_StepFigures]
    samples: Counter[int]  # sample id -> how often the run consumed it
    handoff: ResizePart
    ledger: ResizePart
    drift: ResizePart
    over: _StepFigures | None  # the first step after the resize over a tolerance
    fault: DriftSummary | None  # else the final drift over its tolerance

    @classmethod
    def judge(cls, shape: Shape, tolerances: dict[str, float], rules: Rules,
              traces: tuple[LegTrace, LegTrace], ctrl: dict[int, StepRecords],
              pre: dict[int, StepRecords], drift: list[DriftSummary]) -> _Parts:
        """Each part judged from the legs' ``traces`` and authoritative records."""
        figures = _figures(shape, tolerances, ctrl, pre)
        h = handoffs(*traces)
        # Equal per step, so equal over the run: the run's total is what the control consumed.
        samples = sum((consumed(s) for s in pre.values()), Counter[int]())
        drifted, over, fault = _drift_part(shape, figures, drift, rules, tolerances)
        return cls(h, figures, samples, _handoff_part(h), _ledger_part(shape, figures, samples),
                   drifted, over, fault)

    @property
    def failed(self) -> list[ResizePart]:
        return [part for part in (self.handoff, self.ledger, self.drift) if not part.ok]

    def first_divergence(self, tolerances: dict[str, float], ctrl: dict[int, StepRecords],
                         pre: dict[int, StepRecords], steps: int) -> Divergence:
        """Where the first failed part shows: a restore, a step's samples, a step's drift or
        the final checkpoints'."""
        first = self.failed[0]
        if first is self.handoff:
            return _handoff_divergence(self.handoffs)
        if first is self.ledger:
            bad = next(f for f in self.figures if not f.ledger.ok)
            return _ledger_divergence(bad.ledger, ctrl[bad.row.step], pre[bad.row.step])
        if self.over is not None:
            return _drift_divergence(self.over, tolerances)
        assert self.fault is not None
        return _final_divergence(self.fault, steps)


def judge_resize(spec: QualificationSpec, control: LegTrace, preempted: LegTrace,
                 drift: list[DriftSummary], checks: list[ValidityCheck], cut: Cut) -> Verdict:
    """The verdict of a valid resize run (its checks passed, its final drift measured)."""
    shape = Shape.of(spec)
    tolerances: dict[str, float] = {str(k): v for k, v in spec.comparison.tolerances.items()}
    ctrl, pre = authoritative(control), authoritative(preempted)
    ctrl_steps = as_steps(ctrl)
    early = _BeforeResize.of(spec, shape, ctrl_steps, preempted)
    rules = Rules(spec.comparison, {d.group: d for d in drift})
    parts = _Parts.judge(shape, tolerances, rules, (control, preempted), ctrl, pre, drift)
    exact_through = min(early.walk.exact_through, shape.resize_step)
    nondeterministic = early.nondeterministic(ctrl_steps)
    first: Divergence | None = None
    if nondeterministic is not None:
        result, (reason, first) = Result.NONDETERMINISTIC, nondeterministic
    elif parts.failed:
        result = Result.FAIL
        reason = _fail_reason("→".join(map(str, shape.worlds)), parts.failed)
        first = parts.first_divergence(tolerances, ctrl, pre, shape.steps)
    else:
        result = Result.PASS
        reason = _pass_reason(shape, exact_through, parts, drift)
    h = parts.handoffs
    return Verdict(
        result=result, reason=reason, cut=cut, first_divergence=first,
        resumed_from=h.rows[0].checkpoint if h.rows else None,
        exact_through_step=exact_through, checks=checks, drift=drift,
        loss_deltas=loss_deltas(ctrl_steps, as_steps(pre), range(1, shape.steps + 1)),
        boundary_table=([r for r in early.walk.rows if r.step <= shape.resize_step]
                        + _resized_rows(parts.figures, tolerances, rules, shape.resize_step + 1)),
        steps_compared=shape.steps, ranks_compared=shape.full,
        resize=ResizeOutcome(
            world_sizes=shape.worlds, resize_step=shape.resize_step, grow_step=shape.grow_step,
            parts=[early.part(shape), parts.handoff, parts.ledger, parts.drift],
            handoffs=h.rows, steps=[f.row for f in parts.figures]))


def _fail_reason(worlds: str, failed: list[ResizePart]) -> str:
    """E.g. "resize 2→1→2 ranks: data ledger not exact: step 5: ...; also drift"."""
    first = failed[0]
    also = "; also " + ", ".join(p.words() for p in failed[1:]) if len(failed) > 1 else ""
    reason = (f"resize {worlds} ranks: {first.words()} not exact"
              if first.name != "drift" else f"resize {worlds} ranks: drift over tolerance")
    return reason + f": {first.detail}{also}"


def _pass_reason(shape: Shape, exact_through: int, parts: _Parts,
                 drift: list[DriftSummary]) -> str:
    """E.g. "resize: 2→1→2 ranks; exact through step 4 before the resize; handoff exact
    (2 restores); ledger exact (12 steps, 576 samples each once); drift within ..."."""
    after = [f for f in parts.figures if f.row.step > shape.resize_step]
    params = next((d.max_abs_diff for d in drift if d.group == "model"), 0.0)
    return (f"resize: {'→'.join(map(str, shape.worlds))} ranks; exact through step "
            f"{exact_through} before the resize; handoff exact "
            f"({count(len(parts.handoffs.rows), 'restore')}); ledger exact "
            f"({count(shape.steps, 'step')}, {_samples(parts.samples)}); drift within "
            f"tolerance (loss ≤ {_largest([f.loss for f in after]):.3g}, grad norm ≤ "
            f"{_largest([f.grad_norm for f in after]):.3g}, params ≤ {params:.3g})")

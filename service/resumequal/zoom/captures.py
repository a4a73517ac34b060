"""Comparing two replays of one step, tensor by tensor and module by module.

Each leg's replay left one capture per rank (:mod:`resumequal.trace.capture`). Module
calls are matched by (module, phase, microstep, call); stages by tensor name. A module
that differs is classified by what it received:

- ``state``: its own parameters or buffers already differed when the step began;
- ``origin``: its inputs (and parameters) were equal and its outputs were not — or, with
  its whole forward equal, the gradients reaching it were equal and those it passed back
  (or its parameters' gradients) were not;
- ``encloses_origin``: it would be an origin, but a module inside it is one: the
  difference arose in the child, not in the parent's own code;
- ``propagation``: its inputs (or the gradients reaching it) already differed.

A difference can also enter from outside the model: its inputs already differ (the data
path, or what loss_fn passes it), or its outputs are equal and the gradients loss_fn sends
back are not. When neither holds and no module is an origin, the first stage that differs
while the one before it did not names where the difference starts: the reduction (local
gradients equal, reduced gradients not), clipping and unscaling, or the optimizer update.
:func:`summary` says which, in one sentence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Any, Final

import torch

from resumequal.errors import ReportError
from resumequal.results.verdict import (
    Bucket,
    ZoomKind,
    ZoomModule,
    ZoomOriginKind,
    ZoomReplay,
    ZoomStage,
    ZoomTensor,
)
from resumequal.spec.boundaries import TABLE, StageOrigin
from resumequal.trace.capture import CAPTURE_FORMAT, ROOT, STAGES, STAGES_BEFORE
from resumequal.words import count

MODULE_TENSORS = 8
STAGE_TENSORS = 32
Capture = dict[str, Any]


def load_capture(path: Path) -> Capture:
    """One rank's capture, written by a replay this process started; ReportError if not."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError) as e:
        raise ReportError(f"{path}: unreadable capture: {e}") from e
    if not isinstance(data, dict) or data.get("format") != CAPTURE_FORMAT:
        raise ReportError(f"{path}: not a capture of format {CAPTURE_FORMAT}")
    return data


def tensor_diff(name: str, rank: int, a: torch.Tensor | None,
                b: torch.Tensor | None) -> ZoomTensor | None:
    """None when ``a`` and ``b`` are bitwise equal (NaNs in the same places count equal)."""
    if a is None and b is None:
        return None
    if a is None or b is None or a.shape != b.shape or a.dtype != b.dtype:
        numel = max(t.numel() for t in (a, b) if t is not None)
        return ZoomTensor(name=name, rank=rank, numel=numel, differ=numel, max_abs_diff=None)
    if a.is_floating_point() or a.is_complex():
        differ = (a != b) & ~(torch.isnan(a) & torch.isnan(b))
    else:
        differ = a != b
    count = int(differ.sum())
    if count == 0:
        return None
    delta = (a.double() - b.double()).abs()[differ] if not a.is_complex() \
        else (a - b).abs()[differ].double()
    worst = float(delta.max()) if delta.numel() else None
    if worst is not None and math.isnan(worst):
        worst = math.inf  # a NaN on one side only
    return ZoomTensor(name=name, rank=rank, numel=a.numel(), differ=count, max_abs_diff=worst)


def _list_diffs(label: str, rank: int, a: Sequence[torch.Tensor | None],
                b: Sequence[torch.Tensor | None]) -> list[ZoomTensor]:
    out = []
    for i in range(max(len(a), len(b))):
        d = tensor_diff(f"{label}[{i}]", rank, a[i] if i < len(a) else None,
                        b[i] if i < len(b) else None)
        if d is not None:
            out.append(d)
    return out


def _max(diffs: Sequence[ZoomTensor]) -> float | None:
    values = [d.max_abs_diff for d in diffs if d.max_abs_diff is not None]
    return max(values) if values else None


@dataclass
class _Module:
    """What one module showed over every call and rank."""

    path: str
    order: int
    ranks: set[int] = field(default_factory=set)
    inputs: bool = False
    outputs: bool = False
    grads_in: bool = False
    grads_out: bool = False
    params: bool = False
    forward_origin: bool = False
    backward_origin: bool = False
    first_call: int | None = None
    phase: str = "forward"
    tensors: list[ZoomTensor] = field(default_factory=list)
    largest: dict[str, float | None] = field(default_factory=dict)  # phase -> max |diff|

    @property
    def differs(self) -> bool:
        return self.outputs or self.grads_out or self.params

    def note(self, position: int, phase: str, rank: int, diffs: list[ZoomTensor]) -> None:
        if self.first_call is None or position < self.first_call:
            self.first_call, self.phase = position, phase
        self.ranks.add(rank)
        self.tensors.extend(diffs[: MODULE_TENSORS - len(self.tensors)])
        values = [v for v in (self.largest.get(phase), _max(diffs)) if v is not None]
        self.largest[phase] = max(values) if values else None


def _key(call: Mapping[str, Any]) -> tuple[str, str, int, int]:
    return (call["module"], call["phase"], call["microstep"], call["call"])


def _is_inside(child: str, parent: str) -> bool:
    return child != parent and (parent == ROOT or child.startswith(parent + "."))


@dataclass
class CaptureComparison:
    """The two replays compared: modules, stages, and where the difference starts."""

    modules: list[ZoomModule]
    modules_total: int
    stages: list[ZoomStage]
    origin_kind: ZoomOriginKind
    origins: list[str]
    buckets: dict[str, list[Bucket]] | None


_Call = Mapping[str, Any]
_Where = tuple[str, int, int]  # module, microstep, call


@dataclass
class _RankCalls:
    """One rank's module calls compared in execution order, into ``modules``."""

    rank: int
    modules: dict[str, _Module]
    own_params: dict[str, list[ZoomTensor]]  # module -> its state that differed
    # A forward call -> whether its inputs and its outputs differed.
    forward: dict[_Where, tuple[bool, bool]] = field(default_factory=dict)
    # Modules that received something different in some call on this rank: their
    # parameters' gradients, summed over every microstep, cannot be an origin.
    tainted: set[str] = field(default_factory=set)
    backward_at: dict[str, int] = field(default_factory=dict)  # module -> first backward

    def compare(self, position: int, call: _Call, other: _Call | None) -> None:
        """Note what differs in one call of the control replay, ``other`` its counterpart."""
        path = call["module"]
        mod = self.modules.setdefault(path, _Module(path, position))
        if other is None:  # the preempted replay made no such call: it differs
            mod.outputs = True
            self.tainted.add(path)
            mod.note(position, call["phase"], self.rank, [])
            return
        forward = call["phase"] == "forward"
        ins = _list_diffs("input" if forward else "grad_output", self.rank,
                          call["inputs"], other["inputs"])
        outs = _list_diffs("output" if forward else "grad_input", self.rank,
                           call["outputs"], other["outputs"])
        params = bool(self.own_params.get(path))
        mod.params |= params
        where = (path, call["microstep"], call["call"])
        if forward:
            self._forward(mod, position, where, ins, outs, params)
        else:
            self._backward(mod, position, where, ins, outs, params)

    def _forward(self, mod: _Module, position: int, where: _Where, ins: list[ZoomTensor],
                 outs: list[ZoomTensor], params: bool) -> None:
        self.forward[where] = (bool(ins), bool(outs))
        mod.inputs |= bool(ins)
        mod.outputs |= bool(outs)
        if ins or params:
            self.tainted.add(mod.path)
        if outs:
            mod.forward_origin |= not ins and not params
            mod.note(position, "forward", self.rank, outs)

    def _backward(self, mod: _Module, position: int, where: _Where, ins: list[ZoomTensor],
                  outs: list[ZoomTensor], params: bool) -> None:
        self.backward_at.setdefault(mod.path, position)
        f_ins, f_outs = self.forward.get(where, (True, True))
        mod.grads_in |= bool(ins)
        received = bool(ins) or f_ins or f_outs or params
        if received:
            self.tainted.add(mod.path)
        if outs:
            mod.grads_out = True
            mod.backward_origin |= not received
            mod.note(position, "backward", self.rank, outs)

    def param_grads(self, a: Capture, b: Capture) -> None:
        """Note the modules whose own parameters' local gradients differ."""
        for path, mod in self.modules.items():
            # Accumulated over the step's microsteps: an origin only if nothing the module
            # received in any of them differed.
            grads = _param_grad_diffs(a, b, self.rank, a["module_params"].get(path, []))
            if grads:
                mod.grads_out = True
                mod.backward_origin |= path not in self.tainted
                mod.note(self.backward_at.get(path, mod.order), "backward", self.rank, grads)

    def param_state(self, after: int) -> None:
        """Note the modules whose own state differed when the step began; one that made no
        call is ordered ``after`` every call."""
        for path, diffs in self.own_params.items():
            if diffs:
                mod = self.modules.setdefault(path, _Module(path, after))
                mod.params = True
                mod.note(mod.order, "forward", self.rank, diffs)


def _compare_modules(control: Mapping[int, Capture], preempted: Mapping[int, Capture],
                     ) -> dict[str, _Module]:
    """Every module that made a call or holds state, with what differed in it on any rank."""
    modules: dict[str, _Module] = {}
    for rank in sorted(control):
        a, b = control[rank], preempted[rank]
        b_calls = {_key(c): c for c in b["calls"]}
        # A replay that resumed inside the step (a graceful emergency checkpoint) runs only
        # its later microsteps: the ones both replays ran are compared.
        common = {c["microstep"] for c in a["calls"]} & {c["microstep"] for c in b["calls"]}
        calls = _RankCalls(rank, modules, _param_diffs(a, b, rank))
        for position, call in enumerate(a["calls"]):
            if call["microstep"] in common:
                calls.compare(position, call, b_calls.get(_key(call)))
        calls.param_grads(a, b)
        calls.param_state(len(a["calls"]))
    return modules


def _param_diffs(a: Capture, b: Capture, rank: int) -> dict[str, list[ZoomTensor]]:
    """Per module, its own parameters (and buffers under its path) that differed at the
    step's start."""
    before_a, before_b = a["stages"].get("params_before", {}), b["stages"].get("params_before", {})
    out: dict[str, list[ZoomTensor]] = {}
    for name in sorted(set(before_a) | set(before_b)):
        d = tensor_diff(name, rank, before_a.get(name), before_b.get(name))
        if d is not None:
            owner = name.rpartition(".")[0] or ROOT
            out.setdefault(owner, []).append(d)
    return out


def _param_grad_diffs(a: Capture, b: Capture, rank: int,
                      names: Sequence[str]) -> list[ZoomTensor]:
    """A module's own parameters' local gradients (before any reduction) that differ."""
    ga, gb = a["stages"].get("local_grads", {}), b["stages"].get("local_grads", {})
    out = []
    for name in names:
        if name in ga or name in gb:
            d = tensor_diff(f"{name}.grad", rank, ga.get(name), gb.get(name))
            if d is not None:
                out.append(d)
    return out


def _kind(mod: _Module, origins: set[str]) -> ZoomKind:
    if mod.params:
        return "state"
    if mod.path in origins:
        if any(_is_inside(o, mod.path) for o in origins):
            return "encloses_origin"
        return "origin"
    return "propagation"


def _stages(control: Mapping[int, Capture], preempted: Mapping[int, Capture]
            ) -> list[ZoomStage]:
    out = []
    for name in STAGES:
        total, diffs = 0, []
        for rank in sorted(control):
            a = control[rank]["stages"].get(name)
            b = preempted[rank]["stages"].get(name)
            if a is None and b is None:
                continue
            a, b = a or {}, b or {}
            for tname in list(a) + [n for n in b if n not in a]:
                total += 1
                d = tensor_diff(tname, rank, a.get(tname), b.get(tname))
                if d is not None:
                    diffs.append(d)
        if total:
            out.append(ZoomStage(name=name, total=total, differ=len(diffs),
                                 max_abs_diff=_max(diffs), tensors=diffs[:STAGE_TENSORS]))
    return out


# Each boundary's zoom stage in the order the step runs them, with its zoom rule.
_RULES: Final[tuple[tuple[str, StageOrigin | None], ...]] = tuple(
    (b.stage, b.zoom) for b in TABLE if b.stage is not None)


def _stage_origin(stages: Sequence[ZoomStage]) -> tuple[ZoomOriginKind, list[str]]:
    """Where the stages say a difference starts: the state the step began from, else the
    first rule whose stages differ while the stage before them was captured and equal (the
    reduction, clipping and unscaling, the optimizer update)."""
    by = {s.name: s.differ for s in stages}
    before = [n for n in STAGES_BEFORE if by.get(n)]
    if before:
        return "state", before
    previous: str | None = None  # the last stage of the rule before
    for origin, rule in groupby(_RULES, key=lambda r: r[1]):
        names = [stage for stage, _ in rule]
        differing = [stage for stage in names if by.get(stage)]
        if origin is not None and differing and previous in by and not by[previous]:
            return origin, differing
        previous = names[-1]
    return "none", []


def _entry(root: _Module | None) -> ZoomOriginKind | None:
    """Where a difference enters the model from outside: ``input`` when the model is called
    with different inputs, ``loss_fn`` when its outputs are equal and the gradients that
    reach them are not; None when neither."""
    if root is None:
        return None
    if root.inputs:
        return "input"
    if root.grads_in and not root.outputs:
        return "loss_fn"
    return None


def _buckets(control: Mapping[int, Capture], preempted: Mapping[int, Capture]
             ) -> dict[str, list[Bucket]] | None:
    for rank in sorted(control):
        a, b = control[rank].get("buckets") or [], preempted[rank].get("buckets") or []
        if a != b:
            return {"control": [Bucket(**x) for x in a],
                    "preempted": [Bucket(**x) for x in b]}
    return None


def compare_captures(control: Mapping[int, Capture],
                     preempted: Mapping[int, Capture]) -> CaptureComparison:
    """Compare every rank's captures of the two replays (both must hold the same ranks)."""
    if sorted(control) != sorted(preempted):
        raise ReportError(f"the replays captured different ranks: control {sorted(control)}, "
                          f"preempted {sorted(preempted)}")
    raw = _compare_modules(control, preempted)
    stages = _stages(control, preempted)
    differing = sorted((m for m in raw.values() if m.differs),
                       key=lambda m: (m.first_call if m.first_call is not None else m.order))
    origin_paths = {m.path for m in differing
                    if not m.params and (m.forward_origin or m.backward_origin)}
    modules = [ZoomModule(
        module=m.path, kind=_kind(m, origin_paths), phase=m.phase,  # type: ignore[arg-type]
        first_call=m.first_call if m.first_call is not None else m.order,
        ranks=sorted(m.ranks), inputs_differ=m.inputs, outputs_differ=m.outputs,
        grads_in_differ=m.grads_in, grads_out_differ=m.grads_out, params_differ=m.params,
        max_abs_diff=m.largest.get(m.phase), tensors=m.tensors) for m in differing]
    origins = [m.module for m in modules if m.kind == "origin"]
    kind: ZoomOriginKind
    entry = _entry(raw.get(ROOT))
    if any(m.kind == "state" for m in modules):
        kind = "state"
        origins = [m.module for m in modules if m.kind == "state"]
    elif entry == "input":
        # Every module the inputs reach differs in turn: none of them is where it started.
        kind, origins = entry, ["inputs"]
    elif origins:
        kind = "module"
    elif entry == "loss_fn":
        kind, origins = entry, ["loss_fn"]
    else:
        kind, origins = _stage_origin(stages)
    return CaptureComparison(modules=modules, modules_total=len(raw), stages=stages,
                             origin_kind=kind, origins=origins,
                             buckets=_buckets(control, preempted))


def summary(step: int, found: CaptureComparison, replays: Sequence[ZoomReplay]) -> str:
    """One sentence: where the difference of ``step`` enters (the data path or loss_fn, a
    module, the reduction, clipping, the optimizer, restored state), or that there is none."""
    bad = [r.leg for r in replays if not r.reproduced]
    lead = (f"the replay of the {' and '.join(bad)} leg did not reproduce step {step} as "
            "recorded; " if bad else "")
    return lead + _where(step, found)


def _where(step: int, found: CaptureComparison) -> str:
    kind, origins, differing = found.origin_kind, found.origins, len(found.modules)
    if kind == "input":
        return (f"at step {step} the difference enters before the model: the model is "
                "called with different inputs, from the data path (the batch) or loss_fn; "
                f"the {count(differing, 'module')} that differ only carry it on")
    if kind == "loss_fn":
        return (f"at step {step} the difference enters in loss_fn: the model's outputs are "
                "equal, the gradients loss_fn sends back are not (its own computation, or "
                "targets from the data path that the model never sees)")
    if kind == "module":
        return (f"step {step} first differs in {count(len(origins), 'module')} "
                f"({', '.join(origins)}): its inputs were equal and its outputs were not; "
                f"{differing} of {found.modules_total} modules differ")
    if kind == "state":
        return (f"step {step} began from different state ({', '.join(origins)}): the "
                "difference was restored, not computed in this step")
    if kind == "reduction":
        return (f"at step {step} every module and every rank-local gradient is equal; "
                "the gradients first differ after the reduction across ranks")
    if kind == "clipping":
        return (f"at step {step} the reduced gradients are equal; they first differ "
                "after unscaling and clipping")
    if kind == "optimizer":
        return (f"at step {step} the difference enters in the optimizer: the model and the "
                "gradients it took are equal, the parameters or optimizer state after the "
                "update are not")
    stages = [f"{st.name} {st.differ}/{st.total}" for st in found.stages if st.differ]
    if differing or stages:
        what = ", ".join([count(differing, "module")] * bool(differing) + stages)
        return (f"the replays of step {step} differ ({what}), but no captured tensor shows "
                "where the difference enters")
    return f"the replays of step {step} are equal in every captured tensor"

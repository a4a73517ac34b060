"""The bisection ``resumequal bisect`` runs: confirm the ends, search, write the result.

Changes mode: qualify the good pin and the bad pin; when they end differently, delta
debugging (:func:`~resumequal.bisect.search.ddmin`) over the packages they differ in, each
probe the good pin with some of the bad pin's versions. Ordered mode: qualify the first and
the last pin of a list (unless assumed), then binary search for the first that flips; the
pins are pin files (probe venvs) or images (QualificationRuns on a cluster). Either way,
every probe's environment or run, verdict and first divergence go into ``bisect.json`` and
``bisect.html`` in the output folder. What qualifies a probe is a
:class:`~resumequal.bisect.runner.Runner`; everything else is shared.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from resumequal.bisect import html, search
from resumequal.bisect.envs import Environments
from resumequal.bisect.pins import (
    Change,
    PinSet,
    Requirement,
    diff,
    layer,
    mix,
    read_pins,
    shared,
)
from resumequal.bisect.probe import Qualified
from resumequal.bisect.result import (
    Attempt,
    BisectResult,
    ClusterTarget,
    FlipPin,
    PinChange,
    Probe,
)
from resumequal.bisect.runner import Prepared, ProbeId, Runner, VenvRunner
from resumequal.bisect.search import BudgetSpent, Outcome
from resumequal.errors import UsageError
from resumequal.exitcodes import ExitCode
from resumequal.results.verdict import Result
from resumequal.spec import QualificationSpec, apply_overrides, load_spec

log = logging.getLogger(__name__)

# What a retry may change: chance (a timeout on a loaded machine) or a stack that is not
# reproducible run to run. A FAIL or PASS is an answer; an error repeats.
RETRIED = (Result.INVALID, Result.NONDETERMINISTIC)
JUDGED = (Result.PASS, Result.FAIL)
Signature = tuple[str, ...]
T = TypeVar("T")
S = TypeVar("S")

if TYPE_CHECKING:
    from resumequal.bisect.cluster import ClusterOptions


@dataclass(frozen=True)
class BisectOptions:
    """What ``resumequal bisect`` was asked: ``pins`` are good and bad, or the ordered
    list; or ``images`` in order, qualified on the ``cluster``."""

    pins: tuple[Path, ...]
    ordered: bool
    out: Path
    cache: Path
    spec: Path | None = None
    sets: tuple[str, ...] = ()
    base_env: Path | None = None
    retries: int = 1
    max_probes: int = 32
    probe_timeout_s: float = 1800.0
    assume_good: bool = False
    assume_bad: bool = False
    images: tuple[str, ...] = ()
    cluster: ClusterOptions | None = None


class Listener:
    """What the terminal hears of a bisection (this one hears nothing)."""

    def probe_starts(self, number: int, limit: int, label: str) -> None: ...

    def qualifying(self, number: int, attempt: int, where: str) -> None: ...

    def probe_done(self, probe: Probe) -> None: ...


def bisect(options: BisectOptions, listener: Listener | None = None) -> BisectResult:
    """Run the bisection ``options`` ask for; write ``bisect.json`` and ``bisect.html``
    into ``options.out``. Raises :class:`~resumequal.spec.SpecError` or
    :class:`~resumequal.bisect.pins.PinError` before anything is built, and
    :class:`~resumequal.errors.ClusterError` when the cluster's API refuses or fails."""
    if options.cluster is not None:
        return _write(options, _on_cluster(options, options.cluster, listener or Listener()))
    _check_spec(options)
    # Absolute: every probe runs in its own folder, and a venv's paths are read from there.
    options = dataclasses.replace(
        options, out=options.out.resolve(), cache=options.cache.resolve(),
        spec=options.spec.resolve() if options.spec else None,
        base_env=options.base_env.resolve() if options.base_env else None)
    pins = [read_pins(p) for p in options.pins]
    if len(pins) < 2:
        raise UsageError("a bisection needs two pins (good and bad) or an ordered list of "
                         "at least two")
    common = shared(pins)
    options_lines = tuple(dict.fromkeys(o for p in pins for o in p.options))
    envs = Environments(options.cache, common, options_lines, options.base_env,
                        known=_one_version(pins))
    runner = VenvRunner(envs, options.out, options.spec, options.sets, options.probe_timeout_s)
    run = _PinBisection(options, pins, runner, listener or Listener())
    result = run.ordered() if options.ordered else run.changes()
    seconds = None if envs.common_seconds is None else round(envs.common_seconds, 3)
    return _write(options, result.model_copy(update={"common_build_seconds": seconds}))


def _one_version(pins: Sequence[PinSet]) -> list[Requirement]:
    """The requirements of the packages the pins give exactly one version (whichever pins
    hold them): what a probe that pulls one in without naming it gets."""
    versions: dict[str, set[Requirement]] = {}
    for pin in pins:
        for name, req in pin.packages.items():
            versions.setdefault(name, set()).add(req)
    return [next(iter(reqs)) for _, reqs in sorted(versions.items()) if len(reqs) == 1]


def _on_cluster(options: BisectOptions, cluster: ClusterOptions,
                listener: Listener) -> BisectResult:
    from resumequal.bisect.cluster import ClusterRunner

    if len(options.images) < 2:
        raise UsageError("an ordered bisection needs at least two images")
    runner = ClusterRunner.connect(cluster, options.probe_timeout_s)
    run = _ImageBisection(options, list(options.images), runner, listener,
                          cluster=ClusterTarget(namespace=runner.namespace,
                                                bisection=runner.bisection,
                                                delete_runs=cluster.delete_runs))
    return run.ordered()


def _write(options: BisectOptions, result: BisectResult) -> BisectResult:
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "bisect.json").write_text(result.model_dump_json(indent=2) + "\n")
    (options.out / "bisect.html").write_text(html.render(result))
    return result


def _check_spec(options: BisectOptions) -> QualificationSpec:
    """The spec every probe runs, refused here (exit 2) rather than once per probe."""
    base = load_spec(str(options.spec)) if options.spec else QualificationSpec()
    return apply_overrides(base, options.sets) if options.sets else base


def _pin_change(change: Change) -> PinChange:
    return PinChange(package=change.name,
                     good=change.good.version if change.good else None,
                     bad=change.bad.version if change.bad else None, label=change.label)


def describe(signature: Signature | None) -> str:
    """``PASS``; ``FAIL at step 5, inputs``."""
    if signature is None:
        return "no verdict"
    result, *where = signature
    return result if not where else f"{result} at step {where[0]}, {where[1]}"


class _Bisection(Generic[S]):
    """The state of one bisection: its runner, its probes, what each end gave."""

    def __init__(self, options: BisectOptions, pins: Sequence[str], runner: Runner[S],
                 listener: Listener, *, common: int = 0,
                 cluster: ClusterTarget | None = None) -> None:
        self.options, self.labels, self.listener = options, list(pins), listener
        self.runner, self.common_count, self.cluster = runner, common, cluster
        self.started = time.monotonic()
        self.when = datetime.now(UTC).isoformat(timespec="seconds")
        self.probes: list[Probe] = []
        self.good_sig: Signature | None = ("PASS",) if options.assume_good else None
        self.bad_sig: Signature | None = None
        self.limit = options.max_probes

    # -- ordered pins, whatever they are ----------------------------------------------

    def _first_flip(self, subjects: Sequence[S],
                    names: Sequence[str]) -> search.FirstFlip | BisectResult:
        """Confirm the ends, then binary search: the flip found, or the result to give."""
        ends = self._ends(subjects[0], subjects[-1], first=0, last=len(subjects) - 1,
                          names=(names[0], names[-1]))
        if ends is not None:
            return self._result("ordered", ends[0], ends[1], [], [], False)

        def probe(i: int) -> Outcome:
            return self._probe("pin", names[i], subjects[i], pin_index=i).outcome_enum

        found = search.first_flip(len(subjects), self._budgeted(probe))
        if found.index is not None:
            return found
        skipped = ", ".join(names[i] for i in found.unjudged)
        why = (f"{skipped} could not be judged" if skipped else
               f"the probe budget ({self.limit}) ran out")
        return self._result("ordered", "undecided", f"could not decide: the first pin to "
                            f"flip is after {names[found.good]} and at or before "
                            f"{names[found.bad]}; {why}", [], [], False)

    def _flip_summary(self, name: str, index: int) -> str:
        unproven = (" (assumed, never qualified)"
                    if index == len(self.labels) - 1 and self.options.assume_bad else "")
        return (f"{name} is the first pin to flip the verdict{unproven} "
                f"({self._flip_words()})")

    def _flip_words(self) -> str:
        """``PASS → FAIL at step 5, inputs``; with the bad end assumed, what the probes
        that flipped were held to."""
        bad = describe(self.bad_sig) if self.bad_sig else "another verdict (bad end assumed)"
        return f"{describe(self.good_sig)} → {bad}"

    # -- the ends ----------------------------------------------------------------------

    def _ends(self, good: S, bad: S, first: int | None = None, last: int | None = None,
              names: tuple[str, str] | None = None) -> tuple[str, str] | None:
        """Qualify the ends not assumed: None when the bisection can go on, else its
        conclusion and summary."""
        named = ("the good pin", "the bad pin") if names is None else (
            f"the good pin, {names[0]}", f"the bad pin, {names[1]}")
        if not self.options.assume_good:
            probed = self._probe("good", named[0], good, pin_index=first)
            self.good_sig = probed.signature
            if probed.probe.status != "judged":
                return "undecided", ("could not decide: the good pin was not judged "
                                     f"({probed.probe.why})")
        if not self.options.assume_bad:
            probed = self._probe("bad", named[1], bad, pin_index=last)
            if probed.probe.status != "judged":
                return "undecided", ("could not decide: the bad pin was not judged "
                                     f"({probed.probe.why})")
            if probed.signature == self.good_sig:
                return "no-flip", (f"no flip: the bad pin ends as the good one "
                                   f"({describe(self.good_sig)}); nothing to bisect")
            self.bad_sig = probed.signature
        return None

    def _budgeted(self, probe: Callable[[T], Outcome]) -> Callable[[T], Outcome]:
        def within(arg: T) -> Outcome:
            if len(self.probes) >= self.limit:
                raise BudgetSpent
            return probe(arg)
        return within

    # -- one probe ---------------------------------------------------------------------

    def _probe(self, role: str, label: str, subject: S, *, applied: Sequence[str] = (),
               pin_index: int | None = None, check_mix: bool = False) -> _Probed:
        number = len(self.probes) + 1
        self.listener.probe_starts(number, self.limit, f"{self.runner.readying} {label}")
        started = time.monotonic()
        prepared = self.runner.prepare(subject, role, check_mix)
        attempts: list[Qualified] = []
        if prepared.refused:
            status, outcome, why = "unresolvable", Outcome.UNRESOLVED, prepared.refused
        else:
            attempts = self._attempts(number, role, pin_index, prepared)
            status, outcome, why = self._judge(attempts[-1])
        probe = Probe(number=number, role=role, label=label, applied=list(applied),  # type: ignore[arg-type]
                      pin_index=pin_index, env=prepared.record, image=prepared.image,
                      status=status, outcome=outcome.value, why=why,  # type: ignore[arg-type]
                      attempts=[_attempt(q) for q in attempts],
                      seconds=round(time.monotonic() - started, 3))
        self.probes.append(probe)
        self.listener.probe_done(probe)
        last = attempts[-1] if attempts else None
        return _Probed(probe, outcome, last.signature if last else None)

    def _attempts(self, number: int, role: str, pin_index: int | None,
                  prepared: Prepared) -> list[Qualified]:
        attempts: list[Qualified] = []
        for attempt in range(1, self.options.retries + 2):
            self.listener.qualifying(number, attempt, prepared.shown)
            q = self.runner.qualify(prepared, ProbeId(number, role, attempt, pin_index))
            attempts.append(q)
            if q.result not in RETRIED:
                break
        return attempts

    def _judge(self, q: Qualified) -> tuple[str, Outcome, str]:
        sig = q.signature
        if q.result is None:
            return "error", Outcome.UNRESOLVED, f"no verdict (exit {q.exit_code}): {q.error}"
        if q.result not in JUDGED:
            return "unjudged", Outcome.UNRESOLVED, f"{q.result}: {q.reason}"
        if self.bad_sig is not None and sig == self.bad_sig:
            return "judged", Outcome.FLIP, f"ends as the bad pin: {describe(sig)}"
        if sig == self.good_sig or self.good_sig is None:
            return "judged", Outcome.SAME, f"ends as the good pin: {describe(sig)}"
        if self.bad_sig is None:
            return "judged", Outcome.FLIP, f"ends unlike the good pin: {describe(sig)}"
        return "judged", Outcome.UNRESOLVED, f"ends a third way: {describe(sig)}"

    # -- the result --------------------------------------------------------------------

    def _result(self, mode: str, conclusion: str, summary: str, changes: list[PinChange],
                culprits: list[PinChange], decided: bool,
                flip: FlipPin | None = None) -> BisectResult:
        code = {"flip": ExitCode.PASS, "no-flip": ExitCode.NO_FLIP,
                "undecided": ExitCode.UNDECIDED}[conclusion]
        assumed = [end for end, yes in (("good", self.options.assume_good),
                                        ("bad", self.options.assume_bad)) if yes]
        spec = self.options.cluster.manifest if self.options.cluster else self.options.spec
        return BisectResult(
            mode=mode, conclusion=conclusion, summary=summary, exit_code=int(code),  # type: ignore[arg-type]
            pins=self.labels, assumed=assumed,  # type: ignore[arg-type]
            spec=str(spec) if spec else None, cluster=self.cluster,
            sets=list(self.options.sets), common_packages=self.common_count, changes=changes,
            culprits=culprits, decided=decided, first_flip=flip, probes=self.probes,
            qualifications=sum(len(p.attempts) for p in self.probes),
            unresolvable=sum(p.status == "unresolvable" for p in self.probes),
            started=self.when, seconds=round(time.monotonic() - self.started, 3))


class _ImageBisection(_Bisection[str]):
    """Images in order, each qualified on a cluster."""

    def ordered(self) -> BisectResult:
        found = self._first_flip(self.labels, self.labels)
        if isinstance(found, BisectResult):
            return found
        index = found.index or 0
        at, before = self.labels[index], self.labels[index - 1]
        flip = FlipPin(index=index, path=at, previous=before)
        return self._result("ordered", "flip", self._flip_summary(at, index) +
                            f"; what changed from {before} is the images' to tell (`pip "
                            "freeze` in each, then --good/--bad)", [], [], True, flip)


class _PinBisection(_Bisection[list[Requirement]]):
    """Pin files in probe venvs: delta debugging over their changes, or ordered."""

    def __init__(self, options: BisectOptions, pins: Sequence[PinSet], runner: VenvRunner,
                 listener: Listener) -> None:
        self.pins, self.common = list(pins), shared(pins)
        self.envs = runner.envs
        super().__init__(options, [p.source for p in pins], runner, listener,
                         common=len(self.common))

    def changes(self) -> BisectResult:
        good, bad = self.pins[0], self.pins[-1]
        if len(self.pins) != 2:
            raise UsageError("without --ordered, give exactly --good and --bad")
        _, changes = diff(good, bad)
        self.envs.check_base_lacks([c.name for c in changes])
        labels = [_pin_change(c) for c in changes]
        ends = self._ends(mix(changes, ()), mix(changes, range(len(changes))))
        if ends is not None:
            return self._result("changes", ends[0], ends[1], labels, [], False)
        if not changes:
            return self._result("changes", "undecided", "the pins hold the same packages, yet "
                                "their qualifications ended differently: the stack is not "
                                "reproducible run to run", labels, [], False)

        def probe(subset: frozenset[int]) -> Outcome:
            applied = sorted(subset)
            names = [changes[i].name for i in applied]
            return self._probe("mix", "good + " + ", ".join(changes[i].label for i in applied),
                               mix(changes, subset), applied=names, check_mix=True).outcome_enum

        minimal = search.ddmin(len(changes), self._budgeted(probe))
        culprits = [changes[i] for i in minimal.culprits]
        named = " and ".join(c.label for c in culprits)
        flips = self._flip_words()
        if not minimal.decided:
            unsure = ", ".join(changes[i].label for i in minimal.unsure)
            why = (minimal.why if not minimal.unsure else
                   f"leaving out {unsure} was never judged (unresolved)")
            return self._result("changes", "undecided", f"could not decide: {why}; the "
                                f"smallest set found to flip it ({flips}) is {named}",
                                labels, [_pin_change(c) for c in culprits], False)
        together = " (only together)" if len(culprits) > 1 else ""
        return self._result("changes", "flip", f"{named} flip{'s' if len(culprits) == 1 else ''}"
                            f" the verdict{together}: {flips}", labels,
                            [_pin_change(c) for c in culprits], True)

    def ordered(self) -> BisectResult:
        pins = self.pins
        self.envs.check_base_lacks(sorted({n for p in pins for n in p.packages}
                                          - {r.name for r in self.common}))
        layers = [layer(p, set(self.common)) for p in pins]
        found = self._first_flip(layers, [Path(p.source).name for p in pins])
        if isinstance(found, BisectResult):
            return found
        index = found.index or 0
        before, at = pins[index - 1], pins[index]
        changes = [_pin_change(c) for c in diff(before, at)[1]]
        flip = FlipPin(index=index, path=at.source, previous=before.source)
        named = ", ".join(c.label for c in changes) or "no package change"
        return self._result("ordered", "flip", self._flip_summary(Path(at.source).name, index)
                            + f"; it changes {named}", changes, changes, True, flip)


@dataclass(frozen=True)
class _Probed:
    probe: Probe
    outcome_enum: Outcome
    signature: Signature | None


def _attempt(q: Qualified) -> Attempt:
    return Attempt(result=q.result, reason=q.reason if q.result is not None else q.error,
                   first_divergence=q.first, exit_code=q.exit_code,
                   seconds=round(q.seconds, 3), run_dir=q.where, run=q.run)


__all__ = ["BisectOptions", "Listener", "bisect", "describe"]

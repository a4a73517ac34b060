"""What qualifies a probe: the protocol the bisection drives, and its local runner.

A runner readies a probe (:meth:`Runner.prepare`: a venv built or found; nothing for an
image) and qualifies it, once per attempt (:meth:`Runner.qualify`). The search, the
retries, the judging and ``bisect.json`` are the bisection's, whichever runner it drives:
:class:`VenvRunner` here (``resumequal run`` in a probe venv), or
:class:`~resumequal.bisect.cluster.ClusterRunner` (a QualificationRun the operator runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from resumequal.bisect.envs import Built, Environments, Refused
from resumequal.bisect.pins import Requirement
from resumequal.bisect.probe import Qualified, qualify
from resumequal.bisect.result import ProbeEnv

S = TypeVar("S", contravariant=True)
ENDS = ("good", "bad")


@dataclass(frozen=True)
class ProbeId:
    """Which qualification this is: the probe's number and role, the attempt (1, 2, ...)
    and, in ordered mode, the pin's position."""

    number: int
    role: str
    attempt: int
    pin_index: int | None = None

    @property
    def folder(self) -> str:
        """``03-pin``, ``03-pin-retry1``."""
        suffix = "" if self.attempt == 1 else f"-retry{self.attempt - 1}"
        return f"{self.number:02d}-{self.role}{suffix}"


@dataclass(frozen=True)
class Prepared:
    """A probe readied: how the terminal names where it qualifies, or why it cannot be
    (``refused``: unresolvable, no qualification runs); what bisect.json records of it."""

    shown: str = ""
    refused: str = ""
    record: ProbeEnv | None = None
    env: Built | None = None
    image: str | None = None


class Runner(Protocol[S]):
    """Readies and qualifies probes whose subject is an ``S`` (requirements, an image)."""

    readying: str  # what the terminal says while prepare runs: "building the venv for"

    def prepare(self, subject: S, role: str, check_mix: bool) -> Prepared: ...

    def qualify(self, prepared: Prepared, probe: ProbeId) -> Qualified: ...


@dataclass
class VenvRunner:
    """``resumequal run`` in a probe venv per mix, each attempt in ``out/probes/NN-role``."""

    envs: Environments
    out: Path
    spec: Path | None
    sets: Sequence[str]
    timeout_s: float
    readying: str = "building or finding the venv for"
    # What pip check finds broken in the ends' venvs: a mix is blamed only for more.
    end_problems: set[str] = field(default_factory=set)

    def prepare(self, subject: Sequence[Requirement], role: str, check_mix: bool) -> Prepared:
        env = self.envs.probe_env(list(subject))
        record = ProbeEnv(key=env.key, path=str(self.envs.cache / "venvs" / env.key),
                          reused=env.reused, build_seconds=round(env.seconds, 3),
                          packages=[r.line for r in subject],
                          pulled_in=list(env.pulled_in) if isinstance(env, Built) else [])
        if isinstance(env, Refused):
            return Prepared(refused=f"the resolver refuses this mix: {env.message}",
                            record=record)
        broken = sorted(set(env.problems) - self.end_problems) if check_mix else []
        if role in ENDS:
            self.end_problems |= set(env.problems)
        if broken:
            return Prepared(refused=f"pip check: {'; '.join(broken)}", record=record)
        how = "reused" if env.reused else f"built in {env.seconds:.1f} s"
        if env.pulled_in:
            how += f"; pip added {', '.join(env.pulled_in)}"
        return Prepared(shown=f"in venv {env.key} ({how})", record=record, env=env)

    def qualify(self, prepared: Prepared, probe: ProbeId) -> Qualified:
        assert prepared.env is not None, "qualify a prepared venv only"
        return qualify(prepared.env.python, self.out / "probes" / probe.folder, spec=self.spec,
                       sets=self.sets, pin=f"bisect-{prepared.env.key}",
                       timeout_s=self.timeout_s)


__all__ = ["Prepared", "ProbeId", "Runner", "VenvRunner"]

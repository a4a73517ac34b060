"""Which legs a qualification runs: the reference leg, the main preempted leg, negative
controls, and the positive scenarios of a seed matrix. Pure data derived from the spec; no I/O.

Each leg has a role: ``reference`` (runs uninterrupted; its folder is named ``control``, see
:data:`~resumequal.spec.REFERENCE_LEG`), ``main`` (the preempted leg the verdict is about),
``negative_control`` (a preempted leg that must be caught) or ``scenario`` (one positive
scenario of a seed matrix).

Negative controls are real preempted-and-restarted legs: the same cut and kill as the main
leg, with one part of the state left out of the resume; when each applies, and which kill it
needs, is its descriptor's (:data:`resumequal.spec.omissions.CONTROLS`). The pending-gradients
control needs a checkpoint that holds pending gradients, which only a graceful kill at a
mid-accumulation cut writes, so that control runs with a graceful kill. Controls of state
a qualification does not have are reported not applicable, with no leg: the scaler control
needs a GradScaler (only ``training.precision: fp16`` has one), the loader-state control a
StatefulDataLoader (``workload.loader``). The rank-keyed controls (``rank_cursor``,
``rank_rng``) plant bugs that show only once the world has resized, so they run only with
``preemption.resize``; a resize run draws every microbatch's samples and random streams
from its global position, so the per-rank RNG, data cursor and pending gradients that the
``rng``, ``data_cursor`` and ``pending_grads`` controls leave out play no part in it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from resumequal.spec import (
    REFERENCE_LEG,
    Omission,
    QualificationSpec,
    ResizeSpec,
    Scenario,
    with_preemption,
)
from resumequal.spec.omissions import control

Role = Literal["reference", "main", "negative_control", "scenario"]

REAL_LEG = "a real preempted-and-restarted leg"


@dataclass(frozen=True)
class LegPlan:
    """One leg: its folder name, what it is for, the spec it runs with, what it omits."""

    name: str
    role: Role
    spec: QualificationSpec
    omit: tuple[Omission, ...] = ()
    method: str = REAL_LEG

    @property
    def cut(self) -> bool:
        return self.role != "reference"

    @property
    def resize(self) -> ResizeSpec | None:
        """The resize this leg goes through: a cut leg's. The reference leg of a resize run
        carries the same spec (and so the same elastic launch) but is never shrunk."""
        return self.spec.preemption.resize if self.cut else None

    @property
    def final_world_size(self) -> int:
        """The ranks that finish the leg: fewer after a resize that does not grow back."""
        w, resize = self.spec.world, self.resize
        if resize is None or resize.grow_after_step is not None:
            return w.world_size
        return resize.to_nodes * w.nproc_per_node

    @property
    def resumed_world_size(self) -> int:
        """The ranks of the first attempt after the kill (whose progress dates the resume)."""
        w, resize = self.spec.world, self.resize
        return w.world_size if resize is None else resize.to_nodes * w.nproc_per_node


@dataclass(frozen=True)
class NotRun:
    """A control that cannot apply to this spec, and why (no leg is started for it)."""

    omission: Omission
    evidence: str
    mechanism: str


@dataclass(frozen=True)
class Plan:
    """All legs of one qualification, in launch order."""

    legs: list[LegPlan]
    not_run: list[NotRun] = field(default_factory=list)

    def leg(self, name: str) -> LegPlan:
        for plan in self.legs:
            if plan.name == name:
                return plan
        raise KeyError(name)

    @property
    def negative_controls(self) -> list[LegPlan]:
        return [p for p in self.legs if p.role == "negative_control"]


def negative_control_leg_name(omission: str) -> str:
    return "nc-" + omission.replace("_", "-")


def reference_leg(spec: QualificationSpec) -> LegPlan:
    return LegPlan(REFERENCE_LEG, "reference", spec)


def qualification_plan(spec: QualificationSpec) -> Plan:
    """The reference leg, the main preempted leg, and the negative controls the spec asks for."""
    legs = [reference_leg(spec), LegPlan("preempted", "main", spec)]
    not_run: list[NotRun] = []
    if spec.controls.enabled:
        for omission in spec.controls.omissions:
            nc = control(omission)
            refused = nc.inapplicable(spec)
            if refused is not None:
                not_run.append(NotRun(omission, refused.evidence, refused.mechanism))
                continue
            leg_spec, method = spec, REAL_LEG
            if nc.graceful is not None and spec.preemption.mode != "graceful":
                leg_spec = with_preemption(spec, mode="graceful")
                method = f"{REAL_LEG}, graceful kill: {nc.graceful}"
            legs.append(LegPlan(negative_control_leg_name(omission), "negative_control",
                                leg_spec, (omission,), method))
    return Plan(legs, not_run)


def scenario_spec(spec: QualificationSpec, scenario: Scenario) -> QualificationSpec:
    """The spec of one positive scenario: a boundary or mid-accumulation cut, hard or graceful."""
    where, _, mode = scenario.partition("-")
    p = spec.preemption
    microstep = 0 if where == "boundary" else (p.microstep or 1)
    return with_preemption(spec, microstep=microstep, mode=mode, at="microbatch")


def scenario_plan(spec: QualificationSpec) -> Plan:
    """The reference leg and one preempted leg per positive scenario of the matrix."""
    legs = [reference_leg(spec)]
    for scenario in spec.matrix.scenarios:
        legs.append(LegPlan(scenario, "scenario", scenario_spec(spec, scenario)))
    return Plan(legs)


def rdzv_conf(spec: QualificationSpec) -> dict[str, str]:
    """torchrun's c10d rendezvous settings from ``spec.timeouts`` (``--rdzv-conf``, or a
    PyTorchJob's ``elasticPolicy.rdzvConf``); torch reads them as whole seconds.

    ``read_timeout`` bounds every request to the rendezvous store on the first node,
    connecting included, so it is how long a node may come up before that one (torch's
    default, 60 s, fails a node whose image pulled a minute faster). ``join_timeout``
    bounds a rendezvous, at the start and after every kill, when a recreated pod must be
    scheduled and pull its image. Both are the longest the spec lets nodes wait for each
    other: ``process_group_seconds`` at the start, ``restart_seconds`` after a kill.
    """
    t = spec.timeouts
    seconds = str(math.ceil(max(t.process_group_seconds, t.restart_seconds)))
    return {"join_timeout": seconds, "read_timeout": seconds}


# A dead node leaves the rendezvous once its heartbeats are this old: 1 s x 5 instead of
# torch's 5 s x 3 (dynamic_rendezvous.py ``create_handler``; ``_sanitize`` drops it), so a
# replaced node rejoins within seconds. Shorter expiries declare live nodes dead: the
# heartbeat timer's jitter stretches a period to nearly two intervals.
NODE_KEEP_ALIVE = {"keep_alive_interval": "1", "keep_alive_max_attempt": "5"}
# A resize's rendezvous closes 1 s after its minimum of nodes joined instead of torch's
# 30 s, which every re-rendezvous at the minimum size waits out (``_add_to_participants``).
RESIZE_LAST_CALL = {"last_call_timeout": "1"}




def local_torchrun_args(*, endpoint: str, nproc: int, max_restarts: int,
                        rdzv: Mapping[str, str] | None = None,
                        log_dir: str | None = None,
                        local_addr: str | None = None) -> list[str]:
    """torchrun's own flags for a leg on one machine: one node, a c10d rendezvous at
    ``endpoint`` (``host:port``), ``nproc`` ranks, and ``rdzv`` as ``--rdzv-conf``. On a
    cluster the training operator passes the same through ``PET_*`` variables.

    ``log_dir`` is where torchrun keeps each worker's error file (``--log-dir``); without
    it, every launch leaves a ``torchelastic_*`` folder in the temporary folder.
    ``local_addr`` is the address the agent gives its workers for their group's store
    (``MASTER_ADDR``; ``--local-addr``, else this machine's FQDN)."""
    args = ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}", "--monitor-interval=0.1"]
    if local_addr is not None:
        args.append(f"--local-addr={local_addr}")
    if log_dir is not None:
        args.append(f"--log-dir={log_dir}")
    if rdzv:
        args.append("--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in rdzv.items()))
    return args


def leg_module_args(leg: str, run_dir: str, *, omit: Iterable[str] = (),
                    spec_file: str | None = None, scratch: str | None = None) -> list[str]:
    """What torchrun runs for a leg: ``-m resumequal leg --leg L --run-dir DIR ...``.

    Not ``--run``: torchrun's argument parser scans the module's arguments too and takes
    ``--run`` for an abbreviation of its own ``--run-path``."""
    args = ["-m", "resumequal", "leg"]
    if spec_file is not None:
        args += ["--spec", spec_file]
    args += ["--leg", leg, "--run-dir", run_dir]
    if scratch is not None:
        args += ["--scratch", scratch]
    for omission in omit:
        args += ["--omit", omission]
    return args

"""What the workers of a leg and the comparator write into the run location, without torch.

The node agent runs the pods (its runs' image scripted: testing/cluster/node/scripted.py);
these functions play their containers the way our
launcher around torchrun (``resumequal leg`` under it) and ``resumequal compare`` do,
through the same :class:`RunLocation`: each rank reads its leg's spec file, appends step
records as trace segments, the cut rank of a cut leg writes its beacon on attempt 0 and
every rank holds there until its pod is signalled or the group restarts (a peer's pod
replaced), and a restarted attempt (the rendezvous round, as the workers count joins)
resumes after the newest checkpoint step and finishes. A signalled launcher exits 143.
The comparator writes a prepared ``verdict.json``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from resumequal.results.verdict import (
    Cut,
    Divergence,
    DriftSummary,
    Result,
    StepDelta,
    ValidityCheck,
    Verdict,
    Zoom,
    ZoomReplay,
)
from resumequal.run.location import RunLocation
from resumequal.run.signing import RunSeal
from resumequal.store.s3settings import S3Settings
from testing.cluster.node.scriptrt import SIGTERM_EXIT, Container
from testing.trace_records import step_record, trace_line


def verdict(result: Result = Result.PASS) -> Verdict:
    """A comparator's verdict: exact for PASS, a divergence at step 5 lr rank 1 otherwise."""
    diverged = result == Result.FAIL
    return Verdict(
        result=result, reason=f"{result.value} (simulated comparator)",
        cut=Cut(step=4, microstep=1, rank=1, mode="hard"), resumed_from="step-00000002",
        first_divergence=Divergence(step=5, boundary="lr", rank=1, control=0.1,
                                    preempted=0.2, before_cut=False) if diverged else None,
        exact_through_step=4 if diverged else 6,
        checks=[ValidityCheck(name="kill happened", ok=True, detail="pod deleted")],
        drift=[DriftSummary(group="model", tensors=4, numel=100,
                            max_abs_diff=0.25 if diverged else 0.0,
                            rel_l2=0.01 if diverged else 0.0,
                            mismatch_fraction=0.5 if diverged else 0.0, worst=[])],
        loss_deltas=[StepDelta(step=s, control_loss=1.0, preempted_loss=1.0,
                               abs_diff=0.125 if diverged and s >= 5 else 0.0)
                     for s in range(1, 7)],
    )


def zoom_result() -> Zoom:
    """What the scripted zoom Job finds: the difference starts in ``blocks.1.mix``."""
    return Zoom(step=5, boundary="lr", replays=[
        ZoomReplay(leg=leg, attempt=attempt, start=start, world_size=2, reproduced=True,
                   detail="equal at every boundary")
        for leg, attempt, start in (("control", 0, None), ("preempted", 1, "step-00000002"))],
        origin_kind="module", origins=["blocks.1.mix"],
        summary="step 5 first differs in 1 module (blocks.1.mix)", modules_total=6,
        modules=[], stages=[])


@dataclass
class Workers:
    """Plays every leg's ranks and the comparator against run locations (S3 via ``s3``)."""

    s3: S3Settings | None = None
    result: Result = Result.PASS
    hold_timeout: float = 30.0
    arm: bool = True  # False: the cut rank never reaches its cut (an arm timeout)
    resume: bool = True  # False: a restarted attempt hangs before its first step
    write_verdict: bool = True  # False: the comparator crashes before writing its verdict
    # Set: the control leg fails at once, writing this reason into its FAILED.json.
    fail_reason: str | None = None
    # Set: what the comparator writes as verdict.json instead of its verdict.
    verdict_bytes: bytes | None = None
    # The zoom Job's exit code; 0 writes zoom.json first, as `resumequal zoom` does.
    zoom_exit: int = 0
    # Set: the armed rank's beacon names this pod instead of its own (a planted beacon).
    beacon_pod: str | None = None
    # rank -> seconds it still writes (last trace segments, final checkpoint) after its last
    # step, before it marks the leg done; a pod deleted meanwhile never marks it.
    finish_seconds: dict[int, float] = field(default_factory=dict)
    _locations: dict[str, RunLocation] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __getstate__(self) -> dict[str, object]:
        """What a node process (:class:`testing.cluster.node.scriptnode.NodeRuntime`) is sent: the
        script's settings, not the locations opened here or the lock."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_locations", "_lock")}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state, _locations={}, _lock=threading.Lock())

    def location(self, uri: str, seal: RunSeal) -> RunLocation:
        """The run location as the pod's processes open it: sealed with the run's key and
        id from the pod's env (its Secret, its run's uid)."""
        with self._lock:
            if uri not in self._locations:
                self._locations[uri] = RunLocation.open(uri, self.s3, seal=seal)
            return self._locations[uri]

    def run_rank(self, uri: str, leg: str, rank: int, attempt: int, pod: str,
                 stopped: Callable[[float], bool], seal: RunSeal) -> bool:
        """One rank's workers for one group attempt; True when they finished, False when
        they stopped (SIGTERM, or the elastic agent restarts the group). ``stopped(t)``
        waits up to ``t`` seconds for that stop and says whether it came (0: at once)."""
        loc = self.location(uri, seal)
        leg_file = loc.read_leg_spec(leg)
        assert leg_file is not None, f"{uri}: no legs/{leg}.spec.json (the operator writes it)"
        spec = leg_file.spec
        p, steps = spec.preemption, spec.training.steps
        cut = leg != "control"
        sink = loc.trace_sink(leg, rank, attempt)
        first = 1
        if attempt > 0:
            if not self.resume:
                stopped(self.hold_timeout)
                return False
            every = spec.checkpoint.every_steps or 1
            first = (p.step - 1) // every * every + 1
        last = p.step - 1 if cut and attempt == 0 else steps
        for step in range(first, last + 1):
            sink.append(trace_line(step_record(rank, attempt, step, time.time())))
        if cut and attempt == 0:
            if rank == p.rank and self.arm:
                beacon = {"pid": 1000 + rank, "host": pod, "pod": self.beacon_pod or pod,
                          "rank": rank,
                          "attempt": 0, "step": p.step, "microstep": p.microstep,
                          "at": p.at, "armedAt": time.time()}
                key = loc.leg(leg).beacon_key(rank, 0)
                loc.store.put_bytes(key, seal.seal_json(key, beacon))
            # Every rank is stuck at the cut: the armed one holds, the others wait for it.
            stopped(self.hold_timeout)
            return False
        if stopped(self.finish_seconds.get(rank, 0.0)):
            return False
        # As `resumequal leg` does once its trace is closed and its last checkpoint committed.
        loc.leg(leg).mark_rank_done(rank, attempt, steps)
        return True

    def compare(self, uri: str, seal: RunSeal) -> int:
        """The comparator Job: writes verdict.json; exit 0 PASS, 1 FAIL, 2 INVALID."""
        if not self.write_verdict:
            return 2
        v = verdict(self.result)
        body = v.model_dump_json().encode() if self.verdict_bytes is None else self.verdict_bytes
        self.location(uri, seal).put_result("verdict.json", body)
        return {Result.PASS: 0, Result.FAIL: 1}.get(v.result, 2)


    def zoom(self, uri: str, seal: RunSeal) -> int:
        """The zoom Job: writes zoom.json (origin: one module) unless it is to fail."""
        if self.zoom_exit == 0:
            self.location(uri, seal).put_result("zoom.json",
                                                zoom_result().model_dump_json().encode())
        return self.zoom_exit

    def __call__(self, container: Container) -> int | None:
        """``run_container`` of the scripted runtime: a leg's pod or the comparator, decided
        by the container's command line as the image would. A leg's pod plays our launcher
        around torchrun: its agent restarts the workers whenever the group changes, and a
        SIGTERM ends it with 128+15, as a signalled launcher exits."""
        args = container.command
        # As every process of a run: its key from the run's Secret, its id the run's uid.
        seal = RunSeal.from_env(container.env)
        if "compare" in args:
            return self.compare(args[args.index("compare") + 1], seal)
        if "zoom" in args:
            return self.zoom(args[args.index("zoom") + 1], seal)
        uri, leg = args[args.index("--run-dir") + 1], args[args.index("--leg") + 1]
        if self.fail_reason is not None and leg == "control":
            self.location(uri, seal).leg(leg).mark_failed(self.fail_reason)
            return 1
        nproc = int(container.env.get("PET_NPROC_PER_NODE") or 1)
        while True:
            group = container.rendezvous(self.hold_timeout)
            if group is None:  # killed, or torchrun gave up (store gone, restarts spent)
                return SIGTERM_EXIT if container.killed.is_set() else 1
            done = self.run_rank(uri, leg, container.index * nproc, group.number,
                                 container.pod_name,
                                 lambda t, g=group: container.hold(g, t), seal)
            if done:
                container.exit_barrier()
                return 0
            if container.killed.is_set():
                return SIGTERM_EXIT


"""`resumequal run` end to end: real legs, real kills, verdicts, reports, and no orphans."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from resumequal.run.signing import RUN_ID_ENV
from tests.exposition import value
from tests.integration import legs
from tests.waiting import eventually

pytestmark = pytest.mark.slow

FAST = ["--set", "workload.name=dropout-mlp", "--set", "controls.enabled=false"]


# Every process a run starts inherits its environment, this variable with it: its legs'
# torchrun agents and their workers (and, for a forked leg, the forkserver the workers are
# forked from, whose command line the workers keep and which names no run).
RUN_MARK = "RESUMEQUAL_TEST_RUN"


def _resumequal(*args: str, timeout: float = 280,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return legs.resumequal(*args, timeout=timeout, env={**(env or {}), **_marked(args)})


def _marked(args: Sequence[str]) -> dict[str, str]:
    """The environment that marks the processes of a run started with ``args``."""
    return {RUN_MARK: args[args.index("--run-dir") + 1]} if "--run-dir" in args else {}


def _processes_of(run_dir: Path) -> list[int]:
    """The processes still alive that a run of ``run_dir`` started."""
    mark = f"{RUN_MARK}={run_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if mark in environ:
            found.append(int(entry.name))
    return found


def _report(run_dir: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((run_dir / "report.json").read_text())  # type: ignore[no-any-return]


@pytest.mark.timeout(900)
def test_default_qualification_passes_and_leaves_reports(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # The default runs eight legs (control, preempted, six negative controls); the same run
    # checks the verdict, the reports and every control's mechanism.
    proc = _resumequal("run", "--run-dir", str(run_dir), timeout=840)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout
    report = _report(run_dir)
    verdict = report["verdict"]
    assert verdict["result"] == "PASS"
    assert verdict["exact_through_step"] == 12
    assert verdict["first_divergence"] is None
    assert report["restart_seconds"] > 0
    assert [p["phase"] for p in report["phases"]] == [
        "Pending", "LegsRunning", "Armed", "Preempted", "Resumed", "Comparing", "Succeeded"]
    assert (run_dir / "verdict.json").exists()
    html = (run_dir / "report.html").read_text()
    assert "<svg" in html and "PASS" in html
    metrics = (run_dir / "metrics.prom").read_text()
    assert value(metrics, "resumequal_qualification_passed", namespace="local") == 1.0
    _assert_default_controls(report, metrics)
    assert not _processes_of(run_dir)


def _assert_default_controls(report: dict, metrics: str) -> None:  # type: ignore[type-arg]
    """The default run's negative controls: each detected by the mechanism it breaks, or
    not applicable with the reason; checked on the same run as the verdict."""
    controls = {c["omission"]: c for c in report["verdict"]["controls"]}
    assert set(controls) == {"rng", "data_cursor", "scheduler", "optimizer",
                             "model_optimizer_only", "pending_grads", "scaler", "loader_state",
                             "rank_cursor", "rank_rng"}
    # fp32 has no GradScaler, nor this workload a StatefulDataLoader, nor this run a resize:
    # no leg runs for their controls, and the report says why.
    scaler, loader = controls.pop("scaler"), controls.pop("loader_state")
    assert (scaler["status"], scaler["leg"]) == ("not_applicable", None)
    assert scaler["evidence"].startswith("training.precision is fp32: there is no GradScaler")
    assert (loader["status"], loader["leg"]) == ("not_applicable", None)
    assert loader["evidence"].startswith("workload.loader is not set")
    for name in ("rank_cursor", "rank_rng"):
        keyed = controls.pop(name)
        assert (keyed["status"], keyed["leg"]) == ("not_applicable", None)
        assert keyed["evidence"].startswith("preemption.resize is not set")
    assert all(c["status"] == "detected" for c in controls.values()), controls
    # Resumed from step 4: fresh RNGs show at the start of step 5, immediately.
    rng = controls["rng"]["first_divergence"]
    assert (rng["step"], rng["boundary"]) == (5, "rng")
    # The optimizer's saved lr is right for step 5; the fresh scheduler's lr is used from
    # step 6 on: a delayed divergence, learning rate first, then the parameters it moved.
    sched = controls["scheduler"]
    assert (sched["first_divergence"]["step"], sched["first_divergence"]["boundary"]) == (6, "lr")
    assert sched["mechanism"].startswith("learning rate differed from step 6")
    assert "parameters from step 6" in sched["mechanism"]
    assert sched["max_param_diff"] > 0
    # A fresh optimizer: no Adam moments, and the initial lr in its param groups where the
    # saved ones held the scheduled one (the scheduler's own state was restored).
    optim = controls["optimizer"]
    assert (optim["first_divergence"]["step"], optim["first_divergence"]["boundary"]) == (5, "lr")
    assert "parameters from step 5" in optim["mechanism"]
    # Dropping pending gradients needs them to exist: that leg is killed gracefully.
    pending = controls["pending_grads"]
    assert "graceful" in pending["method"]
    assert (pending["first_divergence"]["step"],
            pending["first_divergence"]["boundary"]) == (6, "local_grads")
    assert value(metrics, "resumequal_negative_controls_detected", namespace="local") == len(
        [c for c in controls.values() if c["status"] == "detected"])


def test_a_run_leaves_nothing_in_the_temporary_folder(tmp_path: Path) -> None:
    """torchrun's error files and inductor's caches live in the run's private scratch, in
    the temporary folder, and go with the run: no torchelastic_* folder per launch."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    run_dir = tmp_path / "run"
    proc = _resumequal("run", "--run-dir", str(run_dir), *FAST, env={"TMPDIR": str(tmp)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in tmp.glob("torchelastic_*")) == []
    assert list((tmp / f"resumequal-{os.getuid()}").iterdir()) == []
    assert not (run_dir / "compile-cache").exists()


def test_resume_without_scheduler_state_fails_at_the_learning_rate(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _resumequal("run", "--run-dir", str(run_dir), *FAST, "--omit", "scheduler")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdict = _report(run_dir)["verdict"]
    assert verdict["result"] == "FAIL"
    first = verdict["first_divergence"]
    # Resumed from step 4: the optimizer's saved lr is right for step 5, then the fresh
    # scheduler sets its own step-1 lr, so step 6 is the first update with a wrong lr.
    assert (first["step"], first["boundary"]) == (6, "lr")
    assert first["before_cut"] is False
    assert verdict["exact_through_step"] == 5
    assert not _processes_of(run_dir)


def test_armed_rank_never_killed_times_out_and_leaves_no_process(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    started = time.monotonic()
    proc = _resumequal("run", "--run-dir", str(run_dir), *FAST, "--no-kill",
                       "--set", "timeouts.arm_seconds=4")
    assert proc.returncode == 3, proc.stdout + proc.stderr  # INVALID
    report = _report(run_dir)
    failed = report["phases"][-1]
    assert failed["phase"] == "Failed" and failed["reason"] == "Timeout"
    assert "timeouts.armSeconds=4" in failed["message"]
    armed = next(p for p in report["phases"] if p["phase"] == "Armed")
    assert failed["at"] - armed["at"] < 4 + 3
    assert report["verdict"]["result"] == "INVALID"
    assert time.monotonic() - started < 120
    assert not _processes_of(run_dir)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("preemption.step=13", "after the last step"),
        ("preemption.step=2", "lands before the first committed checkpoint"),
        ("preemption.microstep=3", "must be < training.accumulationSteps"),
    ],
)
def test_experiments_that_cannot_be_valid_are_rejected_up_front(
    override: str, message: str, tmp_path: Path
) -> None:
    proc = _resumequal("run", "--run-dir", str(tmp_path / "run"), "--set", override, timeout=60)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert not (tmp_path / "run").exists()


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_interrupt_stops_every_process(tmp_path: Path) -> None:
    # Interrupted while the armed rank holds at its cut (no kill is delivered): the leg's
    # torchrun and both workers are certainly alive then, however loaded the machine.
    run_dir = tmp_path / "run"
    # SIGINT as a terminal delivers it: a suite started in the background (nohup, `&`) has
    # it ignored, and a child would inherit that and rightly keep running.
    args = ["run", "--run-dir", str(run_dir), "--no-kill", *FAST,
            "--set", "timeouts.armSeconds=100"]
    proc = subprocess.Popen([sys.executable, "-m", "resumequal", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=_default_sigint, env=dict(os.environ, **_marked(args)))
    beacon = run_dir / "preempted" / "beacons" / "attempt-0-rank-1.json"
    eventually(beacon.exists, 180, "the preempted leg to arm", interval=0.1,
               abort=lambda: None if proc.poll() is None else f"the run exited {proc.returncode}")
    processes = _processes_of(run_dir)
    assert len(processes) >= 4  # the run, the leg's torchrun and two workers
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # every thread's stack, for the failure message
        time.sleep(2)
        proc.kill()
        out, _ = proc.communicate(timeout=30)
        raise AssertionError("the interrupted run did not end within 60 s:\n"
                             + out.decode(errors="replace")[-6000:]) from None
    assert proc.returncode == 130, out
    assert not _processes_of(run_dir)


def _commands(pids: Sequence[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                       .decode(errors="replace")[:160])
        except OSError:
            continue
    return out


def test_a_run_killed_with_sigkill_leaves_nothing_behind(tmp_path: Path) -> None:
    """SIGKILL (the OOM killer, a CI job's timeout) runs no cleanup in the run: every
    process it started ends all the same, within seconds: the leg's rendezvous store, its
    torchrun agent and the workers."""
    run_dir = tmp_path / "run"
    args = ["run", "--run-dir", str(run_dir), "--no-kill", *FAST,
            "--set", "timeouts.armSeconds=100"]
    proc = subprocess.Popen([sys.executable, "-m", "resumequal", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, **_marked(args)))
    beacon = run_dir / "preempted" / "beacons" / "attempt-0-rank-1.json"
    eventually(beacon.exists, 180, "the preempted leg to arm", interval=0.1,
               abort=lambda: None if proc.poll() is None else f"the run exited {proc.returncode}")
    started = [pid for pid in _processes_of(run_dir) if pid != proc.pid]
    commands = " | ".join(_commands(started))
    assert "resumequal.local.rdzv_store" in commands and "torch.distributed.run" in commands
    assert len(started) >= 4, commands  # the store, the agent, two workers
    proc.kill()
    proc.wait(10)
    killed = time.monotonic()
    try:
        eventually(lambda: not _processes_of(run_dir), 10, "every process of the run to end",
                   interval=0.05)
    finally:
        left = _processes_of(run_dir)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    print(f"every process of the run ended {time.monotonic() - killed:.2f} s after its SIGKILL")
    assert not left, _commands(left)


# Loaded by every Python process of the run (PYTHONPATH): the comparison, wherever it runs,
# never returns, as one stuck on a store that stops answering would.
_HANG_THE_COMPARISON = """
import importlib.abc, importlib.util, sys, time

class _Hang(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "resumequal.compare.controls":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.compare_qualification = lambda *a, **k: time.sleep(3600)

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Hang())
"""


@pytest.mark.timeout(600)
def test_a_comparison_that_hangs_ends_the_run_at_its_deadline(tmp_path: Path) -> None:
    """The local comparison is bounded as a cluster's comparator Job is: past
    timeouts.legSeconds in Comparing, the run ends (Timeout, INVALID) and the comparison's
    process goes with it."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_HANG_THE_COMPARISON)
    run_dir = tmp_path / "run"
    args = ("run", "--run-dir", str(run_dir), *FAST, "--set", "timeouts.legSeconds=75")
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    proc = _resumequal(*args, timeout=500, env={"PYTHONPATH": path})
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    verdict = _report(run_dir)["verdict"]
    assert verdict["result"] == "INVALID"
    assert "the comparison did not finish within timeouts.legSeconds=75" in verdict["reason"]
    assert not _processes_of(run_dir)


def test_the_comparators_report_dates_the_kill_and_the_restart_as_the_run_did(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    proc = _resumequal("run", "--run-dir", str(run_dir), *FAST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = _report(run_dir)
    # What a cluster's comparator Job does: judge the location and write the results.
    # With the run's key and id that `resumequal run` kept (none in the environment).
    again = _resumequal("compare", str(run_dir), "--write", "--pin", "torch==test",
                        env={RUN_ID_ENV: ""})
    assert again.returncode == 0, again.stdout + again.stderr
    compared = _report(run_dir)
    assert [p["phase"] for p in compared["phases"]] == [
        "LegsRunning", "Armed", "Preempted", "Resumed", "Comparing", "Succeeded"]
    # The kill order is written right after the signal the runner timed.
    assert abs(compared["kill_at"] - ran["kill_at"]) < 1
    assert compared["restart_seconds"] > 0
    assert abs(compared["restart_seconds"] - ran["restart_seconds"]) < 1


@pytest.mark.timeout(400)
def test_the_reports_name_the_optimizer_and_schedule_a_factory_built(tmp_path: Path) -> None:
    """The spec keeps its defaults (adamw, lr 0.003, warmup-cosine); the factory builds SGD
    and a LambdaLR: every report names those, and none claims the spec's."""
    run_dir = tmp_path / "run"
    proc = _resumequal("run", "--run-dir", str(run_dir), *legs.FORKED, "--set",
                       "workload.name=tests.sgd_workload:build", "--set",
                       "controls.enabled=false", timeout=380)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = _report(run_dir)
    built = report["built"]
    assert (built["optimizer"], built["scheduler"]) == ("SGD", "LambdaLR")
    assert built["hyperparameters"]["momentum"] == 0.9
    assert built["hyperparameters"]["initial_lr"] == 0.05
    assert not built["optimizer_from_spec"] and not built["schedule_from_spec"]
    assert {"optimizer", "schedule"}.isdisjoint(report["spec"]["training"])
    words = "SGD (lr 0.05, momentum 0.9, weight_decay 0), schedule LambdaLR"
    html = (run_dir / "report.html").read_text()
    assert words in proc.stdout and words in html
    for shown in ((run_dir / "report.json").read_text(), html, proc.stdout):
        assert "adamw" not in shown.lower() and "warmup-cosine" not in shown

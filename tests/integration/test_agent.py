"""``python -m resumequal.worker.agent``: torchrun's agent with ``-m`` workers forked from a
forkserver that loaded their code once. Real agents on loopback, 2 workers, real SIGKILLs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from resumequal.local.processes import ProcessTree
from resumequal.qualify.plan import local_torchrun_args
from resumequal.spec.launchers import command
from testing.ports import free_port
from tests.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

WORKER = "tests.integration.agent_worker"
MARK = "AGENT_TEST_MARK"


@pytest.fixture
def tree() -> Iterator[ProcessTree]:
    t = ProcessTree()
    yield t
    t.stop_all(grace_seconds=1)


def _agent(tree: ProcessTree, tmp_path: Path, script: list[str], what: str,
           max_restarts: int = 1, agent: Sequence[str] = command("forked"),
           ) -> tuple[subprocess.Popen[bytes], Path, Path]:
    out = tmp_path / "out"
    out.mkdir()
    log = tmp_path / "agent.log"
    cmd = [sys.executable, *agent,
           *local_torchrun_args(endpoint=f"127.0.0.1:{free_port()}", nproc=2,
                                max_restarts=max_restarts),
           *script, str(out), what]
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd(), **{MARK: "yes"})
    return tree.spawn(cmd, log, env), out, log


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not: it only waits to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _fresh_start_method() -> str:
    return subprocess.run([sys.executable, "-c", "import multiprocessing as m; "
                           "print(m.get_start_method())"], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def _records(out: Path) -> dict[tuple[int, int], dict[str, Any]]:
    return {(r["attempt"], r["rank"]): r for r in (
        json.loads(p.read_text()) for p in out.glob("attempt-*-rank-*.json"))}


def test_module_workers_are_forked_with_their_code_loaded_and_a_kill_restarts_them(
    tree: ProcessTree, tmp_path: Path
) -> None:
    agent, out, log = _agent(tree, tmp_path, ["-m", WORKER], "kill")
    eventually(lambda: (out / "pid").exists(), 120, "rank 1 of attempt 0 to wait",
               abort=lambda: None if agent.poll() is None else log.read_text()[-3000:])
    os.kill(int((out / "pid").read_text()), signal.SIGKILL)
    assert agent.wait(120) == 0, log.read_text()[-3000:]
    records = _records(out)
    assert sorted(records) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # Every worker of both attempts was forked by one process, which is not the agent,
    # and found torch, DCP, dynamo and the leg's modules loaded when it started.
    (forkserver,) = {r["ppid"] for r in records.values()}
    assert forkserver != agent.pid
    for r in records.values():
        assert all(r["loaded"].values()), r["loaded"]
        # What torchrun gives a worker of ``python -u -m MODULE ARGS``.
        assert r["argv"][0].endswith("agent_worker.py")
        assert r["argv"][1:] == [str(out), "kill"]
        assert r["env"]["LOCAL_RANK"] == str(r["rank"]) and r["env"]["WORLD_SIZE"] == "2"
        assert r["env"]["MASTER_ADDR"] and r["env"]["PYTHONUNBUFFERED"] == "1"
        assert r["env"][MARK] == "yes"  # the agent's environment, inherited
        # As torchrun starts a worker: a session of its own, the platform's default start
        # method (not the forkserver's), nothing the forkserver's imports set.
        assert r["own_session"] and r["start_method"] == _fresh_start_method(), r
        assert r["env"]["TORCHINDUCTOR_CACHE_DIR"] is None
    assert len({r["pid"] for r in records.values()}) == 4
    # The children the cut attempt's workers started (the killed worker's among them) were
    # stopped with their workers' process groups, as torchrun stops a worker's.
    children = [records[(0, rank)]["child"] for rank in (0, 1)]
    assert all(children) and not any(_alive(pid) for pid in children), children
    assert "worker exit codes: " in log.read_text() and "local_rank 1: -9" in log.read_text()
    # What each worker registered to run at exit ran, as at the end of ``python -m``;
    # nothing of the SIGKILLed one. Its peer of the cut attempt runs its own only when
    # gloo's error (the peer's socket closed) ends its barrier before the agent's SIGTERM
    # arrives, whose default action ends a process without them: under torchrun too that
    # is a race, which a loaded machine can lose.
    ran = sorted(p.name for p in out.glob("atexit-*"))
    assert ran in (["atexit-0-0", "atexit-1-0", "atexit-1-1"], ["atexit-1-0", "atexit-1-1"])


def test_a_raising_worker_exits_with_its_failure_held_and_its_exit_functions_run(
    tree: ProcessTree, tmp_path: Path
) -> None:
    # ``python -m`` exits with what the module raised still referenced; a forked worker
    # that released it would tear its training state down first, which with a DDP
    # reducer over gloo can deadlock the worker that should be restarted.
    agent, out, log = _agent(tree, tmp_path, ["-m", WORKER], "raise")
    assert agent.wait(120) == 0, log.read_text()[-3000:]
    assert "local_rank 1: 1" in log.read_text()
    assert sorted(_records(out)) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert not list(out.glob("torn-down-*"))
    assert (out / "atexit-0-1").exists()


def test_a_failing_worker_fails_the_agent_once_its_restarts_are_spent(
    tree: ProcessTree, tmp_path: Path
) -> None:
    agent, out, log = _agent(tree, tmp_path, ["-m", WORKER], "exit 3", max_restarts=0)
    assert agent.wait(120) == 1, log.read_text()[-3000:]
    assert "local_rank 1: 3" in log.read_text()
    assert sorted(_records(out)) == [(0, 0), (0, 1)]
    assert (out / "atexit-0-1").exists()  # sys.exit(3) runs them too


def test_a_worker_ends_as_python_ends_threads_then_exit_functions_then_open_files(
    tree: ProcessTree, tmp_path: Path
) -> None:
    agent, out, log = _agent(tree, tmp_path, ["-m", WORKER], "ok")
    assert agent.wait(120) == 0, log.read_text()[-3000:]
    for rank in (0, 1):
        assert (out / f"late-0-{rank}.thread").read_text() == "done"
        assert (out / f"late-0-{rank}.atexit").read_text() == "after the thread"
        assert (out / f"late-0-{rank}.unclosed").read_text() == "8 bytes!"


def test_a_torch_without_the_internals_it_patches_runs_stock_torchrun_with_a_warning(
    tree: ProcessTree, tmp_path: Path
) -> None:
    # A torch whose MultiprocessContext has no _poll: the agent cannot work there.
    without = ("import sys; import torch.distributed.elastic.multiprocessing.api as api; "
               "del api.MultiprocessContext._poll; import resumequal.worker.agent as agent; "
               "agent.main(sys.argv[1:])")
    agent, out, log = _agent(tree, tmp_path, ["-m", WORKER], "ok", agent=("-c", without))
    assert agent.wait(120) == 0, log.read_text()[-3000:]
    assert "MultiprocessContext._poll; running stock torchrun instead" in log.read_text()
    for r in _records(out).values():
        assert r["ppid"] == agent.pid and not any(r["loaded"].values())


def test_a_script_path_runs_as_torchrun_runs_it(tree: ProcessTree, tmp_path: Path) -> None:
    script = str(Path(__file__).with_name("agent_worker.py"))
    agent, out, log = _agent(tree, tmp_path, [script], "ok")
    assert agent.wait(120) == 0, log.read_text()[-3000:]
    for r in _records(out).values():
        assert r["ppid"] == agent.pid  # started by the agent, as programs
        assert not any(r["loaded"].values())


def test_a_traceback_is_logged_without_loading_dynamo(tmp_path: Path) -> None:
    # torch's formatter loads dynamo to format a traceback; the agent's filter formats it
    # first. Without it, the same record loads dynamo: what the filter saves.
    probe = textwrap.dedent("""
        import logging, sys
        import torch.distributed.run  # torch's log handlers, as in the agent
        from resumequal.worker.agent import format_tracebacks_first
        if sys.argv[1] == "filtered":
            format_tracebacks_first()
        try:
            raise ValueError("a worker failed")
        except ValueError:
            logging.getLogger("torch.distributed.elastic.x").exception("failed (exitcode: 1)")
        print("dynamo loaded:", "torch._dynamo" in sys.modules)
    """)
    runs = {how: subprocess.run([sys.executable, "-c", probe, how], capture_output=True,
                                text=True, timeout=120) for how in ("filtered", "plain")}
    for how, run in runs.items():
        assert run.returncode == 0, run.stderr
        assert "ValueError: a worker failed" in run.stderr, how  # the traceback is logged
    assert "dynamo loaded: False" in runs["filtered"].stdout
    assert "dynamo loaded: True" in runs["plain"].stdout

"""What a launcher lets a verdict see: a resume that depends on the process.

:mod:`tests.set_order_workload` restores its data cursors in the order of a ``set`` of
strings, which a fresh interpreter draws anew. Under the default launcher (stock torchrun,
every worker a fresh interpreter, as a production restart) the qualification FAILs at the
first boundary that reads the data after the resume; forked from one warm process, the
resumed workers keep its hash secret and the same bug resumes exactly, which is what the
forked launcher's report says it cannot see.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration import legs

pytestmark = pytest.mark.slow

SET_ORDER = ["--set", "workload.name=tests.set_order_workload:build",
             "--set", "controls.enabled=false"]


def _run(run_dir: Path, *args: str) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    # A fixed PYTHONHASHSEED would give every fresh interpreter the same secret.
    proc = legs.resumequal("run", "--run-dir", str(run_dir), *SET_ORDER, *args,
                           env={"PYTHONHASHSEED": "random"})
    report = json.loads((run_dir / "report.json").read_text())
    return proc.returncode, report, proc.stdout


def test_the_default_launcher_fails_a_resume_that_depends_on_the_process(
        tmp_path: Path) -> None:
    # Digested as on a GPU (wsum128): the same verdict as xxh3_128's.
    code, report, out = _run(tmp_path / "run", "--set", "comparison.digest=wsum128")
    verdict = report["verdict"]
    assert (code, verdict["result"]) == (1, "FAIL"), verdict["reason"]
    first = verdict["first_divergence"]
    # Resumed from step 4: the first step after the resume reads the wrong cursors.
    assert (first["step"], first["boundary"]) == (5, "inputs"), first
    assert verdict["exact_through_step"] == 4
    assert report["launcher"] == "torchrun" and report["caveats"] == []
    assert report["inventory"]["launcher"] == "torchrun"
    assert report["inventory"]["digest"] == "wsum128"
    assert "launcher" in out and "torchrun" in out and "cannot see" not in out


def test_forked_workers_hide_it_and_the_report_says_what_forked_cannot_see(
        tmp_path: Path) -> None:
    code, report, out = _run(tmp_path / "run", "--set", "world.launcher=forked")
    assert (code, report["verdict"]["result"]) == (0, "PASS"), report["verdict"]["reason"]
    assert report["launcher"] == "forked"
    assert report["inventory"]["launcher"] == "forked"
    assert "forked (cannot see what a fresh process changes" in " ".join(out.split())
    (caveat,) = report["caveats"]
    assert "str-hash secret" in caveat and "fresh" in caveat
    html = (tmp_path / "run" / "report.html").read_text()
    assert "workers forked from one warm process" in html and "str-hash secret" in html

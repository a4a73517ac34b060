"""Which launcher starts a run's workers: stock torchrun unless ``world.launcher: forked``;
the leg pods' command and the run's status say which, and a forked run's status says what
its verdict cannot see."""

from __future__ import annotations

from typing import Any

import pytest

from resumequal_operator.kube import PYTORCHJOBS, QUALIFICATION_RUNS
from testing.cluster.testapi import RealAPI
from testing.operator.harness import Operators, qr, run_manifest

pytestmark = pytest.mark.timeout(60)


def _launched(api: RealAPI, name: str) -> dict[str, Any]:
    return api.wait_for(lambda: (r := qr(api, name)).get("status", {}).get("legs", {}).get(
        "preempted", {}).get("job") and r, 20, f"{name}'s legs launched")


def _commands(api: RealAPI, name: str) -> list[list[str]]:
    return [job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "command"] for job in api.created(PYTORCHJOBS.plural)
        if job["metadata"]["name"].startswith(name)]


@pytest.mark.parametrize("launcher", ["torchrun", "forked"])
def test_the_status_and_the_leg_pods_say_which_launcher_runs_the_workers(
        api: RealAPI, operators: Operators, store: dict[str, str], launcher: str) -> None:
    operators.start()
    world = {"world": {"launcher": launcher}} if launcher != "torchrun" else {}
    api.create(QUALIFICATION_RUNS.plural, run_manifest("lr", store, **world))
    status = _launched(api, "lr")["status"]
    assert status["launcher"] == launcher
    commands = _commands(api, "lr")
    assert len(commands) == 2
    for command in commands:
        assert command[command.index("--launcher") + 1] == launcher
    if launcher == "torchrun":
        assert "launcherCaveats" not in status  # an empty list is left out
    else:
        (caveat,) = status["launcherCaveats"]
        assert caveat.startswith("launcher forked:") and "str-hash secret" in caveat

"""Unit tests for the pieces of a leg's launch that need no process: exit statuses and the
rendezvous settings derived from the spec."""

from __future__ import annotations

import signal

import pytest

from resumequal.qualify.plan import rdzv_conf
from resumequal.spec import parse_spec
from resumequal.worker.launch import exit_code


def _exited(code: int) -> int:
    """The wait status of a process that exited with ``code`` (the encoding of wait(2))."""
    return (code & 0xFF) << 8


@pytest.mark.parametrize(
    ("status", "code"),
    [
        pytest.param(_exited(0), 0, id="success"),
        pytest.param(_exited(1), 1, id="torchrun-failed"),
        pytest.param(_exited(143), 143, id="exited-143"),
        # A signal death's status is the signal number itself.
        pytest.param(int(signal.SIGKILL), 137, id="killed-by-sigkill"),
        pytest.param(int(signal.SIGTERM), 143, id="killed-by-sigterm"),
    ],
)
def test_exit_code_is_what_a_shell_reports(status: int, code: int) -> None:
    assert exit_code(status) == code


def test_rdzv_conf_defaults_cover_the_group_and_restart_timeouts() -> None:
    assert rdzv_conf(parse_spec({})) == {"join_timeout": "120", "read_timeout": "120"}


@pytest.mark.parametrize(
    ("timeouts", "join", "read"),
    [
        pytest.param({"process_group_seconds": 300, "restart_seconds": 90}, "300", "300",
                     id="slow-start"),
        pytest.param({"process_group_seconds": 45, "restart_seconds": 240, "arm_seconds": 30},
                     "240", "240", id="slow-restart"),
        pytest.param({"process_group_seconds": 30.2, "restart_seconds": 10.5,
                      "arm_seconds": 20}, "31", "31", id="whole-seconds-rounded-up"),
    ],
)
def test_rdzv_conf_follows_the_spec_timeouts(
    timeouts: dict[str, float], join: str, read: str
) -> None:
    conf = rdzv_conf(parse_spec({"timeouts": timeouts}))
    assert conf == {"join_timeout": join, "read_timeout": read}
    # torch reads them with get_as_int: whole positive numbers.
    assert all(int(v) > 0 for v in conf.values())


def test_one_leg_command_line_parses_as_torchrun_means_it() -> None:
    # The builder the local runner, the operator's manifests, the tests and the benches
    # share: torchrun's own parser must read our flags as its own and hand every leg
    # argument to the module (a "--run" would be taken for its --run-path).
    from torch.distributed.run import get_args_parser

    from resumequal.qualify.plan import leg_module_args, local_torchrun_args

    flags = local_torchrun_args(endpoint="127.0.0.1:29500", nproc=3, max_restarts=2,
                                rdzv={"join_timeout": "120", "read_timeout": "120"})
    module = leg_module_args("nc-rng", "s3://b/p/run", omit=["rng"], scratch="/tmp/s")
    parsed = get_args_parser().parse_args([*flags, *module])
    assert (parsed.rdzv_backend, parsed.rdzv_endpoint) == ("c10d", "127.0.0.1:29500")
    assert (parsed.nproc_per_node, parsed.max_restarts) == ("3", 2)
    assert parsed.rdzv_conf == "join_timeout=120,read_timeout=120"
    assert parsed.module and parsed.training_script == "resumequal"
    assert parsed.training_script_args == [
        "leg", "--leg", "nc-rng", "--run-dir", "s3://b/p/run", "--scratch", "/tmp/s",
        "--omit", "rng"]
    assert leg_module_args("control", "/runs/r", spec_file="/runs/s.yaml")[3:5] == [
        "--spec", "/runs/s.yaml"]

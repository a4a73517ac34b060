"""A container's mounts as the node agent's shim makes them (testing/cluster/node/enter.py),
in a mount namespace of the test's own: root only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _in_mount_namespace(script: str) -> str:
    """Run ``script`` (Python) in a mount namespace of its own whose mounts reach nothing
    else; its output."""
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "slave", sys.executable, "-c", script],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts need root")
def test_a_mount_over_a_later_mounts_source_leaves_that_source_to_it(tmp_path: Path) -> None:
    # An emptyDir on a folder that holds the pod's own folder (a checkout under /tmp with
    # an emptyDir on /tmp): the secret bound after it comes from where it was, as from a
    # runtime's host path.
    pod = tmp_path / "checkout" / "pod"
    (pod / "secret").mkdir(parents=True)
    (pod / "secret" / "key").write_text("k3y")
    (pod / "empty").mkdir()
    (pod / "hosts").write_text("127.0.0.1 localhost\n")
    target = tmp_path / "mounted"
    mounts = [
        {"target": str(tmp_path / "checkout"), "source": str(pod / "empty")},
        {"target": str(target / "key"), "source": str(pod / "secret"), "readOnly": True},
        {"target": str(target / "hosts"), "source": str(pod / "hosts")},
        {"target": str(target / "scratch"), "tmpfsSize": ""},
    ]
    out = _in_mount_namespace(
        "import json, os, sys\n"
        "from testing.cluster.node.enter import mount_all\n"
        f"mount_all(json.loads({json.dumps(json.dumps(mounts))}))\n"
        f"t = {str(target)!r}\n"
        "print(open(t + '/key/key').read(), open(t + '/hosts').read().split()[1],\n"
        "      os.listdir(" + repr(str(tmp_path / "checkout")) + "))\n"
        "try:\n"
        "    open(t + '/key/new', 'w')\n"
        "except OSError as e:\n"
        "    print('read-only', e.errno)\n")
    assert out.split("\n")[:2] == ["k3y localhost []", "read-only 30"]
    # Nothing of it reached this mount namespace.
    assert not (target / "key" / "key").exists()
    assert (pod / "secret" / "key").read_text() == "k3y"


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts need root")
def test_a_mount_that_fails_says_what_mount_said(tmp_path: Path) -> None:
    out = _in_mount_namespace(
        "from testing.cluster.node.enter import _mount\n"
        "try:\n"
        f"    _mount(['--bind', {str(tmp_path / 'absent')!r}, {str(tmp_path)!r}])\n"
        "except OSError as e:\n"
        "    print(e)\n")
    assert "exited 32" in out and "absent" in out

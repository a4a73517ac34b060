"""The pod cluster's folders (testing/cluster/podcluster.py): one a killed session left is
stopped and removed by the next session; a live session's is left alone. Its module loads
the node agent, whose import starts a process (ldconfig): not a unit test."""

from __future__ import annotations

import os
from pathlib import Path

from testing.cluster import podcluster


def test_a_pod_cluster_left_by_a_session_that_is_gone_is_reaped(tmp_path: Path) -> None:
    live, dead, unowned = (tmp_path / f"podcluster-{n}" for n in ("live", "dead", "unowned"))
    for folder in (live, dead, unowned):
        (folder / "run").mkdir(parents=True)
    (live / podcluster.OWNER).write_text(podcluster._process_id(os.getpid()) or "")
    # This process's pid with another start time: the pid was reused by another process.
    (dead / podcluster.OWNER).write_text(f"{os.getpid()} 1")
    assert podcluster.reap_orphans(tmp_path) == [dead]
    assert live.exists() and unowned.exists() and not dead.exists()

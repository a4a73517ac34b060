"""What a worker process loads before its first collective.

A leg's workers are forked from a process that loaded the leg's code once
(``resumequal.worker.agent``, ``resumequal.train.preload``), and a leg started by plain torchrun
pays its imports at every start; either way the leg's entry point (``python -m resumequal
leg``) must not load what only the runner, the comparator, the reports or an S3 store
use: the forkserver loads it before a leg's first attempt, and a replaced node or pod
again. Each check runs in a fresh interpreter: this test process has imported everything
already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

# Loaded for other commands or other stores, never needed by a leg on a folder store.
NOT_IN_A_WORKER = (
    "rich",  # the terminal summary (resumequal run)
    "boto3",  # an S3 store's client: loads with the first S3Store
    "s3transfer",
    "prometheus_client",  # metrics: the runner and the operator
    "kubernetes",
    "resumequal.report",
    "resumequal.compare",
    "resumequal.local",
    "resumequal.jobs",
    "resumequal.qualify.machine",
    "resumequal.results.assembly",
    "resumequal.results.publish",
    "resumequal.qualify.timeline",
    "resumequal.results.matrix",
    "resumequal.results.metrics",
    "resumequal.results.verdict",  # read by the runner and the operator, never written by a worker
)


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, timeout=120, check=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPROFILEIMPORTTIME"},
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_the_leg_entry_point_loads_nothing_the_leg_does_not_use() -> None:
    loaded = _modules_after("import resumequal.cli, resumequal.train.worker")
    assert "torch" in loaded  # the import really reached the worker
    found = sorted(m for m in loaded
                   if any(m == name or m.startswith(name + ".") for name in NOT_IN_A_WORKER))
    assert found == []


def test_a_folder_store_opens_without_boto3() -> None:
    loaded = _modules_after(
        "import tempfile\n"
        "from resumequal.run.location import RunLocation\n"
        "RunLocation.open(tempfile.mkdtemp()).leg('control').failure()")
    assert "resumequal.store.s3" in loaded  # the registry found every store class
    assert "boto3" not in loaded


def test_the_spec_loads_no_store_sdk() -> None:
    """The spec imports the store's registry and S3 settings; botocore loads with the
    first lookup of a scheme, not with the spec (every command imports the spec)."""
    loaded = _modules_after("import resumequal.spec")
    assert "resumequal.store.s3settings" in loaded
    assert not {"resumequal.store.s3", "botocore", "boto3"} & loaded

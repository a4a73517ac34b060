"""``resumequal bisect --ordered-images`` on the local cluster: eight nightly images, the
sixth the first whose data source stops saving its cursor's position, found through
QualificationRuns the operator runs.

Each image is the worker image loaded into the node with a layer of its own (the node
agent's ``load``, as ``kind load``): the data source package of
tests/integration/bisect_stack.py, 1.0 in nights 1-5, 2.0 (no position saved: FAIL at
step 5, ``inputs``) in nights 6-8. The first night is confirmed, the last assumed bad
(``--assume-bad``), three binary-search probes between: four qualifications of one pod
per leg, two ranks, eight steps, a process kill: 77 s in all on a quiet 2-core machine,
about 150 s beside other work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import jsonschema
import pytest
import yaml

from tests.integration.bisect_stack import WORKLOAD

if TYPE_CHECKING:
    import kubernetes.client

    from testing.cluster.cluster import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(1500)]

SCHEMA = Path(__file__).resolve().parents[2] / "docs/reference/bisect.schema.json"
NAMESPACE = "resumequal-e2e"
NIGHTS = [f"localhost/rqb-nightly:2026-11-{day:02d}" for day in range(1, 9)]
FIRST_BAD = 5  # 2026-11-06


def _manifest(cluster: Cluster) -> dict[str, object]:
    from testing.cluster import cluster as local

    return {
        "apiVersion": "resumequal.dev/v1alpha1", "kind": "QualificationRun",
        "metadata": {"name": "nightly", "namespace": NAMESPACE},
        "spec": {
            "stack": {"image": "replaced-by-each-pin", "imagePullPolicy": "IfNotPresent"},
            "store": {"uri": f"s3://{local.BUCKET}/bisect", "endpointUrl": cluster.s3_in_cluster,
                      "credentialsSecret": local.S3_SECRET, "addressingStyle": "path"},
            "backend": "pytorchjob",
            "workload": {"name": "rqb_cursor.workload:build"},
            # The smallest resume mid-accumulation: one pod per leg, the cut (step 6,
            # rank 1) a process kill, resumed from step 4.
            "world": {"nnodes": 1, "nprocPerNode": 2, "backend": "gloo"},
            "training": {"steps": 8},
            "preemption": {"target": "process"},
            "controls": {"enabled": False},
            "timeouts": {"armSeconds": 240, "processGroupSeconds": 300,
                         "restartSeconds": 300, "legSeconds": 900},
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
            "retention": {"policy": "Delete"},
        },
    }


def _load_nights(cluster: Cluster, root: Path) -> None:
    from testing.cluster.cluster import load_image

    for night, image in enumerate(NIGHTS):
        version = "2.0" if night >= FIRST_BAD else "1.0"
        package = root / f"layer-{night}" / "rqb_cursor"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(f'__version__ = "{version}"\n')
        (package / "workload.py").write_text(WORKLOAD.format(version=version,
                                                             saves=version == "1.0"))
        load_image(cluster, image, package.parent)


def test_bisect_finds_the_first_nightly_image_to_flip_in_4_qualifications(
        local_cluster: Cluster, cluster_admin: kubernetes.client.ApiClient,
        tmp_path: Path) -> None:
    from kubernetes import client

    if os.environ.get("RESUMEQUAL_CLUSTER_KUBECONFIG"):
        pytest.skip("loads images into the local cluster's node")
    _load_nights(local_cluster, tmp_path)
    manifest = tmp_path / "nightly.yaml"
    manifest.write_text(yaml.safe_dump(_manifest(local_cluster)))
    out = tmp_path / "out"
    objects = client.CustomObjectsApi(cluster_admin)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "resumequal", "bisect", "--ordered-images", "--assume-bad",
         "--spec", str(manifest), "--kubeconfig", str(local_cluster.kubeconfig),
         "--probe-timeout", "900", "--out", str(out), *NIGHTS],
        capture_output=True, text=True, timeout=1400, check=False,
        env=dict(os.environ, COLUMNS="120"))
    took = time.monotonic() - started
    text = proc.stdout + proc.stderr
    assert (out / "bisect.json").exists(), text[-4000:]
    result = json.loads((out / "bisect.json").read_text())
    bisection = (result.get("cluster") or {}).get("bisection")
    try:
        jsonschema.validate(result, json.loads(SCHEMA.read_text()))
        sys.stdout.write(f"\nbisect over images: {result['qualifications']} qualifications, "
                         f"{took:.0f} s\n")
        assert (proc.returncode, result["conclusion"]) == (0, "flip"), text[-4000:]
        assert result["first_flip"]["index"] == FIRST_BAD
        assert result["first_flip"]["path"] == NIGHTS[FIRST_BAD]
        assert result["first_flip"]["previous"] == NIGHTS[FIRST_BAD - 1]
        assert result["assumed"] == ["bad"] and result["qualifications"] <= 4
        probes = result["probes"]
        assert probes[0]["role"] == "good" and probes[0]["attempts"][0]["result"] == "PASS"
        flipped = [a for p in probes for a in p["attempts"] if a["result"] == "FAIL"]
        assert flipped and all((a["first_divergence"]["step"], a["first_divergence"]["boundary"])
                               == (5, "inputs") for a in flipped)
        # Every run is kept, labelled with the bisection, its status the verdict read.
        kept = objects.list_namespaced_custom_object(
            "resumequal.dev", "v1alpha1", NAMESPACE, "qualificationruns",
            label_selector=f"resumequal.dev/bisection={bisection}")["items"]
        runs = {a["run"]["name"]: a for p in probes for a in p["attempts"]}
        assert {r["metadata"]["name"] for r in kept} == set(runs)
        for run in kept:
            attempt = runs[run["metadata"]["name"]]
            assert run["metadata"]["uid"] == attempt["run"]["uid"]
            assert run["status"]["verdict"]["result"] == attempt["result"]
            assert run["status"]["runUri"] == attempt["run_dir"]
        assert "FLIP" in text and NIGHTS[FIRST_BAD] in text
    finally:
        if bisection:
            objects.delete_collection_namespaced_custom_object(
                "resumequal.dev", "v1alpha1", NAMESPACE, "qualificationruns",
                label_selector=f"resumequal.dev/bisection={bisection}")

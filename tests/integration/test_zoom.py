"""``resumequal zoom``: real replays of a divergent step, in fresh torchrun processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from resumequal.run.signing import KEY_ENV, RUN_ID_ENV, new_key
from tests.integration import legs

pytestmark = pytest.mark.slow

HISTORY = ["--set", "workload.name=tests.history_workload:build",
           "--set", "controls.enabled=false"]


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


@pytest.mark.timeout(600)
def test_zoom_names_the_one_module_that_computes_differently_after_a_resume(
        tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # zoom authenticates the run with its key, and the run id `resumequal run` kept for it.
    env = {KEY_ENV: new_key(), RUN_ID_ENV: ""}
    # spec.zoom: onFail zooms before the results are published.
    proc = legs.resumequal("run", "--run-dir", str(run_dir), *HISTORY, "--set", "zoom=onFail",
                           env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = _json(run_dir / "report.json")
    first = report["verdict"]["first_divergence"]
    assert first["step"] == 5 and not first["before_cut"]
    assert report["zoom"]["origins"] == ["mix"], report["zoom"]
    assert "zoom" in proc.stdout and "mix" in proc.stdout
    (run_dir / "zoom.json").unlink()

    # Without the run's key nothing of the run authenticates: refused before any replay.
    proc = legs.resumequal("zoom", str(run_dir), env={**env, KEY_ENV: new_key()})
    assert proc.returncode == 3, proc.stdout + proc.stderr  # could not zoom
    assert "cannot be zoomed with this key and run id" in proc.stderr, proc.stderr
    assert not (run_dir / "zoom.json").exists()

    # resumequal zoom on the finished run: zoom.json, and the report published again.
    proc = legs.resumequal("zoom", str(run_dir), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    zoom = _json(run_dir / "zoom.json")
    assert zoom["step"] == 5
    # Both replays ran as the legs did: the control from the beginning, the resumed attempt
    # from the checkpoint it restored, and each reproduced its leg's digests of the step.
    replays = {r["leg"]: r for r in zoom["replays"]}
    assert replays["control"]["start"] is None and replays["control"]["attempt"] == 0
    assert replays["preempted"]["start"] == "step-00000004"
    assert replays["preempted"]["attempt"] == 1
    assert all(r["reproduced"] for r in zoom["replays"]), zoom["replays"]
    kinds = {m["module"]: m["kind"] for m in zoom["modules"]}
    assert zoom["origin_kind"] == "module" and zoom["origins"] == ["mix"]
    assert kinds["mix"] == "origin"
    mix = next(m for m in zoom["modules"] if m["module"] == "mix")
    assert not mix["inputs_differ"] and mix["outputs_differ"] and mix["phase"] == "forward"
    assert mix["max_abs_diff"] > 0 and mix["tensors"][0]["differ"] > 0
    # Everything after it in the forward pass, and (through the gradients) before it.
    for module in ("act2", "drop2", "out", "hidden", "input"):
        assert kinds[module] == "propagation", (module, kinds)
    assert kinds["(model)"] == "encloses_origin"
    after = {m["module"]: m for m in zoom["modules"]}
    assert after["act2"]["inputs_differ"] and after["hidden"]["grads_in_differ"]
    assert not after["hidden"]["inputs_differ"]
    stages = {s["name"]: s for s in zoom["stages"]}
    assert stages["params_before"]["differ"] == 0
    assert stages["local_grads"]["differ"] > 0
    # The report gained the zoom: report.json holds it, report.html shows it.
    assert _json(run_dir / "report.json")["zoom"]["origins"] == ["mix"]
    html = (run_dir / "report.html").read_text()
    assert 'id="zoom"' in html and "<code>mix</code>" in html
    assert "origin" in proc.stdout and "mix" in proc.stdout
    metrics = (run_dir / "metrics.prom").read_text()
    assert 'resumequal_zoom_origin_info{' in metrics and 'origin="mix"' in metrics


@pytest.mark.timeout(120)
def test_zoom_of_a_run_without_a_divergence_asks_for_a_step(tmp_path: Path) -> None:
    run_dir = tmp_path / "empty"
    run_dir.mkdir()
    proc = legs.resumequal("zoom", str(run_dir))
    assert proc.returncode == 2
    assert "error:" in proc.stderr

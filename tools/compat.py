"""Qualify this project on several torch pins: a venv per pin, one run per feature, a table.

    python3 tools/compat.py 2.6.0 2.9.1 2.14.1            # every feature on three pins
    python3 tools/compat.py --features default 2.6.0      # what CI runs: the floor pin
    make compat PINS="2.6.0 2.14.1" FEATURES=default,fsdp2-bf16

Each pin gets a venv ``<venvs>/torch-<pin>`` (kept, and reused while its torch is that
pin) with torch installed first and this checkout after it, editable. Each feature is one
``resumequal run`` of the default spec with that feature's ``--set`` overrides. A run that
exits 2 with resumequal's "not supported" message was refused up front (the pin lacks
the feature), which is an outcome, not a failure. The Markdown table goes to stdout and to
``--out``. Exit 0 when every run passed or was refused (the default: passed), 1 otherwise.
Standard library only: it runs before any venv exists.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "compat"
# What a compat venv installs beside torch: the loader feature needs torchdata.
EXTRAS = "data"
RUN_TIMEOUT_S = 1800.0  # a backstop: each leg has its own timeouts (timeouts.legSeconds)
# What resumequal.spec.capabilities.NotSupported says; how a refusal is told from an error.
REFUSED_MARK = "is not supported by torch"
# resize and its tolerances as in tests/integration/test_resize.py (2 nodes x 1 rank).
RESIZE = ("world.nnodes=2", "world.nprocPerNode=1", "preemption.target=pod",
          "preemption.rank=1", "preemption.resize={toNodes: 1, growAfterStep: 8}",
          "comparison.mode=tolerance",
          "comparison.tolerances={loss: 1.0e-4, grad_norm: 1.0e-4, params: 1.0e-4}")
FEATURES: dict[str, tuple[str, ...]] = {
    "default": (),
    "fsdp2-bf16": ("parallelism.kind=fsdp2", "training.precision=bf16"),
    "compile": ("compile.enabled=true",),
    "loader": ("workload.loader={}",),
    "resize": RESIZE,
    "async-save": ("checkpoint.async=true",),
    "fp16": ("training.precision=fp16",),
}


@dataclass(frozen=True)
class Outcome:
    """One run: PASS, FAIL, NONDETERMINISTIC, INVALID, refused or error, and its time."""

    result: str
    seconds: float
    detail: str = ""

    def cell(self) -> str:
        minutes, seconds = divmod(round(self.seconds), 60)
        return f"{self.result} {minutes}m{seconds:02d}s"


def torch_of(python: Path) -> str | None:
    """The torch version ``python`` imports (local build tag dropped), or None."""
    if not python.exists():
        return None
    proc = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True, check=False)
    return proc.stdout.strip().split("+")[0] if proc.returncode == 0 else None


def ensure_venv(pin: str, venvs: Path) -> Path:
    """``<venvs>/torch-<pin>`` with torch ``pin`` and this checkout; made when missing,
    reused while its torch is ``pin``."""
    venv = venvs / f"torch-{pin}"
    python = venv / "bin" / "python"
    if torch_of(python) == pin and (venv / "bin" / "resumequal").exists():
        log.info("torch %s: reusing %s", pin, venv)
        return venv
    log.info("torch %s: making %s (a CUDA build from PyPI is several GB)", pin, venv)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    # torch first, so that the project's range is satisfied and pip fetches no other one.
    subprocess.run([*pip, f"torch=={pin}"], check=True)
    subprocess.run([*pip, "-e", f"{ROOT}[{EXTRAS}]"], check=True)
    found = torch_of(python)
    if found != pin:
        raise SystemExit(f"compat: {venv} imports torch {found}, not {pin}")
    return venv


def qualify(venv: Path, feature: str, run_dir: Path) -> Outcome:
    """One ``resumequal run`` of ``feature`` in ``venv``; its output goes to a log beside
    ``run_dir``."""
    sets = [arg for s in FEATURES[feature] for arg in ("--set", s)]
    cmd = [str(venv / "bin" / "resumequal"), "run", "--run-dir", str(run_dir), *sets]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log_path = run_dir.with_suffix(".log")
    started = time.monotonic()
    with log_path.open("w") as out:
        # Outside the checkout: what a user's shell would run, not the tree's conftest.
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=run_dir.parent)
        try:
            code = proc.wait(RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            # As Ctrl-C: the runner stops every process it started before it exits.
            proc.send_signal(signal.SIGINT)
            code = proc.wait()
    seconds = time.monotonic() - started
    text = log_path.read_text(errors="replace")
    return Outcome(_result(code, run_dir, text), seconds, _detail(run_dir, text))


def _result(code: int, run_dir: Path, text: str) -> str:
    verdict = run_dir / "verdict.json"
    if verdict.exists():
        return str(json.loads(verdict.read_text())["result"])
    if code == 2 and REFUSED_MARK in text:
        return "refused"
    return "error"


def _detail(run_dir: Path, text: str) -> str:
    """The verdict's reason, or the last error line of the log."""
    verdict = run_dir / "verdict.json"
    if verdict.exists():
        return str(json.loads(verdict.read_text()).get("reason", ""))
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    return errors[-1] if errors else (text.splitlines() or [""])[-1]


def table(results: dict[str, dict[str, Outcome]], features: Sequence[str]) -> str:
    """A pin x feature Markdown table, then the reason of every run that did not pass."""
    lines = ["| torch | " + " | ".join(features) + " |",
             "|---|" + "---|" * len(features)]
    for pin, row in results.items():
        lines.append(f"| {pin} | " + " | ".join(row[f].cell() for f in features) + " |")
    notes = [f"- {pin} {feature}: {o.detail}" for pin, row in results.items()
             for feature, o in row.items() if o.result != "PASS" and o.detail]
    return "\n".join(lines + (["", *notes] if notes else [])) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pins", nargs="+", metavar="PIN", help="torch versions, e.g. 2.6.0")
    parser.add_argument("--features", default="all",
                        help=f"all, or comma-separated of: {', '.join(FEATURES)}")
    parser.add_argument("--venvs", type=Path, default=BUILD / "venvs",
                        help="where the venv of each pin lives (default: build/compat/venvs)")
    parser.add_argument("--runs", type=Path, default=BUILD / "runs",
                        help="where each pin's run directories and logs go")
    parser.add_argument("--out", type=Path, default=BUILD / "compat.md",
                        help="the Markdown table is written here too")
    parser.add_argument("--venvs-only", action="store_true",
                        help="make (or check) each pin's venv and run nothing: the downloads "
                        "can then overlap other work")
    args = parser.parse_args(argv)
    features = list(FEATURES) if args.features == "all" else \
        [f.strip() for f in args.features.split(",") if f.strip()]
    unknown = sorted(set(features) - set(FEATURES))
    if unknown:
        parser.error(f"unknown feature(s) {', '.join(unknown)}; known: {', '.join(FEATURES)}")
    logging.basicConfig(level=logging.INFO, format="compat: %(message)s")
    results: dict[str, dict[str, Outcome]] = {}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for pin in args.pins:
        started = time.monotonic()
        venv = ensure_venv(pin, args.venvs.resolve())
        log.info("torch %s: venv ready in %.0f s", pin, time.monotonic() - started)
        if args.venvs_only:
            continue
        results[pin] = {}
        for feature in features:
            run_dir = args.runs.resolve() / f"{pin}-{stamp}" / feature
            outcome = qualify(venv, feature, run_dir)
            log.info("torch %s %s: %s (%s)", pin, feature, outcome.cell(), run_dir)
            results[pin][feature] = outcome
    if args.venvs_only:
        return 0
    text = table(results, features)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    sys.stdout.write(text)
    return 0 if all(passed(f, o) for row in results.values() for f, o in row.items()) else 1


def passed(feature: str, outcome: Outcome) -> bool:
    """PASS, or a feature refused up front; never the default, which every pin in the
    declared range must pass."""
    return outcome.result == "PASS" or (outcome.result == "refused" and feature != "default")


if __name__ == "__main__":
    sys.exit(main())

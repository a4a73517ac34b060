"""The ``resumequal`` command line. Commands parse options and call one function."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import cast

import click

from resumequal.errors import ResumequalError
from resumequal.spec import (
    OMISSIONS,
    Omission,
    QualificationSpec,
    SpecError,
    apply_overrides,
    check_leg_name,
    load_spec,
)

log = logging.getLogger("resumequal")

EXIT_ERROR = 2


def _configure_logging(verbose: bool) -> None:
    rank = os.environ.get("RANK")
    prefix = f"[rank {rank}] " if rank is not None else ""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s",
    )


def _load(spec_path: str | None, overrides: tuple[str, ...] = ()) -> QualificationSpec:
    if not overrides:
        return load_spec(spec_path) if spec_path else QualificationSpec()
    base = load_spec(spec_path) if spec_path else QualificationSpec()
    return apply_overrides(base, overrides)


def _leg_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return check_leg_name(value)
    except SpecError as e:
        raise click.BadParameter(str(e)) from e


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@click.version_option(package_name="resumequal")
def main(verbose: bool) -> None:
    """Qualify a training stack for exact resumption after preemption."""
    _configure_logging(verbose)


@main.command()
@click.option("--spec", "spec_path", type=str, default=None,
              help="Spec file (YAML or JSON); defaults apply when omitted.")
@click.option("--leg", required=True, metavar="NAME", callback=_leg_name,
              help="control (never cut), preempted, or another preempted leg's name.")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--omit", type=click.Choice(OMISSIONS), multiple=True,
              help="Leave this part of the state out of every resume (a negative control).")
def leg(spec_path: str | None, leg: str, run_dir: Path, omit: tuple[str, ...]) -> None:
    """Run one training leg in this process; meant to run under torchrun."""
    from resumequal.train.worker import run_leg  # torch loads only for commands that train

    try:
        code = run_leg(_load(spec_path), leg, run_dir, frozenset(omit))
    except (SpecError, ResumequalError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_ERROR)
    sys.exit(code)


@main.command("validate")
@click.argument("spec_path", type=str)
def validate(spec_path: str) -> None:
    """Check a spec file and print it with every default filled in."""
    try:
        spec = load_spec(spec_path)
    except SpecError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_ERROR)
    click.echo(spec.model_dump_json(indent=2))


@main.command()
@click.option("--spec", "spec_path", type=str, default=None,
              help="Spec file (YAML or JSON); the embedded default qualifies tiny-gpt on 2 ranks.")
@click.option("--set", "overrides", multiple=True, metavar="PATH=VALUE",
              help="Override one spec field, e.g. --set preemption.mode=graceful (repeatable).")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where legs, traces, checkpoints and reports go (default: runs/qual-<time>).")
@click.option("--pin", default=None, help="Label of the stack under qualification "
              "(default: the installed torch version).")
@click.option("--side-by-side", is_flag=True, help="Run both legs at once instead of in turn.")
@click.option("--no-kill", is_flag=True, hidden=True,
              help="Never deliver the kill (tests the arm timeout).")
@click.option("--omit", type=click.Choice(OMISSIONS), multiple=True,
              help="Plant a broken resume in the preempted leg (a negative control).")
@click.option("--metrics-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Prometheus textfile to write (default: RUN_DIR/metrics.prom).")
@click.option("--pushgateway", default=None, help="Also push the metrics to this Pushgateway.")
def run(
    spec_path: str | None,
    overrides: tuple[str, ...],
    run_dir: Path | None,
    pin: str | None,
    side_by_side: bool,
    no_kill: bool,
    omit: tuple[str, ...],
    metrics_file: Path | None,
    pushgateway: str | None,
) -> None:
    """Qualify this machine's stack: control and preempted legs, kill, compare, report."""
    from rich.console import Console

    from resumequal.local.runner import RunOptions, default_run_dir, exit_code, run_qualification
    from resumequal.report.terminal import print_summary

    console = Console(stderr=False)
    try:
        spec = _load(spec_path, overrides)
        opts = RunOptions(
            run_dir=run_dir or default_run_dir(),
            pin=pin or _default_pin(),
            side_by_side=side_by_side,
            deliver_kill=not no_kill,
            omit=cast(tuple[Omission, ...], omit),
            metrics_file=metrics_file,
            pushgateway=pushgateway,
        )
        report = run_qualification(spec, opts, console)
    except (SpecError, ResumequalError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_ERROR)
    except KeyboardInterrupt:
        click.echo("interrupted; every process of this run was stopped", err=True)
        sys.exit(130)
    files = {name: opts.run_dir / name for name in ("report.html", "report.json", "verdict.json")}
    files["metrics"] = opts.metrics_file or opts.run_dir / "metrics.prom"
    print_summary(report, console, files=files)
    sys.exit(exit_code(report.verdict.result))


@main.command()
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print verdict.json instead of a summary.")
def compare(run_dir: Path, as_json: bool) -> None:
    """Compare the legs of a finished run directory and print the verdict."""
    from resumequal.compare import compare_run
    from resumequal.local.runner import exit_code

    try:
        verdict = compare_run(run_dir)
    except (SpecError, ResumequalError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_ERROR)
    if as_json:
        click.echo(verdict.model_dump_json(indent=2))
    else:
        click.echo(f"{verdict.result}: {verdict.reason}")
    sys.exit(exit_code(verdict.result))


def _default_pin() -> str:
    from importlib.metadata import version

    return f"torch=={version('torch')}"

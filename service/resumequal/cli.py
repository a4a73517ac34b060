"""The ``resumequal`` command line. Commands parse options and call one function."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import click

from resumequal.errors import ResumequalError
from resumequal.spec import OMISSIONS, QualificationSpec, SpecError, load_spec

log = logging.getLogger("resumequal")

EXIT_ERROR = 2


def _configure_logging(verbose: bool) -> None:
    rank = os.environ.get("RANK")
    prefix = f"[rank {rank}] " if rank is not None else ""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s",
    )


def _load(spec_path: str | None) -> QualificationSpec:
    return load_spec(spec_path) if spec_path else QualificationSpec()


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@click.version_option(package_name="resumequal")
def main(verbose: bool) -> None:
    """Qualify a training stack for exact resumption after preemption."""
    _configure_logging(verbose)


@main.command()
@click.option("--spec", "spec_path", type=str, default=None,
              help="Spec file (YAML or JSON); defaults apply when omitted.")
@click.option("--leg", type=click.Choice(["control", "preempted"]), required=True)
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

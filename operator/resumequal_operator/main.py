"""The ``resumequal-operator`` command line. Commands parse options and call one function."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import click

from resumequal.logs import configure_logging
from resumequal_operator.crd import crd_yaml


@click.group()
def main() -> None:
    """Run qualifications of training stacks on Kubernetes."""


@main.command()
def crd() -> None:
    """Print the QualificationRun CustomResourceDefinition (YAML)."""
    click.echo(crd_yaml(), nl=False)


@main.command()
@click.argument("file", type=click.File("r"))
@click.option("--namespace", default=None, metavar="NS",
              help="Namespace of the run; default: metadata.namespace, else 'default'.")
def render(file: TextIO, namespace: str | None) -> None:
    """Print, as YAML, every object the QualificationRun(s) in FILE ('-': stdin) would
    create (leg PyTorchJobs, comparator Job), without a cluster. Exit 2 on a bad spec."""
    from resumequal_operator.render import render_yaml
    from resumequal_operator.resource import RunSpecError

    try:
        click.echo(render_yaml(file.read(), namespace=namespace), nl=False)
    except RunSpecError as e:
        click.echo(f"error: {file.name}: invalid QualificationRun:\n{e}", err=True)
        sys.exit(2)
    except UnicodeDecodeError as e:
        click.echo(f"error: {file.name}: not UTF-8 text ({e.reason} at byte {e.start})",
                   err=True)
        sys.exit(2)


@main.command()
@click.option("--namespace", "namespaces", multiple=True, metavar="NS",
              help="Watch this namespace (repeatable); default: POD_NAMESPACE.")
@click.option("--all-namespaces", is_flag=True, help="Watch every namespace.")
@click.option("--port", type=int, default=8080, show_default=True,
              help="Port of /metrics, /healthz and /readyz.")
@click.option("--leader-elect/--no-leader-elect", default=True, show_default=True,
              help="Elect one active replica through a Lease.")
@click.option("--lease-name", default="resumequal-operator", show_default=True)
@click.option("--lease-namespace", default=None, metavar="NS",
              help="Namespace of the Lease; default: POD_NAMESPACE, else 'default'.")
@click.option("--resync-seconds", type=click.FloatRange(min=1), default=60.0,
              show_default=True, help="Reconcile every run at least this often.")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True,
              help="Runs reconciled in parallel.")
@click.option("--poll-seconds", type=click.FloatRange(min=0.1), default=2.0,
              show_default=True, help="How often a running qualification is looked at.")
@click.option("--crd", "crd_policy", default="apply", show_default=True,
              type=click.Choice(["apply", "verify", "skip"]),
              help="At start-up, bring the QualificationRun CRD to this version (apply), "
              "refuse to start when it differs (verify), or leave it alone (skip).")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
def run(namespaces: tuple[str, ...], all_namespaces: bool, port: int, leader_elect: bool,
        lease_name: str, lease_namespace: str | None, resync_seconds: float, workers: int,
        poll_seconds: float, crd_policy: str, log_level: str) -> None:
    """Run the controller until SIGTERM."""
    from resumequal_operator.crdsync import CRDMismatch
    from resumequal_operator.service import ServiceOptions, serve

    configure_logging(logging.getLevelName(log_level),
                      "%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(ServiceOptions(namespaces=namespaces, all_namespaces=all_namespaces, port=port,
                             leader_elect=leader_elect, lease_name=lease_name,
                             lease_namespace=lease_namespace, resync_seconds=resync_seconds,
                             workers=workers, poll_seconds=poll_seconds,
                             crd_policy=crd_policy))  # type: ignore[arg-type]
    except CRDMismatch as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)

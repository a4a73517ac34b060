"""The ``resumequal-operator`` command line. Commands parse options and call one function."""

from __future__ import annotations

import logging

import click

from resumequal_operator.crd import crd_yaml


@click.group()
def main() -> None:
    """Run qualifications of training stacks on Kubernetes."""


@main.command()
def crd() -> None:
    """Print the QualificationRun CustomResourceDefinition (YAML)."""
    click.echo(crd_yaml(), nl=False)


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
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
def run(namespaces: tuple[str, ...], all_namespaces: bool, port: int, leader_elect: bool,
        lease_name: str, lease_namespace: str | None, resync_seconds: float, workers: int,
        poll_seconds: float, log_level: str) -> None:
    """Run the controller until SIGTERM."""
    from resumequal_operator.service import ServiceOptions, serve

    logging.basicConfig(level=log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve(ServiceOptions(namespaces=namespaces, all_namespaces=all_namespaces, port=port,
                         leader_elect=leader_elect, lease_name=lease_name,
                         lease_namespace=lease_namespace, resync_seconds=resync_seconds,
                         workers=workers, poll_seconds=poll_seconds))

"""The ``resumequal-operator`` command line. Commands parse options and call one function."""

from __future__ import annotations

import click

from resumequal_operator.crd import crd_yaml


@click.group()
def main() -> None:
    """Run qualifications of training stacks on Kubernetes."""


@main.command()
def crd() -> None:
    """Print the QualificationRun CustomResourceDefinition (YAML)."""
    click.echo(crd_yaml(), nl=False)

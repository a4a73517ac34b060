"""The ``resumequal-operator`` command line. Commands parse options and call one function."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import click

from resumequal.logs import configure_logging
from resumequal_operator.crd import crd_yaml

if TYPE_CHECKING:
    from resumequal_operator.allowlist import Allowlist, SecurityAllowlist


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
@click.option("--default-backend", type=click.Choice(["pytorchjob", "trainjob"]),
              default="pytorchjob", show_default=True,
              help="The operator's default, for a run whose spec.backend is unset.")
@click.option("--trainjob-runtime", default="resumequal-leg", show_default=True,
              metavar="NAME", help="The runtime TrainJob legs name.")
@click.option("--trainjob-runtime-kind", default="ClusterTrainingRuntime", show_default=True,
              type=click.Choice(["ClusterTrainingRuntime", "TrainingRuntime"]))
def render(file: TextIO, namespace: str | None, default_backend: str, trainjob_runtime: str,
           trainjob_runtime_kind: str) -> None:
    """Print, as YAML, every object the QualificationRun(s) in FILE ('-': stdin) would
    create (checkpoint key Secret with a placeholder key, each leg's NetworkPolicy and
    PyTorchJob or TrainJob, the comparator Job, and with zoom: onFail the zoom
    Job and its NetworkPolicy), without a cluster. Exit 2 on a bad spec."""
    from resumequal_operator.legjobs import TrainerSettings
    from resumequal_operator.render import render_yaml
    from resumequal_operator.validation import RunSpecError

    trainer = TrainerSettings(trainjob_runtime, trainjob_runtime_kind)  # type: ignore[arg-type]
    try:
        click.echo(render_yaml(file.read(), namespace=namespace,
                               default_backend=default_backend,  # type: ignore[arg-type]
                               trainer=trainer), nl=False)
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
@click.option("--allow-image", "allow_images", multiple=True, metavar="GLOB",
              help="Runs may use only images matching one of these (repeatable; e.g. "
              "'ghcr.io/acme/*'); none given: any image.")
@click.option("--allow-service-account", "allow_service_accounts", multiple=True,
              metavar="GLOB", help="Runs' pods may run only as these ServiceAccounts "
              "(repeatable; unset in a run is 'default'); none given: any.")
@click.option("--allow-bucket", "allow_buckets", multiple=True, metavar="GLOB",
              help="Runs may store only in these S3 buckets (repeatable); none given: any.")
@click.option("--allow-endpoint", "allow_endpoints", multiple=True, metavar="URL",
              help="store.endpointUrl values runs may name (repeatable, exact "
              "http(s)://host[:port]); none given: runs may name none, and use the "
              "operator's own S3 endpoint.")
@click.option("--allow-privileged", is_flag=True,
              help="Runs may set securityContext.privileged (also escalation, an unmasked "
              "/proc, SELinux options of their own).")
@click.option("--allow-run-as-root", is_flag=True,
              help="Runs may set runAsUser 0 or runAsNonRoot false.")
@click.option("--allow-privilege-escalation", is_flag=True,
              help="Runs may set allowPrivilegeEscalation true.")
@click.option("--allow-unconfined", is_flag=True,
              help="Runs may set an Unconfined seccomp or AppArmor profile.")
@click.option("--allow-capability", "allow_capabilities", multiple=True, metavar="CAP",
              help="A capability runs may add (repeatable; '*': any, and keeping the "
              "runtime's defaults); none given: none.")
@click.option("--allow-sysctl", "allow_sysctls", multiple=True, metavar="GLOB",
              help="Sysctls runs may set (repeatable); none given: none.")
@click.option("--network-policies/--no-network-policies", default=True, show_default=True,
              help="Give each leg a NetworkPolicy admitting only its own pods (the "
              "rendezvous store runs what it is sent).")
@click.option("--default-backend", type=click.Choice(["pytorchjob", "trainjob"]),
              default="pytorchjob", show_default=True,
              help="What runs the legs of a run whose spec.backend is unset.")
@click.option("--trainjob/--no-trainjob", default=False, show_default=True,
              help="Run TrainJob legs (Kubeflow Trainer v2 must be installed, and the "
              "runtime below).")
@click.option("--trainjob-runtime", default="resumequal-leg", show_default=True,
              metavar="NAME", help="The runtime TrainJob legs name (the chart installs it).")
@click.option("--trainjob-runtime-kind", default="ClusterTrainingRuntime", show_default=True,
              type=click.Choice(["ClusterTrainingRuntime", "TrainingRuntime"]),
              help="TrainingRuntime: one in each watched namespace.")
@click.option("--key-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The master key each run's key is made from (the chart mounts it from "
              "a Secret); without it, a key for this process's lifetime: runs in flight at "
              "a restart end INVALID.")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
def run(namespaces: tuple[str, ...], all_namespaces: bool, port: int, leader_elect: bool,
        lease_name: str, lease_namespace: str | None, resync_seconds: float, workers: int,
        poll_seconds: float, crd_policy: str, allow_images: tuple[str, ...],
        allow_service_accounts: tuple[str, ...], allow_buckets: tuple[str, ...],
        allow_endpoints: tuple[str, ...], allow_privileged: bool, allow_run_as_root: bool,
        allow_privilege_escalation: bool, allow_unconfined: bool,
        allow_capabilities: tuple[str, ...], allow_sysctls: tuple[str, ...],
        network_policies: bool, default_backend: str, trainjob: bool,
        trainjob_runtime: str, trainjob_runtime_kind: str, key_file: Path | None,
        log_level: str) -> None:
    """Run the controller until SIGTERM."""
    from resumequal.errors import CheckpointError
    from resumequal_operator.crdsync import CRDMismatch
    from resumequal_operator.legjobs import TrainerSettings
    from resumequal_operator.runkeys import MasterKey
    from resumequal_operator.service import ServiceOptions, serve

    if default_backend == "trainjob" and not trainjob:
        raise click.BadParameter("needs --trainjob", param_hint="--default-backend")
    trainer = TrainerSettings(trainjob_runtime,
                              trainjob_runtime_kind) if trainjob else None  # type: ignore[arg-type]

    security = security_allowlist_of(allow_privileged, allow_run_as_root,
                                     allow_privilege_escalation, allow_unconfined,
                                     allow_capabilities, allow_sysctls)
    allowlist = allowlist_of(allow_images, allow_service_accounts, allow_buckets,
                             allow_endpoints, security=security)
    try:
        master_key = None if key_file is None else MasterKey.from_file(key_file)
    except CheckpointError as e:
        raise click.BadParameter(str(e), param_hint="--key-file") from None
    configure_logging(logging.getLevelName(log_level),
                      "%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(ServiceOptions(namespaces=namespaces, all_namespaces=all_namespaces, port=port,
                             leader_elect=leader_elect, lease_name=lease_name,
                             lease_namespace=lease_namespace, resync_seconds=resync_seconds,
                             workers=workers, poll_seconds=poll_seconds,
                             crd_policy=crd_policy,  # type: ignore[arg-type]
                             allowlist=allowlist, network_policies=network_policies,
                             default_backend=default_backend,  # type: ignore[arg-type]
                             trainer=trainer, master_key=master_key))
    except CRDMismatch as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)


def security_allowlist_of(privileged: bool, run_as_root: bool, escalation: bool,
                          unconfined: bool, capabilities: tuple[str, ...],
                          sysctls: tuple[str, ...]) -> SecurityAllowlist:
    """The ``--allow-*`` options of ``allowlist.security``; a bad entry is a usage error
    naming its option."""
    from pydantic import ValidationError

    from resumequal_operator.allowlist import SecurityAllowlist

    try:
        return SecurityAllowlist(privileged=privileged, run_as_root=run_as_root,
                                 allow_privilege_escalation=escalation, unconfined=unconfined,
                                 capabilities=capabilities, sysctls=sysctls)
    except ValidationError as e:
        first = e.errors()[0]
        option = {"capabilities": "--allow-capability", "sysctls": "--allow-sysctl"}.get(
            str(first["loc"][0]), "--allow-*")
        raise click.BadParameter(str(first["msg"]).removeprefix("Value error, "),
                                 param_hint=option) from None


def allowlist_of(images: tuple[str, ...], service_accounts: tuple[str, ...],
                 buckets: tuple[str, ...], endpoints: tuple[str, ...], *,
                 security: SecurityAllowlist | None = None) -> Allowlist:
    """The ``--allow-*`` options as an Allowlist; a bad entry is a usage error naming its
    option (never echoing it: an endpoint may hold user:password)."""
    from pydantic import ValidationError

    from resumequal_operator.allowlist import Allowlist, SecurityAllowlist

    try:
        return Allowlist(images=images, service_accounts=service_accounts, buckets=buckets,
                         endpoints=endpoints, security=security or SecurityAllowlist())
    except ValidationError as e:
        first = e.errors()[0]
        option = f"--allow-{str(first['loc'][0]).replace('_', '-').removesuffix('s')}"
        raise click.BadParameter(str(first["msg"]).removeprefix("Value error, "),
                                 param_hint=option) from None

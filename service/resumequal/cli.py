"""The ``resumequal`` command line. Commands parse options and call one function."""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import io
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

import click

from resumequal.errors import ResumequalError
from resumequal.exitcodes import ExitCode, epilog, for_error, for_result
from resumequal.logs import configure_logging
from resumequal.redact import printable, redact
from resumequal.spec import (
    OMISSIONS,
    Omission,
    QualificationSpec,
    SpecError,
    apply_overrides,
    check_leg_name,
    check_pin,
    load_spec,
    store_uri,
)
from resumequal.spec.launchers import DEFAULT_LAUNCHER, LAUNCHERS

if TYPE_CHECKING:
    from resumequal.bisect.cluster import ClusterOptions

log = logging.getLogger("resumequal")

# A worker (leg, replay) that cannot go on: torchrun, and a leg's Job, take any exit from 1
# to 127 as the leg's own failure; the qualification's verdict says the rest.
WORKER_ERROR = 2
VERDICTS = epilog(ExitCode.PASS, ExitCode.FAIL, ExitCode.SPEC_ERROR, ExitCode.INVALID,
                  ExitCode.NONDETERMINISTIC, ExitCode.INTERNAL_ERROR, ExitCode.INTERRUPTED)


def _configure_logging(verbose: bool) -> None:
    rank = os.environ.get("RANK")
    prefix = f"[rank {rank}] " if rank is not None else ""
    configure_logging(logging.DEBUG if verbose else logging.INFO,
                      f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s")


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


def _uri(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A store or run URI in its one spelling; a local path as it is."""
    if value is None or "://" not in value:
        return value
    try:
        return store_uri(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from e


def _pin(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A pin: it becomes a metrics label that alert templates query by."""
    if value is None:
        return value
    try:
        return check_pin(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from e


def _fail(e: ResumequalError) -> NoReturn:
    """Say the error and exit with its status (:func:`resumequal.exitcodes.for_error`)."""
    click.echo(f"error: {printable(str(e))}", err=True)
    sys.exit(for_error(e))


def _interrupted(what: str = "interrupted") -> NoReturn:
    # click would print "Aborted!" and exit 1, which is FAIL here.
    click.echo(what, err=True)
    sys.exit(ExitCode.INTERRUPTED)


class _Judging(click.Command):
    """A command whose status is a verdict's or an error's (run, compare, validate, zoom):
    an exception that no boundary turned into one of ours is a bug, and exits with a status
    of its own (never a verdict's) saying so. A worker's (leg, replay) is torchrun's
    business: a peer's death is an exception there, no bug."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as e:  # what no boundary expected: nothing else may catch it
            _internal_error(e)


def _internal_error(e: Exception) -> NoReturn:
    """Say that ``e`` is a bug, with its traceback (redacted), and exit INTERNAL_ERROR."""
    trace = "".join(traceback.format_exception(e))
    click.echo(printable(redact(trace)), err=True, nl=False)
    click.echo(f"internal error: {printable(redact(f'{type(e).__name__}: {e}'))}\n"
               "This is a bug in resumequal, not a verdict: nothing was judged. Please report "
               "it with the output above.", err=True)
    sys.exit(ExitCode.INTERNAL_ERROR)


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@click.version_option(package_name="resumequal")
def main(verbose: bool) -> None:
    """Qualify a training stack for exact resumption after preemption."""
    _configure_logging(verbose)


@main.command()
@click.option("--spec", "spec_path", type=str, default=None,
              help="Spec file (YAML or JSON); default: legs/<leg>.spec.json of the run "
              "location, else (a local folder without one) the defaults.")
@click.option("--leg", required=True, metavar="NAME", callback=_leg_name,
              help="control (never cut), preempted, or another preempted leg's name.")
@click.option("--run", "--run-dir", "run", required=True, metavar="URI", callback=_uri,
              help="The run location: a folder, file:///abs/path or s3://bucket/prefix/...")
@click.option("--omit", type=click.Choice(OMISSIONS), multiple=True,
              help="Leave this part of the state out of every resume (a negative control).")
@click.option("--scratch", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Local folder for checkpoint staging and downloads (default: a "
              "temporary folder per run location).")
@click.option("--trace-every", type=click.IntRange(min=1), default=1, show_default=True,
              help="Trace records per segment (1: none lost to a SIGKILL).")
def leg(spec_path: str | None, leg: str, run: str, omit: tuple[str, ...],
        scratch: Path | None, trace_every: int) -> None:
    """Run one training leg in this process; meant to run under torchrun."""
    from resumequal.lifeline import die_with_parent
    from resumequal.train.startup import pause_gc, resume_gc

    die_with_parent()  # a local run's worker ends with its agent, however that one ends

    pause_gc()  # until the first step: see resumequal.train.startup
    try:
        from resumequal.train.worker import run_leg  # torch loads only for commands that train

        spec, omissions = _leg_spec(spec_path, leg, run, omit)
        if scratch is None and trace_every == 1:
            code = run_leg(spec, leg, run, omissions)
        else:
            code = run_leg(spec, leg, run, omissions, scratch=scratch, trace_every=trace_every)
    except (SpecError, ResumequalError) as e:
        click.echo(f"error: {printable(str(e))}", err=True)
        _exit_now(WORKER_ERROR)
    finally:
        resume_gc(freeze=False)  # a start-up that failed (the leg resumed it otherwise)
    from resumequal.train.preemption import EXIT_PREEMPTED

    if code == EXIT_PREEMPTED and os.environ.get("TORCHELASTIC_RUN_ID") is not None:
        # The emergency checkpoint is committed and the trace flushed: interpreter teardown
        # (1-2.5 s of it, with a peer that may be gone already) would only delay the
        # restart, or hang it. What was registered to run at exit still runs first.
        atexit._run_exitfuncs()
        _exit_now(code)
    sys.exit(code)


@main.command()
@click.option("--mode", type=click.Choice(["hard", "graceful"]), default="hard",
              show_default=True,
              help="On SIGTERM/SIGINT: hard kills torchrun and its workers at once (nothing "
              "is saved); graceful forwards the signal (the workers write an emergency "
              "checkpoint).")
@click.option("--launcher", type=click.Choice(LAUNCHERS), default=DEFAULT_LAUNCHER,
              show_default=True,
              help="torchrun: stock torchrun, every worker a fresh interpreter. forked: "
              "workers forked from a process that loaded their code once (world.launcher).")
@click.argument("torchrun_args", nargs=-1, type=click.UNPROCESSED, metavar="-- TORCHRUN_ARGS")
def launch(mode: str, launcher: str, torchrun_args: tuple[str, ...]) -> None:
    """Run torchrun as a child: a leg pod's main process.

    Exits with torchrun's code, or with 128+signal when this process was signalled
    (never 1, which the training operator takes for a permanent failure).
    """
    from resumequal.worker.launch import Mode
    from resumequal.worker.launch import launch as launch_torchrun

    sys.exit(launch_torchrun(cast(Mode, mode), list(torchrun_args), launcher))


def _exit_now(code: int) -> NoReturn:
    """Exit a failed worker without interpreter teardown.

    The error's traceback keeps the training state (the DDP reducer and its gloo group)
    alive until the interpreter finalizes, where destroying the group can deadlock joining
    its threads; the launcher would then wait for a process that never ends.
    """
    if os.environ.get("TORCHELASTIC_RUN_ID") is None:
        sys.exit(code)  # not under torchrun (e.g. a test of this command): exit normally
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _leg_spec(
    spec_path: str | None, leg: str, run: str, omit: tuple[str, ...]
) -> tuple[QualificationSpec, frozenset[str]]:
    """The spec and omissions a worker runs: --spec, else the run location's leg spec."""
    if spec_path is not None:
        return load_spec(spec_path), frozenset(omit)
    from resumequal.run.location import RunLocation
    from resumequal.run.signing import RunSeal

    # What the workers run (their module, their store) is read only from a spec file
    # this run wrote: the run's key and id come with the leg's environment.
    location = RunLocation.open(run, seal=RunSeal.from_env())
    found = location.read_leg_spec(leg)
    if found is None:
        # A location nobody has set up runs the defaults; one a runner or the operator set
        # up (its spec written) names each leg's spec, and a missing one is an error.
        if location.has_spec():
            raise SpecError(f"{location.url(f'legs/{leg}.spec.json')} does not exist; "
                            "write it first (or pass --spec)")
        return QualificationSpec(), frozenset(omit)
    return found.spec, frozenset(omit) | frozenset(found.omit)


@main.command("validate", cls=_Judging, epilog=epilog(
    ExitCode.PASS, ExitCode.SPEC_ERROR, ExitCode.INTERNAL_ERROR, ExitCode.INTERRUPTED,
    says={ExitCode.PASS: "the spec is valid and its workload builds"}))
@click.argument("spec_path", type=str)
def validate(spec_path: str) -> None:
    """Check a spec file, build its workload once (a trial, in a process of its own), and
    print the spec with every default filled in."""
    from resumequal.local.trial import trial_build
    from resumequal.train.probes import check_installed

    try:
        spec = load_spec(spec_path)
        check_installed(spec)  # NotSupported (a SpecError) when this torch lacks a feature
        trial_build(spec)
    except SpecError as e:
        _fail(e)
    except KeyboardInterrupt:
        _interrupted()
    click.echo(spec.model_dump_json(indent=2))


@main.command(cls=_Judging, epilog=VERDICTS)
@click.option("--spec", "spec_path", type=str, default=None,
              help="Spec file (YAML or JSON); the embedded default qualifies tiny-gpt on 2 ranks.")
@click.option("--set", "overrides", multiple=True, metavar="PATH=VALUE",
              help="Override one spec field, e.g. --set preemption.mode=graceful (repeatable).")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where legs, traces, checkpoints and reports go (default: runs/qual-<time>).")
@click.option("--pin", default=None, callback=_pin,
              help="Label of the stack under qualification "
              "(default: the installed torch version).")
@click.option("--side-by-side", is_flag=True, help="Run both legs at once instead of in turn.")
@click.option("--no-kill", is_flag=True, hidden=True,
              help="Never deliver the kill (tests the arm timeout).")
@click.option("--omit", type=click.Choice(OMISSIONS), multiple=True,
              help="Plant a broken resume in the preempted leg (a negative control).")
@click.option("--metrics-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Prometheus textfile to write (default: RUN_DIR/metrics.prom).")
@click.option("--pushgateway", default=None, help="Also push the metrics to this Pushgateway.")
@click.option("--store", default=None, metavar="s3://BUCKET/PREFIX", callback=_uri,
              help="Keep traces, beacons, checkpoints and reports in this store, under "
              "<store>/local/<run>/<uid> (logs and staging stay in --run-dir).")
@click.option("--launcher", type=click.Choice(LAUNCHERS), default=None,
              help="What starts the workers (world.launcher; default: the spec's, else "
              "torchrun). torchrun: stock torchrun, every worker a fresh interpreter, as a "
              "production restart. forked: faster restarts from one warm process, blind to "
              "what a fresh process changes (the report says what).")
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
    store: str | None,
    launcher: str | None,
) -> None:
    """Qualify this machine's stack: control and preempted legs, kill, compare, report."""
    from rich.console import Console

    # SIGUSR1 prints every thread's stack to stderr: how a run that seems stuck shows where.
    # Only where stderr is a file (an in-process runner's is not).
    with contextlib.suppress(io.UnsupportedOperation, ValueError, AttributeError):
        faulthandler.register(signal.SIGUSR1, file=sys.stderr.fileno(), all_threads=True)

    from resumequal.local.runner import RunOptions, default_run_dir, qualify_here
    from resumequal.report.terminal import print_summary
    from resumequal.train.probes import check_installed
    from resumequal.zoom.replays import zoomed

    console = Console(stderr=False)
    try:
        launched_by = (f"world.launcher={launcher}",) if launcher is not None else ()
        spec = _load(spec_path, (*overrides, *launched_by))
        check_installed(spec)  # refused before anything launches
        opts = RunOptions(
            run_dir=run_dir or default_run_dir(),
            pin=pin or _default_pin(),
            side_by_side=side_by_side,
            deliver_kill=not no_kill,
            omit=cast(tuple[Omission, ...], omit),
            metrics_file=metrics_file,
            pushgateway=pushgateway,
            store=store,
        )
        outcome = qualify_here(spec, opts, console, zoomed)
    except ResumequalError as e:
        _fail(e)
    except KeyboardInterrupt:
        _interrupted("interrupted; every process of this run was stopped")
    files: dict[str, Path | str] = {
        "metrics" if name == "metrics.prom" else name: where
        for name, where in outcome.files.items()
    }
    print_summary(outcome.report, console, files=files)
    sys.exit(for_result(outcome.report.verdict.result))


@main.command(cls=_Judging, epilog=VERDICTS)
@click.argument("uri", metavar="RUN", callback=_uri)
@click.option("--write", is_flag=True,
              help="Write verdict.json, report.json, report.html and metrics.prom into RUN.")
@click.option("--pin", default=None, callback=_pin,
              help="Label of the stack (default: the installed torch).")
@click.option("--namespace", default=None,
              help="Metrics label (default: from s3://.../<namespace>/<run>/<uid>, or local).")
@click.option("--name", default=None, help="Run name in the report (default: from RUN).")
@click.option("--json", "as_json", is_flag=True, help="Print verdict.json instead of a summary.")
def compare(uri: str, write: bool, pin: str | None, namespace: str | None, name: str | None,
            as_json: bool) -> None:
    """Compare the legs of a finished run (a folder or s3:// URI), negative controls included."""
    from resumequal.jobs.comparator import compare_location

    try:
        judged = compare_location(uri, write=write, pin=pin or _default_pin(),
                                  namespace=namespace, name=name)
    except ResumequalError as e:
        _fail(e)
    except KeyboardInterrupt:
        _interrupted()
    verdict = judged.verdict
    if as_json:
        click.echo(verdict.model_dump_json(indent=2))
    else:
        click.echo(printable(f"{verdict.result}: {verdict.reason}"))
        for file_name, where in judged.files.items():
            click.echo(printable(f"{file_name}: {where}"))
    sys.exit(for_result(verdict.result))


@main.command(cls=_Judging, epilog=epilog(
    ExitCode.PASS, ExitCode.SPEC_ERROR, ExitCode.INVALID, ExitCode.INTERNAL_ERROR,
    ExitCode.INTERRUPTED,
    says={ExitCode.PASS: "zoomed", ExitCode.INVALID: "could not zoom: a replay failed, or a "
          "checkpoint did not verify"}))
@click.argument("uri", metavar="RUN", callback=_uri)
@click.option("--step", type=click.IntRange(min=1), default=None,
              help="The step to replay (default: the verdict's first divergence).")
@click.option("--leg", "leg_name", default="preempted", show_default=True, callback=_leg_name,
              help="The preempted leg to replay beside the control leg.")
@click.option("--no-write", is_flag=True,
              help="Print the result only; write neither zoom.json nor the report.")
@click.option("--namespace", default=None,
              help="Metrics label for the rewritten metrics.prom (default: from RUN).")
@click.option("--json", "as_json", is_flag=True, help="Print zoom.json instead of a summary.")
def zoom(uri: str, step: int | None, leg_name: str, no_write: bool, namespace: str | None,
         as_json: bool) -> None:
    """Replay a divergent step of both legs in fresh processes, every module hooked, and say
    which module (or stage) the difference starts in. Needs the run's checkpoint key."""
    from resumequal.zoom.job import zoom_location

    try:
        zoomed = zoom_location(uri, step=step, leg=leg_name, write=not no_write,
                               namespace=namespace)
    except ResumequalError as e:
        _fail(e)
    except KeyboardInterrupt:
        _interrupted()
    if as_json:
        click.echo(zoomed.zoom.model_dump_json(indent=2))
    else:
        from resumequal.report.zoom import zoom_lines

        for line in zoom_lines(zoomed.zoom):
            click.echo(printable(line))
        for file_name, where in zoomed.files.items():
            click.echo(printable(f"{file_name}: {where}"))


@main.command(cls=_Judging, epilog=epilog(
    ExitCode.PASS, ExitCode.SPEC_ERROR, ExitCode.INVALID, ExitCode.NO_FLIP, ExitCode.UNDECIDED,
    ExitCode.INTERNAL_ERROR, ExitCode.INTERRUPTED,
    says={ExitCode.PASS: "a flip found: the change(s), or the first pin, that flip it named",
          ExitCode.SPEC_ERROR: "spec, pin file, manifest, kubeconfig or usage error: "
                               "nothing was built or created",
          ExitCode.INVALID: "an environment could not be built (not a resolver refusal), "
                            "or the cluster's API refused or failed a request"}))
@click.option("--good", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The pin that passes: pip freeze output or pylock.toml.")
@click.option("--bad", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The pin that does not (or fails elsewhere).")
@click.option("--ordered", is_flag=True,
              help="Binary search over the PINS given in order for the first that flips.")
@click.option("--ordered-images", is_flag=True,
              help="As --ordered, the PINS being images, each qualified on a cluster as a "
              "QualificationRun made from --spec (a QualificationRun manifest).")
@click.argument("pins", nargs=-1)
@click.option("--spec", "spec_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="The spec every probe runs (default: the embedded default); "
              "with --ordered-images, the QualificationRun manifest (required).")
@click.option("--set", "overrides", multiple=True, metavar="PATH=VALUE",
              help="Override one spec field in every probe (repeatable).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where bisect.json, bisect.html and every probe's run go "
              "(default: runs/bisect-<time>).")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where probe venvs are kept and reused (default: "
              "~/.cache/resumequal/bisect).")
@click.option("--base-env", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="An environment (a venv's folder) holding packages the pins share, at "
              "their pinned versions: probes take those from it instead of installing them.")
@click.option("--retries", type=click.IntRange(min=0, max=10), default=1, show_default=True,
              help="Qualify a probe that ends INVALID or NONDETERMINISTIC again, this often.")
@click.option("--max-probes", type=click.IntRange(min=2, max=1000), default=32,
              show_default=True, help="Stop, undecided, after this many probes.")
@click.option("--probe-timeout", type=click.FloatRange(min=1), default=1800.0,
              show_default=True, help="Seconds one qualification may take (a backstop).")
@click.option("--assume-good", is_flag=True,
              help="Take the good (first) pin's PASS as known: do not qualify it.")
@click.option("--assume-bad", is_flag=True,
              help="Take the bad (last) pin's flip as known: do not qualify it.")
@click.option("--namespace", default=None,
              help="--ordered-images: where the runs go (default: the manifest's).")
@click.option("--kubeconfig", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="--ordered-images: the cluster's kubeconfig (default: $KUBECONFIG, "
              "~/.kube/config, else the pod's service account).")
@click.option("--context", default=None, help="--ordered-images: the kubeconfig's context.")
@click.option("--delete-runs", is_flag=True,
              help="--ordered-images: delete each QualificationRun once its verdict is read "
              "(default: kept, listed in bisect.json).")
def bisect(good: Path | None, bad: Path | None, ordered: bool, ordered_images: bool,
           pins: tuple[str, ...], spec_path: Path | None, overrides: tuple[str, ...],
           out: Path | None, cache_dir: Path | None, base_env: Path | None, retries: int,
           max_probes: int, probe_timeout: float, assume_good: bool, assume_bad: bool,
           namespace: str | None, kubeconfig: Path | None, context: str | None,
           delete_runs: bool) -> None:
    """Find which change between two stack pins flips the verdict (--good A --bad B), the
    first pin of an ordered list that flips it (--ordered PIN...), or the first image that
    flips it on a cluster (--ordered-images --spec RUN.yaml IMAGE...)."""
    from rich.console import Console

    from resumequal.bisect.bisection import BisectOptions
    from resumequal.bisect.bisection import bisect as run_bisection
    from resumequal.bisect.envs import default_cache
    from resumequal.bisect.terminal import TerminalProgress, print_result

    cluster = _bisect_cluster(ordered_images, spec_path, overrides, base_env, namespace,
                              kubeconfig, context, delete_runs)
    ordered = ordered or ordered_images
    if ordered == (good is not None or bad is not None) or (not ordered and pins):
        raise click.UsageError("give --good and --bad, or --ordered and the pins in order")
    if not ordered and (good is None or bad is None):
        raise click.UsageError("give both --good and --bad")
    listed = tuple(map(Path, pins)) if ordered else (cast(Path, good), cast(Path, bad))
    options = BisectOptions(
        pins=() if cluster else listed, ordered=ordered,
        out=out or Path("runs") / time.strftime("bisect-%Y%m%d-%H%M%S"),
        cache=cache_dir or default_cache(), spec=spec_path, sets=overrides,
        base_env=base_env, retries=retries, max_probes=max_probes,
        probe_timeout_s=probe_timeout, assume_good=assume_good, assume_bad=assume_bad,
        images=pins if cluster else (), cluster=cluster)
    console = Console()
    try:
        with TerminalProgress(console) as progress:
            result = run_bisection(options, progress)
    except ResumequalError as e:
        _fail(e)
    except KeyboardInterrupt:
        _interrupted("interrupted; the running probe was stopped")
    print_result(result, console, {name: str(options.out / name)
                                   for name in ("bisect.json", "bisect.html")})
    sys.exit(result.exit_code)


def _bisect_cluster(ordered_images: bool, spec_path: Path | None, overrides: tuple[str, ...],
                    base_env: Path | None, namespace: str | None, kubeconfig: Path | None,
                    context: str | None, delete_runs: bool) -> ClusterOptions | None:
    """The cluster of --ordered-images, or None; its options refused without it."""
    from resumequal.bisect.cluster import ClusterOptions

    if not ordered_images:
        if namespace or kubeconfig or context or delete_runs:
            raise click.UsageError("--namespace, --kubeconfig, --context and --delete-runs "
                                   "go with --ordered-images")
        return None
    if spec_path is None:
        raise click.UsageError("--ordered-images needs --spec: the QualificationRun manifest "
                               "each image's run is made from")
    if overrides or base_env:
        raise click.UsageError("--set and --base-env do not go with --ordered-images (edit "
                               "the manifest; the images hold the packages)")
    return ClusterOptions(manifest=spec_path, namespace=namespace, kubeconfig=kubeconfig,
                          context=context, delete_runs=delete_runs)


@main.command(hidden=True)
@click.option("--leg", required=True, metavar="NAME", callback=_leg_name)
@click.option("--run-dir", "run", required=True, metavar="URI", callback=_uri)
@click.option("--step", type=click.IntRange(min=1), required=True)
@click.option("--from-checkpoint", "start", default=None, metavar="NAME",
              help="The checkpoint the replayed attempt restored (default: none).")
@click.option("--attempt", type=click.IntRange(min=0), required=True)
@click.option("--capture-dir", type=click.Path(file_okay=False, path_type=Path), required=True)
def replay(leg: str, run: str, step: int, start: str | None, attempt: int,
           capture_dir: Path) -> None:
    """One rank of a zoom replay; run by ``resumequal zoom`` under torchrun."""
    from resumequal.lifeline import die_with_parent
    from resumequal.train.replay import replay_leg

    die_with_parent()
    try:
        spec, omissions = _leg_spec(None, leg, run, ())
        code = replay_leg(spec, leg, run, omissions, step=step, start=start, attempt=attempt,
                          out=capture_dir)
    except (SpecError, ResumequalError) as e:
        click.echo(f"error: {printable(str(e))}", err=True)
        _exit_now(WORKER_ERROR)
    sys.exit(code)


def _default_pin() -> str:
    from importlib.metadata import version

    return f"torch=={version('torch')}"

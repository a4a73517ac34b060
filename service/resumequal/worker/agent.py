"""``python -m resumequal.worker.agent``: torchrun, with its workers forked from a warm process.

torchrun starts every worker of every attempt as a fresh interpreter, and a resumed
worker then spends most of its restart loading code: torch, DCP (which loads DTensor, FX
and sympy), dynamo (which DDP's constructor loads), our CLI and worker modules, about
1.7 s of CPU before its first collective, against 0.95 s for a worker that only imports
torch and joins its group. This agent is torchrun itself (its argument parser, its
elastic agent, rendezvous, restarts, signals and exit codes, unchanged) run with
``--start-method forkserver``: the training module (``-m MODULE``) runs as a function in
workers that a forkserver forks, and that forkserver loads all of the above once, before
the first attempt (:mod:`resumequal.train.preload`). A restart forks again: its workers
start with that code loaded, so a restart costs what the training itself does.

What a worker sees is what torchrun gives it: the same environment variables (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, TORCHELASTIC_RESTART_COUNT, ...), its own pid, the
agent's stdout and stderr, ``sys.argv`` as ``python -m MODULE ARGS`` would set it, and its
exit code as the agent's verdict on it. A pod's main process is still the launcher
(:mod:`resumequal.worker.launch`), with this agent as its child instead of torchrun's CLI.

Only ``-m MODULE`` scripts run this way; anything else (a path, ``--no-python``) runs as
torchrun runs it, and so does everything when a torch internal the agent relies on is
missing from the installed torch (with a warning).

This is an opt-in launcher (``world.launcher: forked``): a forked worker inherits what the
forkserver had, its str-hash secret, its memory layout, what its imports drew or read
(:data:`resumequal.spec.launchers.FORKED_BLIND_SPOTS`). Everything else is made as torchrun
makes it: each worker runs in a session of its own and is stopped by process group (its
loader workers with it), gets the platform's default start method back, and ends as
``python -m`` ends (non-daemon threads joined, then ``atexit``, then open files flushed).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import io
import logging
import multiprocessing
import os
import runpy
import signal
import sys
import threading
import time
import uuid
from typing import Any

from resumequal.spec.launchers import FORKED_ENV

log = logging.getLogger(__name__)

# Imported once in the forkserver, before it forks the first worker.
PRELOAD = "resumequal.train.preload"


# What a worker's module raised: kept until the process ends (see run_module).
_FAILURES: list[BaseException] = []


def run_module(module: str, *args: str) -> None:
    """A worker: ``python -m module args`` in this (forked) interpreter, ended as that
    interpreter ends.

    A forked worker ends with ``os._exit`` (multiprocessing/forkserver.py ``main``), where
    ``python -m`` ends by finalizing, so two things that interpreter does are done here:

    - what the module registered with :mod:`atexit` runs (a checkpoint store removes its
      verified copies that way);
    - what the module raised is kept until the process exits, with every frame it holds.
      ``python -m`` prints an uncaught error and exits with it still referenced
      (Python/pythonrun.c ``_PyErr_PrintEx``). Released here instead, once torch's
      wrapper has turned it into ``sys.exit(1)`` (torch/multiprocessing/spawn.py
      ``_wrap``), it would free the failed attempt's DDP reducer with the GIL held, whose
      gloo group waits for its worker thread (``~ProcessGroupGloo``) while that thread
      waits for the GIL to release the failed collective's tensors
      (``ProcessGroupGloo::runLoop``; pytorch/pytorch#56297): a survivor of a killed peer
      that never exits, and a restart that never comes.
    """
    _as_torchrun_starts_it()
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except BaseException as e:
        _FAILURES.append(e)
        raise
    finally:
        _end_as_python_ends()


def _as_torchrun_starts_it() -> None:
    """What a worker torchrun starts has from its start that a forked one must be given.

    - A session of its own (torchrun's ``SubprocessHandler`` starts workers with
      ``start_new_session=True``), so that stopping it by process group stops what it
      started (its DataLoader workers) too.
    - The platform's default start method: a forkserver's child inherits its parent's
      (multiprocessing/forkserver.py ``main`` → spawn.py ``prepare``), so its DataLoader
      workers would start from a nested forkserver, where a fresh interpreter's fork.
    """
    os.setsid()
    multiprocessing.set_start_method(None, force=True)  # type: ignore[arg-type]
    os.environ[FORKED_ENV] = "1"


def _end_as_python_ends() -> None:
    """Do what ``Py_FinalizeEx`` does before a forked worker's ``os._exit``: join the
    non-daemon threads, run the ``atexit`` functions, then flush files still open (a file
    never closed is flushed when finalization frees it: its data is not lost)."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for obj in gc.get_objects():
        if isinstance(obj, io.IOBase):
            try:
                if not obj.closed:
                    obj.flush()
            except (OSError, ValueError):
                continue


class _TracebackText(logging.Filter):
    """Formats a record's traceback before torch's formatter does.

    torch's log formatter (torch/_logging/_internal.py ``TorchLogsFormatter.format``) imports
    ``torch._dynamo.config`` to format any record that carries a traceback, and the agent
    logs one as soon as a worker of a function entrypoint fails
    (torch/distributed/elastic/multiprocessing/api.py ``MultiprocessContext._poll``): 0.9 s
    of loading dynamo between the failure and the restart. Here the traceback becomes text
    as ``logging.Formatter`` would make it, which that formatter appends as it is.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        return True


def format_tracebacks_first() -> None:
    """:class:`_TracebackText` on every handler torch set up (it sets them on several
    loggers of its own: torch, torch.distributed, ...)."""
    tracebacks = _TracebackText()
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and name.split(".")[0] == "torch":
            for handler in logger.handlers:
                handler.addFilter(tracebacks)


def _log_every_exit_code() -> None:
    """Have the agent log every worker's exit code when a worker of a function fails.

    For such workers torchrun names one failure: the lowest local rank among those already
    ended when it looks (torch/multiprocessing/spawn.py ``ProcessContext.join``), often a
    survivor whose collective failed after its peer was killed, not the peer. (For workers
    it starts as programs it names the earliest, torch/distributed/elastic/multiprocessing/
    api.py ``SubprocessContext._poll``.) The codes of all of them say which was killed, and
    by what.
    """
    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext

    poll = MultiprocessContext._poll

    def _poll(self: Any) -> Any:
        result = poll(self)
        processes = getattr(getattr(self, "_pc", None), "processes", None)
        if result is not None and result.is_failed() and processes is not None:
            log.error("worker exit codes: %s", ", ".join(
                f"local_rank {rank}: {process.exitcode}"
                for rank, process in enumerate(processes)))
        return result

    MultiprocessContext._poll = _poll  # type: ignore[method-assign]


def _stop_by_process_group() -> None:
    """Stop each worker as torchrun stops the workers it starts: the death signal to its
    process group, SIGKILL to what is left of the group after the timeout
    (torch/distributed/elastic/multiprocessing/subprocess_handler/subprocess_handler.py
    ``close``, api.py ``SubprocessContext._close``). torch's ``MultiprocessContext._close``
    signals each worker's pid alone, which leaves the DataLoader workers it started."""
    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext

    def _close(self: Any, death_sig: signal.Signals, timeout: int = 30) -> None:
        processes = getattr(getattr(self, "_pc", None), "processes", None) or []
        groups = [p.pid for p in processes if p.pid is not None]
        for pgid in groups:
            _signal_group(pgid, death_sig)
        end = time.monotonic() + timeout
        for p in processes:
            p.join(max(0.0, end - time.monotonic()))
        for pgid in groups:
            _signal_group(pgid, signal.SIGKILL)
        for p in processes:
            p.join(timeout)
            if p.is_alive():
                log.error("worker %s did not exit after SIGKILL within %ss", p.pid, timeout)

    MultiprocessContext._close = _close  # type: ignore[method-assign]


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    # Gone already: nothing of the group is left (a zombie leader is reaped by its join).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _missing_internals() -> str | None:
    """The first torch internal this agent patches or calls that the installed torch lacks
    (they are private and move between releases), or None."""
    try:
        from torch.distributed.elastic.multiprocessing.api import MultiprocessContext
        from torch.distributed.elastic.multiprocessing.errors import record  # noqa: F401
        from torch.distributed.launcher.api import elastic_launch  # noqa: F401
        from torch.distributed.run import config_from_args, parse_args  # noqa: F401
    except ImportError as e:
        return str(e)
    for name in ("_poll", "_close"):
        # Its own: the base class's raise NotImplementedError.
        if not callable(vars(MultiprocessContext).get(name)):
            return f"torch.distributed.elastic.multiprocessing.api.MultiprocessContext.{name}"
    return None


def main(argv: list[str] | None = None) -> None:
    """torchrun's ``main`` with ``-m`` scripts run as :func:`run_module` in forked workers."""
    from resumequal.logs import configure_logging

    # Our own lines; torch's loggers keep their handlers (they do not propagate).
    configure_logging(logging.INFO, "%(asctime)s %(levelname)s %(name)s: %(message)s")

    missing = _missing_internals()
    if missing is not None:
        import torch
        from torch.distributed.run import main as torchrun_main

        log.warning("launcher forked: torch %s lacks %s; running stock torchrun instead "
                    "(every worker a fresh interpreter)", torch.__version__, missing)
        torchrun_main(sys.argv[1:] if argv is None else argv)
        return

    from torch.distributed.elastic.multiprocessing.errors import record
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    format_tracebacks_first()

    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not args.module or args.no_python or args.run_path or args.rdzv_backend == "static":
        from torch.distributed.run import run

        record(run)(args)
        return
    # What torch/distributed/run.py run() does before it builds its config.
    if args.standalone:
        args.rdzv_backend, args.rdzv_endpoint = "c10d", "localhost:0"
        args.rdzv_id = str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = 29500
    args.start_method = "forkserver"
    config, _, _ = config_from_args(args)
    _log_every_exit_code()
    _stop_by_process_group()
    # torchrun runs a module's workers as ``python -u``; forked ones take the forkserver's
    # streams, unbuffered this way (nothing a worker printed is lost to its SIGKILL).
    os.environ["PYTHONUNBUFFERED"] = "1"
    multiprocessing.set_forkserver_preload([PRELOAD])
    record(elastic_launch(config=config, entrypoint=run_module))(
        args.training_script, *args.training_script_args)


if __name__ == "__main__":
    main()

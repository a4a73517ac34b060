"""Which launcher runs a leg's workers: the choice, its command, and what it cannot see.

Imports nothing (a pod's launcher process and the operator use it too).

- ``torchrun`` (the default): stock torchrun, ``python -m torch.distributed.run``. Every
  worker of every attempt is a fresh interpreter, as a production restart (torchrun's, or
  a new pod's) makes it, so a verdict sees everything a restart changes in a process.
- ``forked`` (opt-in): :mod:`resumequal.worker.agent`, torchrun's own agent with each worker forked
  from a forkserver that loaded torch and the leg's code once. A restart costs what the
  training does, but a forked worker inherits what the forkserver had (see
  :data:`FORKED_BLIND_SPOTS`), so its verdict cannot see a resume that depends on them.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

Launcher = Literal["torchrun", "forked"]
LAUNCHERS: Final[tuple[str, ...]] = get_args(Launcher)
DEFAULT_LAUNCHER: Final[Launcher] = "torchrun"

# After the interpreter: ``[sys.executable, *COMMANDS[launcher], TORCHRUN_OPTIONS...]``.
COMMANDS: Final[dict[str, tuple[str, ...]]] = {
    "torchrun": ("-m", "torch.distributed.run"),
    "forked": ("-m", "resumequal.worker.agent"),
}
# Stock torchrun, for what always runs fresh processes (zoom's replays).
TORCHRUN: Final = COMMANDS["torchrun"]

# Set in a forked worker's environment by the agent: the inventory records what ran.
FORKED_ENV: Final = "RESUMEQUAL_FORKED_WORKER"

FORKED_BLIND_SPOTS: Final = (
    "launcher forked: every worker was forked from one warm process, so all of them "
    "shared its str-hash secret (set and dict-of-str iteration order), its memory layout "
    "(id() order) and whatever its imports drew or read from the environment (module-level "
    "random draws, settings read at import time). A resume that depends on any of these "
    "is not seen here; stock torchrun (the default launcher) starts every worker fresh, "
    "as a production restart does."
)


def command(launcher: str) -> tuple[str, ...]:
    """The interpreter arguments that start ``launcher`` (torchrun's options follow)."""
    try:
        return COMMANDS[launcher]
    except KeyError:
        raise ValueError(f"unknown launcher {launcher!r}; allowed: "
                         f"{', '.join(LAUNCHERS)}") from None


def caveats(launcher: str) -> list[str]:
    """What a verdict taken under ``launcher`` cannot see (none for stock torchrun)."""
    return [FORKED_BLIND_SPOTS] if launcher == "forked" else []

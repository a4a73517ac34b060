"""A local run's key and id, kept so that the run can be judged and zoomed again later.

``resumequal run`` makes a fresh run id per run and a fresh checkpoint key (unless
``RESUMEQUAL_CHECKPOINT_KEY`` is set), hands both to its legs, and keeps them in a file only
this user can read: ``$XDG_STATE_HOME/resumequal/run-keys/<digest of the run id>.json``
(``~/.local/state`` by default; mode 0600 in a 0700 folder, never in the run folder, which
may be a store others write). ``resumequal compare`` and ``resumequal zoom`` of a location
take them from there when the environment does not give them: the kept run whose key and id
authenticate the location's ``run.json`` is its run, wherever the folder has since been
moved, copied or synced to. The folder keeps the :data:`KEEP_KEYS` runs used last, none
unused for :data:`KEEP_DAYS` days. On a cluster the comparator and zoom Jobs get the key
and id from the run's Secret and uid.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resumequal.errors import CheckpointError, TraceError, TraceNotAuthentic, UsageError
from resumequal.run.layout import RUN_FILE, SMALL_OBJECT_BYTES
from resumequal.run.location import RunLocation
from resumequal.run.signing import (
    KEY_ENV,
    RUN_ID_ENV,
    RunSeal,
    check_key,
    check_run_id,
    key_from_env,
    run_id_from_env,
)
from resumequal.spec import REFERENCE_LEG
from resumequal.store import StoreNotFound, regular

log = logging.getLogger(__name__)

# What a key file may hold: a key, a run id and the location's URI.
_KEY_FILE_BYTES = 64 << 10


def keys_folder() -> Path:
    """Where run keys are kept: ``$XDG_STATE_HOME/resumequal/run-keys``."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "resumequal" / "run-keys"


# The kept runs: the ones used last, and none left unused this long.
KEEP_KEYS = 256
KEEP_DAYS = 90


def key_file(run: str) -> Path:
    """The file that keeps the key of run ``run`` (and where it was run)."""
    return keys_folder() / f"{hashlib.sha256(run.encode()).hexdigest()[:32]}.json"


def remember(uri: str, seal: RunSeal) -> Path:
    """Keep ``seal`` for the run at ``uri`` (replacing what was kept for that run id); the
    file. Runs used long ago, or beyond the newest :data:`KEEP_KEYS`, are forgotten."""
    folder = keys_folder()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() \
            or stat.S_IMODE(info.st_mode) & 0o077:
        raise CheckpointError(f"{folder} is not a private folder of this user (mode "
                              f"{stat.S_IMODE(info.st_mode):o}); the run's key is not kept there")
    path = key_file(seal.run)
    body = json.dumps({"uri": uri, "run": seal.run, "key": seal.key.decode()}).encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    prune(folder)
    return path


def prune(folder: Path, now: float | None = None) -> list[Path]:
    """Forget the runs not used for :data:`KEEP_DAYS` days and those beyond the
    :data:`KEEP_KEYS` used last (a use touches the file); the files removed."""
    now = time.time() if now is None else now
    kept = sorted(_key_files(folder), key=lambda p: -p[1])
    gone = [p for i, (p, used) in enumerate(kept)
            if i >= KEEP_KEYS or now - used > KEEP_DAYS * 86400]
    for path in gone:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return gone


def _key_files(folder: Path) -> list[tuple[Path, float]]:
    """Every key file of ``folder`` and when it was last used (written or recalled)."""
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return []
    return [(Path(e.path), e.stat(follow_symlinks=False).st_mtime) for e in entries
            if e.name.endswith(".json") and not e.name.startswith(".")
            and e.is_file(follow_symlinks=False)]


@dataclass(frozen=True)
class Kept:
    """What was kept of one run: its seal and where it ran."""

    seal: RunSeal
    uri: str
    path: Path


def _read_kept(path: Path) -> Kept | None:
    """The run kept in ``path``; None for a file that is not one of this user's key files
    (a foreign or damaged file is never used, and never stops the others being tried)."""
    try:
        # Non-blocking and no link: a FIFO or a link planted there is refused, never waited on.
        fd = regular.open_path(path, follow=False)
    except OSError:
        return None
    info = os.fstat(fd)
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        os.close(fd)
        log.warning("%s: not a private file of this user; not used", path)
        return None
    data = regular.read_fd(fd, _KEY_FILE_BYTES)
    try:
        kept = json.loads(data)
        run, key, uri = str(kept["run"]), str(kept["key"]), str(kept["uri"])
        seal = RunSeal(check_key(key, f"the key in {path}"), check_run_id(run, str(path)))
    except (ValueError, KeyError, TypeError, CheckpointError):
        return None
    return Kept(seal, uri, path)


def kept_runs(uri: str) -> list[Kept]:
    """Every run kept in the keys folder, the one last run at ``uri`` first, then the most
    recently used."""
    files = sorted(_key_files(keys_folder()), key=lambda p: -p[1])
    kept = [k for k in (_read_kept(path) for path, _ in files) if k is not None]
    return sorted(kept, key=lambda k: k.uri != uri)


def _authenticates(run_file: Any, seal: RunSeal) -> bool:
    return seal.open_json(RUN_FILE, run_file) is not None


def recall(location: RunLocation, key: bytes | None = None,
           run: str | None = None) -> RunSeal | None:
    """The kept seal (its key or run id replaced by ``key`` or ``run`` where given) that
    authenticates ``location``'s ``run.json`` (the location a run was made in, or a copy of
    it anywhere), or None."""
    run_file = _run_file(location)
    if run_file is None:
        return None
    for kept in kept_runs(location.uri):
        seal = RunSeal(key or kept.seal.key, run or kept.seal.run)
        if _authenticates(run_file, seal):
            with contextlib.suppress(OSError):
                os.utime(kept.path)  # used: kept the longer
            return seal
    return None


def _run_file(location: RunLocation) -> Any:
    """``run.json`` of the location as parsed JSON (its MAC is checked by the caller), or
    None where there is none or it is not JSON."""
    try:
        return json.loads(location.store.get_bytes(RUN_FILE, SMALL_OBJECT_BYTES))
    except (StoreNotFound, ValueError):
        return None


def seal_for(location: RunLocation) -> RunSeal:
    """The seal to judge the run at ``location`` with: the environment's key and run id,
    else those of the kept run that authenticates it; UsageError saying what is missing."""
    uri = location.uri
    run = run_id_from_env()
    key = key_from_env() if os.environ.get(KEY_ENV) else None
    if key is not None and run is not None:
        return RunSeal(key, run)
    kept = recall(location, key, run)
    if kept is not None:
        return kept
    # None holds: judged as the run kept for this very place, check_seal then says the
    # key or id given does not authenticate it (and nothing is written).
    here = next((k for k in kept_runs(uri) if k.uri == uri), None)
    if here is not None:
        return RunSeal(key or here.seal.key, run or here.seal.run)
    missing = " and ".join(name for name, value in ((KEY_ENV, key), (RUN_ID_ENV, run))
                           if value is None)
    raise UsageError(
        f"{uri}: its run cannot be authenticated: set {missing} (a cluster run's key "
        "is in the Secret its status names, its id is the QualificationRun's uid), or "
        "judge it as the user and on the machine that ran it")


def export(seal: RunSeal) -> None:
    """Hand ``seal`` to the processes this one starts (legs, replays)."""
    os.environ[KEY_ENV] = seal.key.decode()
    os.environ[RUN_ID_ENV] = seal.run


def check_seal(location: RunLocation, doing: str) -> None:
    """CheckpointError when the reference leg's first rank's trace does not authenticate
    with ``location``'s seal: the wrong key or run id, with which every leg would look
    foreign (and a finished verdict be replaced). A leg damaged or copied from elsewhere is
    for the comparison to judge and name."""
    try:
        location.traces(REFERENCE_LEG).records(0)
    except TraceNotAuthentic as e:
        raise CheckpointError(
            f"{location.uri} cannot be {doing} with this key and run id (the {REFERENCE_LEG} "
            f"leg's trace does not authenticate: {e}); nothing {doing}, nothing written") from e
    except (StoreNotFound, TraceError):
        pass

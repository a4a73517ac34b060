"""A local run's key and id, kept so that the run can be judged and zoomed again later.

``resumequal run`` makes a fresh run id per run and a fresh checkpoint key (unless
``RESUMEQUAL_CHECKPOINT_KEY`` is set), hands both to its legs, and keeps them in a file only
this user can read: ``$XDG_STATE_HOME/resumequal/run-keys/<digest of the location>.json``
(``~/.local/state`` by default; mode 0600 in a 0700 folder, never in the run folder, which
may be a store others write). ``resumequal compare`` and ``resumequal zoom`` of that
location take them from there when the environment does not give them; on a cluster the
comparator and zoom Jobs get them from the run's Secret and uid.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from resumequal.errors import CheckpointError, TraceError, TraceNotAuthentic, UsageError
from resumequal.runstore import RunLocation
from resumequal.signing import (
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

# What a key file may hold: a key, a run id and the location's URI.
_KEY_FILE_BYTES = 64 << 10


def keys_folder() -> Path:
    """Where run keys are kept: ``$XDG_STATE_HOME/resumequal/run-keys``."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "resumequal" / "run-keys"


def key_file(uri: str) -> Path:
    """The file that keeps the key and run id of the run at ``uri``."""
    return keys_folder() / f"{hashlib.sha256(uri.encode()).hexdigest()[:32]}.json"


def remember(uri: str, seal: RunSeal) -> Path:
    """Keep ``seal`` for the run at ``uri`` (replacing what was kept for it); the file."""
    folder = keys_folder()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() \
            or stat.S_IMODE(info.st_mode) & 0o077:
        raise CheckpointError(f"{folder} is not a private folder of this user (mode "
                              f"{stat.S_IMODE(info.st_mode):o}); the run's key is not kept there")
    path = key_file(uri)
    body = json.dumps({"uri": uri, "run": seal.run, "key": seal.key.decode()}).encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def recall(uri: str) -> RunSeal | None:
    """The key and run id kept for the run at ``uri``, or None; CheckpointError when the
    file is there but is no key file of this user's."""
    path = key_file(uri)
    try:
        # Non-blocking and no link: a FIFO or a link planted there is refused, never waited on.
        fd = regular.open_path(path, follow=False)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read the run's key: {e.strerror}") from e
    info = os.fstat(fd)
    if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        os.close(fd)
        raise CheckpointError(f"{path}: not a private file of this user; not used")
    data = regular.read_fd(fd, _KEY_FILE_BYTES)
    try:
        kept = json.loads(data)
        run, key, kept_uri = str(kept["run"]), str(kept["key"]), str(kept["uri"])
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{path}: not a run key file") from e
    if kept_uri != uri:
        return None  # another location's file under a colliding digest: not this run's
    return RunSeal(check_key(key, f"the key in {path}"), check_run_id(run, str(path)))


def seal_for(uri: str) -> RunSeal:
    """The seal to judge the run at ``uri`` with: the environment's key and run id, else
    what ``resumequal run`` kept for it; UsageError saying what is missing."""
    run = run_id_from_env()
    kept = recall(uri)
    key = key_from_env() if os.environ.get(KEY_ENV) else kept.key if kept else None
    if run is None and kept is not None:
        run = kept.run
    if key is None or run is None:
        missing = " and ".join(name for name, value in ((KEY_ENV, key), (RUN_ID_ENV, run))
                               if value is None)
        raise UsageError(
            f"{uri}: its run cannot be authenticated: set {missing} (a cluster run's key "
            "is in the Secret its status names, its id is the QualificationRun's uid), or "
            "judge it as the user and on the machine that ran it")
    return RunSeal(key, run)


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
        location.leg(REFERENCE_LEG).traces().lines(0)
    except TraceNotAuthentic as e:
        raise CheckpointError(
            f"{location.uri} cannot be {doing} with this key and run id (the {REFERENCE_LEG} "
            f"leg's trace does not authenticate: {e}); nothing {doing}, nothing written") from e
    except (StoreNotFound, TraceError):
        pass

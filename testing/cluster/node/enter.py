"""A container's first moment: run inside the pod's namespaces, it mounts the pod's volumes
and files, takes the pod's host name and user, and becomes the container's process.

Started by the node agent as ``ip netns exec <pod> unshare --uts -- python -m
testing.cluster.node.enter SPEC``: ``ip netns exec`` puts it in the pod's network
namespace and a mount namespace of its own (with ``/`` a slave, so nothing mounted here
reaches the machine), ``unshare --uts`` gives it a host name of its own. What a runtime
does before it starts a container's process (runc's ``libcontainer/rootfs_linux.go``
mounts, ``init_linux.go`` finalizeNamespace: groups, gid, uid, then the working folder).
Then ``exec``: the pid the node agent holds is the container's process.

Standard library only: it runs in the pod's environment before anything else.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

# When the command cannot start, this process exits so (runc's codes: 127 not found, 126
# not executable) after writing why into the spec's ``start_error`` file, from which the
# node agent reports a StartError as containerd does (exit code 128, the reason, the
# message): the process's own status alone would not tell it from a program exiting 127.
NOT_FOUND = 127
NOT_EXECUTABLE = 126


def _mount(args: list[str], pass_fds: tuple[int, ...] = ()) -> None:
    result = subprocess.run(["mount", *args], capture_output=True, text=True, check=False,
                            pass_fds=pass_fds)
    if result.returncode != 0:
        # What mount(8) said reaches the container's log, as a runtime's mount error does.
        raise OSError(f"mount {' '.join(args)} exited {result.returncode}: "
                      f"{result.stderr.strip()}")


def _prepare_target(target: Path, is_file: bool) -> None:
    if is_file:
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
    else:
        target.mkdir(parents=True, exist_ok=True)


def mount_all(mounts: list[dict[str, object]]) -> None:
    """Each bind or tmpfs at its target, read-only where asked.

    A runtime binds host paths into a root of the container's own, so no mount of the
    container can cover another's source. Here the container sees the machine's tree: an
    emptyDir on /tmp covers a pod folder under /tmp (a checkout there) that later mounts
    come from. So every source is held by a handle before anything is mounted, and bound
    from it."""
    sources: dict[int, tuple[int, bool]] = {}
    try:
        for index, m in enumerate(mounts):
            if m.get("tmpfsSize") is None:
                source = Path(str(m["source"]))
                sources[index] = (os.open(source, os.O_PATH), source.is_file())
        for index, m in enumerate(mounts):
            target = Path(str(m["target"]))
            size = m.get("tmpfsSize")
            if size is not None:
                _prepare_target(target, False)
                options = "mode=1777" + (f",size={size}" if size else "")
                _mount(["-t", "tmpfs", "-o", options, "tmpfs", str(target)])
            else:
                fd, is_file = sources[index]
                _prepare_target(target, is_file)
                # --no-canonicalize: mount(8) would resolve the descriptor's link to the
                # source's path, which an earlier mount may cover.
                _mount(["--no-canonicalize", "--bind", f"/proc/self/fd/{fd}", str(target)],
                       pass_fds=(fd,))
            if m.get("readOnly"):
                _mount(["-o", "remount,bind,ro", str(target)])
    finally:
        for fd, _ in sources.values():
            os.close(fd)


def _hidden_ancestor(path: Path) -> Path | None:
    """The topmost folder above ``path`` that other users cannot pass through."""
    for parent in reversed(path.parents):
        if parent != Path("/") and not parent.stat().st_mode & 0o001:
            return parent
    return None


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_dev, info.st_ino


Stashed = list[tuple[Path, int, tuple[int, int] | None, Path | None]]


def stash(paths: list[str]) -> Stashed:
    """Before the pod's mounts: a handle on each path of the image (the interpreter, the
    environment, the programs), so that a volume mounted over a folder holding it (an
    emptyDir on /tmp, say) does not take it from the container."""
    stashed = []
    for text in paths:
        path = Path(text).resolve()
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY)
        stashed.append((path, fd, _identity(path), _hidden_ancestor(path)))
    return stashed


def restore(stashed: Stashed, for_user: bool) -> None:
    """After them: a path a mount covered is bound back from its handle; for a user other
    than root, a path under a folder others cannot enter is put on a tmpfs laid over that
    folder (in this mount namespace only), as an image's files are readable by its user."""
    covered: set[Path] = set()
    for path, fd, identity, hidden_by in stashed:
        hidden = hidden_by if for_user else None
        if hidden is not None and hidden not in covered:
            _mount(["-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(hidden)])
            covered.add(hidden)
        if hidden is not None or _identity(path) != identity:
            path.mkdir(parents=True, exist_ok=True)
            # --no-canonicalize: mount(8) would otherwise resolve the descriptor's link to
            # its path, the very path now covered.
            _mount(["--no-canonicalize", "--bind", f"/proc/self/fd/{fd}", str(path)],
                   pass_fds=(fd,))
        os.close(fd)


def become(uid: int | None, gid: int | None, groups: list[int]) -> None:
    """Supplementary groups, then the group, then the user (so the last can be dropped)."""
    if gid is not None or groups:
        os.setgroups(sorted(set(groups) | ({gid} if gid is not None else set())))
    if gid is not None:
        os.setgid(gid)
    if uid is not None:
        os.setuid(uid)


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    # Opened while still root (the container's user may not write the pod's folder); closed
    # by the exec, so the container never holds it.
    start_error = os.open(spec["start_error"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                          | os.O_CLOEXEC, 0o600)
    socket.sethostname(spec["hostname"])
    stashed = stash(spec.get("image") or [])
    mount_all(spec["mounts"])
    restore(stashed, for_user=bool(spec.get("uid")))
    become(spec.get("uid"), spec.get("gid"), spec.get("groups") or [])
    os.chdir(spec["cwd"])
    argv: list[str] = spec["argv"]
    env: dict[str, str] = spec["env"]
    program = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH", ""))
    if program is None or not os.path.exists(program):
        _cannot_start(start_error, f'exec: "{argv[0]}": executable file not found in $PATH',
                      NOT_FOUND)
    try:
        os.execve(program, argv, env)
    except OSError as e:
        _cannot_start(start_error, f'exec: "{argv[0]}": {e.strerror}', NOT_EXECUTABLE)


def _cannot_start(fd: int, message: str, code: int) -> NoReturn:
    print(message, file=sys.stderr)
    os.write(fd, message.encode())
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1])

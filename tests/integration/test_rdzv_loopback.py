"""A local leg's rendezvous store listens on loopback alone: torch keeps the rendezvous
state pickled there, so a peer on the network that reached it would run code in the
agents. Real store processes; the peer connects from this machine's own non-loopback
addresses."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from resumequal.local.processes import ProcessTree
from testing.ports import free_port
from tests.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]


def _own_addresses() -> list[str]:
    """This machine's addresses that are not loopback (as `hostname -I` lists them)."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True,
                             timeout=10).stdout
    except OSError:
        out = ""
    found = {a for a in out.split() if not ipaddress.ip_address(a.split("%")[0]).is_loopback}
    for info in socket.getaddrinfo(socket.gethostname(), None):
        address = str(info[4][0])
        if not ipaddress.ip_address(address.split("%")[0]).is_loopback:
            found.add(address)
    return sorted(found)


@pytest.mark.waits
def test_the_store_serves_loopback_and_refuses_this_machines_other_addresses(
        tmp_path: Path) -> None:
    addresses = _own_addresses()
    if not addresses:
        pytest.skip("this machine has no non-loopback address to connect from")
    port = free_port()
    tree = ProcessTree()
    log = tmp_path / "store.log"
    try:
        store = tree.spawn([sys.executable, "-m", "resumequal.local.rdzv_store",
                            f"--port={port}"], log, dict(os.environ))
        eventually(lambda: "serving on 127.0.0.1" in log.read_text(), 60, "the store",
                   abort=lambda: None if store.poll() is None else log.read_text())
        from torch.distributed import TCPStore

        client = TCPStore("127.0.0.1", port, is_master=False,
                          timeout=datetime.timedelta(seconds=10))
        client.set("torch.rendezvous.probe", b"state")  # what an agent writes
        assert client.get("torch.rendezvous.probe") == b"state"
        for address in addresses:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as peer:
                peer.settimeout(5)
                with pytest.raises(ConnectionRefusedError):
                    peer.connect((address, port))
    finally:
        tree.stop_all(grace_seconds=1)


def _listening() -> set[tuple[str, int]]:
    """(address, port) of every IPv4 and IPv6 TCP socket listening on this machine."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            if state == "0A":  # TCP_LISTEN
                address, port = local.rsplit(":", 1)
                found.add((address, int(port, 16)))
    return found


# Every process of a run inherits its environment, this mark with it.
RUN_MARK = "RESUMEQUAL_TEST_RUN"


def _marked(run_dir: Path) -> list[int]:
    """The live processes whose environment carries ``RUN_MARK=run_dir``."""
    mark = f"{RUN_MARK}={run_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and mark in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _listening_sockets(pids: list[int]) -> dict[int, set[str]]:
    """Each of ``pids``' listening TCP sockets: pid -> its addresses (/proc/net hex)."""
    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes[target[8:-1]] = pid
        except OSError:
            continue
    found: dict[int, set[str]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # TCP_LISTEN, one of theirs
                found.setdefault(inodes[fields[9]], set()).add(fields[1].rsplit(":", 1)[0])
    return found


def _armed_run(run_dir: Path) -> subprocess.Popen[bytes]:
    """A local run held while its preempted leg's rank 1 waits at its cut (no kill)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "resumequal", "run", "--run-dir", str(run_dir), "--no-kill",
         "--set", "workload.name=dropout-mlp", "--set", "controls.enabled=false",
         "--set", "timeouts.armSeconds=60"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=dict(os.environ, **{RUN_MARK: str(run_dir)}))
    beacon = run_dir / "preempted" / "beacons" / "attempt-0-rank-1.json"
    try:
        eventually(beacon.exists, 240, "the preempted leg to arm", interval=0.1,
                   abort=lambda: None if proc.poll() is None else f"exited {proc.returncode}")
    except BaseException:
        proc.kill()
        raise
    return proc


def _interrupt(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


@pytest.fixture(scope="module")
def armed_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One armed run for the tests below (they only look at it): its run folder."""
    run_dir = tmp_path_factory.mktemp("armed") / "run"
    proc = _armed_run(run_dir)
    try:
        yield run_dir
    finally:
        _interrupt(proc)


def test_nothing_of_a_running_local_leg_listens_beyond_loopback(armed_run: Path) -> None:
    """Every process of a local run (the runner, the leg's rendezvous store, its torchrun
    agent, its workers) listens on 127.0.0.1 alone: the workers' group store too (rank 0's,
    not the agent's, which torch would bind to every interface)."""
    listening = _listening_sockets(_marked(armed_run))
    assert listening, "nothing of the run listens: not the process tree expected"
    everywhere = {pid: addresses - {"0100007F"} for pid, addresses in listening.items()}
    assert not any(everywhere.values()), {
        pid: (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200],
              addresses) for pid, addresses in everywhere.items() if addresses}


def test_a_running_legs_rendezvous_port_listens_on_loopback_alone(armed_run: Path) -> None:
    store_log = (armed_run / "preempted.rdzv-store.log").read_text()
    port = int(store_log.rsplit(":", 1)[1])
    on_port = {address for address, p in _listening() if p == port}
    # 127.0.0.1 in /proc/net/tcp's little-endian hex; nothing on a wildcard address.
    assert on_port == {"0100007F"}, on_port

"""The operator under load: N QualificationRuns reconciled from apply to verdict.

The operator runs as its own process (``resumequal-operator run``, as in a pod, with a
token of the chart's ServiceAccount) against the local cluster built from source
(:mod:`testing.cluster`: the real kube-apiserver, etcd, controller manager and scheduler,
the real Kubeflow training operator), the chart installed by helm for its CRD and RBAC,
and the node agent running every pod, the legs' and comparator's containers played by the
scripted workers below in a process of their own
(:class:`testing.cluster.node.scriptnode.NodeRuntime`) at the lowest CPU priority: on two
cores they get what the operator and the API leave, as training processes on other
machines would take none of it. Needs root (the pods' network namespaces). The workers
write traces, beacons and verdicts into a ``file://`` store (no S3 endpoint in the way:
what is measured is the operator). Every run has 2 legs of 2 nodes x 1 rank, a hard kill
on rank 1, and a comparator Job.

Printed: reconcile latency percentiles (from the operator's own
``resumequal_operator_reconcile_duration_seconds`` histogram, interpolated within buckets as
``histogram_quantile`` does), how long runs waited in the operator's work queue before a
reconcile (``resumequal_operator_queue_wait_seconds``: changes and requeues at normal
priority, listings and resyncs at low), apply-to-verdict latency percentiles, reconciles
per second,
the operator process's peak resident memory (VmHWM), and the API requests the operator
made (per reconcile; Events, which its recorder writes apart from the reconciles, GETs of
a QualificationRun and status writes counted apart).

    python bench/operator_reconcile.py [--runs 200] [--concurrency 50] [--workers 4]
                                       [--poll-seconds 1] [--held 1800]
                                       [--placement apart|spread|shared]

At most ``--concurrency`` runs are in flight; finished ones stay (the operator keeps
resyncing them), so it ends holding all of them. ``--held N`` runs the same load twice in
one go, first alone, then with N more runs already finished when the operator starts (as
after a restart of an operator that has held them for weeks: the status a finished run
keeps, its verdict.json in the store), and prints the ratios of the second to the first:
reconcile p99, peak memory and the queue wait p99 of changes with ``runs + N`` held
against ``runs``.

Placed as far as a machine of two cores can stand for a cluster, where the operator's pod
and the API server run on machines of their own: the control plane (etcd, kube-apiserver,
the controller manager, the scheduler) alone on one CPU, as on a control plane node; the
operator on the other, with the services a worker node runs beside it (the Kubeflow
training operator and its webhook, CoreDNS, SeaweedFS) at its priority, and the node agent
(this process) and the pods' process at the lowest, as kubelets and training processes on
other machines would take none of its CPU. The operator's requests do not wait for the
API's CPU on its core, nor the API's answers for the operator's, and neither process's
threads (which run one at a time anyway) move between the cores.
``--placement spread`` lets the control plane use both cores below the operator's priority
(and that of its node's services): a control plane node of two cores, kubeadm's least,
whose second core is what the operator's node leaves. ``--placement shared`` lets the
scheduler place everything on both cores (what the bench did before it placed them): the
operator and the API server then take turns on the cores, each waiting for the other's
threads.

Also printed: the share of reconciles over 50 ms (exact, at a bucket's bound: the p99 is
under 50 ms exactly when it is at most 1%), the CPU of each of the cluster's programs, and
what the API server served most (every client's requests).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# The repository root: the local cluster (testing/) and the operator tests' harness (tests/).
sys.path.insert(0, str(REPO))

from resumequal.local.backend import free_port  # noqa: E402
from resumequal.qualify.machine import LegRun, Phase, QualificationStatus, Reason  # noqa: E402
from resumequal.qualify.plan import qualification_plan  # noqa: E402
from resumequal.results.verdict import PhaseEvent, Result  # noqa: E402
from resumequal.run.location import RunLocation  # noqa: E402
from resumequal.run.name import run_uri  # noqa: E402
from resumequal.run.signing import new_key  # noqa: E402
from resumequal_operator import pytorchjob  # noqa: E402
from resumequal_operator.controller import FINALIZER  # noqa: E402
from resumequal_operator.kube import QUALIFICATION_RUNS  # noqa: E402
from resumequal_operator.runkeys import MasterKey  # noqa: E402
from resumequal_operator.status import run_status  # noqa: E402
from resumequal_operator.validation import parse_run_spec, qualification_spec  # noqa: E402
from testing.cluster.node.scriptnode import NodeRuntime  # noqa: E402
from testing.operator.harness import run_manifest  # noqa: E402
from testing.operator.workers import Workers, verdict  # noqa: E402

NAMESPACE = "quals"
# The pods' process runs at the lowest CPU priority (see measure).
NODE_NICE = 19
# --placement spread: the control plane on both cores, below the operator and its node's
# services (which take a core's CPU from it at once when they want it), above the node
# agent and the pods (other machines' in a cluster).
CONTROL_PLANE_SPREAD_NICE = 5
# Timeouts sized for many runs' pods simulated on 2 cores.
TIMEOUTS = {"armSeconds": 900, "restartSeconds": 900, "processGroupSeconds": 1000,
            "legSeconds": 1800}


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _bucket_quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus' histogram_quantile over one series' cumulative buckets (bound: count)."""
    ordered = sorted(buckets.items())
    rank = q * ordered[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / max(
                count - lower_count, 1e-12)
        lower_bound, lower_count = bound, count
    return lower_bound


def api_server_waits(controlplane: Any) -> None:
    """Where the API server's time went over the run, from its own metrics: the wait of
    each priority level's requests in API Priority and Fairness' queues, and each verb's
    whole request (all clients; the node agent's and the controllers' too)."""
    with urllib.request.urlopen(f"{controlplane.server}/metrics", timeout=30,
                                context=controlplane.ssl_context()) as r:
        text = r.read().decode()
    wanted = {"apiserver_flowcontrol_request_wait_duration_seconds_bucket": "priority_level",
              "apiserver_request_duration_seconds_bucket": "verb"}
    series: dict[tuple[str, str], dict[float, float]] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name not in wanted or 'execute="false"' in rest:
            continue
        labels, _, value = rest.rpartition("} ")
        fields = dict(part.split("=", 1) for part in labels.split(",") if "=" in part)
        key = (name, fields[wanted[name]].strip('"'))
        bound = float(fields["le"].strip('"'))
        series.setdefault(key, {})
        series[key][bound] = series[key].get(bound, 0.0) + float(value)
    # What the API server served most (every client's requests), by verb and resource.
    served: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels, _, value = line[len("apiserver_request_total{"):].rpartition("} ")
            fields = {k: v.strip('"') for k, v in
                      (part.split("=", 1) for part in labels.split(",") if "=" in part)}
            what = fields["resource"] + (f"/{fields['subresource']}"
                                         if fields.get("subresource") else "")
            key = f"{fields['verb']} {what}"
            served[key] = served.get(key, 0.0) + float(value)
    top = sorted(served.items(), key=lambda kv: -kv[1])[:16]
    print("API server served most: " + ", ".join(f"{k} {v:.0f}" for k, v in top))
    for (name, group), buckets in sorted(series.items()):
        count = buckets.get(float("inf"), 0.0)
        if count:
            what = "APF queue wait" if "flowcontrol" in name else "API server request"
            print(f"{what} {group:24s} {count:7.0f}, p50 "
                  f"{_bucket_quantile(0.5, buckets) * 1000:7.1f}ms, p99 "
                  f"{_bucket_quantile(0.99, buckets) * 1000:7.1f}ms")


def histogram_quantile(q: float, metrics: dict[str, float], family: str,
                       labels: str = "") -> float:
    """Prometheus' histogram_quantile over one histogram family (the series whose labels
    after ``le`` are ``labels``, e.g. ``,priority="normal"``)."""
    return _bucket_quantile(q, {
        float(k.split('le="')[1].split('"')[0]): v for k, v in metrics.items()
        if k.startswith(f"{family}_bucket{{le=") and k.endswith(f'"{labels}}}')})


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentiles(values: list[float]) -> str:
    qs = statistics.quantiles(values, n=100, method="inclusive")
    return f"p50 {qs[49]:.3f}s  p90 {qs[89]:.3f}s  p99 {qs[98]:.3f}s"


def pin_threads(pid: int, cpus: int | set[int], nice: int | None = None) -> None:
    """Every thread of process ``pid`` (and those it starts later) onto ``cpus``, at
    ``nice`` if given (a thread's priority is its own on Linux; new ones inherit it)."""
    allowed = {cpus} if isinstance(cpus, int) else cpus
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that has ended
            os.sched_setaffinity(int(task.name), allowed)
            if nice is not None:
                os.setpriority(os.PRIO_PROCESS, int(task.name), nice)


def wait_ready(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    """Until the operator's /readyz answers; the end of its log when it never does."""
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1)
            return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the operator did not become ready: "
                                 f"{log.read_text(errors='replace')[-2000:]}") from None
            time.sleep(0.1)


def held_status(obj: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The status a run that finished an hour ago keeps (its machine in Succeeded, the
    verdict summary), and its location."""
    meta = obj["metadata"]
    name = meta["name"]
    # The spec a run keeps in its status as it started: the backend pinned in it.
    run_spec = {**obj["spec"], "backend": "pytorchjob"}
    spec = parse_run_spec(run_spec)
    uri = run_uri(spec.store.uri, NAMESPACE, name, meta["uid"])
    plan = qualification_plan(qualification_spec(spec, uri))
    t = time.time() - 3600
    machine = QualificationStatus(
        phase=Phase.SUCCEEDED, reason=Reason.COMPLETED, message="PASS: held",
        history=[PhaseEvent(phase=p.value, at=t + k) for k, p in enumerate(
            (Phase.PENDING, Phase.LEGS_RUNNING, Phase.ARMED, Phase.PREEMPTED,
             Phase.RESUMED, Phase.COMPARING, Phase.SUCCEEDED))],
        legs={p.name: LegRun(launched_at=t, finished_at=t + 5, steps=6,
                             attempts=2 if p.cut else 1,
                             killed_at=t + 2 if p.cut else None,
                             resumed_at=t + 3 if p.cut else None) for p in plan.legs})
    machine.verdict = verdict(Result.PASS)
    status = run_status(
        machine, previous=None, generation=meta.get("generation"),
        pin=spec.stack.effective_pin, run_uri=uri, report_url=f"{uri}/report.html",
        leg_jobs={p.name: pytorchjob.leg_job_name(name, meta["uid"], p.name)
                  for p in plan.legs},
        comparator_job=pytorchjob.comparator_job_name(name, meta["uid"]),
        preemption_mode=spec.preemption.mode, run_spec=run_spec, backend="pytorchjob")
    return status.to_k8s(), uri


def seal_verdict(uri: str, uid: str, master: MasterKey) -> None:
    """The run's verdict.json in the store, sealed as the run's comparator seals it: with
    the key the operator makes for it."""
    body = verdict(Result.PASS).model_dump_json().encode()
    location = RunLocation.open(uri, seal=master.seal(uid))
    location.store.put_bytes("verdict.json", body, sync=False)
    location.store.put_bytes("verdict.json.mac", master.seal(uid).digest_mac(
        "verdict.json", hashlib.sha256(body).hexdigest()).encode(), sync=False)


def held_manifest(i: int, store: dict[str, str]) -> dict[str, Any]:
    manifest = run_manifest(f"held-{i:05d}", store, timeouts=TIMEOUTS)
    manifest["metadata"]["finalizers"] = [FINALIZER]  # added when it was first seen
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--poll-seconds", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument("--concurrency", type=int, default=50,
                        help="runs in flight at once (the simulated pods share 2 cores)")
    parser.add_argument("--held", type=int, default=0,
                        help="also run with this many more runs finished beforehand, and "
                             "print the ratios")
    parser.add_argument("--placement", choices=("apart", "spread", "shared"), default="apart",
                        help="apart: the control plane alone on one core, the operator on "
                             "the other; spread: the control plane on both, below the "
                             "operator; shared: every process on both, placed by the "
                             "scheduler (see the docstring)")
    args = parser.parse_args()
    # A SIGTERM (a timeout's) unwinds like Ctrl-C, so the cluster started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.cpus = None
    if args.placement != "shared":
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            parser.error("placing the operator apart needs two CPUs; with one, use "
                         "--placement shared")
        args.cpus = (cpus[0], cpus[1])  # the operator's, the control plane's
        # This process is the node agent: a worker node's, beside the operator at the
        # lowest priority, the other core left to the control plane (place_cluster).
        pin_threads(os.getpid(), args.cpus[0], nice=NODE_NICE)
    # This process runs the node agent for every pod: with its default thresholds, its
    # garbage collector's full passes over that heap would stall the agent at times.
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    first = measure_real(args, held=0)
    if args.held:
        second = measure_real(args, held=args.held)
        print(f"held {args.runs + args.held} / {args.runs}: reconcile p99 "
              f"{second['p99'] / first['p99']:.2f}x ({second['p99'] * 1000:.1f}ms / "
              f"{first['p99'] * 1000:.1f}ms), peak RSS {second['rss'] / first['rss']:.2f}x "
              f"({second['rss']:.0f} / {first['rss']:.0f} MiB), queue wait p99 of changes "
              f"{second['wait_p99'] / first['wait_p99']:.2f}x ({second['wait_p99'] * 1000:.0f}"
              f"ms / {first['wait_p99'] * 1000:.0f}ms)")


# The control plane's programs, as /proc/<pid>/comm names them (cut at 15 characters).
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller", "kube-scheduler")


def cluster_cpu(cluster_id: str) -> dict[str, float]:
    """CPU seconds so far of each of the local cluster's processes, by program (etcd, the
    API server, the controller manager, the scheduler, the Kubeflow controllers...)."""
    from resumequal.local.processes import tagged
    from testing.cluster.daemons import TAG

    seconds: dict[str, float] = {}
    for pid in tagged(cluster_id, TAG):
        with contextlib.suppress(OSError):
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            seconds[comm] = seconds.get(comm, 0.0) + cpu_seconds(pid)
    return seconds


def place_cluster(cluster_id: str, nodes_cpu: int, control_plane_cpu: int,
                  spread: bool = False) -> None:
    """The local cluster's processes placed as a cluster's machines hold them: etcd, the API
    server, the controller manager and the scheduler (a control plane node's) alone on
    ``control_plane_cpu`` (``spread``: on both cores, below every other process but the
    node agent's); the rest (CoreDNS, the Kubeflow controllers, SeaweedFS: services
    on worker nodes, as the operator is) on ``nodes_cpu`` beside the operator, at its
    priority (this process, the node agent, and the scripted pods' at the lowest)."""
    from resumequal.local.processes import tagged
    from testing.cluster.daemons import TAG

    for pid in tagged(cluster_id, TAG):
        with contextlib.suppress(OSError):
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            # Started by this process (or the node agent in it): its priority undone.
            if comm not in CONTROL_PLANE:
                pin_threads(pid, nodes_cpu, nice=0)
            elif spread:
                # Go's runtime follows the affinity: two cores, GOMAXPROCS 2 within a second.
                pin_threads(pid, {nodes_cpu, control_plane_cpu}, nice=CONTROL_PLANE_SPREAD_NICE)
            else:
                pin_threads(pid, control_plane_cpu, nice=0)


def hold_finished_real(objects: Any, store: dict[str, str], count: int,
                       master: MasterKey) -> None:
    """``count`` runs that finished before the operator started: each with the finalizer
    and the status a finished run keeps and its verdict.json in the store, written through
    the API server as the admin. The operator finds nothing to change in them: it writes
    none of their statuses."""
    group, version, plural = (QUALIFICATION_RUNS.group, QUALIFICATION_RUNS.version,
                              QUALIFICATION_RUNS.plural)
    for i in range(count):
        obj = objects.create_namespaced_custom_object(group, version, NAMESPACE, plural,
                                                      held_manifest(i, store))
        status, uri = held_status(obj)
        objects.replace_namespaced_custom_object_status(
            group, version, NAMESPACE, plural, obj["metadata"]["name"], {**obj, "status": status})
        seal_verdict(uri, obj["metadata"]["uid"], master)


def measure_real(args: argparse.Namespace, held: int) -> dict[str, float]:
    """One operator process through ``args.runs`` runs (``held`` more finished already),
    against the local cluster built from source: the real
    kube-apiserver, etcd, controller manager and scheduler, the real Kubeflow training
    operator; the node agent in this process with the legs' and comparator's containers
    played by the scripted workers in a node process of their own (at the lowest CPU
    priority), every other pod a real process; the chart installed with helm (its CRD,
    RBAC and ServiceAccount; no operator Deployment), and the operator as a process of
    its own with a token of the chart's ServiceAccount."""
    from kubernetes import client, config

    from testing.cluster import cluster as local
    from testing.cluster import controlplane
    from testing.cluster.podcluster import PodCluster

    # The operator tests' pod cluster, apart from make cluster-up's: its node agent in this
    # process, the runs' containers the scripted workers of one node process, bound here.
    pods = PodCluster(NAMESPACE)
    try:
        cluster = pods.cluster
        cp = cluster.controlplane
        workers = Workers(hold_timeout=args.timeout)
        node = NodeRuntime(workers)
        assert node.pid is not None
        os.setpriority(os.PRIO_PROCESS, node.pid, NODE_NICE)
        pods.scripts.bind(lambda: node)
        token = cluster.kubectl("create", "token", "resumequal", "-n",
                                local.OPERATOR_NAMESPACE, "--duration=6h").strip()
        with tempfile.TemporaryDirectory(prefix="rq-bench-") as tmp:
            kubeconfig = Path(tmp) / "operator.kubeconfig"
            kubeconfig.write_text(controlplane.kubeconfig(cp.server, cp.pki / "ca.crt",
                                                          "resumequal", token=token))
            admin = client.Configuration()
            config.load_kube_config(config_file=str(cp.admin_kubeconfig),
                                    client_configuration=admin)
            objects = client.CustomObjectsApi(client.ApiClient(admin))
            store = {"uri": f"file://{tmp}/store"}
            key_file = Path(tmp) / "master-key"
            key_file.write_text(new_key())
            key_file.chmod(0o400)
            hold_finished_real(objects, store, held, MasterKey.from_file(key_file))
            figures = _run_operator(args, held, cluster.id, kubeconfig, key_file, objects,
                                    store, node.pid, Path(tmp))
            api_server_waits(cp)
            return figures
    finally:
        pods.close()


def _run_operator(args: argparse.Namespace, held: int, cluster_id: str, kubeconfig: Path,
                  key_file: Path, objects: Any, store: dict[str, str], node_pid: int,
                  tmp: Path) -> dict[str, float]:
    """The operator's process through ``args.runs`` runs on the real API server."""
    import threading

    from kubernetes import watch

    port = free_port()
    env = dict(os.environ, KUBECONFIG=str(kubeconfig), POD_NAME="bench",
               POD_NAMESPACE="resumequal-system")
    log = open(tmp / "operator.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-c", "from resumequal_operator.main import main; main()", "run",
         "--namespace", NAMESPACE, "--port", str(port), "--workers", str(args.workers),
         "--poll-seconds", str(args.poll_seconds), "--key-file", str(key_file),
         "--log-level", "WARNING"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    finished: dict[str, tuple[float, str]] = {}
    stop = threading.Event()

    def follow() -> None:
        # The runs' phases from a watch (as a client follows them), not a listing per poll.
        group, version, plural = (QUALIFICATION_RUNS.group, QUALIFICATION_RUNS.version,
                                  QUALIFICATION_RUNS.plural)
        while not stop.is_set():
            with contextlib.suppress(Exception):
                for event in watch.Watch().stream(
                        objects.list_namespaced_custom_object, group, version, NAMESPACE,
                        plural, timeout_seconds=60):
                    obj = event["object"]
                    name, status = obj["metadata"]["name"], obj.get("status") or {}
                    if status.get("phase") in ("Succeeded", "Failed") and name not in finished:
                        ready = next((c for c in status.get("conditions") or []
                                      if c["type"] == "Ready"), {})
                        finished[name] = (time.time(), status["phase"] if status["phase"]
                                          == "Succeeded" else f"{ready.get('reason')}: "
                                          f"{ready.get('message')}")
                    if stop.is_set():
                        return

    try:
        wait_ready(proc, port, tmp / "operator.log")
        if args.cpus is not None:
            pin_threads(proc.pid, args.cpus[0], nice=0)
            place_cluster(cluster_id, args.cpus[0], args.cpus[1],
                          spread=args.placement == "spread")
        threading.Thread(target=follow, daemon=True).start()
        created: dict[str, float] = {}
        start = time.monotonic()
        bench_cpu_start = time.process_time()
        pods_cpu_start = cpu_seconds(node_pid)
        cluster_cpu_start = cluster_cpu(cluster_id)
        mine = {n for n in finished}  # the held ones, finished before
        while len(set(finished) - mine) < args.runs:
            done = len(set(finished) - mine)
            while len(created) < min(args.runs, done + args.concurrency):
                name = f"run-{len(created):04d}"
                objects.create_namespaced_custom_object(
                    QUALIFICATION_RUNS.group, QUALIFICATION_RUNS.version, NAMESPACE,
                    QUALIFICATION_RUNS.plural, run_manifest(name, store, timeouts=TIMEOUTS))
                created[name] = time.time()
            if time.monotonic() - start > args.timeout:
                raise SystemExit(f"only {done} of {args.runs} runs finished in "
                                 f"{args.timeout:g}s")
            time.sleep(0.2)
        wall = time.monotonic() - start
        metrics = scrape(port)
        rss = peak_rss_mib(proc.pid)
        operator_cpu = cpu_seconds(proc.pid)
        bench_cpu = time.process_time() - bench_cpu_start
        pods_cpu = cpu_seconds(node_pid) - pods_cpu_start
        cluster_cpu_end = cluster_cpu(cluster_id)
        cluster_used = {comm: seconds - cluster_cpu_start.get(comm, 0.0)
                        for comm, seconds in cluster_cpu_end.items()}
    finally:
        stop.set()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    return summarize(args, held, Figures(
        metrics, created, {n: v for n, v in finished.items() if n in created}, wall, rss,
        operator_cpu, bench_cpu, pods_cpu, cluster_used,
        "the node agent, at the lowest priority beside the operator"))


@dataclass
class Figures:
    """What one measurement collected."""

    metrics: dict[str, float]
    created: dict[str, float]
    finished: dict[str, tuple[float, str]]
    wall: float
    rss: float
    operator_cpu: float
    bench_cpu: float
    pods_cpu: float | None
    cluster_cpu: dict[str, float]  # by program
    here: str  # what this process serves besides the bench


def api_requests(metrics: dict[str, float], reconcile_seconds: float) -> None:
    """The operator's requests to the API server by verb and resource (count, mean, p99),
    and their seconds against the reconciles' (Events and the Lease are written apart)."""
    family = "resumequal_operator_api_request_duration_seconds"
    series = sorted(k[len(family) + len("_count"):] for k in metrics
                    if k.startswith(f"{family}_count{{"))
    within = 0.0
    for labels in series:
        count = metrics[f"{family}_count{labels}"]
        if not count:
            continue
        total = metrics[f"{family}_sum{labels}"]
        p99 = histogram_quantile(0.99, metrics, family, "," + labels[1:-1])
        if 'resource="events"' not in labels and 'resource="leases"' not in labels:
            within += total
        print(f"API {labels[1:-1]:58s} {count:6.0f} requests, mean "
              f"{total / count * 1000:6.1f}ms, p99 {p99 * 1000:6.1f}ms")
    if series and reconcile_seconds:
        print(f"API seconds (Events and the Lease aside) {within:.1f}s against reconciles' "
              f"{reconcile_seconds:.1f}s ({within / reconcile_seconds:.0%})")


def summarize(args: argparse.Namespace, held: int, f: Figures) -> dict[str, float]:
    """Print the figures; return reconcile p99 (s), peak RSS (MiB), queue wait p99 (s)."""
    metrics, created, finished, wall = f.metrics, f.created, f.finished, f.wall
    family = "resumequal_operator_reconcile_duration_seconds"
    reconciles = metrics[f"{family}_count"]
    failed = sorted(n for n, (_, phase) in finished.items() if phase != "Succeeded")
    verdicts = [finished[n][0] - created[n] for n in created]
    print(json.dumps({"runs": args.runs, "held": held, "succeeded": args.runs - len(failed),
                      "concurrency": args.concurrency, "workers": args.workers,
                      "poll_seconds": args.poll_seconds,
                      "pods": f"a process of their own, nice {NODE_NICE}",
                      "placement": args.placement,
                      "cpus": None if args.cpus is None else
                      {"operator, worker nodes' services, node agent and pods": args.cpus[0],
                       "control plane": [args.cpus[1]] if args.placement == "apart" else
                       [args.cpus[1], args.cpus[0]]}}))
    print(f"reconciles: {reconciles:.0f} in {wall:.1f}s ({reconciles / wall:.0f}/s), "
          f"errors {metrics.get('resumequal_operator_reconcile_errors_total', 0):.0f}")
    mean_ms = metrics[f"{family}_sum"] / reconciles * 1000
    print("reconcile latency:  " + "  ".join(
        f"p{round(q * 100)} {histogram_quantile(q, metrics, family) * 1000:.1f}ms"
        for q in (0.5, 0.9, 0.99)) + f"  (mean {mean_ms:.1f}ms)")
    # Exact at a bucket's bound, where the p99 is interpolated within a bucket: the p99 is
    # under 50 ms exactly when at most 1% of the reconciles took longer.
    within = metrics.get(f'{family}_bucket{{le="0.05"}}', 0.0)
    print(f"reconciles over 50 ms: {reconciles - within:.0f} ({1 - within / reconciles:.2%})")
    # What a change waits for a worker before its reconcile starts: with the reconcile,
    # how late the operator acts on it (a kill is delivered, a leg launched). Listings and
    # resyncs (low priority) wait behind changes.
    waits = "resumequal_operator_queue_wait_seconds"
    for priority in ("normal", "low"):
        labels = f',priority="{priority}"'
        count = metrics.get(f"{waits}_count{{{labels[1:]}}}", 0)
        total = metrics.get(f"{waits}_sum{{{labels[1:]}}}", 0)
        if count:
            print(f"queue wait, {priority + ':':8s}" + "  ".join(
                f"p{round(q * 100)} {histogram_quantile(q, metrics, waits, labels) * 1000:.1f}ms"
                for q in (0.5, 0.9, 0.99)) + f"  (mean {total / count * 1000:.1f}ms, "
                f"{count:.0f} keys)")
    api_requests(metrics, metrics[f"{family}_sum"])
    print(f"apply to verdict:   {percentiles(verdicts)}")
    # Wall time in a reconcile is its CPU plus waiting: on the API (served by this
    # process, which also plays the training operator, the Job controller and the kubelet)
    # and for a core.
    here = f.here + (", pods" if f.pods_cpu is None else "")
    operator_cpu, bench_cpu, pods_cpu, rss = f.operator_cpu, f.bench_cpu, f.pods_cpu, f.rss
    pods = "" if pods_cpu is None else f", the pods' process {pods_cpu:.1f}s"
    print(f"CPU:                operator {operator_cpu:.1f}s "
          f"({operator_cpu / reconciles * 1000:.2f}ms/reconcile, whole process), the "
          f"control plane {sum(v for k, v in f.cluster_cpu.items() if k in CONTROL_PLANE):.1f}s"
          f" ({', '.join(f'{k} {v:.1f}s' for k, v in sorted(f.cluster_cpu.items()))}), this "
          f"process ({here}) {bench_cpu:.1f}s{pods}, in {wall:.1f}s on "
          f"{os.cpu_count()} CPUs")
    print(f"operator peak RSS:  {rss:.0f} MiB")
    for name in failed[:5]:
        print(f"not Succeeded: {name}: {finished[name][1]}")
    return {"p99": histogram_quantile(0.99, metrics, family), "rss": rss,
            "wait_p99": histogram_quantile(0.99, metrics, waits, ',priority="normal"')}


if __name__ == "__main__":
    main()

"""Operator scale benchmark: issue 24's four figures from one control plane, one operator, one run.

In order, on one `hack/cluster up` and one `stoker run` process:

1. burst: `--burst` VLLMServices created at once. Per service, its creation -> its Deployment; as the
   yardstick in the same burst, the Deployment controller's Deployment -> ReplicaSet.
2. fill to `--existing` services and wait until they are settled (Ready, spec observed), then a quiet
   resync: one full drift resync period with nothing changed. Counted: the operator's write requests (the
   API server's audit log; the operator signs in as a user of its own) and the children whose
   resourceVersion moved.
3. scale: `--scales` `kubectl scale` of one service among them, each: the service's new replicas ->
   `spec.replicas` on its Deployment.
4. fill to `--at` services: the operator's resident memory and CPU seconds.

Every latency is between two watch events as this process received them, never a poll. The figures go
to --out (bench/results/operator-scale.json); every sample, the load average at each phase and the
operator's requests per phase to --raw.

    .venv/bin/python bench/operator_scale.py [--burst 200 --existing 500 --scales 50 --at 1000]
    .venv/bin/python bench/operator_scale.py --burst 20 --existing 50 --scales 10 --at 100 \\
        --out /tmp/operator-scale-smoke.json --raw /tmp/operator-scale-smoke-raw.txt   # smoke check

The control plane's dir, ports and pod range come from STOKER_CLUSTER_DIR, STOKER_CLUSTER_PORT_BASE and
STOKER_POD_CIDR (defaults below); the operator's metrics port from --metrics-port. Both are taken down at
the end.
"""

from __future__ import annotations

import argparse
import base64
import bisect
import datetime as dt
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, cast

import yaml
from kubernetes import client, config, watch

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "scale"
GROUP, VERSION, PLURAL = "stoker.dev", "v1alpha1", "vllmservices"
CLUSTER_DEFAULTS = {
    "STOKER_CLUSTER_DIR": "/tmp/stoker-bench-cluster",
    "STOKER_CLUSTER_PORT_BASE": "25600",
    "STOKER_POD_CIDR": "10.238.0.0/16",
}
# The operator signs in as this user (system:masters, as the admin), so that the audit log tells its
# requests from the controllers' and this benchmark's, whatever user agent a version of it sends.
OPERATOR_USER = "stoker-bench-operator"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [{"level": "Metadata", "users": [OPERATOR_USER]}, {"level": "None"}],
}
# The kinds stoker renders, and the service itself: their resourceVersions before and after the quiet resync.
CHILD_LISTS = {
    "Deployment": ("AppsV1Api", "list_namespaced_deployment"),
    "Service": ("CoreV1Api", "list_namespaced_service"),
    "PersistentVolumeClaim": ("CoreV1Api", "list_namespaced_persistent_volume_claim"),
    "Job": ("BatchV1Api", "list_namespaced_job"),
    "Secret": ("CoreV1Api", "list_namespaced_secret"),
    "ConfigMap": ("CoreV1Api", "list_namespaced_config_map"),
}


MAX_NODES = 40
PODS_PER_SERVICE = 1.25  # its serving pod and, while it runs, its seed Job's pod


# ------------------------------------------------------------------------------------------- figures
QUIET_SECONDS = 10.0  # no VLLMService written this long: the services are settled for the quiet resync


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of the samples (the p99 of 50 samples is their 49th smallest)."""
    if not values:
        raise ValueError("no samples")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"p50": None, "p99": None, "mean": None, "max": None, "samples": 0}
    return {
        "p50": round(statistics.median(values), 3),
        "p99": round(percentile(values, 0.99), 3),
        "mean": round(statistics.fmean(values), 3),
        "max": round(max(values), 3),
        "samples": len(values),
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None:
        return None
    return round(numerator / max(denominator, 1e-3), 2)


# ------------------------------------------------------------------------------------------- watches
@dataclass
class Sighting:
    at: float  # time.monotonic() when this process received the event
    type: str  # ADDED, MODIFIED, DELETED
    name: str
    owner: str | None  # the controller owner's name (VLLMService of a Deployment, Deployment of a ReplicaSet)
    replicas: int | None  # spec.replicas, or spec.runtime.replicas of a VLLMService
    settled: bool  # a VLLMService whose spec is observed and that is Ready


def sighting(event_type: str, obj: dict[str, Any], received: float) -> Sighting:
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    owner = next((ref["name"] for ref in meta.get("ownerReferences") or [] if ref.get("controller")), None)
    if obj.get("kind") == "VLLMService":
        replicas = (spec.get("runtime") or {}).get("replicas")
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        settled = ready and status.get("observedGeneration") == meta.get("generation")
    else:
        replicas, settled = spec.get("replicas"), False
    return Sighting(received, event_type, meta["name"], owner, replicas, settled)


class Timeline:
    """Every watch event of one resource in the benchmark's namespace, in the order it arrived."""

    def __init__(self, list_call: Callable[..., Any], *args: str) -> None:
        self.list_call, self.args = list_call, args
        self.events: list[Sighting] = []
        self.times: list[float] = []  # each event's arrival, for bisecting
        self.first_of_name: dict[str, float] = {}
        self.first_of_owner: dict[str, float] = {}
        self.last_of_owner: dict[str, Sighting] = {}
        self.last_of_name: dict[str, Sighting] = {}
        self.settled: set[str] = set()  # VLLMServices whose latest event says settled
        self.changed = threading.Condition()

    def follow(self, stop: threading.Event) -> None:
        while not stop.is_set():
            stream = watch.Watch()
            try:
                # Plain JSON, no model objects: the watcher must not lag behind what it times. Without a
                # timeout the client resumes from the last resourceVersion when the server ends a watch.
                for event in stream.stream(self.list_call, *self.args, deserialize=False):
                    received = time.monotonic()
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self.add(sighting(event["type"], event["object"], received))
                    if stop.is_set():
                        stream.stop()
            except Exception as error:  # a dropped watch is listed again, not fatal
                print(f"watch {self.list_call.__name__} restarted: {error}", file=sys.stderr)
                time.sleep(1)

    def add(self, seen: Sighting) -> None:
        with self.changed:
            self.events.append(seen)
            self.times.append(seen.at)
            self.first_of_name.setdefault(seen.name, seen.at)
            self.last_of_name[seen.name] = seen
            if seen.owner is not None:
                self.first_of_owner.setdefault(seen.owner, seen.at)
                self.last_of_owner[seen.owner] = seen
            if seen.settled:
                self.settled.add(seen.name)
            else:
                self.settled.discard(seen.name)
            self.changed.notify_all()

    def first(self, predicate: Callable[[Sighting], bool], after: float) -> float | None:
        """When the first event at or after `after` that satisfies `predicate` arrived."""
        with self.changed:
            start = bisect.bisect_left(self.times, after)
            return next((e.at for e in self.events[start:] if predicate(e)), None)

    def wait(self, done: Callable[[], bool], deadline: float) -> bool:
        """Until `done()` (called with the timeline's lock held) or the monotonic deadline."""
        with self.changed:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 1.0))
        return True


# ------------------------------------------------------------------------------------------- process
def resident_mib(pid: int, field_name: str) -> float:
    """VmRSS (now) or VmHWM (peak) of a process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field_name}:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no {field_name} for {pid}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def operator_metrics(port: int) -> str:
    """The operator's Prometheus exposition; empty if it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def metric_total(exposition: str, name: str) -> float:
    """Sum of a metric's series; 0 if this operator version does not export it."""
    return sum(
        float(line.split()[-1])
        for line in exposition.splitlines()
        if line.startswith(f"{name}{{") or line.startswith(f"{name} ")
    )


def metric_mean(exposition: str, histogram: str) -> float | None:
    """A histogram's mean over all its series; None if this operator version does not export it."""
    count = metric_total(exposition, f"{histogram}_count")
    return round(metric_total(exposition, f"{histogram}_sum") / count, 3) if count else None


def probe_api(core: client.CoreV1Api, samples: list[tuple[float, float]], stop: threading.Event) -> None:
    """(wall time, seconds) of a trivial GET every half second: how loaded the API server and machine are."""
    while not stop.wait(0.5):
        started = time.monotonic()
        try:
            cast(Any, core.read_namespace(NAMESPACE, _preload_content=False)).read()
        except Exception:  # an answer that fails is no latency sample; the run goes on
            continue
        samples.append((time.time(), time.monotonic() - started))


# ---------------------------------------------------------------------------------------------- audit
def audit_requests(path: Path, user: str) -> Iterator[tuple[float, str, str]]:
    """(wall time received, verb, resource[/subresource]) of each completed request of `user`."""
    with path.open() as lines:
        for line in lines:
            event = json.loads(line)
            if event.get("stage") != "ResponseComplete" or event["user"].get("username") != user:
                continue
            received = dt.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
            ref = event.get("objectRef") or {}
            resource = ref.get("resource", event.get("requestURI", "?"))
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            yield received.timestamp(), event["verb"], resource


def requests_by_phase(
    requests: list[tuple[float, str, str]], phases: dict[str, tuple[float, float]]
) -> dict[str, dict[str, Any]]:
    """Per phase: the write and read requests, by verb and resource (the ten commonest reads)."""
    out: dict[str, dict[str, Any]] = {}
    for phase, (start, end) in phases.items():
        inside = [(verb, resource) for at, verb, resource in requests if start <= at < end]
        writes = Counter(f"{verb} {resource}" for verb, resource in inside if verb in WRITE_VERBS)
        reads = Counter(f"{verb} {resource}" for verb, resource in inside if verb not in WRITE_VERBS)
        out[phase] = {
            "seconds": round(end - start, 1),
            "writes": sum(writes.values()),
            "reads": sum(reads.values()),
            "writesByVerbAndResource": dict(writes.most_common()),
            "readsByVerbAndResource": dict(reads.most_common(10)),
        }
    return out


# ------------------------------------------------------------------------------------------ the run
@dataclass
class Bench:
    args: argparse.Namespace
    raw: TextIO
    env: dict[str, str] = field(default_factory=dict)
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> wall start, end
    loads: dict[str, str] = field(default_factory=dict)

    def say(self, message: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')} load {load_average()}] {message}"
        print(line, flush=True)
        self.raw.write(line + "\n")
        self.raw.flush()

    def record(self, name: str, value: Any) -> None:
        """A raw series: kept in the raw output so that every figure can be recomputed."""
        self.raw.write(f"RAW {name} {json.dumps(value)}\n")
        self.raw.flush()

    def phase(self, name: str, start: float) -> None:
        self.phases[name] = (start, time.time())
        self.loads[name] = load_average()
        self.say(f"phase {name} done in {time.time() - start:.1f} s")


def manifest(index: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VLLMService",
        "metadata": {"name": f"svc-{index:04d}", "namespace": NAMESPACE},
        "spec": {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}, "runtime": {"replicas": 1}},
    }


def operator_kubeconfig(admin_kubeconfig: Path, pki: Path, workdir: Path) -> Path:
    """A kubeconfig signing in as OPERATOR_USER (group system:masters), issued by the cluster's own CA."""
    key, csr, crt, ext = (workdir / f"operator.{suffix}" for suffix in ("key", "csr", "crt", "ext"))
    ext.write_text("basicConstraints=critical,CA:FALSE\nextendedKeyUsage=clientAuth\n")
    subprocess.run(
        ["openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj",
         f"/O=system:masters/CN={OPERATOR_USER}", "-keyout", key, "-out", csr],
        check=True, capture_output=True,
    )  # fmt: skip
    subprocess.run(
        ["openssl", "x509", "-req", "-sha256", "-days", "2", "-in", csr, "-CA", pki / "ca.crt",
         "-CAkey", pki / "ca.key", "-CAcreateserial", "-CAserial", workdir / "ca.srl", "-extfile", ext,
         "-out", crt],
        check=True, capture_output=True,
    )  # fmt: skip
    kubeconfig = yaml.safe_load(admin_kubeconfig.read_text())
    kubeconfig["users"][0]["user"] = {
        "client-certificate-data": base64.b64encode(crt.read_bytes()).decode(),
        "client-key-data": base64.b64encode(key.read_bytes()).decode(),
    }
    path = workdir / "operator.kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    path.chmod(0o600)
    return path


def widen_nodes(api_client: client.ApiClient, services: int) -> int:
    """Raise the fake GPU nodes' GPUs and pod slots until every service's pods fit; returns GPUs a node."""
    core = client.CoreV1Api(api_client)
    nodes = [
        str(node.metadata.name) for node in core.list_node(label_selector="type=kwok").items if node.metadata
    ]
    gpus = max(8, math.ceil(services * PODS_PER_SERVICE / len(nodes)))
    room = {"nvidia.com/gpu": str(gpus), "pods": str(max(110, 2 * gpus))}
    for node in nodes:
        core.patch_node_status(node, {"status": {"capacity": room, "allocatable": room}})
    return gpus


def run(args: argparse.Namespace, raw: TextIO) -> dict[str, Any]:
    env = {**os.environ}
    for name, default in CLUSTER_DEFAULTS.items():
        env.setdefault(name, default)
    # kwok, at its default client rate, keeps about 60 nodes Ready at most on this machine: widen_nodes
    # gives these few the room of many.
    env.setdefault("GPU_NODES", str(min(MAX_NODES, math.ceil(args.at * PODS_PER_SERVICE / 8))))
    workdir = Path(tempfile.mkdtemp(prefix="stoker-bench-audit-"))
    policy, audit_log = workdir / "audit-policy.yaml", workdir / "audit.log"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    env["APISERVER_EXTRA_ARGS"] = " ".join(
        [
            env.get("APISERVER_EXTRA_ARGS", ""),
            f"--audit-policy-file={policy}",
            f"--audit-log-path={audit_log}",
        ]
    ).strip()
    bench = Bench(args, raw, env)
    cluster = REPO / "hack" / "cluster"
    bench.say(
        f"sizes burst={args.burst} existing={args.existing} scales={args.scales} at={args.at};"
        f" cluster {env['STOKER_CLUSTER_DIR']} ports {env['STOKER_CLUSTER_PORT_BASE']}+"
        f" {env['GPU_NODES']} GPU nodes; {os.cpu_count()} cores;"
        f" operator {operator_version(args.operator_ref)}"
    )
    try:
        started = time.time()
        subprocess.run([cluster, "up"], env=env, check=True)
        bench.phase("cluster-up", started)
        return measure(bench, cluster, workdir, audit_log)
    finally:
        subprocess.run([cluster, "down"], env=env, check=False)
        shutil.rmtree(workdir, ignore_errors=True)


def operator_version(ref: str | None) -> str:
    """The operator's commit: --operator-ref, or the working tree's HEAD and whether its src/ differs."""
    commit = subprocess.run(
        ["git", "-C", REPO, "rev-parse", "--short", f"{ref or 'HEAD'}^{{commit}}"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if ref:
        return commit
    dirty = subprocess.run(
        ["git", "-C", REPO, "status", "--porcelain", "--", "src"], capture_output=True, text=True
    ).stdout.strip()
    return f"{commit}{' + uncommitted changes in src/' if dirty else ''}"


def operator_tree(ref: str | None, workdir: Path) -> Path:
    """Where the operator's src/ and crds/ come from: the working tree, or --operator-ref exported."""
    if not ref:
        return REPO
    tree = workdir / "operator-tree"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", REPO, "archive", ref, "src", "crds"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
    return tree


def measure(bench: Bench, cluster: Path, workdir: Path, audit_log: Path) -> dict[str, Any]:
    args, env = bench.args, bench.env
    exports = subprocess.run([cluster, "env"], env=env, check=True, capture_output=True, text=True).stdout
    admin_kubeconfig = Path(exports.split('KUBECONFIG="')[1].split('"')[0])
    bin_dir = exports.split('PATH="')[1].split(":")[0]
    kube_env = dict(env, KUBECONFIG=str(admin_kubeconfig), PATH=f"{bin_dir}:{env['PATH']}")
    kubectl = f"{bin_dir}/kubectl"
    tree = operator_tree(args.operator_ref, workdir)
    subprocess.run([kubectl, "apply", "--server-side", "-f", tree / "crds"], env=kube_env, check=True)
    subprocess.run(
        [kubectl, "wait", "--for=condition=Established", f"crd/{PLURAL}.{GROUP}"], env=kube_env, check=True
    )
    subprocess.run([kubectl, "create", "namespace", NAMESPACE], env=kube_env, check=True)

    configuration = client.Configuration()
    config.load_kube_config(str(admin_kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = 32
    api_client = client.ApiClient(configuration)
    api_client.user_agent = "stoker-bench"
    custom, apps = client.CustomObjectsApi(api_client), client.AppsV1Api(api_client)
    bench.say(f"fake GPU nodes widened to {widen_nodes(api_client, args.at)} GPUs each")

    services = Timeline(custom.list_namespaced_custom_object, GROUP, VERSION, NAMESPACE, PLURAL)
    deployments = Timeline(apps.list_namespaced_deployment, NAMESPACE)
    replica_sets = Timeline(apps.list_namespaced_replica_set, NAMESPACE)
    stop = threading.Event()
    for timeline in (services, deployments, replica_sets):
        threading.Thread(target=timeline.follow, args=(stop,), daemon=True).start()
    api_latencies: list[tuple[float, float]] = []
    threading.Thread(
        target=probe_api, args=(client.CoreV1Api(api_client), api_latencies, stop), daemon=True
    ).start()

    metrics_port = args.metrics_port
    operator_log_path = Path(args.operator_log)
    operator_env = dict(
        kube_env,
        KUBECONFIG=str(operator_kubeconfig(admin_kubeconfig, admin_kubeconfig.parent / "pki", workdir)),
        STOKER_METRICS_PORT=str(metrics_port),
        STOKER_LIVENESS_PORT=str(metrics_port + 1),
        STOKER_DRIFT_INTERVAL_SECONDS=str(args.drift_interval),
        STOKER_CONTROL_KEY="bench-control-key",
        PYTHONUNBUFFERED="1",
        # An exported --operator-ref goes before the venv's own (editable) stoker.
        PYTHONPATH=str(tree / "src"),
    )
    with operator_log_path.open("wb") as operator_log:
        operator = subprocess.Popen(
            [
                str(REPO / ".venv" / "bin" / "python"),
                "-c",
                "import sys, stoker.cli; sys.exit(stoker.cli.main())",
                "run",
            ],
            env=operator_env,
            stdout=operator_log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_live(operator, metrics_port + 1)
        time.sleep(1)  # the watches are established before the first create
        figures = phases(bench, operator, services, deployments, replica_sets, api_client, kube_env, kubectl)
        # Where the operator's seconds go, if this version of it says.
        exposition = operator_metrics(metrics_port)
        figures["operatorMetrics"] = {
            "reconciles": int(metric_total(exposition, "stoker_reconcile_total")),
            "meanReconcileSeconds": metric_mean(exposition, "stoker_reconcile_duration_seconds"),
            "meanUrgentQueueWaitSeconds": metric_mean(exposition, "stoker_workqueue_urgent_wait_seconds"),
        }
    finally:
        stop.set()
        operator.terminate()
        try:
            operator.wait(timeout=30)
        except subprocess.TimeoutExpired:
            operator.kill()
    # Ours logs the operator's reads too; where the API server took hack/cluster's own policy instead (writes
    # of every user), that log has the writes.
    logs = [audit_log, admin_kubeconfig.parent / "logs" / "audit.jsonl"]
    if used := next((log for log in logs if log.exists()), None):
        bench.say(f"operator requests from the audit log {used}")
        by_phase = requests_by_phase(list(audit_requests(used, OPERATOR_USER)), bench.phases)
        bench.record("operatorRequestsByPhase", by_phase)
        quiet = by_phase["quiet-resync"]
        figures["quietResyncWrites"] = quiet["writes"]
        figures["quietResync"]["writesByVerbAndResource"] = quiet["writesByVerbAndResource"]
        figures["quietResync"]["readRequests"] = quiet["reads"]
        figures["quietResync"]["readsByVerbAndResource"] = quiet["readsByVerbAndResource"]
        figures["operatorRequestsByPhase"] = {
            phase: {key: counts[key] for key in ("seconds", "writes", "reads")}
            for phase, counts in by_phase.items()
        }
    else:
        bench.say("no audit log: the API server logged no requests; writes not counted")
    figures["loadAverageAtPhaseEnd"] = bench.loads
    figures["apiServerGetSecondsByPhase"] = {
        phase: summary([seconds for at, seconds in api_latencies if start <= at < end])
        for phase, (start, end) in bench.phases.items()
    }
    log_lines = operator_log_path.read_text(errors="replace").splitlines()
    levels = Counter(word for line in log_lines for word in line.split()[2:3])
    bench.say(f"operator log: {len(log_lines)} lines, by level {dict(levels)}; last lines:")
    for line in log_lines[-15:]:
        bench.say(f"  {line[:300]}")
    return figures


def wait_live(process: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("operator exited")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError("operator not live")


def create_services(custom: client.CustomObjectsApi, indexes: range) -> float:
    """Create the services 16 at a time; returns how long submitting them took."""
    started = time.monotonic()

    def create(index: int) -> None:
        custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, manifest(index))

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(create, indexes))
    return time.monotonic() - started


def phases(
    bench: Bench,
    operator: subprocess.Popen[bytes],
    services: Timeline,
    deployments: Timeline,
    replica_sets: Timeline,
    api_client: client.ApiClient,
    kube_env: dict[str, str],
    kubectl: str,
) -> dict[str, Any]:
    args = bench.args
    custom = client.CustomObjectsApi(api_client)

    def reconciles() -> float:
        """The operator's reconcile counter; 0 if this version of it has none."""
        return metric_total(operator_metrics(args.metrics_port), "stoker_reconcile_total")

    def fill(count: int, deadline: float) -> tuple[bool, int]:
        """Wait until `count` services have a Deployment and are settled; returns (all deployed, settled)."""
        deployed = deployments.wait(lambda: len(deployments.first_of_owner) >= count, deadline)
        services.wait(lambda: len(services.settled) >= count, deadline)
        with services.changed:
            return deployed, len(services.settled)

    # 1. Burst: creation -> Deployment, against the Deployment controller's Deployment -> ReplicaSet.
    started = time.time()
    submit = create_services(custom, range(args.burst))
    deadline = time.monotonic() + args.phase_timeout
    all_deployed = deployments.wait(lambda: len(deployments.first_of_owner) >= args.burst, deadline)
    replica_sets.wait(lambda: len(replica_sets.first_of_owner) >= args.burst, time.monotonic() + 30)
    bench.phase("burst", started)
    burst_names = {manifest(i)["metadata"]["name"] for i in range(args.burst)}
    with services.changed, deployments.changed, replica_sets.changed:
        stoker = [
            deployments.first_of_owner[n] - services.first_of_name[n]
            for n in burst_names
            if n in deployments.first_of_owner and n in services.first_of_name
        ]
        burst_deployments = {e.name for e in deployments.events if e.owner in burst_names}
        yardstick = [
            replica_sets.first_of_owner[d] - deployments.first_of_name[d]
            for d in burst_deployments
            if d in replica_sets.first_of_owner
        ]
    bench.record("burstCreateToDeploymentSeconds", sorted(round(v, 4) for v in stoker))
    bench.record("burstDeploymentToReplicaSetSeconds", sorted(round(v, 4) for v in yardstick))
    burst = {
        "services": args.burst,
        "submitSeconds": round(submit, 2),
        "allDeployed": all_deployed,
        "createToDeploymentSeconds": summary(stoker),
        "deploymentControllerDeploymentToReplicaSetSeconds": summary(yardstick),
    }
    bench.say(f"burst: {json.dumps(burst)}")

    # 2. Fill to --existing and settle; then one drift resync period with nothing changed.
    started = time.time()
    create_services(custom, range(args.burst, args.existing))
    all_deployed, settled = fill(args.existing, time.monotonic() + args.phase_timeout)
    bench.phase("fill-existing", started)
    bench.say(f"{settled} of {args.existing} services settled, all deployed: {all_deployed}")
    # Unchanged services: no VLLMService written for QUIET_SECONDS (the learning path's first runs, which
    # write status.startup, have caught up too), at most a phase timeout.
    settle_started = time.monotonic()
    settle_deadline = settle_started + args.phase_timeout
    while time.monotonic() < settle_deadline:
        with services.changed:
            last_change = services.times[-1] if services.times else 0.0
        if time.monotonic() - last_change >= QUIET_SECONDS:
            break
        time.sleep(1)
    bench.say(f"services unchanged for {QUIET_SECONDS} s after {time.monotonic() - settle_started:.1f} s")
    before, statuses_before = resource_versions(api_client)
    reconciles_before = reconciles()
    started = time.time()
    # At least a resync period; longer (up to 3) while the operator's reconcile counter says it has not been
    # through every service once. An operator without the counter gets twice the period.
    shortest, longest = args.drift_interval * 1.2, args.drift_interval * 3
    while (waited := time.time() - started) < longest:
        if reconciles_before:
            enough = reconciles() - reconciles_before >= args.existing
        else:
            enough = waited >= 2 * args.drift_interval
        if waited >= shortest and enough:
            break
        time.sleep(1)
    reconciled = reconciles() - reconciles_before
    bench.phase("quiet-resync", started)
    after, statuses_after = resource_versions(api_client)
    changed = Counter(kind for (kind, name), version in after.items() if before.get((kind, name)) != version)
    status_fields = Counter(
        path
        for name, status in statuses_after.items()
        for path in changed_fields(statuses_before.get(name, {}), status)
    )
    quiet = {
        "services": args.existing,
        "settledServices": settled,
        "windowSeconds": round(bench.phases["quiet-resync"][1] - started, 1),
        "reconcilesInWindow": int(reconciled),
        "changedObjectsByKind": dict(changed),
        "changedStatusFields": dict(status_fields.most_common(20)),
    }
    bench.say(f"quiet resync: {json.dumps(quiet)}")

    # 3. `kubectl scale` of one service among --existing: replicas 2, 1, 2, ... Each scale asks for a count
    # that neither the service nor its Deployment has, so that each needs a write even after a late one.
    started = time.time()
    budget_end = time.monotonic() + args.scale_budget
    target = manifest(0)["metadata"]["name"]
    scale_seconds, kubectl_seconds, timeouts, runs = [], [], 0, 0
    for index in range(args.scales):
        if time.monotonic() >= budget_end:
            bench.say(f"scale budget of {args.scale_budget} s spent after {runs} scales")
            break
        runs += 1
        with services.changed, deployments.changed:
            now = {services.last_of_name[target].replicas, deployments.last_of_owner[target].replicas}
        replicas = next(n for n in (1, 2, 3) if n not in now)
        command = [kubectl, "-n", NAMESPACE, "scale", f"{PLURAL}/{target}", f"--replicas={replicas}"]
        timed = timed_scale(command, kube_env, target, replicas, services, deployments, args.scale_timeout)
        if timed is None:
            timeouts += 1
            bench.say(f"scale {index} to {replicas}: no Deployment change within {args.scale_timeout} s")
            continue
        scale_seconds.append(timed[0])
        kubectl_seconds.append(timed[1])
    bench.phase("scale", started)
    bench.record("scaleToDeploymentSeconds", [round(v, 4) for v in scale_seconds])
    bench.record("kubectlReturnedToDeploymentSeconds", [round(v, 4) for v in kubectl_seconds])
    scale = {
        "scalesAsked": args.scales,
        "scalesRun": runs,
        "among": args.existing,
        "timeouts": timeouts,
        "scaleToDeploymentSeconds": summary(scale_seconds),
        "kubectlReturnedToDeploymentSeconds": summary(kubectl_seconds),
    }
    bench.say(f"scale: {json.dumps(scale)}")
    # A scale that got no reaction within the timeout counts as slower than every other.
    with_timeouts = scale_seconds + [math.inf] * timeouts

    # 4. Fill to --at; memory, and CPU over one resync period at that size.
    started = time.time()
    create_services(custom, range(args.existing, args.at))
    all_deployed, settled = fill(args.at, time.monotonic() + args.phase_timeout)
    bench.phase("fill-at", started)
    started = time.time()
    cpu_before = cpu_seconds(operator.pid)
    time.sleep(args.drift_interval)
    steady_cpu = cpu_seconds(operator.pid) - cpu_before
    bench.phase("steady-at", started)
    at = {
        "services": args.at,
        "allDeployed": all_deployed,
        "settledServices": settled,
        "rssMiB": resident_mib(operator.pid, "VmRSS"),
        "peakRssMiB": resident_mib(operator.pid, "VmHWM"),
        "cpuSecondsSinceStart": round(cpu_seconds(operator.pid), 1),
        "cpuSecondsOneResyncPeriod": round(steady_cpu, 1),
        "coreFractionOneResyncPeriod": round(steady_cpu / args.drift_interval, 3),
    }
    bench.say(f"at {args.at}: {json.dumps(at)}")

    return {
        "burstP99RatioToDeploymentController": ratio(
            burst["createToDeploymentSeconds"]["p99"],
            burst["deploymentControllerDeploymentToReplicaSetSeconds"]["p99"],
        ),
        "scaleP50Seconds": finite(percentile(with_timeouts, 0.5)) if with_timeouts else None,
        "scaleP99Seconds": finite(percentile(with_timeouts, 0.99)) if with_timeouts else None,
        "quietResyncWrites": None,  # from the audit log, once the operator has stopped
        f"rssMiBAt{args.at}": at["rssMiB"],
        f"cpuSecondsAt{args.at}": at["cpuSecondsSinceStart"],
        "sizes": {"burst": args.burst, "existing": args.existing, "scales": args.scales, "at": args.at},
        "driftIntervalSeconds": args.drift_interval,
        "burst": burst,
        "quietResync": quiet,
        "scale": scale,
        "at": at,
        "machine": f"{os.cpu_count()} cores, shared",
        "operatorVersion": operator_version(args.operator_ref),
    }


def timed_scale(
    command: list[str],
    kube_env: dict[str, str],
    target: str,
    replicas: int,
    services: Timeline,
    deployments: Timeline,
    timeout: float,
) -> tuple[float, float] | None:
    """Run one `kubectl scale`; returns seconds from the service's new replicas (watch) to its Deployment's,
    and from kubectl's return to the Deployment's, or None if either was not seen within `timeout`."""
    asked = time.monotonic()
    subprocess.run(command, env=kube_env, check=True, capture_output=True)
    returned = time.monotonic()

    def scaled(e: Sighting) -> bool:
        return e.name == target and e.replicas == replicas

    def deployment_scaled(e: Sighting) -> bool:
        return e.owner == target and e.replicas == replicas

    deadline = returned + timeout
    services.wait(lambda: services.first(scaled, asked) is not None, deadline)
    deployments.wait(lambda: deployments.first(deployment_scaled, asked) is not None, deadline)
    seen_scale, seen_deployment = services.first(scaled, asked), deployments.first(deployment_scaled, asked)
    if seen_scale is None or seen_deployment is None:
        return None
    return max(0.0, seen_deployment - seen_scale), max(0.0, seen_deployment - returned)


def finite(value: float) -> float | None:
    return round(value, 3) if math.isfinite(value) else None


def changed_fields(before: Any, after: Any, path: str = "") -> list[str]:
    """The dotted paths of the leaves (lists whole) that differ between two documents; a mapping that one side
    lacks counts as empty there, so that its leaves are named."""
    if isinstance(before, dict) or isinstance(after, dict):
        before = before if isinstance(before, dict) else {}
        after = after if isinstance(after, dict) else {}
        return [
            changed
            for key in sorted(before.keys() | after.keys())
            for changed in changed_fields(before.get(key), after.get(key), f"{path}.{key}" if path else key)
        ]
    return [] if before == after else [path]


def resource_versions(
    api_client: client.ApiClient,
) -> tuple[dict[tuple[str, str], str], dict[str, dict[str, Any]]]:
    """resourceVersion of every child kind's object and of every VLLMService in the namespace, and the
    VLLMServices' status by name."""
    versions: dict[tuple[str, str], str] = {}
    statuses: dict[str, dict[str, Any]] = {}
    for kind, (api, call) in CHILD_LISTS.items():
        items = getattr(getattr(client, api)(api_client), call)(NAMESPACE, _preload_content=False)
        for item in json.loads(items.data)["items"]:
            versions[(kind, item["metadata"]["name"])] = item["metadata"]["resourceVersion"]
    custom = client.CustomObjectsApi(api_client)
    listed = cast(dict[str, Any], custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL))
    for item in listed["items"]:
        versions[("VLLMService", item["metadata"]["name"])] = item["metadata"]["resourceVersion"]
        statuses[item["metadata"]["name"]] = item.get("status") or {}
    return versions, statuses


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parse.add_argument("--burst", type=int, default=200, help="services created at once")
    parse.add_argument("--existing", type=int, default=500, help="services during the resync and scales")
    parse.add_argument("--scales", type=int, default=50, help="kubectl scale calls of one service")
    parse.add_argument("--at", type=int, default=1000, help="services when memory and CPU are read")
    parse.add_argument("--drift-interval", type=float, default=30.0, help="the operator's resync period")
    parse.add_argument("--phase-timeout", type=float, default=180.0, help="bound on each burst or fill")
    parse.add_argument("--scale-timeout", type=float, default=20.0, help="bound on one scale's reaction")
    parse.add_argument("--scale-budget", type=float, default=240.0, help="bound on all scales together")
    parse.add_argument("--metrics-port", type=int, default=28700, help="and the next one for liveness")
    parse.add_argument("--operator-log", default="/tmp/stoker-bench-operator.log")
    parse.add_argument(
        "--operator-ref", help="run the operator (and its CRD) of this commit, not the working tree"
    )
    results = REPO / "bench" / "results"
    parse.add_argument("--out", type=Path, default=results / "operator-scale.json")
    parse.add_argument("--raw", type=Path, default=results / "operator-scale-raw.txt")
    return parse


def main() -> int:
    args = parser().parse_args()
    # Stopped early, the run still takes its operator and control plane down (the finally blocks).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not args.burst <= args.existing <= args.at:
        raise SystemExit("need --burst <= --existing <= --at")
    args.raw.parent.mkdir(parents=True, exist_ok=True)
    with args.raw.open("w") as raw:
        raw.write(f"$ {' '.join(sys.argv)}\n")
        figures = run(args, raw)
        text = json.dumps(figures, indent=2)
        raw.write(text + "\n")
    print(text)
    args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

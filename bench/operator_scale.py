"""Operator scale benchmark: N VLLMServices applied at once against the local control plane.

Prints p50/p99 seconds from apply to Deployment created, seconds until all are Ready, and the
operator's peak RSS; writes the figures to bench/results/operator-scale.json.

In the same run, as a yardstick on the same loaded machine: the built-in Deployment controller's reaction
(Deployment seen -> its ReplicaSet seen, both by watch), and where stoker's seconds go: the API server's
latency to a trivial GET during the burst, the time new objects waited in the operator's work queue, and
the mean reconcile.

    .venv/bin/python bench/operator_scale.py [--count 200]

It starts its own control plane (hack/cluster, own work dir and ports) and its own operator process,
and stops both at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client, config, watch

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "scale"
CLUSTER_ENV = {
    "STOKER_CLUSTER_DIR": "/tmp/stoker-bench-cluster",
    "STOKER_CLUSTER_PORT_BASE": "25790",
    # Room for every seed pod and serving pod at once: 8 GPUs a node.
    "GPU_NODES": "60",
}
METRICS_PORT, LIVENESS_PORT = 29080, 29081


def manifest(index: int) -> dict:
    return {
        "apiVersion": "stoker.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": f"svc-{index:04d}", "namespace": NAMESPACE},
        "spec": {"model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"}, "runtime": {"replicas": 1}},
    }


def first_seen(list_call, key_of, seen: dict[str, float], stop: threading.Event, count: int) -> None:
    """Watch a namespace's objects and note when each key was first seen (monotonic)."""
    stream = watch.Watch()
    # Plain JSON, no model objects: the watcher must not lag behind what it times.
    for event in stream.stream(list_call, NAMESPACE, timeout_seconds=600, deserialize=False):
        key = key_of(event["object"])
        if key:
            seen.setdefault(key, time.monotonic())
        if stop.is_set() or len(seen) >= count:
            stream.stop()


def owning_deployment(replica_set: dict) -> str | None:
    owners = replica_set["metadata"].get("ownerReferences") or [{}]
    return owners[0].get("name") if owners[0].get("kind") == "Deployment" else None


def probe_api(core, latencies: list[float], stop: threading.Event) -> None:
    """The API server's latency to a trivial GET, every 0.25 s: how loaded the shared machine is."""
    while not stop.wait(0.25):
        started = time.monotonic()
        core.read_namespace(NAMESPACE, _preload_content=False).read()
        latencies.append(time.monotonic() - started)


def metric_sum_count(exposition: str, name: str) -> tuple[float, float]:
    def total(suffix: str) -> float:
        return sum(
            float(line.split()[-1]) for line in exposition.splitlines() if line.startswith(f"{name}_{suffix}")
        )

    return total("sum"), total("count")


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(values), 3),
        "p99": round(percentile(values, 0.99), 3),
        "mean": round(statistics.fmean(values), 3),
    }


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def wait_live(process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, "operator exited"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{LIVENESS_PORT}/healthz", timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError("operator not live")


def run(count: int) -> dict:
    env = dict(os.environ, **CLUSTER_ENV)
    cluster = REPO / "hack" / "cluster"
    try:
        subprocess.run([cluster, "up"], env=env, check=True)
        return measure(count, env, cluster)
    finally:
        subprocess.run([cluster, "down"], env=env, check=False)


def measure(count: int, env: dict[str, str], cluster: Path) -> dict:
    exports = subprocess.run([cluster, "env"], env=env, check=True, capture_output=True, text=True).stdout
    kubeconfig = exports.split('KUBECONFIG="')[1].split('"')[0]
    bin_dir = exports.split('PATH="')[1].split(":")[0]
    kube_env = dict(env, KUBECONFIG=kubeconfig, PATH=f"{bin_dir}:{env['PATH']}")
    kubectl = [f"{bin_dir}/kubectl"]
    subprocess.run([*kubectl, "apply", "--server-side", "-f", REPO / "crds"], env=kube_env, check=True)
    subprocess.run(
        [*kubectl, "wait", "--for=condition=Established", "crd/vllmservices.stoker.dev"],
        env=kube_env,
        check=True,
    )
    subprocess.run([*kubectl, "create", "namespace", NAMESPACE], env=kube_env, check=False)
    config.load_kube_config(kubeconfig)
    api_client = client.ApiClient()
    api_client.configuration.connection_pool_maxsize = 32

    operator_log = open("/tmp/stoker-bench-operator.log", "wb")  # noqa: SIM115 - lives as long as the run
    operator = subprocess.Popen(
        [str(REPO / ".venv" / "bin" / "stoker"), "run"],
        env=dict(
            kube_env,
            STOKER_METRICS_PORT=str(METRICS_PORT),
            STOKER_LIVENESS_PORT=str(LIVENESS_PORT),
            STOKER_BIND_ADDRESS="127.0.0.1",
            STOKER_LOG_LEVEL=os.environ.get("STOKER_LOG_LEVEL", "WARNING"),
        ),
        stdout=operator_log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_live(operator)
        deployment_seen: dict[str, float] = {}
        replica_set_seen: dict[str, float] = {}  # by owning Deployment
        api_latencies: list[float] = []
        stop = threading.Event()
        apps = client.AppsV1Api(api_client)
        watchers = [
            threading.Thread(target=target, args=args, daemon=True)
            for target, args in (
                (
                    first_seen,
                    (
                        apps.list_namespaced_deployment,
                        lambda o: o["metadata"]["name"],
                        deployment_seen,
                        stop,
                        count,
                    ),
                ),
                (
                    first_seen,
                    (apps.list_namespaced_replica_set, owning_deployment, replica_set_seen, stop, count),
                ),
                (probe_api, (client.CoreV1Api(api_client), api_latencies, stop)),
            )
        ]
        for watcher in watchers:
            watcher.start()
        time.sleep(1)  # the watches are established before the first apply

        custom = client.CustomObjectsApi(api_client)
        applied: dict[str, float] = {}

        def apply(index: int) -> None:
            body = manifest(index)
            custom.create_namespaced_custom_object("stoker.dev", "v1alpha1", NAMESPACE, "vllmservices", body)
            applied[body["metadata"]["name"]] = time.monotonic()

        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(apply, range(count)))
        apply_seconds = time.monotonic() - started

        all_ready_at = None
        deadline = started + 600
        while time.monotonic() < deadline:
            items = custom.list_namespaced_custom_object("stoker.dev", "v1alpha1", NAMESPACE, "vllmservices")
            ready = sum(
                1
                for item in items["items"]
                for c in (item.get("status") or {}).get("conditions") or []
                if c["type"] == "Ready" and c["status"] == "True"
            )
            if ready >= count:
                all_ready_at = time.monotonic()
                break
            time.sleep(0.5)
        stop.set()
        latencies = [deployment_seen[name] - applied[name] for name in applied if name in deployment_seen]
        controller = [
            replica_set_seen[name] - deployment_seen[name]
            for name in replica_set_seen
            if name in deployment_seen
        ]
        with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5) as response:
            exposition = response.read().decode()
        reconciles = sum(
            float(line.split()[-1])
            for line in exposition.splitlines()
            if line.startswith("stoker_reconcile_total{")
        )
        reconcile_seconds, reconcile_count = metric_sum_count(exposition, "stoker_reconcile_duration_seconds")
        wait_seconds, waits = metric_sum_count(exposition, "stoker_workqueue_urgent_wait_seconds")
        stoker = summary(latencies)
        deployment_controller = summary(controller)
        return {
            "services": count,
            "applySeconds": round(apply_seconds, 2),
            "deploymentsCreated": len(latencies),
            "applyToDeploymentP50Seconds": stoker["p50"],
            "applyToDeploymentP99Seconds": stoker["p99"],
            "applyToDeploymentMeanSeconds": stoker["mean"],
            # The yardstick: the built-in Deployment controller on the same machine, in the same run.
            "deploymentToReplicaSetSeconds": {**deployment_controller, "samples": len(controller)},
            "p99RatioStokerToDeploymentController": round(
                stoker["p99"] / max(deployment_controller["p99"], 1e-3), 2
            ),
            # Where stoker's seconds go.
            "apiServerGetLatencySeconds": {**summary(api_latencies), "samples": len(api_latencies)},
            "meanUrgentQueueWaitSeconds": round(wait_seconds / max(waits, 1), 3),
            "meanReconcileSeconds": round(reconcile_seconds / max(reconcile_count, 1), 3),
            "allReadySeconds": round(all_ready_at - started, 2) if all_ready_at else None,
            "operatorPeakRssMiB": round(peak_rss_mib(operator.pid), 1),
            "operatorCpuSeconds": round(cpu_seconds(operator.pid), 1),
            "reconciles": int(reconciles),
            "machine": f"{os.cpu_count()} cores",
        }
    finally:
        operator.terminate()
        operator.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "operator-scale.json")
    args = parser.parse_args()
    figures = run(args.count)
    print(json.dumps(figures, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if figures["allReadySeconds"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())

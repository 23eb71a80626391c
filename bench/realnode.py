"""`make bench-realnode`: stock vLLM against a stoker VLLMService through real pods on the real node
(hack/node), on CPU, with the same containers run as host processes in the same run.

    python -m bench.realnode [--reps 3]

It starts its own control plane and real node (hack/cluster, hack/node) and the operator as a local
process, writes the conformance harness's tiny checkpoint (bench/conformance/tiny_model.py) to a hostPath
volume, and seeds the VLLMService once. Then, interleaved, each repetition starts from zero replicas:
- `pod-stock`: a plain Deployment running `vllm serve` in the same image on the same volume, with the same
  settings (max-model-len, KV-cache size, the memory request stoker renders) and a readiness probe of the
  period stoker's startup probe has (1 s), so the difference is the engine's start, not the probe;
- `pod-stoker`: the VLLMService scaled from 0 to 1, its pod starting from the seeded compile cache;
- `host-stock` and `host-stoker`: the two Deployments' own containers as host processes
  (bench/conformance/swaps.py; bench/predictor/cpu_sweep.run_start, the CPU sweep's recorder).
Pod starts are timed from `kubectl scale` to the first 200 of a completion through the Service's
ClusterIP; host starts from exec to /health answering. The page cache is dropped before every start.
Each pod start keeps its phases: Kubernetes' (scheduling, sandbox, init, containerStart), the engine's
(stoker's parser on the log read through the kubelet), podReady (the probes) and route (Ready to the first
routed 200). Results: bench/results/realnode-cpu.json; the logs: bench/results/realnode-cpu-logs.tar.gz.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.conformance import tiny_model
from bench.conformance.versions import default_version, venv_path
from bench.predictor.cpu_sweep import Start, drop_page_cache, model_dir, run_start
from bench.predictor.shapes import Shape

from stoker.phases import parse_log
from stoker.phases.kubernetes import api_timestamp, kubernetes_phases, ready_gap_seconds

REPO = Path(__file__).resolve().parents[1]
RESULTS_JSON = REPO / "bench" / "results" / "realnode-cpu.json"
LOGS_ARCHIVE = REPO / "bench" / "results" / "realnode-cpu-logs.tar.gz"
WORK = Path(os.environ.get("STOKER_REALNODE_WORK", "/tmp/stoker-realnode"))
HOST_WORK = WORK / "host"  # the host starts' model link, caches, HOME and TMPDIR
NAMESPACE = "bench"
SERVICE, STOCK = "real", "stock"
SERVED_NAME = "tiny"
MAX_MODEL_LEN = 512
KV_CACHE_ENV = {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"}
# stoker's default for one GPU: a request of 6 GiB + 2 GiB per GPU and no limit. A limit would not do on
# CPU: vLLM 0.26's CPU worker takes the cgroup's usage, page cache included (the 6 GB of libraries its
# imports read), for memory in use, and refused its KV cache with 0.79 of a 4 GiB limit "available".
MEMORY_REQUEST = "8Gi"
NODE = "stoker-node"
NODE_LABEL = "stoker.dev/real-node"  # hack/node's label and taint key
START_TIMEOUT_SECONDS = 900
Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def placement() -> dict[str, Any]:
    """Pod fields that put a pod on the real node, and only there."""
    return {
        "nodeSelector": {NODE_LABEL: "true"},
        "tolerations": [{"key": NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
    }


def advertise_gpus(kubectl: Kubectl, count: int) -> None:
    """`nvidia.com/gpu` in the real node's capacity, as a device plugin would report it, so that pods asking
    for GPUs (stoker's do) schedule there; they run vLLM's CPU platform. The kubelet keeps an extended
    resource it does not manage."""
    patch = json.dumps({"status": {"capacity": {"nvidia.com/gpu": str(count)}}})
    kubectl("patch", "node", NODE, "--subresource=status", "--type=merge", "-p", patch)


def host_path_volume(kubectl: Kubectl, namespace: str, claim: str, path: Path) -> None:
    """A hostPath PersistentVolume pre-bound to `namespace/claim` (no provisioner on this cluster)."""
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{namespace}-{claim}"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany", "ReadOnlyMany", "ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "hostPath": {"path": str(path), "type": "Directory"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }
    kubectl("apply", "-f", "-", input=json.dumps(volume))


def model_and_cache_volumes(kubectl: Kubectl, namespace: str, root: Path, python: Path) -> tuple[Path, Path]:
    """The tiny checkpoint at ROOT/models/tiny behind the claim `models`, and an empty ROOT/cache pre-bound
    to the compile-cache claim stoker creates for SERVICE. Returns (model dir, cache dir)."""
    models, cache = root / "models", root / "cache"
    if not (models / SERVED_NAME / "config.json").exists():
        # Its output to stderr: `--demo` prints a manifest on stdout.
        subprocess.run(
            [str(python), tiny_model.__file__, models / SERVED_NAME], check=True, stdout=sys.stderr
        )
    cache.mkdir(parents=True, exist_ok=True)
    # The engine runs as uid 1000; hostPath volumes take no fsGroup. (safetensors writes its file 0600.)
    for directory in (root, models, models / SERVED_NAME):
        directory.chmod(0o755)
    for file in (models / SERVED_NAME).iterdir():
        file.chmod(0o644)
    cache.chmod(0o777)
    host_path_volume(kubectl, namespace, "models", models)
    host_path_volume(kubectl, namespace, f"{SERVICE}-cache", cache)
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "models"},
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": "",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(claim))
    return models / SERVED_NAME, cache


def vllm_service(replicas: int, max_model_len: int = MAX_MODEL_LEN) -> dict[str, Any]:
    """SERVICE on the tiny model, placed on the real node; the spec says what a CPU image needs (the `auto`
    loader: InstantTensor needs CUDA; the KV-cache size)."""
    return {
        "apiVersion": "stoker.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": SERVICE},
        "spec": {
            "model": {
                "name": SERVED_NAME,
                "servedModelName": SERVED_NAME,
                "source": {"pvc": {"claimName": "models", "path": f"/{SERVED_NAME}"}},
            },
            "runtime": {
                "image": f"ghcr.io/stoker-dev/stoker-vllm:{default_version()}",
                "replicas": replicas,
                "maxModelLen": max_model_len,
                "env": [KV_CACHE_ENV],
                **placement(),
            },
            "coldStart": {
                "loader": {"format": "auto"},
                "compileCache": {"storageClassName": "", "size": "1Gi", "retentionPolicy": "Retain"},
            },
        },
    }


def stock_objects() -> list[dict[str, Any]]:
    """The Deployment and Service a user writes without stoker: same image, model, settings and node."""
    labels = {"app": STOCK}
    container = {
        "name": "vllm",
        "image": f"ghcr.io/stoker-dev/stoker-vllm:{default_version()}",
        "command": ["vllm", "serve"],
        "args": [
            f"/models/{SERVED_NAME}",
            "--port",
            "8000",
            "--served-model-name",
            SERVED_NAME,
            "--max-model-len",
            str(MAX_MODEL_LEN),
        ],
        "env": [KV_CACHE_ENV],
        "ports": [{"name": "http", "containerPort": 8000}],
        "resources": {"requests": {"memory": MEMORY_REQUEST}, "limits": {"nvidia.com/gpu": "1"}},
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
        "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": STOCK},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    **placement(),
                    "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
                    "containers": [container],
                    "volumes": [
                        {"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": STOCK},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]},
    }
    return [deployment, service]


def service_url(kubectl: Kubectl, namespace: str, service: str, path: str) -> str:
    """`path` at the Service's ClusterIP (kube-proxy's rules on this machine route it)."""
    spec = (json.loads(kubectl("-n", namespace, "get", "service", service, "-o", "json").stdout))["spec"]
    return f"http://{spec['clusterIP']}:{spec['ports'][0]['port']}{path}"


def healthy_through_service(kubectl: Kubectl, namespace: str, service: str, timeout: float = 5) -> bool:
    """vLLM's /health answers 200 through the Service: the route is there, whatever a request then costs."""
    try:
        url = service_url(kubectl, namespace, service, "/health")
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def complete_through_service(kubectl: Kubectl, namespace: str, service: str, timeout: float = 5) -> bool:
    """One completion through the Service's ClusterIP."""
    body = json.dumps({"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 4}).encode()
    request = urllib.request.Request(
        service_url(kubectl, namespace, service, "/v1/completions"),
        data=body,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status == 200 and bool(json.loads(reply.read())["choices"])
    except (OSError, ValueError, KeyError):
        return False


def kubectl_in(env: dict[str, str]) -> Kubectl:
    """`kubectl` with `env` (hack/cluster env's): the completed process, or RuntimeError with its stderr."""

    def run(*args: str, input: str | None = None, check: bool = True, timeout: float = 120) -> Any:
        result = subprocess.run(
            ["kubectl", *args], env=env, input=input, capture_output=True, text=True, timeout=timeout
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result

    return run


def prepare_demo(namespace: str, root: Path) -> dict[str, Any]:
    """What hack/demo --real needs before it applies the VLLMService this returns: the tiny checkpoint and
    the cache volume in `namespace` under `root`, and the real node's advertised GPUs."""
    kubectl = kubectl_in(dict(os.environ))
    model_and_cache_volumes(kubectl, namespace, root, venv_path(default_version()) / "bin" / "python")
    advertise_gpus(kubectl, 4)
    return vllm_service(1)


# ---------------------------------------------------------------------------------------- the run


def pod_phases(
    pod: dict[str, Any], events: list[dict[str, Any]], log: list[str], healthy_at: float, routed_at: float
) -> dict[str, Any]:
    """Every phase of one pod start, Kubernetes' and the engine's, in seconds."""
    status = pod["status"]
    main = next(c for c in status["containerStatuses"] if c["name"] == "vllm")
    started = main["state"]["running"]["startedAt"]
    timeline = parse_log(log, process_start=datetime.fromisoformat(started.replace("Z", "+00:00")))
    phases: dict[str, float] = dict(kubernetes_phases(pod, events, container="vllm"))
    scheduled = api_timestamp(
        next(c["lastTransitionTime"] for c in status["conditions"] if c["type"] == "PodScheduled")
    )
    inits = [c["state"].get("terminated") or {} for c in status.get("initContainerStatuses") or []]
    if inits and scheduled is not None:
        first_init = api_timestamp(inits[0].get("startedAt"))
        last_init = api_timestamp(inits[-1].get("finishedAt"))
        if first_init is not None and last_init is not None:
            phases["sandbox"] = round(first_init - scheduled, 3)
            phases["init"] = round(last_init - first_init, 3)
            phases["containerStart"] = round((api_timestamp(started) or last_init) - last_init, 3)
    phases.update(timeline.phases)
    gap = ready_gap_seconds(pod, timeline.ready_at)
    if gap is not None:
        phases["podReady"] = round(gap, 3)
    ready = api_timestamp(next(c["lastTransitionTime"] for c in status["conditions"] if c["type"] == "Ready"))
    if ready is not None:
        # route: the Service reaches the pod (endpoints, then kube-proxy's rules); firstRequest: the first
        # completion itself, which the engine may still be warming for.
        phases["route"] = round(max(0.0, healthy_at - ready), 3)
        phases["firstRequest"] = round(max(0.0, routed_at - healthy_at), 3)
    return {
        "phases": phases,
        "engineSeconds": timeline.total_seconds,
        "compileCache": timeline.compile_cache,
        "readyGapSeconds": None if gap is None else round(gap, 3),
    }


class Bench:
    def __init__(self, reps: int) -> None:
        self.reps = reps
        self.version = default_version()
        self.env = dict(
            os.environ,
            STOKER_CLUSTER_DIR=str(WORK / "cluster"),
            STOKER_CLUSTER_PORT_BASE=os.environ.get("STOKER_REALNODE_PORT_BASE", "31000"),
            STOKER_POD_CIDR="10.250.0.0/16",
        )
        self.kubectl = kubectl_in(self.env)  # sees what up() adds to self.env
        self.logs = WORK / "logs"
        self.operator: subprocess.Popen[bytes] | None = None

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("-n", NAMESPACE, "get", *args, "-o", "json").stdout)

    def up(self) -> None:
        hack = REPO / "hack"
        subprocess.run([hack / "cluster", "up"], env=self.env, check=True)
        exports = subprocess.run(
            [hack / "cluster", "env"], env=self.env, capture_output=True, text=True, check=True
        )
        for line in exports.stdout.splitlines():
            key, value = line.removeprefix("export ").split("=", 1)
            self.env[key] = value.strip('"').replace("$PATH", os.environ["PATH"])
        subprocess.run([hack / "node", "up"], env=self.env, check=True)
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
        self.kubectl("wait", "--for=condition=Established", "crd/vllmservices.stoker.dev", "--timeout=60s")
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / "operator.log").open("ab") as log:
            self.operator = subprocess.Popen(
                [str(REPO / ".venv" / "bin" / "stoker"), "run"],
                env=dict(self.env, STOKER_METRICS_PORT="31980", STOKER_LIVENESS_PORT="31981"),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.kubectl("create", "namespace", NAMESPACE, check=False)
        advertise_gpus(self.kubectl, 4)

    def down(self) -> None:
        if self.operator is not None:
            self.operator.terminate()
            self.operator.wait(timeout=30)
        subprocess.run([REPO / "hack" / "cluster", "down"], env=self.env, check=False)

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while not (value := predicate()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not within {timeout} s")
            time.sleep(0.25)
        return value

    def pods(self, selector: str) -> list[dict[str, Any]]:
        return [
            p for p in self.get("pods", "-l", selector)["items"] if not p["metadata"].get("deletionTimestamp")
        ]

    def prepare(self) -> None:
        python = venv_path(self.version) / "bin" / "python"
        self.model_dir, self.cache_dir = model_and_cache_volumes(
            self.kubectl, NAMESPACE, WORK / "volumes", python
        )
        for obj in [vllm_service(0), *stock_objects()]:
            self.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=json.dumps(obj))

        def seeded() -> bool:
            cache = (self.get("vllmservice", SERVICE).get("status") or {}).get("cache") or {}
            return bool(cache.get("seededKey")) and cache.get("seededKey") == cache.get("key")

        self.wait(seeded, START_TIMEOUT_SECONDS, "the seed")
        deployment = self.get("deployment", SERVICE)
        stock = self.get("deployment", STOCK)
        seed_job = self.get("jobs", "-l", f"app.kubernetes.io/instance={SERVICE}")["items"][0]
        self.containers = {
            "stoker-seed": seed_job["spec"]["template"]["spec"]["containers"][0],
            "stoker": deployment["spec"]["template"]["spec"]["containers"][0],
            "stock": stock["spec"]["template"]["spec"]["containers"][0],
        }
        # The host runs' own seed, into their own cache directory, before their serving starts.
        host_model = model_dir(self.shape, HOST_WORK)
        if not host_model.exists():
            host_model.parent.mkdir(parents=True, exist_ok=True)
            host_model.symlink_to(self.model_dir)
        seed = Start(self.shape, "stoker-seed", 1)
        record = run_start(seed, self.containers["stoker-seed"], self.version, self.logs, HOST_WORK)
        assert record["ready"], f"the host seed failed: {self.logs / record['log']}"

    @property
    def shape(self) -> Shape:
        return tiny_model.CONFORMANCE_SHAPE

    def pod_start(self, kind: str, rep: int) -> dict[str, Any]:
        kubectl = self.kubectl
        target, service = ("vllmservice", SERVICE) if kind == "stoker" else ("deployment", STOCK)
        selector = (
            f"app.kubernetes.io/instance={SERVICE},app.kubernetes.io/component=server"
            if kind == "stoker"
            else f"app={STOCK}"
        )
        dropped = drop_page_cache()
        began = time.time()
        kubectl("-n", NAMESPACE, "scale", target, service, "--replicas=1")
        self.wait(
            lambda: healthy_through_service(kubectl, NAMESPACE, service),
            START_TIMEOUT_SECONDS,
            f"{kind}'s route",
        )
        healthy_at = time.time()
        self.wait(
            lambda: complete_through_service(kubectl, NAMESPACE, service),
            START_TIMEOUT_SECONDS,
            f"{kind}'s first completion",
        )
        routed_at = time.time()
        (pod,) = self.pods(selector)
        name = pod["metadata"]["name"]
        events = self.get("events", "--field-selector", f"involvedObject.name={name}")["items"]
        log = kubectl("-n", NAMESPACE, "logs", name, "-c", "vllm", "--timestamps").stdout
        (self.logs / f"pod-{kind}-{rep}.log").write_text(log)
        record = {
            "kind": f"pod-{kind}",
            "rep": rep,
            "pod": name,
            "pageCacheDropped": dropped,
            "loadAverage": [round(x, 2) for x in os.getloadavg()],
            "readySeconds": round(routed_at - began, 3),
            **pod_phases(pod, events, log.splitlines(), healthy_at, routed_at),
        }
        kubectl("-n", NAMESPACE, "scale", target, service, "--replicas=0")
        self.wait(lambda: not self.pods(selector), 300, f"{kind}'s pod to go")
        return record

    def host_start(self, kind: str, rep: int) -> dict[str, Any]:
        record = run_start(
            Start(self.shape, kind, rep), self.containers[kind], self.version, self.logs, HOST_WORK
        )
        assert record["ready"], f"host {kind} start failed: {self.logs / record['log']}"
        lines = (self.logs / record["log"]).read_text().splitlines()
        timeline = parse_log(lines)
        return {
            "kind": f"host-{kind}",
            "rep": rep,
            "pageCacheDropped": record["pageCacheDropped"],
            "loadAverage": record["loadAverage"],
            "readySeconds": record["wallSeconds"],
            "engineSeconds": timeline.total_seconds,
            "compileCache": timeline.compile_cache,
            "phases": timeline.phases,
        }

    def run(self) -> list[dict[str, Any]]:
        runs = []
        order = ["pod-stock", "pod-stoker", "host-stock", "host-stoker"]
        for rep in range(1, self.reps + 1):
            for where_kind in order[rep - 1 :] + order[: rep - 1]:  # each kind goes first once
                where, kind = where_kind.split("-")
                record = self.pod_start(kind, rep) if where == "pod" else self.host_start(kind, rep)
                print(
                    f"{where_kind} {rep}: {record['readySeconds']} s (load {record['loadAverage'][0]})",
                    flush=True,
                )
                runs.append(record)
        return runs


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def median(kind: str, field: str = "readySeconds") -> float:
        return round(statistics.median(r[field] for r in runs if r["kind"] == kind), 2)

    pod_ratio = median("pod-stock") / median("pod-stoker")
    host_ratio = median("host-stock") / median("host-stoker")
    return {
        "stockReadySeconds": median("pod-stock"),
        "stokerReadySeconds": median("pod-stoker"),
        "ratio": round(pod_ratio, 2),
        "readyGapSeconds": median("pod-stoker", "readyGapSeconds"),
        "hostStockReadySeconds": median("host-stock"),
        "hostStokerReadySeconds": median("host-stoker"),
        "hostRatio": round(host_ratio, 2),
        "ratioAgainstHost": round(pod_ratio / host_ratio, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--demo",
        nargs=2,
        metavar=("NAMESPACE", "DIR"),
        help="no benchmark: make hack/demo --real's volumes under DIR and print its VLLMService",
    )
    args = parser.parse_args()
    if args.demo:
        namespace, root = args.demo
        print(json.dumps(prepare_demo(namespace, Path(root))))
        return
    bench = Bench(args.reps)
    try:
        bench.up()
        bench.prepare()
        runs = bench.run()
    finally:
        bench.down()
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "engineVersion": bench.version,
        "model": "tiny (conformance shape)",
        **summary(runs),
        "runs": runs,
    }
    RESULTS_JSON.write_text(json.dumps(result, indent=2) + "\n")
    with tarfile.open(LOGS_ARCHIVE, "w:gz") as archive:
        archive.add(bench.logs, arcname="realnode-cpu-logs")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()

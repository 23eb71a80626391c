"""Shared pytest fixtures: a real control plane (hack/cluster) for e2e tests, real vLLM (CPU build), and
the programs stoker runs in pods as a pod has them.

The control plane is started once per session on its own work dir and ports, so it never collides
with a developer's `hack/cluster up`; it is torn down at the end unless STOKER_KEEP_CLUSTER=1.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from bench.conformance.versions import default_version, venv_path, venv_ready

from stoker.cli import main as stoker_main
from tests.e2e.helpers import build_or_skip, create_namespace

REPO = Path(__file__).resolve().parent.parent
HACK_CLUSTER = REPO / "hack" / "cluster"
HACK_NODE = REPO / "hack" / "node"
HACK_LWS = REPO / "hack" / "lws"
ARTIFACTS = Path(os.environ.get("STOKER_TEST_ARTIFACTS", REPO / ".artifacts" / "e2e"))


@dataclass(frozen=True)
class Cluster:
    work_dir: Path
    kubeconfig: Path
    bin_dir: Path
    env: dict[str, str]


Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def _cluster_env() -> dict[str, str]:
    return dict(
        os.environ,
        STOKER_CLUSTER_DIR=os.environ.get("STOKER_TEST_CLUSTER_DIR", "/tmp/stoker-test-cluster"),
        STOKER_CLUSTER_PORT_BASE=os.environ.get("STOKER_TEST_PORT_BASE", "24790"),
        # Pod IPs are local addresses here; test doubles of vLLM listen on them (tests/fakevllm.py).
        STOKER_POD_CIDR=os.environ.get("STOKER_TEST_POD_CIDR", "10.245.0.0/16"),
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    # Keep each phase's report on the item so fixtures can collect logs when a test failed.
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    env = _cluster_env()
    build = subprocess.run([HACK_CLUSTER, "env"], env=env, capture_output=True, text=True, check=True)
    exports = dict(
        line.removeprefix("export ").split("=", 1) for line in build.stdout.splitlines() if "=" in line
    )
    kubeconfig = Path(exports["KUBECONFIG"].strip('"'))
    bin_dir = Path(exports["PATH"].strip('"').split(":")[0])
    if not (bin_dir / "kube-apiserver").exists():
        message = f"control-plane binaries missing in {bin_dir}: run hack/cluster build"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    subprocess.run([HACK_CLUSTER, "up"], env=env, check=True, timeout=600)
    test_env = dict(env, KUBECONFIG=str(kubeconfig), PATH=f"{bin_dir}:{env['PATH']}")
    try:
        yield Cluster(kubeconfig.parent, kubeconfig, bin_dir, test_env)
    finally:
        if os.environ.get("STOKER_KEEP_CLUSTER") != "1":
            subprocess.run([HACK_CLUSTER, "down"], env=env, check=False, timeout=120)


@pytest.fixture(scope="module")
def lws(cluster: Cluster) -> Iterator[None]:
    """LWS's CRD and controller against the test cluster (hack/lws up), its webhooks on a port of its own;
    for the module's tests only."""
    build_or_skip(HACK_LWS, cluster.env, [cluster.bin_dir / "lws"])
    # hack/cluster takes six ports from the base and hack/node five; LWS takes three more, well clear of them.
    port = int(os.environ.get("STOKER_TEST_PORT_BASE", "24790")) + 20
    subprocess.run(
        [str(HACK_LWS), "up", str(cluster.work_dir), str(port)], env=cluster.env, check=True, timeout=180
    )
    try:
        yield
    finally:
        subprocess.run(
            [str(HACK_LWS), "down", str(cluster.work_dir)], env=cluster.env, check=False, timeout=60
        )


@dataclass(frozen=True)
class RealNode:
    """The real node `hack/node up` started beside the kwok nodes: kubelet, containerd, runc, kube-proxy."""

    name: str
    placement: Callable[[], dict[str, object]]  # pod spec fields that put a pod here, and only here


@pytest.fixture(scope="session")
def real_node(cluster: Cluster) -> Iterator[RealNode]:
    """A real node in the session's cluster. Where this machine cannot run one (not root, no cgroups), the
    reason is reported and the tests that need it are skipped (failed under CI); the rest stay on kwok."""
    check = subprocess.run([HACK_NODE, "check"], env=cluster.env, capture_output=True, text=True)
    if check.returncode != 0:
        message = f"{check.stderr.strip()}; only the kwok nodes are used"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    subprocess.run([HACK_NODE, "up"], env=cluster.env, check=True, timeout=900)
    from bench import realnode  # here, not at the top: it imports the benchmark's harness (about 1 s)

    try:
        yield RealNode(name=realnode.NODE, placement=realnode.placement)
    finally:
        if os.environ.get("STOKER_KEEP_CLUSTER") != "1":
            subprocess.run([HACK_NODE, "down"], env=cluster.env, check=False, timeout=300)


@pytest.fixture(scope="session")
def kubectl(cluster: Cluster) -> Kubectl:
    return kubectl_of(cluster)


def kubectl_of(cluster: Cluster) -> Kubectl:
    """`kubectl` against `cluster`: the completed process, or AssertionError with its stderr (check)."""

    def run(*args: str, input: str | None = None, check: bool = True, timeout: float = 120):
        result = subprocess.run(
            [str(cluster.bin_dir / "kubectl"), *args],
            env=cluster.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    return run


Helm = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session")
def helm(cluster: Cluster) -> Helm:
    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(cluster.bin_dir / "helm"), *args],
            env=cluster.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    return run


@pytest.fixture(scope="session")
def crd(kubectl: Kubectl) -> None:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    kubectl("wait", "--for=condition=Established", "crd/vllmservices.stoker.dev", "--timeout=60s")


@pytest.fixture
def namespace(request: pytest.FixtureRequest, cluster: Cluster, kubectl: Kubectl) -> Iterator[str]:
    name = create_namespace(kubectl)
    yield name
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        _collect_artifacts(request.node.name, name, cluster, kubectl)
    kubectl("delete", "namespace", name, "--wait=false", check=False)


def _collect_artifacts(test_name: str, namespace: str, cluster: Cluster, kubectl: Kubectl) -> None:
    target = ARTIFACTS / test_name
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    state = kubectl("-n", namespace, "get", "all,events,pvc,vllmservices", "-o", "yaml", check=False)
    (target / "namespace.yaml").write_text(state.stdout + state.stderr)
    for log in (cluster.work_dir / "logs").glob("*.log"):
        lines = log.read_text(errors="replace").splitlines()[-400:]
        (target / log.name).write_text("\n".join(lines))
    print(f"\ncollected cluster state and component logs in {target}")


class Operator:
    """`stoker run` as a real process against the test cluster, on ports of its own.

    `env` overrides the environment, e.g. a KUBECONFIG that signs in as another identity, or a setting.
    """

    def __init__(
        self,
        cluster: Cluster,
        log_path: Path,
        *,
        metrics_port: int = 28080,
        env: dict[str, str] | None = None,
    ) -> None:
        self.log_path = log_path
        self.metrics_port = metrics_port
        self.liveness_port = metrics_port + 1
        self.env = {
            **cluster.env,
            "STOKER_METRICS_PORT": str(self.metrics_port),
            "STOKER_LIVENESS_PORT": str(self.liveness_port),
            "STOKER_DRIFT_INTERVAL_SECONDS": "5",
            "STOKER_STANDBY_DRAIN_SECONDS": "1",
            "STOKER_CONTROL_KEY": "e2e-control-key",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [str(REPO / ".venv" / "bin" / "stoker"), "run"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while not self._live():
            assert self.process.poll() is None, f"operator exited; see {self.log_path}"
            assert time.monotonic() < deadline, f"operator not live after 60 s; see {self.log_path}"
            time.sleep(0.3)
        # What answered must be this process, not another one on the same port.
        time.sleep(0.5)
        assert self.process.poll() is None, f"operator exited (port taken?); see {self.log_path}"

    def __enter__(self) -> Operator:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _live(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, as when a node dies under the operator."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="session")
def operator(cluster: Cluster, crd: None) -> Iterator[Operator]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    metrics_port = int(os.environ.get("STOKER_TEST_METRICS_PORT", "28080"))
    running = Operator(cluster, ARTIFACTS / "operator.log", metrics_port=metrics_port)
    running.start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def admin_operator_paused(operator: Operator) -> Iterator[None]:
    """The session's admin operator would reconcile the same objects: it stops while a test runs operators
    of its own, and starts again afterwards."""
    operator.stop()
    try:
        yield
    finally:
        operator.start()


@pytest.fixture(scope="session")
def engine_venv() -> Path:
    """Real vLLM (CPU build) of stoker's default version, as `make test` installs it (hack/vllm-venv):
    skipped without it, failed under CI."""
    version = default_version()
    if not venv_ready(version):
        message = f"no vLLM {version} venv at {venv_path(version)}: run hack/vllm-venv {version}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return venv_path(version)


@pytest.fixture(scope="session")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory `stoker programs DIR` wrote, as a pod's stoker-programs init container writes the
    programs volume: on PYTHONPATH, it is all that `python3 -m stoker.inpod.NAME` imports of stoker."""
    directory = tmp_path_factory.mktemp("programs")
    assert stoker_main(["programs", str(directory)]) == 0
    return directory

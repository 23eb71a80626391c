"""A vLLM test double on every fake pod of a VLLMService with standby replicas, and what tests ask of it."""

from __future__ import annotations

import base64
import json
import subprocess
import threading
from typing import Any

from stoker.render import PORT
from tests.e2e.helpers import condition, get_json, wait_for
from tests.fakevllm import FakeEngine, FakeEngineServer

ROLE = "stoker.dev/role"


class Fleet:
    """A FakeEngine for every pod of one VLLMService that has an IP, started as the pod gets one.

    It watches the pods rather than polling them: a kwok pod is Ready the moment it gets its IP, where a real
    one is Ready only once its engine answers, and the operator calls the engine of a Ready pod (to put a
    standby to sleep) within a fraction of a second. A watch starts the engine well before that."""

    def __init__(self, kubectl: Any, namespace: str, name: str) -> None:
        self.kubectl, self.namespace, self.name = kubectl, namespace, name
        self.selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/component=server"
        self.engines: dict[str, FakeEngineServer] = {}  # pod name -> its engine
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.watcher: subprocess.Popen[str] | None = None
        self.token = ""
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Fleet:
        secret = wait_for(
            lambda: get_json(self.kubectl, "-n", self.namespace, "secret", f"{self.name}-control"),
            what="the control token Secret",
        )
        self.token = base64.b64decode(secret["data"]["token"]).decode()
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopped.set()
        with self.lock:
            if self.watcher is not None:
                self.watcher.terminate()
        self.thread.join(10)
        for engine in self.engines.values():
            engine.close()

    def _watch(self) -> None:
        # `kubectl get --watch --output-watch-events -o json` prints the pods there are, then every change: an
        # event a line. A watch that ends (the API server restarted) is started again.
        while not self.stopped.is_set():
            with self.lock:
                if self.stopped.is_set():
                    return
                self.watcher = self.kubectl.stream(
                    *("-n", self.namespace, "get", "pods", "-l", self.selector),
                    *("--watch", "--output-watch-events", "-o", "json"),
                )
            assert self.watcher.stdout is not None
            for line in self.watcher.stdout:
                event = json.loads(line)
                if event["type"] in ("ADDED", "MODIFIED", "DELETED"):  # not an ERROR's Status
                    self._apply(event["type"], event["object"])
            self.watcher.wait()
            self.stopped.wait(0.5)

    def _apply(self, change: str, pod: dict[str, Any]) -> None:
        name, ip = pod["metadata"]["name"], pod.get("status", {}).get("podIP")
        with self.lock:
            if change == "DELETED" or pod["metadata"].get("deletionTimestamp"):
                if name in self.engines:
                    self.engines.pop(name).close()
                return
            if not ip or name in self.engines:
                return
            # kwok may give a new pod the IP of a deleted one: that one's engine goes first.
            for other in [other for other, server in self.engines.items() if server.host == ip]:
                self.engines.pop(other).close()
            self.engines[name] = FakeEngineServer(self.new_engine(), ip, PORT)

    def new_engine(self) -> FakeEngine:
        """The engine a new pod gets; a subclass may make it fail."""
        return FakeEngine(self.token)

    def pods(self) -> list[dict[str, Any]]:
        found = get_json(self.kubectl, "-n", self.namespace, "pods", "-l", self.selector) or {"items": []}
        return [pod for pod in found["items"] if not pod["metadata"].get("deletionTimestamp")]

    def engine(self, pod: str) -> FakeEngine:
        with self.lock:
            return self.engines[pod].engine

    def by_role(self) -> dict[str, list[str]]:
        roles: dict[str, list[str]] = {"active": [], "standby": []}
        for pod in self.pods():
            roles.setdefault(pod["metadata"]["labels"].get(ROLE, ""), []).append(pod["metadata"]["name"])
        return roles


def sleeps(engine: FakeEngine) -> list[dict[str, list[str]]]:
    """The query of each /sleep call the engine answered."""
    return [query for method, path, query, _ in list(engine.requests) if (method, path) == ("POST", "/sleep")]


def standby_service(name: str, replicas: int, wake_timeout: int = 10) -> dict[str, Any]:
    return {
        "apiVersion": "stoker.dev/v1alpha1",
        "kind": "VLLMService",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
            "runtime": {"replicas": replicas},
            "coldStart": {
                "seed": {"enabled": False},
                "standby": {"replicas": 1, "wakeTimeoutSeconds": wake_timeout},
            },
        },
    }


def settled(fleet: Fleet, active: int, standby: int) -> dict[str, Any] | None:
    """The VLLMService once `active` pods serve and `standby` pods sleep, and no other pod exists."""
    svc = get_json(fleet.kubectl, "-n", fleet.namespace, "vllmservice", fleet.name)
    status = (svc or {}).get("status") or {}
    roles = fleet.by_role()
    if (len(roles["active"]), len(roles["standby"])) != (active, standby) or len(
        fleet.pods()
    ) != active + standby:
        return None
    if status.get("replicas") != active or status.get("standbyReplicas") != standby:
        return None
    return svc if condition(svc, "Ready").get("status") == "True" else None

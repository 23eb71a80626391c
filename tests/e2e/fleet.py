"""A vLLM test double on every fake pod of a VLLMService with standby replicas, and what tests ask of it."""

from __future__ import annotations

import base64
import threading
from typing import Any

from stoker.render import PORT
from tests.e2e.helpers import condition, get_json, vllm_service, wait_for
from tests.fakevllm import FakeEngine, FakeEngineServer

ROLE = "stoker.dev/role"


class Fleet:
    """A FakeEngine for every pod of one VLLMService that has an IP, started as the pod gets one."""

    def __init__(self, kubectl: Any, namespace: str, name: str) -> None:
        self.kubectl, self.namespace, self.name = kubectl, namespace, name
        self.engines: dict[str, FakeEngineServer] = {}  # pod name -> its engine
        self.lock = threading.Lock()
        self.stopped = threading.Event()
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
        self.thread.join(10)
        for engine in self.engines.values():
            engine.close()

    def _watch(self) -> None:
        while not self.stopped.wait(0.3):
            pods = self.pods()
            with self.lock:
                # Gone pods first: kwok may give a new pod the IP of a deleted one.
                for gone in set(self.engines) - {pod["metadata"]["name"] for pod in pods}:
                    self.engines.pop(gone).close()
                for pod in pods:
                    ip, pod_name = pod["status"].get("podIP"), pod["metadata"]["name"]
                    if ip and pod_name not in self.engines:
                        self.engines[pod_name] = FakeEngineServer(self.new_engine(), ip, PORT)

    def new_engine(self) -> FakeEngine:
        """The engine a new pod gets; a subclass may make it fail."""
        return FakeEngine(self.token)

    def pods(self) -> list[dict[str, Any]]:
        selector = f"app.kubernetes.io/instance={self.name},app.kubernetes.io/component=server"
        found = get_json(self.kubectl, "-n", self.namespace, "pods", "-l", selector) or {"items": []}
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
    standby = {"replicas": 1, "wakeTimeoutSeconds": wake_timeout}
    return vllm_service(name, cold_start={"seed": {"enabled": False}, "standby": standby}, replicas=replicas)


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

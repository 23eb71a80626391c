"""Node warming against a hostile tenant on the real control plane (issue 35, finding 3): one namespace's
two services whose seeds print forged facts (checkpointBytes 1 and 28 GiB - 1: with their import pages all
of the 32 GiB per-node budget) take the whole budget while alone, and give back their borrowed part when
another tenant's honest 16 GB service arrives: the honest service is admitted, the forged 30 GiB one is
OverBudget and loses its warmer, and every warmer's --budget-bytes is what it was admitted for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hack.kwoklogs import print_recording

from tests.e2e.helpers import (
    DATA,
    apply,
    condition,
    get_json,
    get_service,
    other_namespace,
    wait_for,
    warm_node,
    warming_service,
)

pytestmark = pytest.mark.e2e

GIB = 1 << 30
HONEST_CHECKPOINT = 16060522496  # what the recorded seed log's facts line says
__all__ = ["other_namespace", "warm_node"]  # the fixtures, used by name


def seed_prints(kubectl: Any, namespace: str, name: str, checkpoint: int, workdir: Path) -> None:
    """The seed's pod prints the recorded seed log with `checkpoint` as its facts' checkpointBytes."""
    recording = workdir / f"{namespace}-{name}.log"
    text = (DATA / "seed-with-facts.log").read_text()
    recording.write_text(
        text.replace(f'"checkpointBytes": {HONEST_CHECKPOINT}', f'"checkpointBytes": {checkpoint}')
    )
    selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/component=seed"
    print_recording(kubectl, namespace, selector, recording, workdir)


def reason(kubectl: Any, namespace: str, name: str) -> str:
    return str(condition(get_service(kubectl, namespace, name), "NodeWarming").get("reason"))


def test_forged_facts_do_not_keep_another_tenant_cold(
    namespace: str,
    other_namespace: str,
    kubectl: Any,
    operator: Any,
    warm_node: dict[str, str],
    tmp_path: Path,
) -> None:
    mallory, alice = namespace, other_namespace
    for name, checkpoint in (("small", 1), ("big", 28 * GIB - 1)):
        apply(kubectl, mallory, warming_service(name, warm_node))
        seed_prints(kubectl, mallory, name, checkpoint, tmp_path)
    # Alone, the forger's namespace may borrow the whole budget.
    for name in ("small", "big"):
        wait_for(lambda n=name: reason(kubectl, mallory, n) in ("Warming", "Warm"), what=f"{name} admitted")

    apply(kubectl, alice, warming_service("llama", warm_node))
    seed_prints(kubectl, alice, "llama", HONEST_CHECKPOINT, tmp_path)
    wait_for(
        lambda: reason(kubectl, alice, "llama") in ("Warming", "Warm"), what="the honest service admitted"
    )
    wait_for(lambda: reason(kubectl, mallory, "big") == "OverBudget", what="the forged 30 GiB one OverBudget")
    wait_for(
        lambda: get_json(kubectl, "-n", mallory, "daemonset", "big-node-warmer") is None,
        what="the forged service's warmer deleted",
    )
    assert reason(kubectl, mallory, "small") in ("Warming", "Warm")
    message = condition(get_service(kubectl, mallory, "big"), "NodeWarming")["message"]
    assert alice not in message  # another namespace's services are counted, never named

    # Each warmer holds what it was admitted for, not the whole budget.
    for ns, name in ((alice, "llama"), (mallory, "small")):
        wanted = get_service(kubectl, ns, name)["status"]["nodeWarming"]["wantedBytes"]
        daemonset = wait_for(
            lambda ns=ns, name=name: get_json(kubectl, "-n", ns, "daemonset", f"{name}-node-warmer")
        )
        (container,) = daemonset["spec"]["template"]["spec"]["containers"]
        command = container["command"]
        assert command[command.index("--budget-bytes") + 1] == str(wanted)
        assert int(container["resources"]["limits"]["memory"]) == wanted + (256 << 20)

"""The programs stoker runs in its pods (stoker.inpod): files on a volume that every rendered pod copies from
the operator's image, each run by a short command that explains itself with --help, on the standard library
alone, so that any vLLM image with python3 runs them."""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import stoker
from stoker.api import KIND, VLLMService
from stoker.cli import main as stoker_main
from stoker.render import render_children
from stoker.render.pods import DEFAULT_PROGRAMS_IMAGE
from tests.unit.test_render_standby import service as standby_service

PACKAGE = Path(stoker.__file__).parent
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
PROGRAMS = ["read_ahead", "seed", "download", "node_warmer", "engine_init"]
SHIPPED = sorted(
    [
        "stoker/__init__.py",
        "stoker/guard.py",
        *(f"stoker/inpod/{path.name}" for path in PACKAGE.glob("inpod/*.py")),
    ]
)
# What a program may import besides the standard library and itself: the vLLM image's own, inside a function.
FROM_THE_VLLM_IMAGE = {"huggingface_hub"}
MOUNT_PATH = "/opt/stoker/programs"
# The pod's programs init container, as every seed and serving pod has it first.
PROGRAMS_CONTAINER = {
    "name": "stoker-programs",
    "image": DEFAULT_PROGRAMS_IMAGE,
    "command": ["stoker", "programs", MOUNT_PATH],
    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
    "volumeMounts": [{"name": "stoker-programs", "mountPath": MOUNT_PATH}],
    "securityContext": {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    },
}


def rendered_pods(**render: Any) -> dict[str, dict[str, Any]]:
    """Every example's seed and serving pod specs, and a standby service's, by `example/kind`."""
    services = {"standby": standby_service({"replicas": 1})}
    for path in EXAMPLES:
        for document in yaml.safe_load_all(path.read_text()):
            if document and document.get("kind") == KIND:
                services[path.stem] = VLLMService.model_validate(document)
    return {
        f"{name}/{child['kind']}": child["spec"]["template"]["spec"]
        for name, svc in services.items()
        for child in render_children(svc, **render)
        if child["kind"] in ("Job", "Deployment")
    }


PODS = rendered_pods()


def test_stoker_programs_writes_the_package_tree_the_programs_import(tmp_path: Path) -> None:
    # A directory of its own: programs have run from the session's `programs`, leaving bytecode there.
    assert stoker_main(["programs", str(tmp_path)]) == 0
    written = sorted(path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*") if path.is_file())
    assert written == SHIPPED
    for name in SHIPPED:
        assert (tmp_path / name).read_bytes() == (PACKAGE.parent / name).read_bytes()


@pytest.mark.parametrize("program", PROGRAMS)
def test_each_program_explains_itself_with_help(programs: Path, program: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", f"stoker.inpod.{program}", "--help"],
        env={**os.environ, "PYTHONPATH": str(programs)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: python3 -m stoker.inpod.{program} ")
    first_line = (importlib.import_module(f"stoker.inpod.{program}").__doc__ or "").splitlines()[0]
    assert first_line in result.stdout


def test_the_shipped_copy_imports_the_standard_library_alone(programs: Path) -> None:
    # -I: no PYTHONPATH, no user site; -S: no site-packages: the copy alone, as in any vLLM image.
    modules = ", ".join(
        ["stoker.guard", *(f"stoker.inpod.{path.stem}" for path in PACKAGE.glob("inpod/*.py"))]
    )
    script = (
        f"import json, sys; sys.path.insert(0, {str(programs)!r}); import {modules}\n"
        "print(json.dumps({name: getattr(module, '__file__', None) for name, module in sys.modules.items()}))"
    )
    run = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, check=True
    )
    loaded: dict[str, str | None] = json.loads(run.stdout)
    tops = {name.split(".")[0] for name in loaded}
    assert tops - {*sys.stdlib_module_names, "__main__", "stoker"} == set()
    ours = {name: file for name, file in loaded.items() if name.split(".")[0] == "stoker"}
    assert all(file is not None and file.startswith(f"{programs}/") for file in ours.values()), ours


@pytest.mark.parametrize("name", SHIPPED)
def test_no_program_imports_beyond_the_standard_library_and_its_own(name: str) -> None:
    tree = ast.parse((PACKAGE.parent / name).read_text(), name)
    in_functions = {
        id(node)
        for function in ast.walk(tree)
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(function)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""]
        else:
            continue
        for module in modules:
            top = module.split(".")[0]
            own = module in ("stoker", "stoker.guard") or module.startswith("stoker.inpod")
            image = top in FROM_THE_VLLM_IMAGE and id(node) in in_functions
            assert top in sys.stdlib_module_names or own or image, f"{name}:{node.lineno} imports {module}"


@pytest.mark.parametrize("name", PODS)
def test_every_pod_copies_the_programs_first_and_runs_them_from_a_read_only_volume(name: str) -> None:
    pod = PODS[name]
    programs, *others = pod["initContainers"]
    assert programs == PROGRAMS_CONTAINER
    assert {"name": "stoker-programs", "emptyDir": {"sizeLimit": "16Mi"}} in pod["volumes"]
    for container in [*others, *pod["containers"]]:
        assert {"name": "stoker-programs", "mountPath": MOUNT_PATH, "readOnly": True} in container[
            "volumeMounts"
        ]
        env = {variable["name"]: variable.get("value") for variable in container["env"]}
        assert env["PYTHONPATH"] == MOUNT_PATH
    argv = [*pod["containers"][0]["command"], *pod["containers"][0].get("args", [])]
    if "--middleware" in argv:  # standby: vLLM imports the guard from the volume too
        assert argv[argv.index("--middleware") + 1] == "stoker.guard.ControlGuard"


@pytest.mark.parametrize("name", PODS)
def test_kubectl_describe_of_every_pod_is_short(name: str) -> None:
    """No argv element over 500 characters, no container's command and args over 2 KB, and the pod's
    commands, arguments and environment together under 4 KB: what `kubectl describe` prints of them."""
    described = 0
    for container in [*PODS[name]["initContainers"], *PODS[name]["containers"]]:
        argv = [*container["command"], *container.get("args", [])]
        assert max(map(len, argv)) <= 500, container["name"]
        assert sum(len(arg) + 1 for arg in argv) < 2048, container["name"]
        env = [f"{variable['name']}: {variable.get('value', '')}" for variable in container.get("env", [])]
        described += sum(len(arg) + 1 for arg in argv) + sum(len(line) + 1 for line in env)
    assert described < 4096


def test_the_operators_programs_image_reaches_every_pod() -> None:
    image = "registry.example/stoker@sha256:" + "0" * 64
    for name, pod in rendered_pods(programs_image=image).items():
        assert pod["initContainers"][0]["image"] == image, name


def test_a_users_pythonpath_follows_the_programs() -> None:
    svc = standby_service(env=[{"name": "PYTHONPATH", "value": "/plugins:/more"}])
    for child in render_children(svc):
        if child["kind"] in ("Job", "Deployment"):
            (engine,) = child["spec"]["template"]["spec"]["containers"]
            env = {variable["name"]: variable.get("value") for variable in engine["env"]}
            assert env["PYTHONPATH"] == f"{MOUNT_PATH}:/plugins:/more"

"""The Dockerfile, checked without a Docker engine: its structure is parsed and linted here, and the
operator target's install steps are replayed (wheel from the build context, clean venv, entry point)."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stoker.api import DEFAULT_IMAGE

REPO = Path(__file__).resolve().parents[2]
# The operator venv's own stoker, not a source tree on PYTHONPATH.
WITHOUT_PYTHONPATH = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
DOCKERFILE = REPO / "Dockerfile"
VLLM_VERSION = DEFAULT_IMAGE.rsplit(":", 1)[1]


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) with continuation lines joined and comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, args = line.partition(" ")
        result.append((keyword.upper(), args.strip()))
    return result


def parse() -> dict[str, Stage]:
    """The stages by name, their `${ARG}` bases resolved from the global ARG defaults."""
    global_args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for keyword, args in instructions(DOCKERFILE.read_text()):
        if keyword == "FROM":
            match = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)\s+AS\s+(\S+)", args, re.I)
            assert match, f"every FROM names its stage: FROM {args}"
            base = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)], match.group(1))
            current = stages.setdefault(match.group(2), Stage(match.group(2), base))
        elif current is None:
            assert keyword == "ARG", f"only ARG may precede the first FROM, not {keyword}"
            name, _, default = args.partition("=")
            global_args[name] = default
        else:
            current.instructions.append((keyword, args))
    return stages


def test_operator_and_runtime_targets_exist() -> None:
    stages = parse()
    assert {"operator", "runtime"} <= set(stages)


def test_every_base_image_is_pinned_and_none_is_latest() -> None:
    stages = parse()
    for stage in stages.values():
        if stage.base in stages:
            continue
        image, _, tag = stage.base.rpartition(":")
        assert image and "/" not in tag, f"{stage.name}: {stage.base} has no tag"
        assert tag != "latest", f"{stage.name}: {stage.base}"
        # A release number, not a floating major/minor tag such as `3.11-slim`.
        assert re.match(r"v?\d+\.\d+\.\d+", tag), f"{stage.name}: {stage.base} is not pinned to a release"


def test_operator_is_a_slim_python_running_the_project_wheel_as_non_root() -> None:
    stages = parse()
    operator = stages["operator"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", operator.base)
    install = " ".join(operator.all("RUN"))
    assert "python -m venv /opt/stoker" in install
    assert re.search(r"pip install --no-cache-dir /dist/stoker-\*\.whl", install)
    assert json.loads(operator.last("ENTRYPOINT") or "null") == ["stoker"]
    assert json.loads(operator.last("CMD") or "null") == ["run"]  # the chart passes args: ["run"] too
    assert "8080" in (operator.last("EXPOSE") or "") and "8081" in (operator.last("EXPOSE") or "")


def test_runtime_is_the_supported_vllm_with_the_streamer_instanttensor_and_bytecode() -> None:
    stages = parse()
    runtime = stages["runtime"]
    assert runtime.base == f"vllm/vllm-openai:v{VLLM_VERSION}"
    stage_args = dict(arg.partition("=")[::2] for arg in runtime.all("ARG"))
    assert stage_args["VLLM_VERSION"] == VLLM_VERSION
    assert re.fullmatch(r"\d+\.\d+\.\d+", stage_args["RUNAI_STREAMER_VERSION"])
    install = " ".join(runtime.all("RUN"))
    assert '"runai-model-streamer[s3,gcs,azure]==${RUNAI_STREAMER_VERSION}"' in install
    # The renderer picks --load-format instanttensor for this image (render.engine.load_format).
    assert re.fullmatch(r"\d+\.\d+\.\d+", stage_args["INSTANTTENSOR_VERSION"])
    assert '"instanttensor==${INSTANTTENSOR_VERSION}"' in install and "import instanttensor" in install
    assert "compileall" in install and "--invalidation-mode unchecked-hash" in install
    # The build fails if the base image's vLLM is not the supported one.
    assert "vllm.__version__ == '${VLLM_VERSION}'" in install


@pytest.mark.parametrize("target", ["operator", "runtime"])
def test_targets_run_as_a_numeric_non_root_user(target: str) -> None:
    stages = parse()
    user = stages[target].last("USER")
    assert user, f"{target} sets no USER"
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"{target}: USER {user}"


def test_every_pip_install_names_pinned_versions_or_the_local_wheel() -> None:
    stages = parse()
    for stage in stages.values():
        for run in stage.all("RUN"):
            for command in re.findall(r"pip install ([^&;|]+)", run):
                packages = [word.strip("\"'") for word in command.split() if not word.startswith("-")]
                for package in packages:
                    assert package.endswith(".whl") or "==" in package, f"{stage.name}: {package}"


def context_files() -> list[Path]:
    """What .dockerignore lets into the build context (its `*` then `!allowed` form)."""
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    assert patterns[0] == "*", ".dockerignore starts by excluding everything"
    allowed = [pattern[1:].rstrip("/") for pattern in patterns if pattern.startswith("!")]
    excluded = [pattern for pattern in patterns[1:] if not pattern.startswith("!")]
    files = []
    for path in sorted(REPO.rglob("*")):
        relative = path.relative_to(REPO)
        # Docker matches a pattern against the path and each of its parent directories.
        ancestry = [relative.as_posix(), *(parent.as_posix() for parent in relative.parents)]
        if (
            path.is_file()
            and any(name in allowed for name in ancestry)
            and not any(fnmatch.fnmatch(name, pattern) for name in ancestry for pattern in excluded)
        ):
            files.append(path)
    return files


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel target's step, replayed: a wheel built from the build context alone."""
    root = tmp_path_factory.mktemp("operator-image")
    context = root / "context"
    for path in context_files():
        target = context / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    dist = root / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "wheel", "--no-cache-dir", "--no-deps", "--wheel-dir", str(dist), "."],
        cwd=context,
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheels = sorted(dist.glob("stoker-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def operator_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The operator target: a clean venv that installs the wheel and its dependencies like the image does."""
    venv = tmp_path_factory.mktemp("operator-venv") / "opt-stoker"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(wheel)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return venv


def test_build_context_holds_what_the_copy_steps_need() -> None:
    files = {path.relative_to(REPO).as_posix() for path in context_files()}
    assert {"pyproject.toml", "README.md", "src/stoker/cli.py", "src/stoker/controller/main.py"} <= files
    assert not any(name.startswith(("tests/", ".venv/", "charts/")) for name in files)


def test_the_clean_venv_runs_the_operator_entry_point(operator_venv: Path) -> None:
    help_text = subprocess.run(
        [str(operator_venv / "bin" / "stoker"), "run", "--help"],
        env=WITHOUT_PYTHONPATH,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert "STOKER_" in help_text
    imported = subprocess.run(
        [
            str(operator_venv / "bin" / "python"),
            "-c",
            "import stoker.controller.main, stoker; print(stoker.__file__)",
        ],
        env=WITHOUT_PYTHONPATH,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert str(operator_venv) in imported  # the wheel's copy, not the source tree


def test_the_runtime_image_installs_nothing_of_stoker() -> None:
    """Its pods copy stoker's programs (stoker.inpod, stoker.guard) from the operator's image, as any vLLM
    image's pods do (render.pods)."""
    install = " ".join(parse()["runtime"].all("RUN"))
    assert "stoker" not in install and "/dist" not in install


def test_the_operator_image_ships_the_programs_its_pods_copy(operator_venv: Path, tmp_path: Path) -> None:
    """What the pods' init container runs, from the wheel: a copy that runs on the standard library alone."""
    subprocess.run(
        [str(operator_venv / "bin" / "stoker"), "programs", str(tmp_path)],
        env=WITHOUT_PYTHONPATH,
        check=True,
        capture_output=True,
        timeout=60,
    )
    for program in ("read_ahead", "seed", "download"):
        usage = subprocess.run(
            [sys.executable, "-S", "-m", f"stoker.inpod.{program}", "--help"],
            env={**WITHOUT_PYTHONPATH, "PYTHONPATH": str(tmp_path)},
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        assert usage.startswith(f"usage: python3 -m stoker.inpod.{program}")


def test_the_runtime_streamer_pin_exists_for_the_image_python(tmp_path: Path) -> None:
    """The runtime target's pip install, resolved for the vLLM image's CPython 3.12 on x86-64 Linux."""
    stages = parse()
    stage_args = dict(arg.partition("=")[::2] for arg in stages["runtime"].all("ARG"))
    version = stage_args["RUNAI_STREAMER_VERSION"]
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps"),
            *("--only-binary=:all:", "--python-version", "3.12", "--platform", "manylinux2014_x86_64"),
            *("--dest", str(tmp_path)),
            *(f"{name}=={version}" for name in ("runai-model-streamer", "runai-model-streamer-s3")),
            *(f"{name}=={version}" for name in ("runai-model-streamer-gcs", "runai-model-streamer-azure")),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert len(list(tmp_path.glob("runai_model_streamer*.whl"))) == 4


def test_the_runtime_instanttensor_pin_exists_for_the_image_python(tmp_path: Path) -> None:
    stages = parse()
    version = dict(arg.partition("=")[::2] for arg in stages["runtime"].all("ARG"))["INSTANTTENSOR_VERSION"]
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps"),
            *("--only-binary=:all:", "--python-version", "3.12", "--platform", "manylinux_2_28_x86_64"),
            *("--dest", str(tmp_path), f"instanttensor=={version}"),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert len(list(tmp_path.glob("instanttensor-*.whl"))) == 1


def test_the_wheel_carries_the_version_of_pyproject(operator_venv: Path) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    installed = subprocess.run(
        [
            str(operator_venv / "bin" / "python"),
            "-c",
            "import importlib.metadata as m; print(m.version('stoker'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert installed == version

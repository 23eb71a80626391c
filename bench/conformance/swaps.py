"""Every change the harness makes to a rendered container before running it as a local process, and why.

The container's command, args and env are otherwise run exactly as rendered. The swaps:

- model: the positional model of `vllm serve` (a Hugging Face id, an s3:// URI or a /models path) becomes
  the tiny local checkpoint (bench/conformance/tiny_model.py): no network, no GPU-sized weights.
- port: the `--port` value (which the seed wrapper also asks) becomes a free loopback port, so runs and
  colleagues' processes on this machine do not collide.
- cache volume: env values under the cache mount (VLLM_CACHE_ROOT, VLLM_ASSETS_CACHE, TRITON_CACHE_DIR,
  TORCHINDUCTOR_CACHE_DIR, ...) and arguments under it (the import-pages listing that the seed wrapper
  writes and the read-ahead reads) point into one temp dir that the seed and the serving run share, as
  the PVC does; the model-cache mount (HF_HOME) points to another.
- programs volume: PYTHONPATH's entry for it (the wrappers `python3 -m stoker.inpod.NAME` run from it, vLLM
  imports stoker.guard from it) becomes stoker's sources, which hold the same files.
- secrets: env from Secrets (valueFrom, envFrom: HF_TOKEN, S3 credentials, the control token) is
  dropped; the local model needs none and the harness has no cluster.
- added env: VLLM_CPU_KVCACHE_SPACE=1 (the CPU backend sizes its KV cache in GiB from this, not from
  GPU memory), HF_HUB_OFFLINE=1 (no hub requests, the model is local), a fresh HOME (a container starts
  with an empty one), PATH as the runtime image has it (the version's venv first).
- GPU-only parts: `nvidia.com/gpu` limits, probes and mounts are pod fields, not part of the process, so
  they fall away by themselves; `--cudagraph-capture-sizes` stays (the CPU platform accepts and empties it).
  `--load-format instanttensor` (rendered for weights on a volume) becomes `auto`, vLLM's default loader:
  InstantTensor refuses to run without CUDA ("InstantTensor requires NVIDIA GPUs"). The read-ahead wrapper
  stays as rendered (it reads the rendered model path, which the swap leaves absent: nothing to read).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker.api.owned import PROGRAMS_MOUNT_PATH
from stoker.render import CACHE_MOUNT_PATH
from stoker.render.engine import MODEL_CACHE_MOUNT_PATH

STOKER_SOURCES = Path(__file__).resolve().parents[2] / "src"
SERVE_SUBCOMMAND = "serve"
# GPU-only load formats and what a CPU process loads with instead.
CPU_LOAD_FORMATS = {"instanttensor": "auto"}
CPU_KV_CACHE_GIB = "1"


@dataclass(frozen=True)
class LocalRun:
    """Where one local run of a rendered container finds its model, caches, port and interpreter."""

    venv: Path
    model_dir: Path
    cache_dir: Path
    hf_home: Path
    home: Path
    port: int


def container_argv(container: dict[str, Any]) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


def local_argv(argv: list[str], run: LocalRun) -> list[str]:
    """`argv` with the model, the port and paths on the cache volume swapped (see the module docstring)."""
    swapped = []
    previous = None
    for arg in argv:
        if previous == SERVE_SUBCOMMAND:
            arg = str(run.model_dir)
        elif previous == "--port":
            arg = str(run.port)
        elif previous == "--load-format":
            arg = CPU_LOAD_FORMATS.get(arg, arg)
        else:
            arg = _local_path(arg, run)
        swapped.append(arg)
        previous = arg
    return swapped


def _local_path(value: str, run: LocalRun) -> str:
    mounts = (
        (CACHE_MOUNT_PATH, run.cache_dir),
        (MODEL_CACHE_MOUNT_PATH, run.hf_home),
        (PROGRAMS_MOUNT_PATH, STOKER_SOURCES),
    )
    for mount, local in mounts:
        if value == mount or value.startswith(mount + "/"):
            return str(local) + value[len(mount) :]
    return value


def local_env(container: dict[str, Any], run: LocalRun) -> dict[str, str]:
    """The container's plain env with mounts moved to local dirs, plus what the CPU process needs."""
    env = {
        "HOME": str(run.home),
        "PATH": f"{run.venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "VLLM_CPU_KVCACHE_SPACE": CPU_KV_CACHE_GIB,
        "HF_HUB_OFFLINE": "1",
    }
    for var in container.get("env", []):
        if var["name"] == "PYTHONPATH":
            env["PYTHONPATH"] = ":".join(_local_path(entry, run) for entry in var["value"].split(":"))
        elif "value" in var:
            env[var["name"]] = _local_path(var["value"], run)
    return env

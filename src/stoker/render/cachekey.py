"""stoker's compile-cache key: a stable hash of what the engine hashes into its torch.compile cache key.

vLLM's key (backend dir `torch_compile_cache/<H10>`, AOT dir `torch_aot_compile/<H64>`) covers:
- every registered `VLLM_*` environment value except the release's ignore list (cache root, host/port,
  logging, usage stats, multiprocessing method, ...; `EngineProfile.key_ignored_env`): here, every
  `VLLM_*` variable outside that list;
- the resolved defaults of paths derived from HOME / XDG_* and CUDA_HOME, and TORCHINDUCTOR_* / TRITON_*
  settings through the Inductor config: here, those variables when set. VLLM_CONFIG_ROOT (default
  ~/.config/vllm) and VLLM_XLA_CACHE_PATH (default ~/.cache/vllm/xla_cache) are hashed by vLLM 0.22.1-0.26.0
  (the 0.28.0 wheel's envs.compile_factors ignores both), so a seed and a serving pod with different HOMEs
  would compute different keys: engine_env pins both under the cache mount for every version, as it does
  VLLM_CACHE_ROOT and VLLM_ASSETS_CACHE (with them set, compile_factors of 0.22.1, 0.25.1, 0.26.0 and
  0.32.0 no longer depends on HOME; measured: bench/results/home-split-v0.26.0/);
- HF_HUB_OFFLINE, indirectly: it rewrites a repo id to its snapshot path, and the model string is hashed;
- the model string, revision, TP size, max-model-len, capture sizes, eager mode and every other engine
  flag: here, the serving args minus the flags the release ignores (port, served model name, GPU memory
  utilisation, load format and loader config, and from 0.26 the KV-cache byte budget;
  `EngineProfile.key_ignored_flags`);
- the image (vLLM/torch/Triton builds, install paths of traced sources), the engine version (a different
  engine is a different cache even under one image name) and the cache mount path (the cache index stores
  absolute paths): here, all three;
- the GPU model: here, spec.runtime.nodeSelector, the only spec field that picks the GPU.
Not covered by vLLM and left out here: replicas, gpus beyond TP, tolerations, resources, the load format,
served model name, GPU memory utilisation, pod names. Secret-sourced variables enter by reference (the
secret's name and key), since their values are not known without the cluster.
"""

from __future__ import annotations

import hashlib
import json

from stoker.api import VLLMService
from stoker.engines import EngineProfile
from stoker.render.engine import engine_invocation, key_relevant_args

# Bump when the set of factors changes, so that old seeds are not taken for current ones.
KEY_FORMAT = 2
SHORT_KEY_LENGTH = 10

_KEY_ENV_PREFIXES = ("VLLM_", "TORCH", "TRITON_", "XDG_")
_KEY_ENV_NAMES = frozenset({"HF_HUB_OFFLINE", "HOME", "CUDA_HOME"})


def env_in_key(name: str, profile: EngineProfile) -> bool:
    if name in profile.key_ignored_env:
        return False
    return name in _KEY_ENV_NAMES or name.startswith(_KEY_ENV_PREFIXES)


def cache_key_factors(svc: VLLMService) -> dict[str, object]:
    invocation = engine_invocation(svc, "serve")
    profile = svc.spec.runtime.engine_profile
    return {
        "format": KEY_FORMAT,
        "image": invocation.image,
        "engineVersion": svc.spec.runtime.resolved_engine_version,
        "command": invocation.command,
        "args": key_relevant_args(invocation.args, profile),
        "env": {name: value for name, value in invocation.env.items() if env_in_key(name, profile)},
        "envFrom": {
            var.name: var.value_from
            for var in svc.spec.runtime.env
            if var.value_from is not None and env_in_key(var.name, profile)
        },
        "cacheMountPath": invocation.cache_mount_path,
        "nodeSelector": svc.spec.runtime.node_selector,
    }


def cache_key(svc: VLLMService) -> str:
    canonical = json.dumps(cache_key_factors(svc), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def short_cache_key(svc: VLLMService) -> str:
    return cache_key(svc)[:SHORT_KEY_LENGTH]

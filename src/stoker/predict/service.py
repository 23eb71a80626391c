"""A VLLMService's hardware class and engine settings, as the predictor takes them.

One reading for the operator (status.startup.expected) and `stoker predict -f`: the settings come from the
invocation stoker renders for the service (for serving pods, what their Deployment runs: vLLM under the
read-ahead where it applies), the hardware class from its spec.
"""

from __future__ import annotations

from stoker.api import VLLMService
from stoker.phases import CompileCache
from stoker.predict.model import EngineSettings, HardwareClass
from stoker.predict.settings import engine_settings
from stoker.render import Role, engine_invocation
from stoker.render.peers import fallback_env, peers_enabled
from stoker.render.prefetch import serving_invocation

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
# A service that names no GPU product: the class stoker's own coefficients were measured on.
DEFAULT_GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"


def hardware_class(svc: VLLMService) -> HardwareClass:
    runtime = svc.spec.runtime
    product = runtime.node_selector.get(GPU_PRODUCT_LABEL, DEFAULT_GPU_PRODUCT)
    return HardwareClass(
        # `_` separates the parts of a hardware key; label values may hold one, product names do not.
        gpu_product=product.replace("_", "-"),
        gpu_count=runtime.gpus,
        engine_version=runtime.resolved_engine_version,
    )


def service_settings(svc: VLLMService, cache_state: CompileCache, role: Role = "serve") -> EngineSettings:
    """The settings of the `role` pod's rendered `vllm serve`, with `cache_state` expected."""
    invocation = serving_invocation(svc) if role == "serve" else engine_invocation(svc, role)
    # The pod's environment beside the invocation's: ModelExpress's switches say which loader reads storage.
    env = {**invocation.env, **(fallback_env(svc) if role == "serve" and peers_enabled(svc) else {})}
    return engine_settings(invocation.argv, env, cache_state, svc.spec.runtime.resolved_engine_version)

"""What a vLLM startup log says at each phase boundary, as regular-expression alternatives per wording.

Each wording is written once here with the release that introduced it (file:line in that release's wheel);
the profiles in `profiles.py` pick the wordings their releases print. A pattern matches the start of a log
message (the text after vLLM's `LEVEL date time [file:line] ` header), never a whole line.
"""

from enum import StrEnum


class Marker(StrEnum):
    """A log message that bounds a phase or tells how torch.compile used its cache."""

    ARGS = "args"
    ARCHITECTURE = "architecture"
    LOAD_START = "load_start"
    LOADED = "loaded"
    DYNAMO = "dynamo"
    COMPILED = "compiled"
    KV_CACHE = "kv_cache"
    JIT_WARMUP_DONE = "jit_warmup_done"
    JIT_MONITOR = "jit_monitor"
    GRAPHS = "graphs"
    SERVER = "server"
    GRAPH_FROM_CACHE = "graph_from_cache"
    GRAPH_COMPILED = "graph_compiled"
    GRAPH_STORED = "graph_stored"
    CACHE_LOAD_FAILED = "cache_load_failed"


# 0.32 tags compile lines with the compiled component (`[backbone] `, `[eagle_head] `, an encoder's class
# name): compilation/backends.py:147 `_log_prefix`, compilation/monitor.py:40.
COMPILE_TAG = r"(?:\[[\w.-]+\] )?"

# Wordings every supported release prints (0.22.1 file:line; the text is unchanged through 0.33.0).
COMMON: tuple[tuple[Marker, str], ...] = (
    (Marker.ARGS, r"non-default args: "),  # entrypoints/utils.py:278
    (Marker.ARCHITECTURE, r"Resolved architecture: "),  # config/model.py:617
    # V1 runner (v1/worker/gpu_model_runner.py:5038, cpu_model_runner.py:104) | V2 (gpu/model_runner.py:274)
    (Marker.LOAD_START, r"Starting to load model |Loading model from scratch"),
    # V1 "GiB memory and" | V2 "GiB and" (gpu/model_runner.py:296; V1 wording from 0.28)
    (Marker.LOADED, r"Model loading took "),
    (Marker.GRAPHS, r"Graph capturing finished "),  # gpu_model_runner.py:6457
    (Marker.SERVER, r"Starting vLLM server on "),  # entrypoints/openai/api_server.py:596
    # The CPU runner prints no load, Dynamo or compile totals: it announces a warm-up, which compiles,
    # right after loading weights, and its end (v1/worker/cpu_model_runner.py:121, :125; from 0.23
    # v1/worker/cpu/model_runner.py:13, :16).
    (Marker.LOADED, r"Warming up model for the compilation"),
    (Marker.COMPILED, r"Warming up done\."),
)

# Untagged compile lines, 0.22.1 to 0.31.x.
UNTAGGED_COMPILE: tuple[tuple[Marker, str], ...] = (
    (Marker.DYNAMO, r"Dynamo bytecode transform time: "),  # compilation/backends.py:1149
    (Marker.COMPILED, r"torch\.compile took [\d.]+ s in total"),  # compilation/monitor.py:20
    # AOT artifact (decorators.py:312) | per-range Inductor artifact (backends.py:293)
    (Marker.GRAPH_FROM_CACHE, r"Directly load (?:AOT compilation from path|the compiled graph)"),
    (Marker.GRAPH_COMPILED, r"Compiling a graph for "),  # backends.py:394
    (Marker.GRAPH_STORED, r"saved AOT compiled function |Cache the graph of "),  # decorators.py:709, :379
    # A kept AOT artifact that could not be used: vLLM compiles again (decorators.py:322).
    (Marker.CACHE_LOAD_FAILED, r"Compiling model again due to a load failure"),
)

# 0.32.0: the same lines behind the component tag (backends.py:1167, monitor.py:20, decorators.py:320,
# backends.py:296, :399, decorators.py:744, backends.py:383, decorators.py:334).
TAGGED_COMPILE: tuple[tuple[Marker, str], ...] = tuple(
    (marker, COMPILE_TAG + f"(?:{pattern})") for marker, pattern in UNTAGGED_COMPILE
)

# GPU KV-cache line: 0.22.1 `GPU KV cache size: ` (v1/core/kv_cache_utils.py:1733); 0.28.0 merges it with
# the concurrency line, same start (kv_cache_utils.py:1870); 0.30.0 names the device, `%s KV cache size: `
# with the device type (GPU, CPU, ...; kv_cache_utils.py:2396), plus ` + host` on 0.33.0 (:1145).
KV_CACHE_GPU = ((Marker.KV_CACHE, r"GPU KV cache size: "),)
KV_CACHE_ANY_DEVICE = ((Marker.KV_CACHE, r"[A-Z]+(?: \+ host)? KV cache size: "),)

# 0.22.1 activates the kernel JIT monitor right after warm-up ends (triton_utils/jit_monitor.py:55, "—");
# 0.25.1 rewords it (utils/jit_monitor.py:74, ";"). Model Runner V2's kernel warm-up runs silently before it
# on 0.26.0 to 0.28.x (v1/worker/gpu_worker.py:863 `warmup_kernels`).
JIT_MONITOR = ((Marker.JIT_MONITOR, r"Kernel JIT monitor activated"),)
# 0.29.0 logs its JIT warm-up (model_executor/warmup/kernel_warmup.py:124 `starting.`, :135 `finished in`).
JIT_WARMUP_LOGGED = ((Marker.JIT_WARMUP_DONE, r"JIT kernel warmup finished in "),)

# The device memory the loaded weights took, in GiB rounded to 0.01 (utils/mem_utils.py `format_gib`), at the
# end of the LOADED line: one worker's share of the model in its dtype, the same with dummy weights. The V1
# runner logs it once per node (v1/worker/gpu_model_runner.py:5133 `%s GiB memory and`), Model Runner V2 on
# every rank (v1/worker/gpu/model_runner.py:296 `%s GiB and`; `GiB memory and` from 0.28.0, :381). The CPU
# runner logs none.
WEIGHT_MEMORY_EITHER_RUNNER = r"Model loading took (\d+(?:\.\d+)?) GiB (?:memory )?and "
WEIGHT_MEMORY = r"Model loading took (\d+(?:\.\d+)?) GiB memory and "

# Wordings of releases before 0.22, kept so that the version-tolerant parse still reads their logs.
PRE_0_22: tuple[tuple[Marker, str], ...] = (
    (Marker.LOADED, r"Loading model weights took "),  # V0
    (
        Marker.COMPILED,
        r"torch\.compile (?:and initial profiling/warmup run together )?takes [\d.]+ s in total",
    ),
    (Marker.KV_CACHE, r"# (?:GPU|cuda) blocks: "),  # V0
    (Marker.SERVER, r"Starting vLLM API server (?:\d+ )?on "),
)

"""Weights from a peer, once, on a host with two GPUs: does vLLM's `modelexpress` loader with stoker's
rendered ModelExpress settings load a replica from a running one, and does that replica answer as the one
that read the disk? (issue 39; not the benchmark the issue asks for: no network namespaces, one start each)

Replica A (GPU 0) finds no source and loads from the disk, then publishes; replica B (GPU 1) takes its
weights from A. Both run stoker's rendered `vllm serve` arguments and ModelExpress environment for
MANIFEST with peerWeights on, with what a host lacks replaced: the per-rank Service becomes A's address,
the pod IP 127.0.0.1, and B's own ports move up by 100 (both processes see their GPU as device 0).
`--enforce-eager`: no seed, no compile; the weights are what is compared. Writes OUT/A.log, OUT/B.log and
OUT/peer-smoke.json (ready times, B's weights as stoker's phase parser reads them, greedy completions).

With --one-gpu both replicas share GPU 0 (each with 40 % of its memory): the transfer is then CUDA IPC on
one device, which says nothing of speed but as much of correctness. With --quantization fp8 both replicas
quantize the bf16 checkpoint while loading (vLLM's online FP8), so what B receives are A's post-processed
FP8 weights and scales, not what is on the disk.

usage (repository root, PYTHONPATH=src:.:bench/gpu):
    python3 bench/gpu/peer_smoke.py MANIFEST OUT [--one-gpu] [--quantization fp8]
"""

from __future__ import annotations

import argparse
import json
import urllib.request
from pathlib import Path

from harness import HOME, completion_request, start_server
from profiles import Invocation, load_service, serve_invocation

from stoker.phases import parse_log
from stoker.render.peers import MANIFEST_PORT, NIXL_PORT, fallback_env, peer_env

PROMPTS = ["def main():", "The capital of France is", "1, 2, 3, 5, 8,", "Once upon a time"]
SHIFT = 100


def invocation(manifest: str, replica: str, one_gpu: bool, quantization: str | None) -> Invocation:
    svc = load_service(manifest)
    svc.spec.cold_start.peer_weights.enabled = True
    rendered = serve_invocation(svc, "stoker")
    vllm = rendered.argv[rendered.argv.index("vllm") :]
    env = {var["name"]: var["value"] for var in peer_env(svc) if "value" in var}
    env.update(fallback_env(svc))
    shift = SHIFT if replica == "B" else 0
    env.update(
        MX_K8S_SERVICE_PATTERN=f"127.0.0.1:{MANIFEST_PORT}",
        MX_WORKER_HOST="127.0.0.1",
        MX_WORKER_GRPC_PORT=str(MANIFEST_PORT + shift),
        MX_METADATA_PORT=str(NIXL_PORT + shift),
        CUDA_VISIBLE_DEVICES="1" if replica == "B" and not one_gpu else "0",
        PYTHONPATH=f"{HOME}/site:{HOME}/mx",
        VLLM_USE_FLASHINFER_SAMPLER="0",
    )
    port = 8000 + shift
    argv = [*vllm, "--enforce-eager", "--port", str(port)]
    if one_gpu:
        argv += ["--gpu-memory-utilization", "0.4"]
    if quantization:
        argv += ["--quantization", quantization]
    return Invocation(argv, env, port, rendered.served_model_name, None)


def greedy(base: str, model: str) -> list[str]:
    texts = []
    for prompt in PROMPTS:
        body = {"model": model, "prompt": prompt, "max_tokens": 24, "temperature": 0}
        with urllib.request.urlopen(completion_request(base, body), timeout=120) as response:
            texts.append(json.loads(response.read())["choices"][0]["text"])
    return texts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("manifest")
    parser.add_argument("out", type=Path)
    parser.add_argument("--one-gpu", action="store_true", help="both replicas on GPU 0")
    parser.add_argument("--quantization", help="vLLM's --quantization for both replicas, e.g. fp8")
    args = parser.parse_args()
    manifest, out = args.manifest, args.out
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, object] = {"oneGpu": args.one_gpu, "quantization": args.quantization}
    source = start_server(out / "A.log", invocation(manifest, "A", args.one_gpu, args.quantization))
    result["A"] = {"readySeconds": source.ready_seconds}
    try:
        if source.ready_seconds is None:
            return
        inv = invocation(manifest, "B", args.one_gpu, args.quantization)
        target = start_server(out / "B.log", inv)
        result["B"] = {"readySeconds": target.ready_seconds, "argv": inv.argv, "env": inv.env}
        try:
            if target.ready_seconds is not None:
                a, b = greedy(source.base, inv.served_model_name), greedy(target.base, inv.served_model_name)
                result["greedy"] = {"A": a, "B": b, "equal": a == b}
        finally:
            target.stop()
        for name in ("A", "B"):
            with (out / f"{name}.log").open(errors="replace") as log:
                result[name]["parsed"] = parse_log(log).to_json_dict()  # type: ignore[index]
    finally:
        source.stop()
        (out / "peer-smoke.json").write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result, indent=1)[:6000], flush=True)


if __name__ == "__main__":
    main()

#!/bin/bash
# Build an offline vLLM bundle for the air-gapped x86-64 H100/H200 host, whose image already has torch
# 2.11.0+cu130, transformers, tokenizers, safetensors, numpy (/work/shared/gpu/README.md), and split it into
# parts of at most 45 MiB (one per device call; bench/gpu/setup.sh reassembles them).
# usage: build.sh VERSION OUTDIR   (VERSION has a deps-VERSION.txt beside this script; needs pip access)
set -euo pipefail
VERSION=${1:?VERSION} OUT=${2:?OUTDIR}; W=$(mktemp -d); mkdir -p "$OUT"
PLAT="--python-version 3.12 --implementation cp --only-binary=:all: --platform manylinux_2_28_x86_64
 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_27_x86_64
 --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64"
python3 -m pip download -q --no-deps $PLAT -d "$W/whl" "vllm==$VERSION" runai-model-streamer==0.16.1
# vLLM's pure-Python and small native dependencies that the GPU image lacks, from the wheel's Requires-Dist
# (torch, flashinfer and the optional kernel packages are left out on purpose: the image has torch; the
# rest load lazily, and VLLM_USE_FLASHINFER_SAMPLER=0 keeps the sampler off flashinfer).
python3 -m pip download -q --no-deps $PLAT -d "$W/bundle/deps" -r "$(dirname "$0")/deps-$VERSION.txt"
cp "$W"/whl/runai_model_streamer-*.whl "$W/bundle/deps/"
mkdir -p "$W/v" && (cd "$W/v" && unzip -q "$W"/whl/vllm-"$VERSION"-*.whl)
# Not needed for a dense model on Hopper: FA2 (FA3 is used), the optional Rust frontend, MoE kernels
# (_moe_C up to 0.22, _moe_C_stable_libtorch from 0.26: only torch.ops._moe_C.* of fused_moe), SM100-only
# attention sources, other CPython builds of DeepGEMM.
rm -rf "$W"/v/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so "$W"/v/vllm/vllm-rs "$W"/v/vllm/_moe_C.abi3.so \
      "$W"/v/vllm/_moe_C_stable_libtorch.abi3.so "$W"/v/vllm/third_party/fmha_sm100 \
      "$W"/v/vllm/third_party/deep_gemm/_C.cpython-31[01345]-*.so
tar -C "$W/v" -cf - vllm "vllm-$VERSION.dist-info" | xz -T0 -6 > "$W/bundle/vllm.tar.xz"
tar -C "$W/bundle" -cf "$W/bundle.tar" .
split -b 45M -d -a 2 "$W/bundle.tar" "$OUT/part-"
ls -la "$OUT"; rm -rf "$W"

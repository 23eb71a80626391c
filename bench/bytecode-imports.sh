#!/usr/bin/env bash
# bench/bytecode-imports.sh: the API server's imports (`import vllm.entrypoints.openai.api_server`) in the
# real vLLM CPU venv (hack/vllm-venv) with its bytecode, in a copy of it without (as an image installed by uv,
# whose engine cannot write beside the image's files), and in that copy under stoker's prefix
# (stoker.inpod.keep_bytecode): first the seed's start, which writes it, then serving starts, which load it.
# Wall seconds, one line each, interleaved; results in bench/results/bytecode-imports-cpu.txt.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$HOME/.cache/stoker/vllm/0.26.0}"
WORK="${WORK:-/tmp/stoker-bytecode}"
COPY="$WORK/venv-without-bytecode" PREFIX="$WORK/prefix"
if [[ ! -d "$COPY" ]]; then
  mkdir -p "$WORK" && cp -al "$VENV" "$COPY"   # hard links: the copy's files are the venv's
  find "$COPY" -name __pycache__ -type d -prune -exec rm -rf {} +
fi
IMPORT="import vllm.entrypoints.openai.api_server"
KEEP="from stoker.inpod import keep_bytecode; print(keep_bytecode('$PREFIX')); $IMPORT"
seconds() { local began=$EPOCHREALTIME; "$@" > /dev/null 2>&1; echo "$EPOCHREALTIME - $began" | bc; }
with() { seconds env -u PYTHONPYCACHEPREFIX "$VENV/bin/python" -c "$IMPORT"; }
without() { seconds env PYTHONDONTWRITEBYTECODE=1 "$COPY/bin/python" -c "$IMPORT"; }
kept() { seconds env PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$REPO/src" "$COPY/bin/python" -c "$KEEP"; }
echo "with-bytecode $(with)"; echo "without-bytecode $(without)"
rm -rf "$PREFIX"; echo "prefix-seed $(kept)"
for rep in 1 2 3; do echo "with-bytecode $(with)"; echo "without-bytecode $(without)"; echo "prefix $(kept)"; done
echo "prefix size $(du -sh "$PREFIX" | cut -f1), $(find "$PREFIX" -name '*.pyc' | wc -l) files"

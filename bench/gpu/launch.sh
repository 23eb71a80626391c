#!/bin/bash
# Device call after the last bundle part arrived: install vLLM, write the model, profile imports once, then
# start the benchmark driver detached (it outlives this call) and wait for it like harvest.sh does.
# usage (repo root, on the device): bench/gpu/launch.sh LAST_PART_DIR STOP_AFTER_S CALL_BUDGET_S [driver args]
set -euo pipefail
part_dir=$1 stop_after=$2 call_budget=$3; shift 3
start=$(date +%s)
mkdir -p /root/stage /root/out /models && cp "$part_dir"/part-* /root/stage/
python3 bench/gpu/make_model.py /models/synth8b > /root/out/model.json 2>&1 &
model=$!
bash bench/gpu/setup.sh
wait $model
rm -rf /root/bench && mkdir -p /root/bench && cp -r bench/gpu src /root/bench/
# Where the ~20 s before vLLM's first line go: one import profile of the API server, cold page cache.
sync && echo 3 > /proc/sys/vm/drop_caches
PYTHONPATH=/root/site python3 -X importtime -c "import vllm.entrypoints.cli.serve" 2> /root/out/importtime.txt || true
cd /root/bench/gpu
PYTHONPATH=/root/bench/src:/root/site setsid nohup python3 coldstart.py llama-8b.json /root/out \
    --stop-after "$stop_after" "$@" > /root/out/driver.log 2>&1 < /dev/null &
echo "driver started after $(( $(date +%s) - start )) s"
cd - > /dev/null
exec bash bench/gpu/harvest.sh $(( call_budget - ($(date +%s) - start) ))

#!/bin/bash
# Device call after the last bundle part arrived: install vLLM, write the model, profile imports once, then
# start the benchmark driver detached (it outlives this call) and wait for it like harvest.sh does.
# The driver starts no run that would end after /root/t0 (written by the first call) + LEASE_S.
# usage (repo root, on the device): [MANIFEST=llama-8b-tp2.json] bench/gpu/launch.sh LAST_PART_DIR LEASE_S CALL_BUDGET_S [driver args]
set -euo pipefail
part_dir=$1 lease=$2 call_budget=$3; shift 3
start=$(date +%s)
mkdir -p /root/stage /root/bench-out /models && cp "$part_dir"/part-* /root/stage/
python3 bench/gpu/make_model.py /models/synth8b > /root/bench-out/model.json 2>&1 &
model=$!
# The image ships torch without bytecode (PYTHONDONTWRITEBYTECODE=1, so none is ever written): every process
# would compile torch's sources again. A real image ships bytecode; compile it once, for every profile alike.
python3 -m compileall -q -j 16 "$(python3 -c 'import site; print(site.getsitepackages()[0])')" > /dev/null 2>&1 || true
bash bench/gpu/setup.sh
wait $model
rm -rf /root/bench && mkdir -p /root/bench && cp -r bench/gpu src /root/bench/
# Where the ~20 s before vLLM's first line go: one import profile of the API server, cold page cache.
sync && echo 3 > /proc/sys/vm/drop_caches
PYTHONPATH=/root/site python3 -X importtime -c "import vllm.entrypoints.cli.serve" 2> /root/bench-out/importtime.txt || true
cd /root/bench/gpu
stop_after=$(( $(cat /root/t0) + lease - $(date +%s) ))
PYTHONPATH=/root/bench/src:/root/site setsid nohup python3 coldstart.py "${MANIFEST:-llama-8b.json}" /root/bench-out \
    --stop-after "$stop_after" "$@" > /root/bench-out/driver.log 2>&1 < /dev/null &
echo "driver started after $(( $(date +%s) - start )) s, stop after ${stop_after} s"
cd - > /dev/null
exec bash bench/gpu/harvest.sh $(( call_budget - ($(date +%s) - start) ))

#!/bin/bash
# Device calls for a benchmark driver that takes MANIFEST OUT [args] (seedwarmup.py, standby.py), with the
# model written and the image's bytecode compiled while the bundle parts arrive.
#   first call (carrying the first bundle part):  [LAYERS=8] bench/gpu/launch-staged.sh prep PART_DIR
#     stages the part, writes /root/t0, and starts the model writer and the bytecode compile detached
#   middle calls:                                  bench/gpu/launch-staged.sh stage PART_DIR
#   last call:  DRIVER=standby.py [MANIFEST=...] bench/gpu/launch-staged.sh go LAST_PART_DIR LEASE_S CALL_BUDGET_S [args]
#     installs vLLM, starts the driver detached (--stop-after: no run ends after /root/t0 + LEASE_S), harvests
set -euo pipefail
mode=$1 part_dir=$2; shift 2
start=$(date +%s)
mkdir -p /root/stage /root/bench-out /models && cp "$part_dir"/part-* /root/stage/
case $mode in
prep)
    date +%s > /root/t0
    site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
    # The image ships torch without bytecode; compile it once, for every run alike (as launch.sh does).
    setsid nohup bash -c "python3 -m compileall -q -j 16 $site > /dev/null 2>&1; echo \$? > /root/compile.done" \
        < /dev/null > /dev/null 2>&1 &
    setsid nohup bash -c "LAYERS=${LAYERS:-8} python3 $PWD/bench/gpu/make_model.py /models/synth8b \
        > /root/bench-out/model.json 2>&1; echo \$? > /root/model.done" < /dev/null > /dev/null 2>&1 &
    sleep 2; ls /root/stage; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; exit 0 ;;
stage) ls /root/stage; exit 0 ;;
esac
lease=$1 call_budget=$2; shift 2
while [ ! -f /root/model.done ] || [ ! -f /root/compile.done ]; do sleep 1; done
echo "model rc $(cat /root/model.done), compile rc $(cat /root/compile.done), waited $(( $(date +%s) - start )) s"
bash bench/gpu/setup.sh
rm -rf /root/bench && mkdir -p /root/bench && cp -r bench/gpu src /root/bench/
cd /root/bench/gpu
stop_after=$(( $(cat /root/t0) + lease - $(date +%s) ))
PYTHONPATH=/root/bench/src:/root/site setsid nohup python3 "${DRIVER:-seedwarmup.py}" "${MANIFEST:-llama-8b.json}" /root/bench-out \
    --stop-after "$stop_after" "$@" > /root/bench-out/driver.log 2>&1 < /dev/null &
echo "driver started after $(( $(date +%s) - start )) s, stop after ${stop_after} s"
cd - > /dev/null
exec bash bench/gpu/harvest.sh $(( call_budget - ($(date +%s) - start) ))

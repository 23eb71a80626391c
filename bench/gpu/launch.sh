#!/bin/bash
# The device calls of every GPU benchmark (bench/gpu/coldstart.py and its modes), one call per bundle part
# (bench/gpu/bundle/build.sh), with the models written and the image's bytecode compiled while parts arrive.
# Run from the repository root on the device:
#   first call:   [MODEL_ARGS=...] bench/gpu/launch.sh prep PART_DIR
#       stages the part, writes /root/t0 (the lease's start), starts the model writer and the bytecode
#       compile detached. MODEL_ARGS are make_model.py's arguments: "/models/synth8b" (the default; LAYERS=N
#       for fewer layers) or "/models --shapes NAME,..." (the predictor's sweep). With LOADER_WHEELS=DIR (the
#       weight loaders' wheels, carried beside the part), it also tries them on the GPU (loader_smoke.py).
#   middle calls: bench/gpu/launch.sh stage PART_DIR
#   last call:    [MANIFEST=llama-8b.json] [IMPORT_PROFILE=1] bench/gpu/launch.sh go PART_DIR LEASE_S CALL_S [driver args]
#       does prep's work first if no prep call came (all parts in one call), installs vLLM, waits for the
#       model and the bytecode, optionally profiles the API server's imports (cold, then warm), starts coldstart.py
#       detached under /root/bench-out (--stop-after: no run ends after /root/t0 + LEASE_S), then harvests.
#   later calls:  bench/gpu/launch.sh harvest SECONDS [DRIVER_LOG]
#       waits up to SECONDS (or until the driver prints "done" or is gone), then packs /root/bench-out into
#       $OUT/bench-out.tgz (the device returns few files a call; $OUT is emptied before every call).
#   another run:  [MANIFEST=...] bench/gpu/launch.sh more NAME LEASE_S CALL_S [driver args]
#       after go's driver printed "done": a second driver on the installed host, into /root/bench-out/NAME.
set -euo pipefail
mode=$1; shift
start=$(date +%s)

harvest() {  # harvest SECONDS [DRIVER_LOG]
    local end=$(( $(date +%s) + $1 )) driver_log=${2:-/root/bench-out/driver.log}
    # Until the driver says done, or is gone (a driver that failed leaves no "done": its lease is not waited out).
    while [ "$(date +%s)" -lt "$end" ] && ! grep -qx done "$driver_log" 2>/dev/null \
        && pgrep -f "python3 coldstart.py" > /dev/null; do sleep 5; done
    tar -C /root -czf "$OUT/bench-out.tgz" bench-out
    cat "$driver_log"
}

start_driver() {  # start_driver OUT_DIR LEASE_S [driver args]: coldstart.py detached, stopping by the lease's end
    local out_dir=$1 lease=$2; shift 2
    rm -rf /root/bench && mkdir -p /root/bench/bench "$out_dir/logs" && cp -r src /root/bench/ \
        && cp -r bench/gpu bench/predictor bench/snapshot /root/bench/bench/
    local stop_after=$(( $(cat /root/t0) + lease - $(date +%s) ))
    ( cd /root/bench/bench/gpu && PYTHONPATH=/root/bench/src:/root/bench:/root/site setsid nohup python3 coldstart.py \
        "${MANIFEST:-llama-8b.json}" "$out_dir" --stop-after "$stop_after" "$@" > "$out_dir/driver.log" 2>&1 < /dev/null & )
    echo "driver started after $(( $(date +%s) - start )) s, stop after ${stop_after} s"
}

prep() {
    date +%s > /root/t0
    local site
    site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
    # The image ships torch without bytecode (PYTHONDONTWRITEBYTECODE=1, so none is ever written): every
    # process would compile its sources again. A real image ships bytecode; compile it once, for every run.
    setsid nohup bash -c "python3 -m compileall -q -j 16 $site > /dev/null 2>&1; echo \$? > /root/compile.done" \
        < /dev/null > /dev/null 2>&1 &
    setsid nohup bash -c "python3 -m bench.gpu.make_model ${MODEL_ARGS:-/models/synth8b} \
        > /root/bench-out/model.json 2>&1; echo \$? > /root/model.done" < /dev/null > /dev/null 2>&1 &
}

case $mode in
harvest) harvest "$@"; exit 0 ;;
more)
    name=$1 lease=$2 call_budget=$3; shift 3
    start_driver "/root/bench-out/$name" "$lease" "$@"
    harvest $(( call_budget - ($(date +%s) - start) )) "/root/bench-out/$name/driver.log"
    exit 0 ;;
esac
part_dir=$1; shift
mkdir -p /root/stage /root/bench-out /models && cp "$part_dir"/part-* /root/stage/
case $mode in
prep)
    prep; sleep 2; ls /root/stage; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    if [ -n "${LOADER_WHEELS:-}" ]; then
        python3 -m pip install -q --no-index --no-deps --target /root/loaders "$LOADER_WHEELS"/*.whl
        PYTHONPATH=/root/loaders timeout 180 python3 bench/gpu/loader_smoke.py /root/loader-smoke || true
    fi
    exit 0 ;;
stage) ls /root/stage; exit 0 ;;
go) [ -f /root/t0 ] || prep ;;
*) echo "unknown mode $mode" >&2; exit 2 ;;
esac
lease=$1 call_budget=$2; shift 2
bash bench/gpu/setup.sh
while [ ! -f /root/model.done ] || [ ! -f /root/compile.done ]; do sleep 1; done
echo "model rc $(cat /root/model.done), compile rc $(cat /root/compile.done), waited $(( $(date +%s) - start )) s"
cat /root/bench-out/model.json
if [ -n "${IMPORT_PROFILE:-}" ]; then
    # Where the ~20 s before vLLM's first line go: one import profile of the API server, cold page cache.
    sync && echo 3 > /proc/sys/vm/drop_caches
    PYTHONPATH=/root/site python3 -X importtime -c "import vllm.entrypoints.cli.serve" \
        2> /root/bench-out/importtime.txt || true
    # Again with the page cache warm: what is left is the imports' CPU time, the rest was the cold disk.
    PYTHONPATH=/root/site python3 -X importtime -c "import vllm.entrypoints.cli.serve" \
        2> /root/bench-out/importtime-warm.txt || true
fi
start_driver /root/bench-out "$lease" "$@"
harvest $(( call_budget - ($(date +%s) - start) ))

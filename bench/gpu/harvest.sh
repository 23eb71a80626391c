#!/bin/bash
# Device call while the driver runs: wait up to SECONDS (or until it prints "done"), then copy what it has
# written (logs gzipped) into $OUT. usage: bench/gpu/harvest.sh SECONDS
end=$(( $(date +%s) + $1 ))
while [ "$(date +%s)" -lt "$end" ] && ! grep -qx done /root/out/driver.log 2>/dev/null; do sleep 5; done
mkdir -p "$OUT/out" && cp -r /root/out/. "$OUT/out/" && gzip -rf "$OUT/out/logs" "$OUT/out/importtime.txt" 2>/dev/null
cat /root/out/driver.log

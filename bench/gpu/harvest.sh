#!/bin/bash
# Device call while the driver runs: wait up to SECONDS (or until it prints "done"), then pack what it has
# written under /root/bench-out into $OUT/bench-out.tgz (the device returns few files a call).
# /root/bench-out, never $OUT itself: $OUT is emptied before every call. usage: bench/gpu/harvest.sh SECONDS
end=$(( $(date +%s) + $1 ))
while [ "$(date +%s)" -lt "$end" ] && ! grep -qx done /root/bench-out/driver.log 2>/dev/null; do sleep 5; done
tar -C /root -czf "$OUT/bench-out.tgz" bench-out
cat /root/bench-out/driver.log

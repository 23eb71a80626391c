#!/bin/bash
# On the GPU host: reassemble the offline vLLM bundle (parts of bench/gpu/bundle/build.sh, copied
# one per device call into /root/stage), install it into /root/site with bytecode (a real image ships
# bytecode; without it every import compiles), and put a `vllm` console script on /root/bin, as pip does.
set -euo pipefail
cd /root/stage
cat part-* > bundle.tar
mkdir -p /root/site /root/bundle /root/bin
tar -xf bundle.tar -C /root/bundle
tar -xJf /root/bundle/vllm.tar.xz -C /root/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /root/site /root/bundle/deps/*.whl
python3 -m compileall -q -j 16 /root/site > /dev/null || true
cat > /root/bin/vllm <<'PY'
#!/usr/bin/env python3
import sys

from vllm.entrypoints.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
PY
chmod +x /root/bin/vllm
rm -rf /root/stage /root/bundle
echo "installed $(du -sh /root/site | cut -f1)"

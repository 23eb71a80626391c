#!/bin/bash
# bench/snapshot/kubelet-checkpoint.sh: the kubelet's checkpoint API (POST /checkpoint/NS/POD/CONTAINER) on a
# vLLM CPU pod on hack/node's real node (issue 40's Kubernetes side; results in
# bench/results/snapshot-kubelet-checkpoint-cpu.txt). Needs `hack/criu build`; brings up hack/cluster and hack/node
# with the e2e tests' settings if they are not up. It changes this machine for containerd's runc: a `criu` link in
# /usr/local/sbin (on containerd's PATH) and /etc/criu/runc.conf (the CRIU options runc reads: containerd passes
# none, and vLLM's engine holds a TCP connection and renamed semaphores), both removed at the end.
# The pod runs as root: a node's root needs CAP_SYS_RESOURCE to let CRIU read another uid's rlimits, which the
# development machine's root lacks.
set -uo pipefail
WORK=/tmp/stoker-kubelet-checkpoint
mkdir -p $WORK
cd "$(dirname "$0")/../.."
export STOKER_CLUSTER_DIR=/tmp/stoker-test-cluster STOKER_CLUSTER_PORT_BASE=24790 STOKER_POD_CIDR=10.245.0.0/16
hack/cluster status >/dev/null 2>&1 || hack/cluster up >$WORK/cluster.log 2>&1 || { echo cluster up failed; exit 1; }
hack/node status >/dev/null 2>&1 || hack/node up >$WORK/node.log 2>&1 || { echo node up failed; exit 1; }
eval "$(hack/cluster env)"
trap 'rm -f /usr/local/sbin/criu /etc/criu/runc.conf' EXIT
ln -sf "$(hack/criu bin)" /usr/local/sbin/criu
mkdir -p /etc/criu && printf 'tcp-established\nlink-remap\n' > /etc/criu/runc.conf
mkdir -p $WORK/models && { [ -f $WORK/models/tiny/config.json ] || ~/.cache/stoker/vllm/0.26.0/bin/python bench/conformance/tiny_model.py $WORK/models/tiny >/dev/null; }
chmod -R a+rX $WORK/models
kubectl create namespace snap 2>/dev/null
PYTHONPATH=src:. .venv/bin/python - <<'PY' | kubectl -n snap apply -f -
import json, sys
from bench.realnode import placement
from stoker.engines import DEFAULT_ENGINE_VERSION
pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "vllm"}, "spec": {**placement(),
  "securityContext": {"runAsUser": 0, "runAsGroup": 0, "seccompProfile": {"type": "RuntimeDefault"}},
  "containers": [{"name": "vllm", "image": f"ghcr.io/stoker-dev/stoker-vllm:{DEFAULT_ENGINE_VERSION}",
    "imagePullPolicy": "IfNotPresent",
    "command": ["vllm", "serve"], "args": ["/models/tiny", "--port", "8000", "--served-model-name", "tiny", "--max-model-len", "256"],
    "env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"}],
    "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 1},
    "resources": {"requests": {"memory": "4Gi"}},
    "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}]}],
  "volumes": [{"name": "models", "hostPath": {"path": "/tmp/stoker-kubelet-checkpoint/models", "type": "Directory"}}]}}
print(json.dumps(pod))
PY
kubectl -n snap wait --for=condition=Ready pod/vllm --timeout=600s || { kubectl -n snap describe pod vllm | tail -20; kubectl -n snap logs vllm | tail -20; exit 1; }
IP=$(kubectl -n snap get pod vllm -o jsonpath='{.status.podIP}')
curl -s -m 60 "http://$IP:8000/v1/completions" -H 'content-type: application/json' -d '{"model":"tiny","prompt":"The operator renders one","max_tokens":12,"temperature":0,"ignore_eos":true}' > $WORK/before.json; cat $WORK/before.json; echo
PKI=$STOKER_CLUSTER_DIR/pki
T0=$EPOCHREALTIME
curl -sk -m 900 --cert $PKI/admin.crt --key $PKI/admin.key -X POST "https://10.89.255.1:$((24790+6))/checkpoint/snap/vllm/vllm?timeout=900" > $WORK/checkpoint.json
echo "checkpoint took $(echo "$EPOCHREALTIME - $T0" | bc) s:"; cat $WORK/checkpoint.json; echo
ARCHIVE=$(python3 -c "import json; print(json.load(open('$WORK/checkpoint.json'))['items'][0])" 2>/dev/null) && { ls -la "$ARCHIVE"; tar -tf "$ARCHIVE" | head -20; }
curl -s -m 60 "http://$IP:8000/v1/completions" -H 'content-type: application/json' -d '{"model":"tiny","prompt":"The operator renders one","max_tokens":12,"temperature":0,"ignore_eos":true}' > $WORK/after.json; echo "after: $(cat $WORK/after.json)"

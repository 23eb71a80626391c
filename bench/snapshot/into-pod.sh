#!/bin/bash
# bench/snapshot/into-pod.sh: a vLLM CPU server dumped by CRIU from one pod of hack/node's real node and restored,
# from the host, into ANOTHER running pod's PID namespace, network namespace and cgroup, without the runtime's
# help (the kubelet restores nothing; issue 40). Results in bench/results/snapshot-into-pod-cpu.txt.
# The pods: stoker's vLLM image as root (CRIU reads the engine's rlimits), `sleep` as PID 1 and, in `src`, the
# engine as its child in a session of its own (`setsid`), so that its PIDs are free in `dst`'s namespace and
# CRIU can restore its session; its internal sockets on loopback (VLLM_HOST_IP, GLOO_SOCKET_IFNAME), which any
# network namespace has. What the dump cannot carry is copied from src's root to dst's: /dev/shm, the log (at
# its size at the dump), and the compiled code the engine maps (on a cache volume in stoker's pods).
# Needs `hack/criu build`; brings up hack/cluster and hack/node with the e2e tests' settings if they are not up.
set -uo pipefail
WORK=/tmp/stoker-snapshot-into-pod
mkdir -p $WORK
cd "$(dirname "$0")/../.."
REPO=$PWD
export STOKER_CLUSTER_DIR=/tmp/stoker-test-cluster STOKER_CLUSTER_PORT_BASE=24790 STOKER_POD_CIDR=10.245.0.0/16
hack/cluster status >/dev/null 2>&1 || hack/cluster up >$WORK/cluster.log 2>&1 || { echo cluster up failed; exit 1; }
hack/node status >/dev/null 2>&1 || hack/node up >$WORK/node.log 2>&1 || { echo node up failed; exit 1; }
eval "$(hack/cluster env)"
CRIU=$(hack/criu bin)
mkdir -p $WORK/models && { [ -f $WORK/models/tiny/config.json ] || ~/.cache/stoker/vllm/0.26.0/bin/python bench/conformance/tiny_model.py $WORK/models/tiny >/dev/null; }
chmod -R a+rX $WORK/models
kubectl create namespace snap 2>/dev/null
kubectl -n snap delete pod src dst --ignore-not-found --wait=true --grace-period=1 >/dev/null
for name in src dst; do
PYTHONPATH=src:. .venv/bin/python - $name $WORK <<'PY' | kubectl -n snap apply -f -
import json, sys
from bench.realnode import placement
from stoker.engines import DEFAULT_ENGINE_VERSION
name, work = sys.argv[1:]
serve = "setsid vllm serve /models/tiny --port 8000 --served-model-name tiny --max-model-len 256 >/tmp/vllm.log 2>&1 & "
pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {**placement(),
  "securityContext": {"runAsUser": 0, "runAsGroup": 0, "seccompProfile": {"type": "RuntimeDefault"}},
  "containers": [{"name": "vllm", "image": f"ghcr.io/stoker-dev/stoker-vllm:{DEFAULT_ENGINE_VERSION}",
    "imagePullPolicy": "IfNotPresent",
    "command": ["sh", "-c", (serve if name == "src" else "") + "exec sleep infinity"],
    "env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"}, {"name": "VLLM_HOST_IP", "value": "127.0.0.1"},
            {"name": "GLOO_SOCKET_IFNAME", "value": "lo"}],
    "resources": {"requests": {"memory": "4Gi"}},
    "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}]}],
  "volumes": [{"name": "models", "hostPath": {"path": f"{work}/models", "type": "Directory"}}]}}
print(json.dumps(pod))
PY
done
kubectl -n snap wait --for=condition=Ready pod/src pod/dst --timeout=300s >/dev/null || exit 1
complete() {  # complete POD: the greedy text of one completion through the pod's IP
    local ip; ip=$(kubectl -n snap get pod "$1" -o jsonpath='{.status.podIP}')
    curl -s -m 60 "http://$ip:8000/v1/completions" -H 'content-type: application/json' \
        -d '{"model":"tiny","prompt":"The operator renders one","max_tokens":12,"temperature":0,"ignore_eos":true}' \
        | python3 -c "import json,sys; print(repr(json.load(sys.stdin)['choices'][0]['text']))" 2>/dev/null
}
for _ in $(seq 1 60); do before=$(complete src); [ -n "$before" ] && break; sleep 5; done
echo "src answers: $before"
podpid() { local uid; uid=$(kubectl -n snap get pod "$1" -o jsonpath='{.metadata.uid}')
    for pid in $(pgrep -x sleep); do grep -q "$uid" /proc/$pid/cgroup && echo "$pid"; done; }
SRC=$(podpid src); DST=$(podpid dst); ENGINE=$(ps --ppid "$SRC" -o pid= | tr -d ' ' | head -1)
ns() { stat -L -c %i /proc/$SRC/ns/$1; }
# The namespaces dst has too are external; so are the host's bind mounts (files, volumes) and cgroup mounts.
EXTERNAL=(--external "pid[$(ns pid)]:pidns" --external "net[$(ns net)]:netns")
MOUNTS=$(awk '$5!="/" && ($(NF-2)=="ext4" || $(NF-2)=="cgroup") {print $5}' /proc/$ENGINE/mountinfo)
i=0; for m in $MOUNTS; do i=$((i+1)); EXTERNAL+=(--external "mnt[$m]:m$i"); done
rm -rf $WORK/img && mkdir $WORK/img
LOGSIZE=$(stat -c %s /proc/$SRC/root/tmp/vllm.log)
T0=$EPOCHREALTIME
$CRIU dump -t "$ENGINE" -D $WORK/img --tcp-established --link-remap --leave-running "${EXTERNAL[@]}" -o dump.log
echo "dump rc $? in $(echo "$EPOCHREALTIME - $T0" | bc) s (src serving on), $(du -sh $WORK/img | cut -f1)"
# The same mounts, from what dst has at those paths.
CID=$(grep ":memory:" /proc/$DST/cgroup | awk -F/ '{print $NF}')
ROOT=$STOKER_CLUSTER_DIR/node/containerd/state/io.containerd.runtime.v2.task/k8s.io/$CID/rootfs
MAPPED=(); i=0
for m in $MOUNTS; do i=$((i+1))
    line=$(awk -v m="$m" '$5==m' /proc/$DST/mountinfo | head -1)
    root=$(echo "$line" | awk '{print $4}')
    [ "$(echo "$line" | awk '{print $(NF-2)}')" = cgroup ] && source=/sys/fs/cgroup/${m#/sys/fs/cgroup/}$root || source=$root
    MAPPED+=(--external "mnt[m$i]:$source")
done
cp -a /proc/$SRC/root/dev/shm/. /proc/$DST/root/dev/shm/
mkdir -p /proc/$DST/root/home/vllm && cp -a /proc/$SRC/root/home/vllm/.cache /proc/$DST/root/home/vllm/
cp -a /proc/$SRC/root/tmp/. /proc/$DST/root/tmp/ && truncate -s "$LOGSIZE" /proc/$DST/root/tmp/vllm.log
CGROUP=$(grep ":memory:" /proc/$DST/cgroup | cut -d: -f3)
exec 5</proc/$DST/ns/pid 6</proc/$DST/ns/net
T0=$EPOCHREALTIME
$CRIU restore -d -D $WORK/img --tcp-established --inherit-fd "fd[5]:pidns" --inherit-fd "fd[6]:netns" --root "$ROOT" \
    "${MAPPED[@]}" --cgroup-root "$CGROUP" --pidfile $WORK/restored.pid -o restore.log
echo "restore rc $? in $(echo "$EPOCHREALTIME - $T0" | bc) s (image in the page cache)"
RESTORED=$(cat $WORK/restored.pid)
for kind in pid net; do
    echo "restored engine's $kind namespace is dst's: $([ "$(readlink /proc/$RESTORED/ns/$kind)" = "$(readlink /proc/$DST/ns/$kind)" ] && echo yes || echo no)"
done
echo "restored engine's memory cgroup: $(grep ':memory:' /proc/$RESTORED/cgroup | cut -d: -f3)"
echo "dst's container cgroup:          $CGROUP"
T0=$EPOCHREALTIME; after=$(complete dst)
echo "dst answers: $after ($(echo "$EPOCHREALTIME - $T0" | bc) s), equal: $([ "$before" = "$after" ] && echo yes || echo no)"
echo "src answers still: $(complete src)"
kubectl -n snap delete pod src dst --wait=false >/dev/null

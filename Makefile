# The two commands a newcomer needs: `make demo` and `make test`. Both set up what they need.
VENV := .venv
# bash with pipefail: a step whose output is filtered (pip's below) still fails when the step fails.
SHELL := bash
.SHELLFLAGS := -eo pipefail -c
BIN := $(VENV)/bin
CLUSTER := hack/cluster
DEMO_EXAMPLE ?= examples/minimal.yaml

.PHONY: venv cluster-build epp-build lws-build node-build criu-build vllm-venv node-images bench-realnode lint unit e2e test conformance conformance-flags predictor-cpu demo demo-real demo-down crds docs

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	@echo "make venv: $(VENV) with pip, stoker and its test tools (a line per package pip collects; about 1.5 min cold)"
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install --progress-bar off -e '.[test]' \
	  | awk '/^Collecting / {print; fflush()} /^Successfully installed / {print "installed", NF - 2, "packages"}'
	touch $@

# The control plane: etcd, Kubernetes, kwok and helm (about 10-20 min cold on 2 cores, seconds when present).
cluster-build:
	$(CLUSTER) build

# The Gateway API Inference Extension's endpoint picker and its ext_proc client, for tests/e2e/test_gateway.py
# only (2 min 57 s cold on 2 cores after the control plane's build, seconds when present); the demo does not
# use them.
epp-build:
	hack/epp build

# The LeaderWorkerSet controller (sigs.k8s.io/lws), for tests/e2e/test_multinode.py (2 min 12 s cold on 2 cores
# after the control plane's build, seconds when present); the demo does not use it.
lws-build:
	hack/lws build

# The real node: containerd, its runc shim and the pause binary (1 min 49 s cold on 2 cores after the control
# plane's build, seconds when present; kubelet and kube-proxy come from the control plane's go build), and
# CoreDNS for the cluster's DNS (5 min 50 s on 2 cores shared with a test run). Where
# this machine cannot run a real node, `hack/node check` says why, and the real-node tests say so too.
node-build: cluster-build
	hack/node deps
	if hack/node check; then hack/node build; fi

# CRIU from source, for the snapshot agent's test on the real node (tests/e2e/test_snapshot_into_pod.py; about
# a minute on 2 cores plus its build dependencies from apt, seconds when present).
criu-build:
	if hack/node check; then hack/criu build; fi

# The real node's images (pause, stoker, vLLM CPU from the vllm-venv), built offline; where this machine
# cannot run a real node, `hack/node check` says why and the real-node tests report it.
node-images: node-build vllm-venv criu-build
	if hack/node check; then hack/node images; fi

# Real vLLM (CPU build) of stoker's default version, for the live-engine e2e test; reused once installed.
vllm-venv: venv
	hack/vllm-venv $$($(BIN)/python -m bench.conformance.versions)

# The Grafana dashboard's queries through Prometheus's own PromQL parser (built once, cached like the control plane).
lint: venv
	$(BIN)/ruff check src tests bench hack
	$(BIN)/ruff format --check src tests bench hack
	$(BIN)/mypy
	hack/dashboard-lint
	@# pytest imports test files by basename (rootdir mode): two of one name stop collection.
	@dups=$$(find tests -name 'test_*.py' -printf '%f\n' | sort | uniq -d); \
		if [ -n "$$dups" ]; then echo "test files share a name: $$dups"; exit 1; fi

unit: venv
	$(BIN)/pytest tests/unit

e2e: venv cluster-build epp-build lws-build vllm-venv node-images criu-build
	$(BIN)/pytest tests/e2e

# stoker's rules against every supported release's own `vllm serve` parser: the default's CPU venv, and
# each other release's pure-Python source beside it (hack/vllm-venv --source: about 20 s and 40 MB each).
conformance-flags: venv vllm-venv
	for version in $$($(BIN)/python -m bench.conformance.serve_options --sources-wanted); do \
		hack/vllm-venv --source $$version > /dev/null || exit 1; done
	STOKER_REQUIRE_CONFORMANCE=1 $(BIN)/pytest tests/conformance/test_owned_flags_parser.py \
		tests/conformance/test_serve_options.py

# Everything CI runs: install, build (or reuse) the control plane, lint, unit and e2e tests.
test: venv cluster-build epp-build lws-build vllm-venv node-images criu-build lint
	$(BIN)/pytest --durations=40 tests

# Stock vLLM against a VLLMService through real pods on the real node, and the same containers as host
# processes, interleaved, 3 repetitions (about 30 min on 2 cores); writes bench/results/realnode-cpu.json.
bench-realnode: venv cluster-build node-images
	$(BIN)/python -m bench.realnode

# Every example against every vLLM version in bench/conformance/versions.py (about 15 min per CPU version
# here); writes bench/results/conformance.json and docs/compatibility.md.
conformance: venv conformance-flags
	$(BIN)/python -m bench.conformance

# The CPU predictor sweep: 30 real vLLM CPU starts of six shapes (stock, seed, seeded serving; 46 min
# on 2 quiet cores), then fit on four shapes and judge the two held out (bench/results/predictor-cpu.json)
# and the shipped CPU coefficients fitted on all six. Needs root to drop the page cache (skipped otherwise).
predictor-cpu: vllm-venv
	$(BIN)/python -m bench.predictor.cpu_sweep

crds: venv
	$(BIN)/python -m stoker.api.crd

demo: venv cluster-build
	hack/demo $(DEMO_EXAMPLE)

# A real start on the real node: the seed Job and a serving pod running vLLM (CPU build) in containers.
# Builds the node and its images first (about 25 min cold on 2 cores, then about 5 min per demo).
demo-real: venv cluster-build node-images
	hack/demo --real

demo-down:
	hack/demo --down

# The two commands a newcomer needs: `make demo` and `make test`. Both set up what they need.
VENV := .venv
BIN := $(VENV)/bin
CLUSTER := hack/cluster
DEMO_EXAMPLE ?= examples/minimal.yaml

.PHONY: venv cluster-build vllm-venv node-images lint unit e2e test conformance conformance-flags predictor-cpu demo demo-down crds docs

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# The control plane, then the Gateway API Inference Extension's endpoint picker and its ext_proc client
# (4.4 min cold on 2 cores, seconds when present; tests/e2e/test_gateway.py).
# hack/node build adds the real node's kubelet, kube-proxy (same go build), containerd and the pause binary.
cluster-build:
	hack/node build
	hack/epp build

# The real node's images (pause, stoker, vLLM CPU from the vllm-venv), built offline; where this machine
# cannot run a real node, `hack/node check` says why and the real-node tests report it.
node-images: vllm-venv
	if hack/node check; then hack/node images; fi

# Real vLLM (CPU build) of stoker's default version, for the live-engine e2e test; reused once installed.
vllm-venv: venv
	hack/vllm-venv $$($(BIN)/python -m bench.conformance.versions)

lint: venv
	$(BIN)/ruff check src tests bench hack
	$(BIN)/ruff format --check src tests bench hack
	$(BIN)/mypy

unit: venv
	$(BIN)/pytest tests/unit

e2e: venv cluster-build vllm-venv node-images
	$(BIN)/pytest tests/e2e

# stoker's rules against real vLLM (needs a vLLM environment under ~/.cache/stoker/vllm; fails without).
conformance-flags: venv
	STOKER_REQUIRE_CONFORMANCE=1 $(BIN)/pytest tests/conformance/test_owned_flags_parser.py

# Everything CI runs: install, build (or reuse) the control plane, lint, unit and e2e tests.
test: venv cluster-build vllm-venv node-images lint
	$(BIN)/pytest tests

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

demo-down:
	hack/demo --down

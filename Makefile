# The two commands a newcomer needs: `make demo` and `make test`. Both set up what they need.
VENV := .venv
BIN := $(VENV)/bin
CLUSTER := hack/cluster
DEMO_EXAMPLE ?= examples/minimal.yaml

.PHONY: venv cluster-build lint unit e2e test demo demo-down crds docs conformance-flags

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

cluster-build:
	$(CLUSTER) build

lint: venv
	$(BIN)/ruff check src tests bench hack
	$(BIN)/ruff format --check src tests bench hack
	$(BIN)/mypy

unit: venv
	$(BIN)/pytest tests/unit

e2e: venv cluster-build
	$(BIN)/pytest tests/e2e

# stoker's rules against real vLLM (needs a vLLM environment under ~/.cache/stoker/vllm; fails without).
conformance-flags: venv
	STOKER_REQUIRE_CONFORMANCE=1 $(BIN)/pytest tests/conformance/test_owned_flags_parser.py

# Everything CI runs: install, build (or reuse) the control plane, lint, unit and e2e tests.
test: venv cluster-build lint
	$(BIN)/pytest tests

crds: venv
	$(BIN)/python -m stoker.api.crd

demo: venv cluster-build
	hack/demo $(DEMO_EXAMPLE)

demo-down:
	hack/demo --down

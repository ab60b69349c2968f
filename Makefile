# The two commands of the README. Each creates .venv and installs what it needs on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
# torch is pinned: on CPU-only machines 2.13.0 is the CPU build already on disk; an unpinned
# torch would download a multi-GB CUDA build.
TORCH ?= torch==2.13.0

.PHONY: run test

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev,kernels]"
	touch $@

run: $(VENV)/.installed
	$(PY) -m trace_kernels.demo

test: $(VENV)/.installed
	$(PY) -m pytest -q

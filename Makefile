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

# The main job: SFT warm start then TRACE RL (NVFP4 rollout + guided trainer); `tiny` on a CPU,
# `small` where torch sees a CUDA GPU. Resumes from RUN_DIR's last checkpoint when re-run.
RUN_DIR ?= runs/default
run: $(VENV)/.installed
	$(PY) -m trace_rl.cli train --out $(RUN_DIR) --config $$($(PY) -c "import torch; print('rl/configs/default_gpu.toml' if torch.cuda.is_available() else 'rl/configs/default.toml')")

test: $(VENV)/.installed
	$(PY) -m pytest -q

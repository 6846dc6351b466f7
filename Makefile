# Two commands on a fresh machine: `make train` and `make test`.
# Both create .venv when it is missing and install shoal into it.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip
# torch is installed first, on its own: the default takes the CPU wheel this machine
# class keeps on disk instead of a multi-GB CUDA build. `make TORCH=torch ...` to override.
TORCH  ?= torch==2.13.0
STAMP   = $(VENV)/.installed

.PHONY: train test bench gpu-check gpu-bench docs setup clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[test,atari]"
	touch $(STAMP)

setup: $(STAMP)

train: $(STAMP)
	$(VENV)/bin/shoal train ppo -c examples/ppo_cartpole.yaml

# Lint first (seconds): formatting, import order, pyflakes, bugbear; types of the training core; then the suite.
test: $(STAMP)
	$(PY) -m ruff format --check shoal tests benchmarks examples
	$(PY) -m ruff check shoal tests benchmarks examples
	$(PY) -m mypy
	$(PY) -m pytest -q --durations=25

bench: $(STAMP)
	$(PIP) install -q -e ".[bench]"
	$(PY) benchmarks/sampling.py
	$(PY) benchmarks/ppo_cartpole.py --seeds 3
	$(PY) benchmarks/replay.py
	$(PY) benchmarks/apex_cartpole.py
	$(PY) benchmarks/impala_cartpole.py
	$(PY) benchmarks/appo_cartpole.py
	$(PY) benchmarks/multi_agent_appo.py
	$(PY) benchmarks/ddppo_scaling.py
	$(PY) benchmarks/multi_device_learner.py
	$(PY) benchmarks/recurrent.py
	$(PY) benchmarks/league_connect4.py --budget-s 900
	$(PY) benchmarks/atari_throughput.py --budget-s 120
	$(PY) benchmarks/chaos.py --budget-s 900
	$(PY) benchmarks/atari_pong.py --budget-s 3600

# Every CUDA path once, on a GPU machine (one JSON line; without a GPU it says so and exits 0).
gpu-check: $(STAMP)
	$(PY) benchmarks/gpu_check.py

# One GPU machine, filled (under 9 minutes; one JSON line; without a GPU it says so and exits 0):
# each GPU Pong preset's steady frames/s over 40 s with GPU utilisation, then Pong to +18 with the fastest.
gpu-bench: $(STAMP)
	$(PY) benchmarks/gpu_bench.py

# The documentation site (MkDocs, Material theme) into site/; --strict: any warning fails the build.
docs: $(STAMP)
	$(PIP) install -q -e ".[docs]"
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -d site

clean:
	rm -rf $(VENV) runs build site *.egg-info

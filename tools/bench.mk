# Benchmarks against the peers (included from the Makefile). The peers live in their own environment,
# .bench-venv, never in .venv: same python, the local CPU torch first (letting pip choose torch pulls a
# multi-GB CUDA build), then the project, then the peers.
#   make bench         full run (200M tokens, 100 MB of JSONL; about an hour on 2 cores)
#   make bench-quick   quick run (20M tokens, 30 MB; under 10 minutes after setup)
# Both rewrite docs/benchmarks.md and docs/benchmarks.png; raw results go to bench-out/results/.
PYTHON          ?= python3
TORCH_VERSION   ?= 2.13.0
BENCH_VENV      ?= .bench-venv
BENCH_PY        := $(BENCH_VENV)/bin/python
BENCH_PIP       := $(BENCH_PY) -m pip
BENCH_ARGS      ?=

.PHONY: bench bench-quick bench-setup bench-report bench-clean

$(BENCH_PY):
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_PIP) install --quiet --upgrade pip

$(BENCH_VENV)/.installed: $(BENCH_PY) pyproject.toml tools/requirements-peers.txt tools/peers/requirements-nodeps.txt
	$(BENCH_PIP) install --quiet "torch==$(TORCH_VERSION)"
	$(BENCH_PIP) install --quiet -e .
	$(BENCH_PIP) install --quiet -r tools/requirements-peers.txt
	# MosaicML Streaming pins numpy<2.2 and pulls transformers/cloud SDKs/torchvision: --no-deps, plus what it imports
	$(BENCH_PIP) install --quiet --no-deps -r tools/peers/requirements-nodeps.txt
	$(BENCH_PY) -c "import torch, numpy; assert torch.__version__.startswith('$(TORCH_VERSION)'), torch.__version__; print('bench env: torch', torch.__version__, 'numpy', numpy.__version__)"
	touch $@

bench-setup: $(BENCH_VENV)/.installed

bench: bench-setup
	$(BENCH_PY) tools/bench_tokenize.py --repeat 3 $(BENCH_ARGS)
	$(BENCH_PY) tools/bench_tokenize_coordinator.py
	$(BENCH_PY) tools/bench_loader.py $(BENCH_ARGS)
	$(BENCH_PY) tools/peers/report.py

bench-quick: bench-setup
	$(BENCH_PY) tools/bench_tokenize.py --quick $(BENCH_ARGS)
	$(BENCH_PY) tools/bench_tokenize_coordinator.py --mb 20,60
	$(BENCH_PY) tools/bench_loader.py --quick $(BENCH_ARGS)
	$(BENCH_PY) tools/peers/report.py

bench-report:
	$(BENCH_PY) tools/peers/report.py

bench-clean:
	rm -rf $(BENCH_VENV) bench-out

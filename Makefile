# Everything a fresh Linux machine with Python >= 3.10 needs: `make demo`, `make test`.
PYTHON        ?= python3
VENV          ?= .venv
TORCH_VERSION ?= 2.13.0
PY            := $(VENV)/bin/python
WRITE_PYC     := env -u PYTHONDONTWRITEBYTECODE
PIP           := $(PY) -m pip
DEMO_OUT      ?= demo-out

.PHONY: demo test test-all setup clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade --quiet pip

# Torch first, and only if missing: users bring their own CUDA build; pip must not pick one for us.
# pip is not silenced: its download bars show progress. --no-compile: pip would byte-compile every module of
# torch and ray (about 75 s of a 2-core machine's setup); instead the modules a run imports are compiled once,
# on first use, even where PYTHONDONTWRITEBYTECODE is set (without their .pyc, `import torch` takes twice as
# long in every process: the suite starts hundreds). `make demo` needs only the project itself;
# `make test` adds the dev extras (pytest, a local S3 server, Ray, matplotlib).
$(VENV)/.installed-base: $(PY) pyproject.toml
	@$(PY) -c "import torch" 2>/dev/null || echo "== installing torch $(TORCH_VERSION) into $(VENV) (set TORCH_VERSION=... or install your own build first)"
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install --no-compile --progress-bar on "torch==$(TORCH_VERSION)"
	@echo "== installing dataflow-lm (editable) and its dependencies into $(VENV)"
	PYTHONWARNINGS="ignore:Editable installation" $(PIP) install --no-compile --progress-bar on -e .
	$(WRITE_PYC) $(PY) -c "import torch, torch.distributed, pyarrow, dataflow.cli, trainer.__main__"
	touch $@

$(VENV)/.installed: $(VENV)/.installed-base
	@echo "== installing the dev extras (pytest, moto, boto3, s3fs, ray, matplotlib) into $(VENV)"
	PYTHONWARNINGS="ignore:Editable installation" $(PIP) install --no-compile --progress-bar on -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

demo: $(VENV)/.installed-base
	$(PY) tools/demo.py --out $(DEMO_OUT)

# one test process per core (a file's tests stay together, sharing its module fixtures); the suite waits on
# subprocesses and servers much of the time, so two processes on two cores take 6.5 instead of 11 minutes
test: setup
	$(WRITE_PYC) $(PY) -m pytest -q -n auto --dist loadfile

# everything, the heavy checks included (Ray, distributed, framework integrations, kill soaks), one at a time:
# the distributed runs take fixed ports and every core
test-all: setup
	$(WRITE_PYC) $(PY) -m pytest -q -m ""

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache

# make bench / make bench-quick: our numbers against the peers, in a separate environment
include tools/bench.mk
